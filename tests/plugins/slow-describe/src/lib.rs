//! A plugin whose `describe()` spins forever: the host must give up on it at start-up
//! and serve the other plugins.

use std::hint::black_box;

use weft_sdk::{NamedValue, NodeDef, NodeError, NodeResult};

struct SlowDescribe;

impl weft_sdk::bindings::Guest for SlowDescribe {
    fn describe() -> Vec<NodeDef> {
        let mut spins: u64 = 0;
        loop {
            spins = black_box(spins.wrapping_add(1));
        }
    }

    fn execute(class_type: String, _inputs: Vec<NamedValue>) -> Result<NodeResult, NodeError> {
        Err(NodeError::new("unknown_class", format!("no class {class_type}")))
    }
}

weft_sdk::bindings::__export_plugin_world!(SlowDescribe with_types_in weft_sdk::bindings);
