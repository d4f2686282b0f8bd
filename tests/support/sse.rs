//! A blocking client of the job event stream (SSE) for the black-box tests.

use std::io::{BufRead, BufReader};

use serde_json::Value;

use super::Server;

/// One SSE frame: event name, id, data (parsed), or a comment.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    /// Event name (`message` when the frame names none).
    pub(crate) event: String,
    /// Its id, if it has one.
    pub(crate) id: Option<u64>,
    /// The data, parsed as JSON when it is JSON.
    pub(crate) data: Value,
    /// The comment text, for a comment frame.
    pub(crate) comment: Option<String>,
}

/// An open event stream of one job.
pub(crate) struct Sse {
    lines: std::io::Lines<BufReader<reqwest::blocking::Response>>,
}

impl Sse {
    /// Opens job `id`'s stream, resuming after `last_event_id` when given.
    pub(crate) fn open(server: &Server, id: &str, last_event_id: Option<u64>) -> Sse {
        let mut rb = server.request(reqwest::Method::GET, &format!("/api/v2/jobs/{id}/events"));
        if let Some(last) = last_event_id {
            rb = rb.header("Last-Event-ID", last.to_string());
        }
        let r = rb.send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
        assert!(r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Sse {
            lines: BufReader::new(r).lines(),
        }
    }

    /// The next frame (comments included), or None at the end of the stream.
    pub(crate) fn next_frame(&mut self) -> Option<Frame> {
        let mut frame = Frame {
            event: "message".into(),
            id: None,
            data: Value::Null,
            comment: None,
        };
        let mut data = String::new();
        let mut any = false;
        loop {
            let line = match self.lines.next() {
                Some(Ok(l)) => l,
                _ => return any.then_some(frame),
            };
            if line.is_empty() {
                if any {
                    frame.data = serde_json::from_str(&data).unwrap_or(Value::String(data));
                    return Some(frame);
                }
                continue;
            }
            any = true;
            if let Some(c) = line.strip_prefix(':') {
                frame.comment = Some(c.trim().to_string());
            } else if let Some(v) = line.strip_prefix("event:") {
                frame.event = v.trim().to_string();
            } else if let Some(v) = line.strip_prefix("id:") {
                frame.id = v.trim().parse().ok();
            } else if let Some(v) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(v.strip_prefix(' ').unwrap_or(v));
            }
        }
    }

    /// The next event that is not a comment.
    pub(crate) fn next_event(&mut self) -> Option<Frame> {
        loop {
            let f = self.next_frame()?;
            if f.comment.is_none() {
                return Some(f);
            }
        }
    }

    /// Every remaining event, until the stream ends.
    pub(crate) fn rest(&mut self) -> Vec<Frame> {
        std::iter::from_fn(|| self.next_event()).collect()
    }
}
