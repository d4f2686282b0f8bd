//! `HostileSleep` and `HostileImageHoard`: nodes that hold the host's resources rather than
//! their own: a worker, by sleeping in WASI, and host memory, by keeping image handles.

use std::time::Duration;

use weft_sdk::{images, NodeError};

weft_sdk::node! {
    /// Reports progress once, then sleeps `seconds` in WASI (`std::thread::sleep`, a
    /// blocking `wasi:io/poll` wait), out of reach of the epoch interrupt of wasm code.
    pub struct HostileSleep {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            seconds: f64 = input::float().default(3600.0).min(0.0).max(1e6),
        }
        outputs { INT: i64 }
        fn execute(ctx, inp) {
            let pause = Duration::try_from_secs_f64(inp.seconds)
                .map_err(|e| NodeError::invalid_input(format!("input `seconds`: {e}")))?;
            ctx.progress(0, 1, "sleeping");
            std::thread::sleep(pause);
            Ok((1,))
        }
    }
}

weft_sdk::node! {
    /// Asks the host for `width` x `height` images, one after another, and keeps every
    /// handle, until the host refuses. Returns how many it got if the host ever says no
    /// with a node error instead.
    pub struct HostileImageHoard {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            width: u32 = input::uint().default(1024).min(1).max(65535),
            height: u32 = input::uint().default(1024).min(1).max(65535),
        }
        outputs { INT: i64 }
        fn execute(_, inp) {
            let mut hoard = Vec::new();
            loop {
                match images::empty(inp.width, inp.height, 1, 0) {
                    Ok(image) => hoard.push(image),
                    Err(e) => {
                        return Err(NodeError::new(e.code, format!("{} (after {} images)", e.message, hoard.len())))
                    }
                }
            }
        }
    }
}

weft_sdk::export_plugin!(HostileSleep, HostileImageHoard);
