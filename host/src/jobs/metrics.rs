//! Counters and histograms the job service keeps for `/metrics` (Prometheus text).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use chrono::{DateTime, Utc};

use crate::store::JobStatus;

/// Upper bounds (seconds) of the latency histogram buckets.
const BUCKETS: [f64; 12] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.05, 0.25, 1.0, 10.0,
];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

impl Histogram {
    fn observe(&mut self, seconds: f64) {
        for (i, bound) in BUCKETS.iter().enumerate() {
            if seconds <= *bound {
                self.counts[i] += 1;
            }
        }
        self.count += 1;
        self.sum += seconds;
    }
}

/// The metrics.
#[derive(Default)]
pub struct Metrics {
    submitted: AtomicU64,
    cache_hits: AtomicU64,
    transitions: Mutex<BTreeMap<&'static str, u64>>,
    nodes: Mutex<BTreeMap<String, Histogram>>,
    jobs: Mutex<Histogram>,
    queue_wait: Mutex<Histogram>,
}

impl Metrics {
    /// A job was accepted.
    pub fn submitted(&self) {
        self.submitted.fetch_add(1, Ordering::Relaxed);
    }

    /// A node result came from the cache.
    pub fn cache_hit(&self) {
        self.cache_hits.fetch_add(1, Ordering::Relaxed);
    }

    /// A job moved to `status`.
    pub fn transition(&self, status: JobStatus) {
        *self
            .transitions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(status.as_str())
            .or_default() += 1;
    }

    /// A node call of `class` took `took`.
    pub fn node_call(&self, class: &str, took: Duration) {
        self.nodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(class.to_string())
            .or_default()
            .observe(took.as_secs_f64());
    }

    /// A job ran for `took`.
    pub fn job_finished(&self, took: Duration) {
        self.jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(took.as_secs_f64());
    }

    /// A job created at `created` started now.
    pub fn queue_wait(&self, created: DateTime<Utc>) {
        let waited = (Utc::now() - created).to_std().unwrap_or_default();
        self.queue_wait
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .observe(waited.as_secs_f64());
    }

    /// Mean seconds a job has taken to run, 0 before any ran.
    pub fn mean_job_seconds(&self) -> f64 {
        let h = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if h.count == 0 {
            0.0
        } else {
            h.sum / h.count as f64
        }
    }

    /// Submissions and status transitions so far: it stands still while the service is idle.
    pub fn activity(&self) -> u64 {
        let transitions: u64 = self
            .transitions
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .sum();
        self.submitted.load(Ordering::Relaxed) + transitions
    }

    /// Appends these metrics in Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP weft_jobs_submitted_total Jobs accepted.\n# TYPE weft_jobs_submitted_total counter"
        );
        let _ = writeln!(
            out,
            "weft_jobs_submitted_total {}",
            self.submitted.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP weft_node_cache_hits_total Node results served from the cache.\n# TYPE weft_node_cache_hits_total counter");
        let _ = writeln!(
            out,
            "weft_node_cache_hits_total {}",
            self.cache_hits.load(Ordering::Relaxed)
        );
        let _ = writeln!(out, "# HELP weft_job_transitions_total Status transitions, by new status.\n# TYPE weft_job_transitions_total counter");
        for (status, n) in self.transitions.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            let _ = writeln!(
                out,
                "weft_job_transitions_total{{status=\"{}\"}} {n}",
                label_value(status)
            );
        }
        let _ = writeln!(out, "# HELP weft_node_duration_seconds Node call latency, by class.\n# TYPE weft_node_duration_seconds histogram");
        for (class, h) in self.nodes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
            write_histogram(
                out,
                "weft_node_duration_seconds",
                &format!("class=\"{}\",", label_value(class)),
                h,
            );
        }
        let _ = writeln!(
            out,
            "# HELP weft_job_duration_seconds Job run time.\n# TYPE weft_job_duration_seconds histogram"
        );
        write_histogram(
            out,
            "weft_job_duration_seconds",
            "",
            &self.jobs.lock().unwrap_or_else(|e| e.into_inner()),
        );
        let _ = writeln!(
            out,
            "# HELP weft_queue_wait_seconds Time from submit to start.\n# TYPE weft_queue_wait_seconds histogram"
        );
        write_histogram(
            out,
            "weft_queue_wait_seconds",
            "",
            &self.queue_wait.lock().unwrap_or_else(|e| e.into_inner()),
        );
    }
}

/// `value` escaped for a label of the Prometheus text format: a backslash, a double quote
/// and a line feed are the three characters that would end the value or the line.
fn label_value(value: &str) -> std::borrow::Cow<'_, str> {
    if !value.contains(['\\', '"', '\n']) {
        return value.into();
    }
    let mut escaped = String::with_capacity(value.len() + 8);
    for c in value.chars() {
        match c {
            '\\' => escaped.push_str("\\\\"),
            '"' => escaped.push_str("\\\""),
            '\n' => escaped.push_str("\\n"),
            c => escaped.push(c),
        }
    }
    escaped.into()
}

fn write_histogram(out: &mut String, name: &str, labels: &str, h: &Histogram) {
    for (i, bound) in BUCKETS.iter().enumerate() {
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{bound}\"}} {}", h.counts[i]);
    }
    let _ = writeln!(out, "{name}_bucket{{{labels}le=\"+Inf\"}} {}", h.count);
    let trimmed = labels.trim_end_matches(',');
    let braces = if trimmed.is_empty() {
        String::new()
    } else {
        format!("{{{trimmed}}}")
    };
    let _ = writeln!(out, "{name}_sum{braces} {}", h.sum);
    let _ = writeln!(out, "{name}_count{braces} {}", h.count);
}

#[cfg(test)]
mod label_tests {
    use super::*;

    #[test]
    fn label_values_escape_what_would_end_the_value_or_the_line() {
        assert_eq!(label_value("KSampler"), "KSampler");
        assert_eq!(label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let metrics = Metrics::default();
        metrics.node_call("Evil\"} 1\nweft_fake 2", Duration::from_millis(1));
        let mut out = String::new();
        metrics.render(&mut out);
        assert!(!out.lines().any(|l| l.starts_with("weft_fake")), "{out}");
        assert!(out.contains("class=\"Evil\\\"} 1\\nweft_fake 2\""), "{out}");
    }
}
