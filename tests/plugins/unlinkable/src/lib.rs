//! `HostileUnlinkable`: a plugin of `weft:node@0.2.0` that also imports
//! `hostile:unlinkable/missing`, which no host provides, so it cannot be linked.

wit_bindgen::generate!({
    inline: r#"
        package hostile:unlinkable;

        interface missing {
            nothing: func() -> u32;
        }

        world plugin-plus {
            include weft:node/plugin@0.2.0;
            import missing;
        }
    "#,
    path: "../../../wit/weft-node-0.2.0",
    world: "hostile:unlinkable/plugin-plus",
    generate_all,
});

use weft::node::types::{OutputSpec, Value};

struct Unlinkable;

impl Guest for Unlinkable {
    fn describe() -> Vec<NodeDef> {
        vec![NodeDef {
            class_type: "HostileUnlinkable".into(),
            display_name: "HostileUnlinkable".into(),
            category: "testing/hostile".into(),
            description: "Calls an import no host provides.".into(),
            inputs: Vec::new(),
            outputs: vec![OutputSpec {
                type_name: "INT".into(),
                name: "INT".into(),
                is_list: false,
                tooltip: None,
            }],
            output_node: false,
            deterministic: false,
        }]
    }

    fn execute(_class_type: String, _inputs: Vec<NamedValue>) -> Result<NodeResult, NodeError> {
        let n = hostile::unlinkable::missing::nothing();
        Ok(NodeResult {
            outputs: vec![Value::Int(i64::from(n))],
            files: Vec::new(),
        })
    }
}

export!(Unlinkable);
