//! weft's own OpenAPI document, served at `/api/v2/openapi.json`. The route table below is
//! checked against the live router by the black-box tests, so the two cannot drift.

use serde_json::{json, Value as Json};

/// Every route of the job API, relative to the mount prefix: (method, path, summary, responses).
pub const ROUTES: &[(&str, &str, &str, &[u16])] = &[
    (
        "post",
        "/api/v2/jobs",
        "Submit a workflow",
        &[201, 400, 401, 402, 403, 413, 422, 429, 500],
    ),
    (
        "get",
        "/api/v2/jobs",
        "List the caller's jobs, newest first",
        &[200, 400, 401, 403, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}",
        "Read a job (the only route with logs)",
        &[200, 401, 403, 404, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}/workflow",
        "Read a job's workflow",
        &[200, 401, 403, 404, 500],
    ),
    (
        "post",
        "/api/v2/jobs/{id}/cancel",
        "Cancel a job (idempotent)",
        &[200, 401, 403, 404, 500],
    ),
    (
        "get",
        "/api/v2/jobs/{id}/events",
        "Server-sent events of a job",
        &[200, 401, 403, 404, 429, 500],
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
        &[201, 400, 401, 403, 404, 413, 422, 429, 500],
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
            "job_id": {"type": ["string", "null"]},
            "temporary": {"type": "boolean", "description": "A preview (PreviewImage, ComfyUI's temp folder). It goes with its job unless the server sets a shorter preview retention; url_expires_at is no later than its removal."}}},
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
        "JobList": {"type": "object", "required": ["jobs", "next_cursor"], "properties": {
            "jobs": {"type": "array", "items": {"$ref": "#/components/schemas/Job"}},
            "next_cursor": {"type": ["string", "null"]}}},
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

fn schema_ref(name: &str) -> Json {
    json!({"$ref": format!("#/components/schemas/{name}")})
}

/// What `method path` answers with status `code`.
fn response(method: &str, path: &str, code: u16) -> Json {
    let json_body =
        |schema: Json| json!({"description": "success", "content": {"application/json": {"schema": schema}}});
    if method == "head" {
        return json!({"description": if code < 400 { "the caller has the blob" } else { "no such blob for the caller" }});
    }
    if code >= 400 {
        return json!({"description": "error", "content": {"application/json": {"schema": schema_ref("ErrorEnvelope")}}});
    }
    match (method, path, code) {
        (_, _, 204) => json!({"description": "done, no content"}),
        ("get", "/api/v2/jobs/{id}/events", _) => event_stream(),
        ("get", "/api/v2/jobs", _) => json_body(schema_ref("JobList")),
        ("get", "/api/v2/jobs/{id}/workflow", _) => {
            json_body(json!({"type": "object", "required": ["workflow", "format"],
            "properties": {"workflow": {"type": "object"}, "format": {"type": "string"}}}))
        }
        (_, "/api/v2/jobs" | "/api/v2/jobs/{id}" | "/api/v2/jobs/{id}/cancel", _) => json_body(schema_ref("Job")),
        ("get", "/api/v2/assets/{id}/content", _) => {
            json!({"description": "the asset's bytes (206: the requested range)", "content": {"*/*": {"schema": {"type": "string", "format": "binary"}}}})
        }
        (_, p, _) if p.starts_with("/api/v2/assets") => json_body(schema_ref("Asset")),
        _ => json_body(json!({"type": "object"})),
    }
}

/// The path, query and header parameters of `method path`.
fn parameters(method: &str, path: &str) -> Vec<Json> {
    let mut parameters: Vec<Json> = path
        .split('/')
        .filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string", "minLength": 1}}))
        .collect();
    match (method, path) {
        ("get", "/api/v2/jobs") => parameters.extend([
            json!({"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1, "maximum": 100, "default": 20}}),
            json!({"name": "cursor", "in": "query", "description": "`next_cursor` of the previous page", "schema": {"type": "string", "pattern": "^(c[1-9][0-9]{0,17})?$"}}),
            json!({"name": "metadata", "in": "query", "style": "deepObject", "explode": true,
                   "description": "`metadata[key]=value`: only jobs with every given label",
                   "schema": {"type": "object", "additionalProperties": {"type": "string"}}}),
        ]),
        ("post", "/api/v2/jobs") => parameters.push(json!({"name": "Idempotency-Key", "in": "header",
            "description": "Single-use: a second request with the same key within 24 hours is refused",
            "schema": {"type": "string", "minLength": 1, "maxLength": 255}})),
        ("get", "/api/v2/assets/{id}/content") => parameters.extend([
            json!({"name": "Range", "in": "header", "schema": {"type": "string"}}),
            json!({"name": "expires", "in": "query", "description": "part of a signed link", "schema": {"type": "string"}}),
            json!({"name": "sig", "in": "query", "description": "part of a signed link", "schema": {"type": "string"}}),
        ]),
        _ => {}
    }
    parameters
}

/// The request body of `method path`, if it takes one.
fn request_body(method: &str, path: &str) -> Option<Json> {
    let json_body = |schema: Json| json!({"required": true, "content": {"application/json": {"schema": schema}}});
    match (method, path) {
        ("post", "/api/v2/jobs") => Some(json_body(json!({
        "type": "object", "required": ["workflow"],
        "properties": {
            "workflow": {"type": "object", "minProperties": 1, "description": "A workflow in ComfyUI's API format: node id -> {class_type, inputs}",
                "additionalProperties": {"type": "object", "required": ["class_type", "inputs"],
                    "properties": {"class_type": {"type": "string"}, "inputs": {"type": "object"}}}},
            "metadata": {"type": "object", "maxProperties": 16,
                "additionalProperties": {"type": "string", "maxLength": 256}},
            "extra_data": {"type": "object", "properties": {"api_key_platform_org": {"type": "string"}, "api_key_comfy_org": {"type": "string"}},
                "additionalProperties": false}
        }}))),
        ("post", "/api/v2/assets") => Some(json!({"required": true, "content": {"multipart/form-data": {"schema": {
        "type": "object", "required": ["file"],
        "description": "Parts with other names are ignored.",
        "propertyNames": {"pattern": "^[A-Za-z0-9_.-]{1,64}$"},
        "properties": {
            "file": {"type": "string", "format": "binary"},
            "file_path": {"type": "string", "description": "the asset's name; the file part's filename when absent"},
            "content_type": {"type": "string", "pattern": "^([!#$&^_.+0-9A-Za-z-]+/[!#$&^_.+0-9A-Za-z-]+( *;[ -~]*)?)?$", "maxLength": 255},
            "expected_hash": {"type": "string", "pattern": "^(blake3:[0-9a-f]{64})?$"},
            "tags": {"type": "string", "description": "a tag; repeat the part for more"},
            "expires_in": {"type": "integer", "minimum": 60, "maximum": 604800, "description": "seconds"}
        }}}}})),
        ("post", "/api/v2/assets/from-hash") => Some(json_body(json!({
        "type": "object", "required": ["hash"], "additionalProperties": false,
        "properties": {
            "hash": {"type": "string", "pattern": "^blake3:[0-9a-f]{64}$"},
            "file_path": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "expires_in": {"type": "integer", "minimum": 60, "maximum": 604800, "description": "seconds"}
        }}))),
        _ => None,
    }
}

/// The job event stream's response: its event names and the JSON `data` of each.
fn event_stream() -> Json {
    let schema = schema_ref;
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

/// The methods the job API serves at the request path `path` (under `mount_prefix`), as an
/// `Allow` header value (`GET, HEAD`); `None` for a path it does not serve.
pub fn allowed_methods(mount_prefix: &str, path: &str) -> Option<String> {
    let route = path.strip_prefix(mount_prefix.trim_end_matches('/'))?;
    let matches = |template: &str| {
        let (mut want, mut have) = (template.split('/'), route.split('/'));
        loop {
            match (want.next(), have.next()) {
                (None, None) => return true,
                (Some(w), Some(h)) if w.starts_with('{') => {
                    if h.is_empty() {
                        return false;
                    }
                }
                (Some(w), Some(h)) if w == h => {}
                _ => return false,
            }
        }
    };
    // A literal segment beats a parameter: `assets/from-hash` is not `assets/{id}`.
    let literals = |template: &str| template.split('/').filter(|s| !s.starts_with('{')).count();
    let matching: Vec<_> = ROUTES.iter().filter(|(_, template, _, _)| matches(template)).collect();
    let most_specific = matching.iter().map(|(_, t, _, _)| literals(t)).max()?;
    let mut methods: Vec<String> = matching
        .iter()
        .filter(|(_, template, _, _)| literals(template) == most_specific)
        .map(|(method, _, _, _)| method.to_ascii_uppercase())
        .collect();
    if methods.is_empty() {
        return None;
    }
    methods.dedup();
    Some(methods.join(", "))
}

/// The document, with paths under `mount_prefix`.
pub fn document(mount_prefix: &str) -> Json {
    let prefix = mount_prefix.trim_end_matches('/');
    let mut paths = serde_json::Map::new();
    for (method, path, summary, responses) in ROUTES {
        let entry = paths.entry(format!("{prefix}{path}")).or_insert_with(|| json!({}));
        let responses: serde_json::Map<String, Json> = responses
            .iter()
            .map(|code| (code.to_string(), response(method, path, *code)))
            .collect();
        let mut operation = json!({"summary": summary, "responses": responses, "security": [{"bearer": []}, {}]});
        let parameters = parameters(method, path);
        if !parameters.is_empty() {
            operation["parameters"] = Json::Array(parameters);
        }
        if let Some(body) = request_body(method, path) {
            operation["requestBody"] = body;
        }
        entry[*method] = operation;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "weft job API", "version": env!("CARGO_PKG_VERSION"),
                 "description": "The v2 job and asset API of weft, a workflow job server."},
        "paths": paths,
        "components": {"schemas": schemas(), "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
    })
}
