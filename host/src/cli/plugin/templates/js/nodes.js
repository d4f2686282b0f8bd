// {{name}}'s node declarations: plain JavaScript with weft.js, so `node --test` runs them
// without a build.
import { input, node, output } from "./weft.js";

export const greet = node({
  classType: "{{class}}",
  displayName: "Greet ({{name}})",
  category: "{{name}}",
  description: "Greets someone by name.",
  inputs: { name: input.string({ default: "world", tooltip: "Who to greet" }) },
  outputs: [output.string("STRING")],
  run({ name }, ctx) {
    ctx.progress(1, 1, "greeting");
    return [`Hello, ${name}!`];
  },
});
