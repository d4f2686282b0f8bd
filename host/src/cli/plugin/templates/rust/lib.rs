//! {{name}}: a weft node plugin (a WebAssembly component of the `weft:node@0.2.0` world).

use weft_sdk::prelude::*;

weft_sdk::node! {
    /// Greets someone by name.
    pub struct {{class}} {
        display_name: "Greet ({{name}})",
        category: "{{name}}",
        inputs {
            name: String = input::string().default("world").tooltip("Who to greet"),
        }
        outputs { STRING: String }
        fn execute(ctx, inp) {
            ctx.progress(1, 1, "greeting");
            Ok((format!("Hello, {}!", inp.name),))
        }
    }
}

weft_sdk::export_plugin!({{class}});

#[cfg(test)]
mod tests {
    use weft_sdk::{execute, NamedValue, NodeEntry, Value};

    #[test]
    fn greets_by_name_and_defaults_to_world() {
        let nodes = [NodeEntry::of::<super::{{class}}>()];
        let name = NamedValue {
            name: "name".into(),
            value: Value::Text("Ada".into()),
        };
        let result = execute(&nodes, "{{class}}", vec![name]).unwrap();
        assert!(matches!(&result.outputs[0], Value::Text(s) if s == "Hello, Ada!"));
        let result = execute(&nodes, "{{class}}", vec![]).unwrap();
        assert!(matches!(&result.outputs[0], Value::Text(s) if s == "Hello, world!"));
    }
}
