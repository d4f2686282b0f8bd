//! weft's own OpenAPI document, served at `/api/v2/openapi.json`. The route table below is
//! checked against the live router by the black-box tests, so the two cannot drift.

use serde_json::{json, Value as Json};

/// Every route of the job API, relative to the mount prefix: (method, path, summary, responses).
pub const ROUTES: &[(&str, &str, &str, &[u16])] = &[
    (
        "post",
        "/api/v2/jobs",
        "Submit a workflow",
        &[201, 400, 401, 402, 403, 422, 429, 500],
    ),
    (
        "get",
        "/api/v2/jobs",
        "List the caller's jobs, newest first",
        &[200, 400, 401, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}",
        "Read a job (the only route with logs)",
        &[200, 401, 404, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}/workflow",
        "Read a job's workflow",
        &[200, 401, 404, 500],
    ),
    (
        "post",
        "/api/v2/jobs/{id}/cancel",
        "Cancel a job (idempotent)",
        &[200, 401, 404, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}/events",
        "Server-sent events of a job",
        &[200, 401, 404, 429, 500],
    ),
    (
        "post",
        "/api/v2/assets",
        "Upload an asset (multipart)",
        &[200, 201, 400, 401, 409, 413, 500],
    ),
    (
        "post",
        "/api/v2/assets/from-hash",
        "Make an asset over a blob the caller has",
        &[201, 400, 401, 404, 500],
    ),
    (
        "head",
        "/api/v2/assets/by-hash/{hash}",
        "Whether the caller has a blob",
        &[200, 404],
    ),
    (
        "get",
        "/api/v2/assets/{id}",
        "Read an asset record",
        &[200, 401, 404, 500],
    ),
    (
        "delete",
        "/api/v2/assets/{id}",
        "Delete an uploaded asset",
        &[204, 401, 404, 409, 500],
    ),
    (
        "get",
        "/api/v2/assets/{id}/content",
        "Download an asset (Range supported)",
        &[200, 206, 401, 404, 416, 500],
    ),
    (
        "get",
        "/api/v2/nodes",
        "The node catalogue, in ComfyUI's /object_info shape",
        &[200, 401, 429],
    ),
    ("get", "/api/v2/openapi.json", "This document", &[200]),
    (
        "post",
        "/api/v2/admin/drain",
        "Operator: stop accepting jobs",
        &[200, 401, 403],
    ),
];

fn schemas() -> Json {
    json!({
        "ErrorEnvelope": {"type": "object", "required": ["error"], "properties": {"error": {
            "type": "object", "required": ["code", "message"],
            "properties": {"code": {"type": "string"}, "message": {"type": "string"}, "details": {"type": ["object", "null"]}}}}},
        "Progress": {"type": "object", "required": ["value", "nodes_done", "nodes_total"], "properties": {
            "value": {"type": "number", "minimum": 0, "maximum": 1}, "nodes_done": {"type": "integer"}, "nodes_total": {"type": "integer"},
            "current_node": {"type": ["string", "null"]}, "current_node_class": {"type": ["string", "null"]},
            "step": {"type": ["integer", "null"]}, "steps": {"type": ["integer", "null"]}, "message": {"type": ["string", "null"]}}},
        "Output": {"type": "object", "required": ["node_id", "name", "type", "content_type", "size_bytes", "id", "hash", "url", "url_expires_at"], "properties": {
            "node_id": {"type": "string"}, "name": {"type": "string"},
            "type": {"type": "string", "enum": ["image", "video", "audio", "text", "file", "latent"]},
            "content_type": {"type": "string"}, "size_bytes": {"type": "integer", "format": "int64"}, "id": {"type": "string", "format": "uuid"},
            "hash": {"type": ["string", "null"]}, "url": {"type": "string"}, "url_expires_at": {"type": "string", "format": "date-time"},
            "job_id": {"type": ["string", "null"]}}},
        "JobError": {"type": "object", "required": ["code", "message"], "properties": {
            "code": {"type": "string"}, "message": {"type": "string"}, "node_id": {"type": ["string", "null"]},
            "class_type": {"type": ["string", "null"]}, "traceback": {"type": ["string", "null"]}}},
        "JobLogs": {"type": "object", "required": ["text", "truncated", "captured_at"], "properties": {
            "text": {"type": "string"}, "truncated": {"type": "boolean"}, "captured_at": {"type": "string", "format": "date-time"}}},
        "Job": {"type": "object",
            "required": ["id", "status", "created_at", "started_at", "completed_at", "expires_at", "queue_position", "progress", "outputs", "error", "urls"],
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "status": {"type": "string", "enum": ["queued", "running", "succeeded", "canceling", "canceled", "failed", "expired"]},
                "created_at": {"type": "string", "format": "date-time"}, "started_at": {"type": ["string", "null"]},
                "completed_at": {"type": ["string", "null"]}, "expires_at": {"type": "string", "format": "date-time"},
                "queue_position": {"type": ["integer", "null"]}, "progress": {"oneOf": [{"$ref": "#/components/schemas/Progress"}, {"type": "null"}]},
                "outputs": {"type": "array", "items": {"$ref": "#/components/schemas/Output"}},
                "error": {"oneOf": [{"$ref": "#/components/schemas/JobError"}, {"type": "null"}]},
                "urls": {"type": "object", "required": ["self", "events", "cancel"], "properties": {
                    "self": {"type": "string"}, "events": {"type": "string"}, "cancel": {"type": "string"}}},
                "logs": {"$ref": "#/components/schemas/JobLogs"},
                "metrics": {"type": "object", "additionalProperties": {"type": ["integer", "null"]}}}},
        "PreviewEvent": {"type": "object", "required": ["node_id", "content_type", "data_base64"], "properties": {
            "node_id": {"type": "string"}, "content_type": {"type": "string", "examples": ["image/png"]},
            "data_base64": {"type": "string", "contentEncoding": "base64"}}},
        "LogEvent": {"type": "object", "required": ["level", "message"], "properties": {
            "level": {"type": "string", "enum": ["info", "warning", "error"]}, "message": {"type": "string"}}},
        "Asset": {"type": "object", "required": ["id", "hash", "size_bytes", "content_type"], "properties": {
            "id": {"type": "string"}, "hash": {"type": ["string", "null"]}, "size_bytes": {"type": "integer"}, "content_type": {"type": "string"},
            "file_path": {"type": "string"}, "created_new": {"type": "boolean"}, "created_at": {"type": "string"}, "url": {"type": "string"},
            "url_expires_at": {"type": "string"}, "expires_at": {"type": ["string", "null"]}, "job_id": {"type": ["string", "null"]}}},
    })
}

/// The job event stream's response: its event names and the JSON `data` of each.
fn event_stream() -> Json {
    let schema = |name: &str| json!({"$ref": format!("#/components/schemas/{name}")});
    json!({
        "description": "A server-sent event stream. On connect: the job's `status`, its latest `progress` and, while a sampler runs, its latest `preview`; then live events, each with an `id` that `Last-Event-ID` resumes after. It ends after the terminal `status` event. Clients skip event names they do not know.",
        "content": {"text/event-stream": {
            "schema": {"type": "string"},
            "x-events": {
                "status": {"description": "Every status transition: the job without `logs`, with `queue_position`.", "schema": schema("Job")},
                "progress": {"description": "A progress snapshot, at most about two a second.", "schema": schema("Progress")},
                "preview": {"description": "A small image of what a running node is making: a sampler's current latent mapped to RGB, 1/8 of the image size, at most about two a second.", "schema": schema("PreviewEvent")},
                "output": {"description": "An output, as it is committed.", "schema": schema("Output")},
                "log": {"description": "What a node wrote to stdout and stderr during its call (the newest bytes, within the job's log size).", "schema": schema("LogEvent")}
            }
        }}
    })
}

/// The document, with paths under `mount_prefix`.
pub fn document(mount_prefix: &str) -> Json {
    let prefix = mount_prefix.trim_end_matches('/');
    let mut paths = serde_json::Map::new();
    for (method, path, summary, responses) in ROUTES {
        let entry = paths.entry(format!("{prefix}{path}")).or_insert_with(|| json!({}));
        let responses: serde_json::Map<String, Json> = responses
            .iter()
            .map(|code| {
                let body = if *code >= 400 {
                    json!({"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}})
                } else if path.ends_with("/events") {
                    event_stream()
                } else {
                    json!({"description": "success"})
                };
                (code.to_string(), body)
            })
            .collect();
        entry[*method] = json!({"summary": summary, "responses": responses, "security": [{"bearer": []}, {}]});
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "weft job API", "version": env!("CARGO_PKG_VERSION"),
                 "description": "The v2 job and asset API of weft, a workflow job server."},
        "paths": paths,
        "components": {"schemas": schemas(), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    })
}
