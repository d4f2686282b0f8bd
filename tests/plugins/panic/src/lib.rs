//! `HostilePanic`: a node that panics (a trap in WebAssembly).

weft_sdk::node! {
    /// Panics with the message `hostile panic`.
    pub struct HostilePanic {
        category: "testing/hostile",
        deterministic: false,
        inputs {}
        outputs { STRING: String }
        fn execute(_, _) {
            panic!("hostile panic")
        }
    }
}

weft_sdk::export_plugin!(HostilePanic);
