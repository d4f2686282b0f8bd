//! `HostileMemoryBomb`: allocates and touches memory until allocation fails.

use std::hint::black_box;

use weft_sdk::NodeError;

weft_sdk::node! {
    /// Allocates `chunk_mib` MiB at a time and writes every byte, until allocation
    /// fails. By default a failed allocation aborts (a trap, as any Rust program would);
    /// with `graceful` it returns the node error `out_of_memory` instead.
    pub struct HostileMemoryBomb {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            chunk_mib: u32 = input::uint().default(16).min(1).max(1024),
            graceful: bool = input::boolean().default(false),
        }
        outputs { INT: i64 }
        fn execute(_, inp) {
            let chunk = usize::try_from(u64::from(inp.chunk_mib) << 20)?;
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            let mut total: u64 = 0;
            loop {
                let mut block: Vec<u8> = Vec::new();
                if inp.graceful {
                    if hoard.try_reserve(1).is_err() || block.try_reserve_exact(chunk).is_err() {
                        return Err(NodeError::new(
                            "out_of_memory",
                            format!("allocation failed after {total} bytes"),
                        ));
                    }
                } else {
                    block.reserve_exact(chunk);
                }
                block.resize(chunk, 0xA5);
                total += chunk as u64;
                hoard.push(black_box(block));
                black_box(&hoard);
            }
        }
    }
}

weft_sdk::export_plugin!(HostileMemoryBomb);
