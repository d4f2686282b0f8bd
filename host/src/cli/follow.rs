//! Following a job to its end: its event stream with progress bars (overall, and the
//! current node's sampler steps), resumed with `Last-Event-ID` after a dropped connection,
//! and polling `GET /jobs/{id}` when the stream cannot be had.

use std::io::IsTerminal;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures::StreamExt;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value as Json;

use super::client::{exit, Connection, Failure};

/// Stream attempts in a row that may fail before falling back to polling.
const STREAM_ATTEMPTS: u32 = 5;
/// Poll attempts in a row that may fail before giving up on the server.
const POLL_ATTEMPTS: u32 = 30;

/// Whether a status is final.
pub(crate) fn is_terminal(status: &str) -> bool {
    matches!(status, "succeeded" | "failed" | "canceled" | "expired")
}

/// What the user sees while a job runs: two bars on a terminal; status lines on stderr
/// when stdout is not a terminal; nothing with `--json`.
pub(crate) struct Display {
    bars: Option<(MultiProgress, ProgressBar, ProgressBar)>,
    lines: bool,
    last_status: std::cell::RefCell<String>,
}

impl Display {
    /// Bars when stdout is a terminal and `json` is off.
    pub(crate) fn new(json: bool) -> Self {
        let bars = (!json && std::io::stdout().is_terminal()).then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr());
            let overall = multi.add(ProgressBar::new(1000));
            overall.set_style(
                ProgressStyle::with_template("{spinner} {prefix:>10} [{bar:32}] {percent:>3}% {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            overall.enable_steady_tick(Duration::from_millis(120));
            let steps = multi.add(ProgressBar::new(1));
            steps.set_style(
                ProgressStyle::with_template("  {prefix:>10} [{bar:32}] {pos}/{len} {msg}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
            );
            steps.set_prefix("steps");
            (multi, overall, steps)
        });
        Self {
            bars,
            lines: !json,
            last_status: Default::default(),
        }
    }

    /// Shows a status change.
    pub(crate) fn status(&self, job: &Json) {
        let status = job["status"].as_str().unwrap_or("?").to_string();
        if *self.last_status.borrow() == status {
            return;
        }
        *self.last_status.borrow_mut() = status.clone();
        match &self.bars {
            Some((_, overall, _)) => {
                overall.set_prefix(status.clone());
                if status == "succeeded" {
                    overall.set_position(1000);
                }
            }
            None if self.lines => eprintln!("job {} {status}", job["id"].as_str().unwrap_or("")),
            None => {}
        }
    }

    /// Shows a progress report.
    pub(crate) fn progress(&self, p: &Json) {
        let Some((_, overall, steps)) = &self.bars else {
            return;
        };
        let value = p["value"].as_f64().unwrap_or(0.0).clamp(0.0, 1.0);
        overall.set_position((value * 1000.0) as u64);
        let node = match (p["current_node"].as_str(), p["current_node_class"].as_str()) {
            (Some(id), Some(class)) => format!("node {id} {class}"),
            (Some(id), None) => format!("node {id}"),
            _ => String::new(),
        };
        overall.set_message(format!(
            "{}/{} nodes {node}",
            p["nodes_done"].as_u64().unwrap_or(0),
            p["nodes_total"].as_u64().unwrap_or(0)
        ));
        match (p["step"].as_u64(), p["steps"].as_u64()) {
            (Some(step), Some(total)) if total > 0 => {
                steps.set_length(total);
                steps.set_position(step.min(total));
                steps.set_message(p["current_node_class"].as_str().unwrap_or("").to_string());
            }
            _ => {
                steps.set_length(1);
                steps.set_position(0);
                steps.set_message("");
            }
        }
    }

    /// Prints `text` above the bars.
    pub(crate) fn note(&self, text: &str) {
        match &self.bars {
            Some((multi, _, _)) => {
                let _ = multi.println(text);
            }
            None if self.lines => eprintln!("{text}"),
            None => {}
        }
    }

    /// Runs `f` with the bars hidden (for a prompt).
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bars {
            Some((multi, _, _)) => multi.suspend(f),
            None => f(),
        }
    }

    /// Removes the bars.
    pub(crate) fn finish(&self) {
        if let Some((multi, overall, steps)) = &self.bars {
            overall.finish_and_clear();
            steps.finish_and_clear();
            let _ = multi.clear();
        }
    }
}

/// Follows job `id` until it ends; returns the job as `GET /jobs/{id}` renders it.
pub(crate) async fn follow(conn: &Connection, id: &str, display: &Display) -> Result<Json, Failure> {
    let mut last_event_id: Option<String> = None;
    let mut failures = 0u32;
    loop {
        match conn.events(id, last_event_id.as_deref()).await {
            Ok(response) => {
                let mut events = response.bytes_stream().eventsource();
                while let Some(event) = events.next().await {
                    let Ok(event) = event else { break };
                    failures = 0;
                    if !event.id.is_empty() {
                        last_event_id = Some(event.id.clone());
                    }
                    let data: Json = serde_json::from_str(&event.data).unwrap_or(Json::Null);
                    match event.event.as_str() {
                        "status" => {
                            display.status(&data);
                            if data["status"].as_str().is_some_and(is_terminal) {
                                // The stream's snapshot; the full job (logs included) is read once.
                                return conn.get(&format!("/jobs/{id}")).await.or(Ok(data));
                            }
                        }
                        "progress" => display.progress(&data),
                        "log" => {
                            if let Some(message) = data["message"].as_str() {
                                display.note(message.trim_end());
                            }
                        }
                        _ => {}
                    }
                }
            }
            Err(f) if f.code == exit::VALIDATION || f.code == exit::AUTH => return Err(f),
            Err(_) => {}
        }
        failures += 1;
        if failures >= STREAM_ATTEMPTS {
            display.note("the event stream is unavailable; polling the job instead");
            return poll(conn, id, display).await;
        }
        display.note("the event stream was interrupted; resuming");
        tokio::time::sleep(Duration::from_millis(300 * u64::from(failures))).await;
    }
}

/// Polls job `id` once a second until it ends.
pub(crate) async fn poll(conn: &Connection, id: &str, display: &Display) -> Result<Json, Failure> {
    let mut failures = 0u32;
    loop {
        match conn.get(&format!("/jobs/{id}")).await {
            Ok(job) => {
                failures = 0;
                display.status(&job);
                if !job["progress"].is_null() {
                    display.progress(&job["progress"]);
                }
                if job["status"].as_str().is_some_and(is_terminal) {
                    return Ok(job);
                }
            }
            Err(f) if !f.is_connection() => return Err(f),
            Err(f) => {
                failures += 1;
                if failures >= POLL_ATTEMPTS {
                    return Err(f);
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Follows job `id` like [`follow`]; Ctrl-C asks (on a terminal) whether to cancel the job:
/// yes cancels it and follows it to its end, no leaves it running and stops.
pub(crate) async fn follow_or_cancel(conn: &Connection, id: &str, display: &Display) -> Result<Json, Failure> {
    let following = follow(conn, id, display);
    tokio::pin!(following);
    let mut canceled = false;
    loop {
        tokio::select! {
            result = &mut following => return result,
            _ = tokio::signal::ctrl_c(), if !canceled => {
                let keep_running = || Failure::new(
                    exit::INTERRUPTED,
                    format!("interrupted; job {id} keeps running (follow it with `weft jobs watch {id}`)"),
                );
                if !std::io::stdin().is_terminal() {
                    display.finish();
                    return Err(keep_running());
                }
                let answer = display.suspend(|| {
                    eprint!("\nCancel job {id} on the server? [y/N] ");
                    let mut line = String::new();
                    let _ = std::io::stdin().read_line(&mut line);
                    line
                });
                if !matches!(answer.trim(), "y" | "Y" | "yes") {
                    display.finish();
                    return Err(keep_running());
                }
                conn.post(&format!("/jobs/{id}/cancel"), &Json::Null, None).await?;
                display.note(&format!("cancel requested for job {id}"));
                canceled = true;
            }
        }
    }
}
