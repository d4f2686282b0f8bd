//! The bounded per-job log: every node's stdout and stderr go to one tail buffer.
//!
//! It always accepts writes and keeps the newest bytes; once anything was dropped the log
//! is marked truncated. (wasmtime-wasi's `MemoryOutputPipe` is not used: when full it traps
//! the guest, and it keeps the head of the output rather than the tail.)

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamResult};

/// Largest write permit handed to a guest at once.
const WRITE_PERMIT: usize = 64 << 10;

#[derive(Debug)]
struct Tail {
    capacity: usize,
    bytes: VecDeque<u8>,
    truncated: bool,
    written: u64,
}

/// A snapshot of a job's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogSnapshot {
    /// The retained tail, lossily decoded as UTF-8.
    pub text: String,
    /// Whether older bytes were dropped.
    pub truncated: bool,
}

/// A job's bounded log tail, shared by every node call of the job.
#[derive(Debug, Clone)]
pub struct TailLog {
    inner: Arc<Mutex<Tail>>,
}

impl TailLog {
    /// An empty log keeping at most `capacity` bytes.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Tail {
                capacity,
                bytes: VecDeque::new(),
                truncated: false,
                written: 0,
            })),
        }
    }

    /// Appends `data`, dropping the oldest bytes beyond the capacity.
    pub fn write(&self, data: &[u8]) {
        let mut tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        tail.written += data.len() as u64;
        let capacity = tail.capacity;
        let data = if data.len() > capacity {
            tail.truncated = true;
            tail.bytes.clear();
            &data[data.len() - capacity..]
        } else {
            data
        };
        let overflow = (tail.bytes.len() + data.len()).saturating_sub(capacity);
        if overflow > 0 {
            tail.truncated = true;
            tail.bytes.drain(..overflow);
        }
        tail.bytes.extend(data);
    }

    /// Total bytes ever written, retained or not.
    pub fn written(&self) -> u64 {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).written
    }

    /// The retained bytes written after the first `from` bytes of the log (as much of them
    /// as is still retained).
    pub fn since(&self, from: u64) -> String {
        let tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let new = tail.written.saturating_sub(from).min(tail.bytes.len() as u64) as usize;
        let start = tail.bytes.len() - new;
        let bytes: Vec<u8> = tail.bytes.range(start..).copied().collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// The retained text and the truncation flag.
    pub fn snapshot(&self) -> LogSnapshot {
        let tail = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = tail.bytes.as_slices();
        let mut bytes = Vec::with_capacity(a.len() + b.len());
        bytes.extend_from_slice(a);
        bytes.extend_from_slice(b);
        LogSnapshot {
            text: String::from_utf8_lossy(&bytes).into_owned(),
            truncated: tail.truncated,
        }
    }
}

impl IsTerminal for TailLog {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for TailLog {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[async_trait::async_trait]
impl Pollable for TailLog {
    async fn ready(&mut self) {}
}

#[async_trait::async_trait]
impl OutputStream for TailLog {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        TailLog::write(self, &bytes);
        Ok(())
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        Ok(WRITE_PERMIT)
    }
}

impl tokio::io::AsyncWrite for TailLog {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        TailLog::write(&self, buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_tail_and_marks_truncation() {
        let log = TailLog::new(8);
        log.write(b"hello");
        assert_eq!(
            log.snapshot(),
            LogSnapshot {
                text: "hello".into(),
                truncated: false
            }
        );
        log.write(b" world");
        assert_eq!(
            log.snapshot(),
            LogSnapshot {
                text: "lo world".into(),
                truncated: true
            }
        );
        log.write(b"0123456789abc");
        assert_eq!(log.snapshot().text, "56789abc");
        assert_eq!(log.written(), 24);
    }

    #[test]
    fn since_returns_only_new_retained_bytes() {
        let log = TailLog::new(16);
        log.write(b"first\n");
        let mark = log.written();
        log.write(b"second\n");
        assert_eq!(log.since(mark), "second\n");
    }
}
