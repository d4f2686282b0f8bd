// {{name}}: a weft node plugin in JavaScript (the `plugin` world of weft:node@0.2.0 in ./wit),
// built with componentize-js. Its nodes are declared in nodes.js.
import * as host from "weft:node/host@0.2.0";
import { plugin } from "./weft.js";
import { greet } from "./nodes.js";

export const { describe, execute } = plugin([greet], host);
