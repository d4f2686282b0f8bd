//! `HostileLoop`: a node that never returns. The host must interrupt it.

weft_sdk::node! {
    /// Spins forever without calling the host; only an interrupt (epoch deadline,
    /// fuel) stops it.
    pub struct HostileLoop {
        category: "testing/hostile",
        deterministic: false,
        inputs {}
        outputs { INT: i64 }
        fn execute(_, _) {
            let mut n: u64 = 0;
            loop {
                n = std::hint::black_box(n.wrapping_add(1));
            }
        }
    }
}

weft_sdk::export_plugin!(HostileLoop);
