//! The dashboard's pages, rendered on the server from the same records the job API reads.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde_json::Value as Json;
use warp::http::StatusCode;

use super::html::{self, esc};
use crate::api::session::SessionInfo;
use crate::api::{render, AppState, AuthMode};
use crate::jobs::{JobRecord, JobStatus};

/// Jobs on one page of the list.
const PAGE_SIZE: usize = 50;

/// A dashboard page.
pub(super) enum Page {
    /// `/`: the jobs list.
    Jobs,
    /// `/ui/jobs/{id}`.
    Job(String),
    /// `/ui/submit`.
    Submit,
    /// `/ui/nodes`.
    Nodes,
    /// `/ui/operator`.
    Operator,
    /// `/ui/feed`: the list's live stream.
    Feed,
}

impl Page {
    /// The page at `path`, if any.
    pub(super) fn parse(path: &str) -> Option<Page> {
        match path {
            "/" | "/ui" | "/ui/" | "/ui/jobs" => Some(Page::Jobs),
            "/ui/submit" => Some(Page::Submit),
            "/ui/nodes" => Some(Page::Nodes),
            "/ui/operator" => Some(Page::Operator),
            "/ui/feed" => Some(Page::Feed),
            _ => {
                let id = path.strip_prefix("/ui/jobs/")?;
                (!id.is_empty()
                    && id.len() <= 128
                    && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .then(|| Page::Job(id.to_string()))
            }
        }
    }
}

fn time(t: chrono::DateTime<chrono::Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// Renders `page` for `viewer`.
pub(super) async fn render(state: &AppState, viewer: &SessionInfo, page: Page, query: &str) -> warp::reply::Response {
    let logout = state.config.auth != AuthMode::None;
    let api = state.links.api("");
    let (status, title, name, body) = match page {
        Page::Jobs => match jobs_page(state, viewer, query).await {
            Ok(body) => (StatusCode::OK, "Jobs".to_string(), "jobs", body),
            Err((status, message)) => (status, "Jobs".into(), "jobs", message_body(&message)),
        },
        Page::Job(id) => match job_page(state, viewer, &id).await {
            Ok(body) => (StatusCode::OK, format!("Job {id}"), "job", body),
            Err((status, message)) => (status, "Job".into(), "job", message_body(&message)),
        },
        Page::Submit => (StatusCode::OK, "Submit".into(), "submit", submit_page()),
        Page::Nodes => match nodes_page(state) {
            Ok(body) => (StatusCode::OK, "Nodes".into(), "nodes", body),
            Err((status, message)) => (status, "Nodes".into(), "nodes", message_body(&message)),
        },
        Page::Operator => match operator_page(state, viewer).await {
            Ok(body) => (StatusCode::OK, "Operators".into(), "operator", body),
            Err((status, message)) => (status, "Operators".into(), "operator", message_body(&message)),
        },
        Page::Feed => (
            StatusCode::NOT_FOUND,
            "Not found".into(),
            "error",
            message_body("not a page"),
        ),
    };
    html::response(status, html::page(&title, name, &api, logout, &body))
}

type PageError = (StatusCode, String);

fn message_body(message: &str) -> String {
    format!("<p class=\"error\" id=\"page-error\">{}</p>", esc(message))
}

fn not_ready() -> PageError {
    (
        StatusCode::SERVICE_UNAVAILABLE,
        "The server is still loading its plugins; try again in a moment.".into(),
    )
}

fn store_error(e: impl std::fmt::Display) -> PageError {
    tracing::error!(error = %e, "dashboard read");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        "The job store could not be read.".into(),
    )
}

/// The list's filters, from the query string.
struct Filters {
    status: Option<JobStatus>,
    labels: BTreeMap<String, String>,
    label_text: String,
    before: Option<i64>,
}

fn filters(query: &str) -> Result<Filters, PageError> {
    let mut f = Filters {
        status: None,
        labels: BTreeMap::new(),
        label_text: String::new(),
        before: None,
    };
    for (name, value) in url::form_urlencoded::parse(query.as_bytes()) {
        match name.as_ref() {
            "status" if !value.is_empty() => {
                f.status = Some(
                    JobStatus::parse(&value).ok_or((StatusCode::BAD_REQUEST, format!("unknown status {value:?}")))?,
                );
            }
            "label" if !value.trim().is_empty() => {
                f.label_text = value.trim().to_string();
                for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                    let (k, v) = pair.split_once('=').ok_or((
                        StatusCode::BAD_REQUEST,
                        format!("label filter {pair:?} is not key=value"),
                    ))?;
                    f.labels.insert(k.trim().to_string(), v.trim().to_string());
                }
                if f.labels.len() > 16 {
                    return Err((StatusCode::BAD_REQUEST, "at most 16 label filters".into()));
                }
            }
            "cursor" if !value.is_empty() => {
                f.before = Some(
                    value
                        .strip_prefix('c')
                        .and_then(|n| n.parse().ok())
                        .ok_or((StatusCode::BAD_REQUEST, "the cursor is not one this page issued".into()))?,
                );
            }
            _ => {}
        }
    }
    Ok(f)
}

fn status_badge(status: JobStatus) -> String {
    format!(
        "<span class=\"status status-{0}\" data-status=\"{0}\">{0}</span>",
        status.as_str()
    )
}

fn duration_ms(job: &JobRecord) -> Option<i64> {
    let start = job.started_at?;
    let end = job.completed_at.unwrap_or_else(chrono::Utc::now);
    Some((end - start).num_milliseconds().max(0))
}

fn job_row(job: &JobRecord) -> String {
    let progress = job.progress.as_ref();
    let value = progress.map_or(0.0, |p| p.value);
    let class = progress.and_then(|p| p.current_node_class.as_deref()).unwrap_or("");
    let labels: Vec<String> = job.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!(
        "<tr data-job=\"{id}\" data-created=\"{created}\" data-started=\"{started}\" data-completed=\"{completed}\">\
         <td><a href=\"/ui/jobs/{id}\">{id}</a></td><td class=\"col-status\">{badge}</td>\
         <td><progress max=\"1\" value=\"{value}\"></progress></td><td class=\"col-node\">{class}</td>\
         <td class=\"col-age\"></td><td class=\"col-duration\">{duration}</td><td class=\"col-labels\">{labels}</td></tr>",
        id = esc(&job.id),
        created = time(job.created_at),
        started = job.started_at.map(time).unwrap_or_default(),
        completed = job.completed_at.map(time).unwrap_or_default(),
        badge = status_badge(job.status),
        class = esc(class),
        duration = duration_ms(job).map(|ms| format!("{:.1} s", ms as f64 / 1000.0)).unwrap_or_default(),
        labels = esc(&labels.join(", ")),
    )
}

async fn jobs_page(state: &AppState, viewer: &SessionInfo, query: &str) -> Result<String, PageError> {
    let jobs = state.jobs().map_err(|_| not_ready())?;
    let f = filters(query)?;
    let page = jobs
        .list(&viewer.tenant, PAGE_SIZE, f.before, &f.labels, f.status)
        .await
        .map_err(store_error)?;
    let mut body = String::new();
    body.push_str(
        "<p class=\"hint\">To edit workflows in ComfyUI's own editor, start the server with \
         <code>weft serve --comfyui-frontend DIR</code> (a built ComfyUI frontend).</p>",
    );
    let _ = write!(
        body,
        "<h1>Jobs</h1><form method=\"get\" action=\"/\" class=\"filters\"><label>Status <select name=\"status\" id=\"filter-status\"><option value=\"\">any</option>"
    );
    for s in JobStatus::ALL {
        let selected = if f.status == Some(s) { " selected" } else { "" };
        let _ = write!(body, "<option value=\"{0}\"{selected}>{0}</option>", s.as_str());
    }
    let _ = write!(
        body,
        "</select></label><label>Labels <input name=\"label\" id=\"filter-label\" placeholder=\"key=value, ...\" value=\"{}\"></label>\
         <button type=\"submit\">Filter</button></form>",
        esc(&f.label_text)
    );
    let live = f.before.is_none();
    let _ = write!(
        body,
        "<table class=\"jobs\" id=\"jobs\" data-live=\"{live}\" data-filter-status=\"{}\" data-filter-labels=\"{}\">\
         <thead><tr><th>Job</th><th>Status</th><th>Progress</th><th>Node</th><th>Age</th><th>Duration</th><th>Labels</th></tr></thead><tbody>",
        f.status.map_or("", |s| s.as_str()),
        esc(&serde_json::to_string(&f.labels).unwrap_or_default()),
    );
    for job in &page.jobs {
        body.push_str(&job_row(job));
    }
    body.push_str("</tbody></table>");
    if page.jobs.is_empty() {
        body.push_str("<p id=\"no-jobs\">No jobs yet. <a href=\"/ui/submit\">Submit one.</a></p>");
    }
    if let Some(next) = page.next {
        let mut query = url::form_urlencoded::Serializer::new(String::new());
        if let Some(s) = f.status {
            query.append_pair("status", s.as_str());
        }
        if !f.label_text.is_empty() {
            query.append_pair("label", &f.label_text);
        }
        query.append_pair("cursor", &format!("c{next}"));
        let _ = write!(
            body,
            "<p><a id=\"older\" href=\"/?{}\">Older jobs →</a></p>",
            esc(&query.finish())
        );
    }
    Ok(body)
}

/// A node's duration for people: milliseconds under a second, else seconds.
fn duration_text(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else {
        format!("{:.2} s", ms as f64 / 1000.0)
    }
}

/// A workflow input value for people: links as `← node N output K`, literals as JSON.
fn input_text(value: &Json) -> String {
    match value {
        Json::Array(a) if a.len() == 2 && a[0].is_string() && a[1].is_u64() => {
            format!("← node {} output {}", a[0].as_str().unwrap_or(""), a[1])
        }
        Json::String(s) => s.clone(),
        other => other.to_string(),
    }
}

async fn job_page(state: &AppState, viewer: &SessionInfo, id: &str) -> Result<String, PageError> {
    let jobs = state.jobs().map_err(|_| not_ready())?;
    let view = jobs.get(&viewer.tenant, id).await.map_err(store_error)?.ok_or((
        StatusCode::NOT_FOUND,
        "There is no such job (or it is not yours).".to_string(),
    ))?;
    let workflow = state
        .store
        .job_workflow(id)
        .await
        .map_err(store_error)?
        .unwrap_or_default();
    let job = &view.job;
    let shows_logs = state.config.surface == crate::api::Surface::Serverless && !state.config.public_demo;
    let rendered = render::job(&state.links, &view, shows_logs);
    let mut body = String::new();
    let _ = write!(
        body,
        "<h1>Job <code>{id}</code> <span id=\"job-status\">{badge}</span></h1><div class=\"job\" id=\"job\" data-id=\"{id}\" data-events=\"{events}\" data-cancel=\"{cancel}\">",
        id = esc(&job.id),
        badge = status_badge(job.status),
        events = esc(&state.links.api(&format!("/jobs/{}/events", job.id))),
        cancel = esc(&state.links.api(&format!("/jobs/{}/cancel", job.id))),
    );
    let cancel_hidden = if job.status.is_terminal() { " hidden" } else { "" };
    let _ = write!(
        body,
        "<p><button id=\"cancel\" type=\"button\"{cancel_hidden}>Cancel</button></p>"
    );
    let p = job.progress.as_ref();
    let _ = write!(
        body,
        "<section><h2>Progress</h2><p>Overall <progress id=\"overall\" max=\"1\" value=\"{}\"></progress> \
         <span id=\"progress-text\">{}</span></p><p>Steps <progress id=\"steps\" max=\"{}\" value=\"{}\"></progress> \
         <span id=\"steps-text\"></span></p><img id=\"preview\" alt=\"latent preview\" hidden></section>",
        p.map_or(0.0, |p| p.value),
        esc(&p.and_then(|p| p.message.clone()).unwrap_or_default()),
        p.and_then(|p| p.steps).unwrap_or(1),
        p.and_then(|p| p.step).unwrap_or(0),
    );
    // The workflow as a node list, in node-id order.
    let mut nodes: Vec<(&String, &Json)> = workflow.as_object().map(|o| o.iter().collect()).unwrap_or_default();
    nodes.sort_by(|a, b| match (a.0.parse::<u64>(), b.0.parse::<u64>()) {
        (Ok(x), Ok(y)) => x.cmp(&y),
        _ => a.0.cmp(b.0),
    });
    body.push_str("<section><h2>Nodes</h2><table id=\"nodes\"><thead><tr><th>Node</th><th>Class</th><th>Inputs</th><th>State</th><th>Time</th></tr></thead><tbody>");
    for (node_id, node) in nodes {
        let class = node.get("class_type").and_then(Json::as_str).unwrap_or("?");
        let mut inputs = String::new();
        if let Some(map) = node.get("inputs").and_then(Json::as_object) {
            for (name, value) in map {
                let text: String = input_text(value).chars().take(500).collect();
                let _ = write!(inputs, "<div><b>{}</b>: {}</div>", esc(name), esc(&text));
            }
        }
        // What the server recorded of the node, once the job ended.
        let failed = job.error.as_ref().and_then(|e| e.node_id.as_deref()) == Some(node_id.as_str());
        let (state, time) = match job.node_times.iter().find(|t| &t.node_id == node_id) {
            Some(t) => (
                if failed {
                    "failed"
                } else if t.cached {
                    "cached"
                } else {
                    "done"
                },
                duration_text(t.duration_ms),
            ),
            None => ("", String::new()),
        };
        let _ = write!(
            body,
            "<tr data-node=\"{0}\"><td>{0}</td><td>{1}</td><td>{inputs}</td><td class=\"node-state\">{state}</td><td class=\"node-time\">{time}</td></tr>",
            esc(node_id),
            esc(class)
        );
    }
    body.push_str("</tbody></table></section>");
    let _ = write!(
        body,
        "<section><h2>Timings</h2><p id=\"timings\" data-queue-ms=\"{}\" data-execution-ms=\"{}\"></p></section>",
        rendered["metrics"]["queue_ms"]
            .as_i64()
            .map(|v| v.to_string())
            .unwrap_or_default(),
        rendered["metrics"]["execution_ms"]
            .as_i64()
            .map(|v| v.to_string())
            .unwrap_or_default(),
    );
    body.push_str("<section><h2>Outputs</h2><div id=\"outputs\"></div></section>");
    body.push_str("<section><h2>Error</h2><div id=\"error\"></div></section>");
    let logs = job
        .logs
        .as_ref()
        .filter(|_| shows_logs)
        .map(|l| l.text.as_str())
        .unwrap_or("");
    let _ = write!(
        body,
        "<section><h2>Log</h2><pre id=\"logs\">{}</pre></section>",
        esc(logs)
    );
    // The job as the API renders it, for the script to fill the outputs, error and timings
    // (a JSON document in a data attribute: escaped like any attribute, never executed).
    let _ = write!(
        body,
        "<div id=\"job-data\" hidden data-job=\"{}\"></div></div>",
        esc(&rendered.to_string())
    );
    Ok(body)
}

fn submit_page() -> String {
    "<h1>Submit a workflow</h1>\
     <p class=\"hint\">Paste or drop a ComfyUI API-format workflow (<i>Export (API)</i>). Its literal inputs \
     become a form below.</p>\
     <textarea id=\"workflow\" rows=\"14\" spellcheck=\"false\" placeholder=\"{&quot;1&quot;: {&quot;class_type&quot;: ...}}\"></textarea>\
     <p><button type=\"button\" id=\"load\">Build the form</button></p>\
     <div id=\"form\"></div>\
     <p><label>Labels <input id=\"labels\" placeholder=\"key=value, ...\"></label></p>\
     <section><h2>Assets</h2><p><input type=\"file\" id=\"asset-file\"> <button type=\"button\" id=\"upload\">Upload</button></p>\
     <ul id=\"assets\"></ul></section>\
     <p><button type=\"button\" id=\"queue\" class=\"primary\">Queue</button></p>\
     <div id=\"submit-error\" class=\"error\"></div>"
        .into()
}

fn nodes_page(state: &AppState) -> Result<String, PageError> {
    let jobs = state.jobs().map_err(|_| not_ready())?;
    let runtime = jobs.runtime();
    let catalog = runtime.catalog();
    let mut body = String::from(
        "<h1>Nodes</h1><p><input id=\"node-search\" type=\"search\" placeholder=\"Search classes, categories, inputs\"></p><div id=\"node-list\">",
    );
    for def in catalog.iter() {
        let mut search = format!("{} {} {}", def.class_type, def.display_name, def.category);
        let mut rows = String::new();
        for input in &def.inputs {
            search.push(' ');
            search.push_str(&input.name);
            let range = if input.is_combo() {
                input.options.iter().take(50).cloned().collect::<Vec<_>>().join(", ")
            } else {
                match (input.min, input.max) {
                    (Some(a), Some(b)) => format!("{a} … {b}"),
                    (Some(a), None) => format!("≥ {a}"),
                    (None, Some(b)) => format!("≤ {b}"),
                    _ => String::new(),
                }
            };
            let _ = write!(
                rows,
                "<tr><td title=\"{}\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(input.tooltip.as_deref().unwrap_or("")),
                esc(&input.name),
                esc(&input.type_name),
                if input.required { "yes" } else { "no" },
                esc(&input.default.as_ref().map(|d| d.to_string()).unwrap_or_default()),
                esc(&range),
            );
        }
        let outputs: Vec<&str> = def.outputs.iter().map(|o| o.type_name.as_str()).collect();
        let _ = write!(
            body,
            "<article class=\"node\" data-class=\"{class}\" data-search=\"{search}\"><h2>{class} <small>{category}</small></h2>\
             <p>{description}</p><table><thead><tr><th>Input</th><th>Type</th><th>Required</th><th>Default</th>\
             <th>Range / choices</th></tr></thead><tbody>{rows}</tbody></table><p>Outputs: {outputs}{flag}</p></article>",
            class = esc(&def.class_type),
            search = esc(&search.to_lowercase()),
            category = esc(&def.category),
            description = esc(&def.description),
            outputs = esc(&outputs.join(", ")),
            flag = if def.output_node { " (output node)" } else { "" },
        );
    }
    body.push_str("</div>");
    Ok(body)
}

/// One sample of the Prometheus text: name, labels, value.
fn samples(text: &str) -> Vec<(String, String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            let (name, labels) = match key.split_once('{') {
                Some((n, rest)) => (n.to_string(), rest.trim_end_matches('}').to_string()),
                None => (key.to_string(), String::new()),
            };
            Some((name, labels, value.to_string()))
        })
        .collect()
}

async fn operator_page(state: &AppState, viewer: &SessionInfo) -> Result<String, PageError> {
    if !viewer.operator {
        return Err((
            StatusCode::FORBIDDEN,
            "The operator page counts every tenant's work: log in with the operator token (--admin-token).".into(),
        ));
    }
    let jobs = state.jobs().map_err(|_| not_ready())?;
    let text = crate::api::operator::metrics_text(state)
        .await
        .map_err(|_| store_error("metrics"))?;
    let samples = samples(&text);
    let find = |name: &str, labels: &str| {
        samples
            .iter()
            .find(|(n, l, _)| n == name && l == labels)
            .map_or("0".to_string(), |(_, _, v)| v.clone())
    };
    let runtime = jobs.runtime();
    let mut body = String::from("<h1>Operators</h1><dl class=\"figures\" id=\"figures\">");
    for (label, value, id) in [
        ("Queue depth", find("weft_queue_depth", ""), "queue-depth"),
        ("Queue capacity", find("weft_queue_capacity", ""), "queue-capacity"),
        ("Running jobs", find("weft_jobs", "status=\"running\""), "running"),
        ("Jobs submitted", find("weft_jobs_submitted_total", ""), "submitted"),
        ("Jobs finished", find("weft_job_duration_seconds_count", ""), "finished"),
        ("Workers", jobs.config().workers.to_string(), "workers"),
        ("Open event streams", find("weft_sse_streams", ""), "streams"),
    ] {
        let _ = write!(body, "<dt>{label}</dt><dd id=\"{id}\">{}</dd>", esc(&value));
    }
    body.push_str("<dt>Throughput</dt><dd id=\"throughput\" data-finished=\"\">measuring…</dd></dl>");
    body.push_str("<h2>Plugins</h2><ul id=\"plugins\">");
    for (name, origin) in runtime.plugins() {
        let _ = write!(body, "<li>{} <small>({})</small></li>", esc(name), esc(origin));
    }
    for refused in runtime.refused() {
        let _ = write!(
            body,
            "<li class=\"error\">{} (refused: {})</li>",
            esc(&refused.name),
            esc(&refused.reason)
        );
    }
    body.push_str("</ul><h2>Metrics</h2><table id=\"metrics\"><thead><tr><th>Metric</th><th>Labels</th><th>Value</th></tr></thead><tbody>");
    for (name, labels, value) in &samples {
        let _ = write!(
            body,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(name),
            esc(labels),
            esc(value)
        );
    }
    body.push_str("</tbody></table>");
    Ok(body)
}
