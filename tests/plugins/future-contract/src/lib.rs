//! A plugin of `weft:node@0.9.0`, a contract version no host serves: the host must say so
//! instead of failing to link it with a confusing message.

wit_bindgen::generate!({
    inline: r#"
        package weft:node@0.9.0;

        interface types {
            record node-def {
                class-type: string,
            }
        }

        world plugin {
            use types.{node-def};
            export describe: func() -> list<node-def>;
        }
    "#,
    world: "weft:node/plugin@0.9.0",
});

struct Future;

impl Guest for Future {
    fn describe() -> Vec<NodeDef> {
        vec![NodeDef {
            class_type: "FromTheFuture".into(),
        }]
    }
}

export!(Future);
