// A weft node plugin written in JavaScript, built into a component with componentize-js
// against the `plugin` world of wit/weft-node-0.2.0. Two nodes:
//   JsSlugify   STRING -> STRING   a string node (typed inputs with defaults, progress)
//   JsInvertedFill INT,INT,INT -> IMAGE,STRING  calls the host's image functions (pixels stay on the host)
//
// Build from the repository root: `scripts/build-wasm.sh js`
// (output: target/wasm/js/weft_js_example.wasm).

import * as host from "weft:node/host@0.2.0";
import * as images from "weft:node/images@0.2.0";
import { NodeError, input, node, output, plugin } from "../../sdk/js/weft.js";

const CATEGORY = "utils/js";

const slugify = node({
  classType: "JsSlugify",
  displayName: "Slugify (JS)",
  category: CATEGORY,
  description: "Lower-cases the text and joins its words with the separator, for file names and URLs.",
  inputs: {
    text: input.string({ multiline: true }),
    separator: input.combo(["-", "_", "."]),
    max_length: input.int({ default: 64, min: 1, max: 1024, tooltip: "Longest slug, in characters" }),
  },
  outputs: [output.string("slug")],
  run({ text, separator, max_length }, ctx) {
    ctx.progress(0, 1, "slugifying");
    const words = text
      .toLowerCase()
      .split(/[^a-z0-9]+/)
      .filter((w) => w.length > 0);
    if (words.length === 0) {
      throw new NodeError("empty_slug", "the text has no letters or digits to make a slug of");
    }
    ctx.progress(1, 1);
    return [words.join(separator).slice(0, max_length)];
  },
});

const invertedFill = node({
  classType: "JsInvertedFill",
  displayName: "Inverted Fill (JS)",
  category: CATEGORY,
  description: "A batch of images of one colour, inverted by the host: pixels never enter the plugin.",
  inputs: {
    width: input.int({ default: 64, min: 1, max: 4096 }),
    height: input.int({ default: 64, min: 1, max: 4096 }),
    color: input.int({ default: 0, min: 0, max: 0xffffff, tooltip: "0xRRGGBB, inverted" }),
  },
  outputs: [output.image("IMAGE"), output.string("size")],
  run({ width, height, color }) {
    const filled = images.empty(width, height, 1, color);
    const inverted = images.invert(filled);
    return [inverted, `${inverted.width()}x${inverted.height()}`];
  },
});

export const { describe, execute } = plugin([slugify, invertedFill], host);
