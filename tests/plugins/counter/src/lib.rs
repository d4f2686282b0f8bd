//! `SlowCounter` and `PoliteCounter`: busy loops for cancellation tests.

use std::hint::black_box;
use std::time::{Duration, Instant};

use weft_sdk::{Context, NodeError};

/// How often the counters report progress.
const REPORT_EVERY: Duration = Duration::from_millis(100);

/// Busy-waits for `seconds`, reporting progress every 100 ms; with `polite`, checks
/// `is_canceled` on every iteration and fails with `canceled`. Returns the iterations.
fn count(ctx: &Context, seconds: f64, polite: bool) -> Result<i64, NodeError> {
    let total =
        Duration::try_from_secs_f64(seconds).map_err(|e| NodeError::invalid_input(format!("input `seconds`: {e}")))?;
    let steps = u32::try_from(total.as_millis() / REPORT_EVERY.as_millis())
        .unwrap_or(u32::MAX)
        .max(1);
    let start = Instant::now();
    let mut last_report = start;
    let mut step = 0u32;
    let mut spins: i64 = 0;
    while start.elapsed() < total {
        if polite && ctx.is_canceled() {
            return Err(NodeError::canceled());
        }
        spins = black_box(spins + 1);
        if last_report.elapsed() >= REPORT_EVERY {
            last_report = Instant::now();
            step = (step + 1).min(steps);
            ctx.progress(step, steps, "counting");
        }
    }
    ctx.progress(steps, steps, "done");
    Ok(spins)
}

weft_sdk::node! {
    /// Busy-waits for `seconds` while reporting progress, and never checks for
    /// cancellation: the host has to interrupt it. Returns the loop iterations.
    pub struct SlowCounter {
        category: "testing",
        deterministic: false,
        inputs {
            seconds: f64 = input::float().default(5.0).min(0.0).max(3600.0).step(0.1),
        }
        outputs { INT: i64 }
        fn execute(ctx, inp) {
            Ok((count(ctx, inp.seconds, false)?,))
        }
    }
}

weft_sdk::node! {
    /// Busy-waits for `seconds` while reporting progress, checking `is_canceled` on
    /// every iteration; fails with code `canceled` once the job is canceled.
    pub struct PoliteCounter {
        category: "testing",
        deterministic: false,
        inputs {
            seconds: f64 = input::float().default(5.0).min(0.0).max(3600.0).step(0.1),
        }
        outputs { INT: i64 }
        fn execute(ctx, inp) {
            Ok((count(ctx, inp.seconds, true)?,))
        }
    }
}

weft_sdk::export_plugin!(SlowCounter, PoliteCounter);
