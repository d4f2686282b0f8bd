//! `HostileStdoutFlood`: writes `megabytes` MB (10^6 bytes) to stdout.

use std::io::Write;

use weft_sdk::NodeError;

/// The last line the flood writes.
const END_MARKER: &str = "FLOOD-END-MARKER\n";

weft_sdk::node! {
    /// Writes `megabytes` x 1,000,000 bytes to stdout in 64 KiB chunks of numbered
    /// 100-byte lines; the very last line is `FLOOD-END-MARKER`. Returns the number of
    /// bytes written (the INT output) and a summary; if stdout fails, the node error
    /// `stdout_failed`.
    pub struct HostileStdoutFlood {
        category: "testing/hostile",
        deterministic: false,
        inputs {
            megabytes: u32 = input::uint().default(100).min(1).max(10000),
        }
        outputs { STRING: String, INT: i64 }
        fn execute(_, inp) {
            let total = u64::from(inp.megabytes) * 1_000_000;
            let body = total - END_MARKER.len() as u64;
            let fail = |e: std::io::Error| NodeError::new("stdout_failed", e.to_string());
            let mut out = std::io::stdout().lock();
            let mut chunk = Vec::with_capacity(64 * 1024);
            let mut written: u64 = 0;
            let mut line_no: u64 = 0;
            while written < body {
                chunk.clear();
                while chunk.len() + 100 <= 64 * 1024 && written + (chunk.len() as u64) < body {
                    let line = format!("flood line {line_no:>12} {:x<75}\n", "");
                    chunk.extend_from_slice(line.as_bytes());
                    line_no += 1;
                }
                let left = usize::try_from(body - written)?;
                if left <= chunk.len() {
                    // The last chunk: cut it to size, still ending in a newline, so that
                    // the marker is a line of its own.
                    chunk.truncate(left);
                    if let Some(last) = chunk.last_mut() {
                        *last = b'\n';
                    }
                }
                out.write_all(&chunk).map_err(fail)?;
                written += chunk.len() as u64;
            }
            out.write_all(END_MARKER.as_bytes()).map_err(fail)?;
            out.flush().map_err(fail)?;
            written += END_MARKER.len() as u64;
            Ok((format!("wrote {written} bytes to stdout"), written as i64))
        }
    }
}

weft_sdk::export_plugin!(HostileStdoutFlood);
