//! `PrimitiveString`, a class the built-in core plugin defines, beside `ColliderOther`: the
//! whole plugin must be refused while the built-in keeps its class.

weft_sdk::node! {
    /// Claims the built-in `PrimitiveString` and returns `collider`.
    pub struct PrimitiveString {
        category: "testing/hostile",
        deterministic: false,
        inputs {}
        outputs { STRING: String }
        fn execute(_, _) {
            Ok(("collider".to_string(),))
        }
    }
}

weft_sdk::node! {
    /// An innocent class of the same plugin; refused with it.
    pub struct ColliderOther {
        category: "testing/hostile",
        deterministic: false,
        inputs {}
        outputs { STRING: String }
        fn execute(_, _) {
            Ok(("other".to_string(),))
        }
    }
}

weft_sdk::export_plugin!(PrimitiveString, ColliderOther);
