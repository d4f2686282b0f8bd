// Tests of {{name}}'s nodes: `node --test` in this folder.
import assert from "node:assert/strict";
import { test } from "node:test";

import { plugin } from "./weft.js";
import { greet } from "./nodes.js";

const { describe, execute } = plugin([greet]);

test("describes one class", () => {
  assert.deepEqual(describe().map((d) => d.classType), ["{{class}}"]);
});

test("greets by name, and the world by default", () => {
  const text = (value) => ({ tag: "text", val: value });
  const named = execute("{{class}}", [{ name: "name", value: text("Ada") }]);
  assert.deepEqual(named.outputs, [text("Hello, Ada!")]);
  assert.deepEqual(execute("{{class}}", []).outputs, [text("Hello, world!")]);
});
