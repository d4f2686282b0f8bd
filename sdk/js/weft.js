// weft's helper module for node plugins written in JavaScript or TypeScript and built into a
// WebAssembly component with componentize-js. No npm packages: copy or import this file.
//
// It does for JS authors what the `weft-sdk` crate does for Rust authors:
//   - `node({...})` declares a node class; `plugin(nodes)` turns the declarations into the
//     `describe` and `execute` exports of the `plugin` world (wit/weft-node-0.2.0);
//   - inputs are typed (`input.int`, `input.string`, ...) with defaults and bounds, and
//     `run` receives them as plain JS values, already checked and defaulted;
//   - `ctx.progress(step, steps, message)` reports progress;
//   - `throw new NodeError(code, message)` fails the node with that code.
//
// Usage (see plugins/js-example/plugin.js):
//
//   import { node, plugin, input, output } from "./weft.js";
//   export const { describe, execute } = plugin([
//     node({ classType: "Shout", inputs: { text: input.string() },
//            outputs: [output.string("text")], run: ({ text }) => [text.toUpperCase()] }),
//   ]);

/** A node failure: `code` is snake_case and machine-readable, `message` is for people. */
export class NodeError extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

// The WIT `value` variant tags of plain inputs, by ComfyUI type name.
const SCALAR_TAGS = { INT: "int", FLOAT: "float", BOOLEAN: "boolean", STRING: "text", COMBO: "text" };
// Handle types carried by their own variant case; any other type is a `handle`.
const HANDLE_TAGS = { IMAGE: "image", LATENT: "latent", MASK: "mask", AUDIO: "audio", "core/ASSET": "asset" };

function spec(typeName, options = {}) {
  return {
    typeName,
    // An input with a default may be left out of a workflow: the default is then used.
    required: options.required ?? options.default === undefined,
    default: options.default,
    min: options.min,
    max: options.max,
    step: options.step,
    options: options.options ?? [],
    multiline: options.multiline ?? false,
    tooltip: options.tooltip,
  };
}

/**
 * Input declarations. Each takes `{ default, min, max, step, tooltip, required }` as fits.
 * An input is required unless it has a default (or says `required: false`).
 */
export const input = {
  /** An `INT` input. */
  int: (options) => spec("INT", options),
  /** A `FLOAT` input. */
  float: (options) => spec("FLOAT", options),
  /** A `BOOLEAN` input. */
  boolean: (options) => spec("BOOLEAN", options),
  /** A `STRING` input; `{ multiline: true }` for a text area. */
  string: (options) => spec("STRING", options),
  /** A choice among `choices` (ComfyUI's combo); the default is the first choice. */
  combo: (choices, options = {}) => spec("COMBO", { default: choices[0], ...options, options: choices }),
  /** An `IMAGE` batch, passed to `run` as a host handle. */
  image: (options) => spec("IMAGE", options),
  /** A `MASK` batch, passed to `run` as a host handle. */
  mask: (options) => spec("MASK", options),
  /** An input of any other ComfyUI type (`LATENT`, `MODEL`, ...), passed as a host handle. */
  of: (typeName, options) => spec(typeName, options),
};

function out(typeName, name, options = {}) {
  return { typeName, name: name ?? typeName, isList: options.isList ?? false, tooltip: options.tooltip };
}

/** Output declarations. */
export const output = {
  /** An `INT` output. */
  int: (name, options) => out("INT", name, options),
  /** A `FLOAT` output. */
  float: (name, options) => out("FLOAT", name, options),
  /** A `BOOLEAN` output. */
  boolean: (name, options) => out("BOOLEAN", name, options),
  /** A `STRING` output. */
  string: (name, options) => out("STRING", name, options),
  /** An `IMAGE` output: return the handle a host function gave. */
  image: (name, options) => out("IMAGE", name, options),
  /** An output of any other ComfyUI type. */
  of: (typeName, name, options) => out(typeName, name, options),
};

/**
 * Declares a node class: `{ classType, displayName, category, description, inputs, outputs,
 * deterministic = true, run }`. `inputs` maps names to `input.*` declarations in display
 * order; `run(values, ctx)` returns one value per output, in order.
 */
export function node(declaration) {
  const { classType, run } = declaration;
  if (typeof classType !== "string" || classType.trim() === "") {
    throw new Error("node(): classType must be a non-empty string");
  }
  if (typeof run !== "function") {
    throw new Error(`node ${classType}: run must be a function`);
  }
  const inputs = declaration.inputs ?? {};
  for (const [name, decl] of Object.entries(inputs)) {
    checkDeclaredInput(classType, name, decl);
  }
  return {
    classType,
    displayName: declaration.displayName ?? classType,
    category: declaration.category ?? "custom",
    description: declaration.description ?? "",
    inputs,
    outputs: declaration.outputs ?? [],
    deterministic: declaration.deterministic ?? true,
    run,
  };
}

function checkDeclaredInput(classType, name, decl) {
  const where = `node ${classType}: input ${name}`;
  if (decl.min !== undefined && decl.max !== undefined && decl.min > decl.max) {
    throw new Error(`${where}: min ${decl.min} is above max ${decl.max}`);
  }
  if (decl.default === undefined) return;
  const problem = valueProblem(decl, decl.default);
  if (problem) throw new Error(`${where}: default ${JSON.stringify(decl.default)} ${problem}`);
}

// Why `value` does not fit the declaration `decl`, or undefined when it does.
function valueProblem(decl, value) {
  switch (decl.typeName) {
    case "INT":
      if (typeof value !== "number" && typeof value !== "bigint") return "is not an integer";
      if (typeof value === "number" && !Number.isInteger(value)) return "is not an integer";
      break;
    case "FLOAT":
      if (typeof value !== "number" || !Number.isFinite(value)) return "is not a finite number";
      break;
    case "BOOLEAN":
      if (typeof value !== "boolean") return "is not a boolean";
      return undefined;
    case "STRING":
      if (typeof value !== "string") return "is not a string";
      return undefined;
    case "COMBO":
      if (!decl.options.includes(value)) return `is not one of ${JSON.stringify(decl.options)}`;
      return undefined;
    default:
      return undefined;
  }
  const n = Number(value);
  if (decl.min !== undefined && n < decl.min) return `is below the minimum ${decl.min}`;
  if (decl.max !== undefined && n > decl.max) return `is above the maximum ${decl.max}`;
  return undefined;
}

function inputSpec(name, decl) {
  return {
    name,
    typeName: decl.typeName,
    required: decl.required,
    default: decl.default === undefined ? undefined : JSON.stringify(decl.default, jsonBigInt),
    min: decl.min,
    max: decl.max,
    step: decl.step,
    options: decl.options,
    multiline: decl.multiline,
    tooltip: decl.tooltip,
    modelFolder: undefined,
  };
}

function jsonBigInt(_key, value) {
  return typeof value === "bigint" ? Number(value) : value;
}

function nodeDef(n) {
  return {
    classType: n.classType,
    displayName: n.displayName,
    category: n.category,
    description: n.description,
    inputs: Object.entries(n.inputs).map(([name, decl]) => inputSpec(name, decl)),
    outputs: n.outputs,
    outputNode: false,
    deterministic: n.deterministic,
  };
}

// The JS value of input `name` from the WIT `value` the host passed.
function fromWit(name, decl, value) {
  const wanted = SCALAR_TAGS[decl.typeName];
  if (wanted) {
    if (value.tag !== wanted) {
      throw new NodeError("invalid_input", `input ${name}: expected ${decl.typeName}, got ${value.tag}`);
    }
    const v = value.tag === "int" ? Number(value.val) : value.val;
    const problem = valueProblem(decl, v);
    if (problem) throw new NodeError("invalid_input", `input ${name}: ${JSON.stringify(v)} ${problem}`);
    return v;
  }
  const tag = HANDLE_TAGS[decl.typeName] ?? "handle";
  if (value.tag !== tag) {
    throw new NodeError("invalid_input", `input ${name}: expected ${decl.typeName}, got ${value.tag}`);
  }
  return value.val;
}

// The WIT `value` of output `spec` from what `run` returned.
function toWit(classType, index, spec, v) {
  const where = `node ${classType}: output ${index} (${spec.typeName})`;
  switch (spec.typeName) {
    case "INT":
      if (!Number.isInteger(v) && typeof v !== "bigint") throw new Error(`${where}: ${v} is not an integer`);
      return { tag: "int", val: BigInt(v) };
    case "FLOAT":
      if (typeof v !== "number") throw new Error(`${where}: ${v} is not a number`);
      return { tag: "float", val: v };
    case "BOOLEAN":
      return { tag: "boolean", val: Boolean(v) };
    case "STRING":
      return { tag: "text", val: String(v) };
    default: {
      const tag = HANDLE_TAGS[spec.typeName];
      if (tag) return { tag, val: v };
      if (v !== null && typeof v === "object" && typeof v.typeName === "function") return { tag: "handle", val: v };
      return { tag: "json", val: JSON.stringify(v, jsonBigInt) };
    }
  }
}

/**
 * The `describe` and `execute` exports for `nodes` (made with `node`). `host` is the
 * `weft:node/host` import (`import * as host from "weft:node/host@0.2.0"`), used for
 * progress and cancellation; without it `ctx.progress` does nothing.
 */
export function plugin(nodes, host) {
  const byClass = new Map();
  for (const n of nodes) {
    if (byClass.has(n.classType)) throw new Error(`node class ${n.classType} is declared twice`);
    byClass.set(n.classType, n);
  }
  const ctx = {
    progress: (step, steps, message) => host?.progress(step, steps, message),
    isCanceled: () => (host ? host.isCanceled() : false),
  };
  function describe() {
    return nodes.map(nodeDef);
  }
  function execute(classType, given) {
    try {
      const n = byClass.get(classType);
      if (!n) throw new NodeError("unknown_class", `this plugin has no node class ${classType}`);
      const values = {};
      const byName = new Map(given.map((nv) => [nv.name, nv.value]));
      for (const [name, decl] of Object.entries(n.inputs)) {
        if (byName.has(name)) {
          values[name] = fromWit(name, decl, byName.get(name));
        } else if (decl.default !== undefined) {
          values[name] = decl.default;
        } else if (decl.required) {
          throw new NodeError("invalid_input", `missing required input ${name}`);
        }
      }
      const result = n.run(values, ctx);
      const outputs = Array.isArray(result) ? result : [result];
      if (outputs.length !== n.outputs.length) {
        throw new Error(`node ${classType}: run returned ${outputs.length} values for ${n.outputs.length} outputs`);
      }
      return { outputs: outputs.map((v, i) => toWit(classType, i, n.outputs[i], v)), files: [] };
    } catch (e) {
      if (e instanceof NodeError) throw { code: e.code, message: e.message };
      // A host function's own node error arrives as a ComponentError-like object.
      if (e && typeof e.payload === "object" && typeof e.payload.code === "string") throw e.payload;
      throw { code: "plugin_error", message: String(e?.message ?? e) };
    }
  }
  return { describe, execute };
}
