//! `HostileRecursion`: unbounded recursion until the stack overflows.

use std::hint::black_box;

/// Recurses with a 1 KiB frame on the shadow stack until the stack runs out.
#[inline(never)]
fn dive(depth: u64, parent: &mut [u8; 1024]) -> u64 {
    let mut frame = [0u8; 1024];
    frame[(depth % 1024) as usize] = parent[0].wrapping_add(1);
    if black_box(depth) == u64::MAX {
        return 0;
    }
    let below = dive(depth + 1, black_box(&mut frame));
    below.wrapping_add(u64::from(frame[0]))
}

weft_sdk::node! {
    /// Recurses without bound: a stack overflow, which traps.
    pub struct HostileRecursion {
        category: "testing/hostile",
        deterministic: false,
        inputs {}
        outputs { INT: i64 }
        fn execute(_, _) {
            let mut root = [0u8; 1024];
            Ok((dive(0, &mut root) as i64,))
        }
    }
}

weft_sdk::export_plugin!(HostileRecursion);
