//! The graph engine, by rule: validation at submit (every reason, all errors in one answer),
//! execution (only what outputs need, failures, handles), caching and progress.

mod support;

use serde_json::{json, Value};
use support::{error_code, Options, Server};

fn submit_err(server: &Server, workflow: Value) -> (u16, Value) {
    let r = server.post("/api/v2/jobs", &json!({"workflow": workflow}));
    (r.status().as_u16(), r.json().unwrap())
}

/// The reasons reported for node `id`.
fn reasons(body: &Value, id: &str) -> Vec<String> {
    body["error"]["details"]["node_errors"][id]
        .as_array()
        .map(|a| a.iter().map(|e| e["reason"].as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

fn save(text_from: &str) -> Value {
    json!({"class_type": "SaveText", "inputs": {"text": [text_from, 0], "filename_prefix": "t"}})
}

#[test]
fn an_unknown_class_is_reported_with_the_nearest_known_name() {
    let server = Server::start();
    let (status, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "StringConcatnate", "inputs": {}},
            "2": save("1"),
        }),
    );
    assert_eq!(status, 422);
    assert_eq!(error_code(&body), "invalid_workflow");
    assert_eq!(reasons(&body, "1"), ["unknown_class"]);
    let entry = &body["error"]["details"]["node_errors"]["1"][0];
    assert_eq!(entry["field"], "class_type");
    assert!(
        entry["message"].as_str().unwrap().contains("StringConcatenate"),
        "{entry}"
    );
}

#[test]
fn a_missing_required_input_is_missing_input() {
    let server = Server::start();
    let (status, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "StringConcatenate", "inputs": {"string_a": "a", "delimiter": ""}},
            "2": save("1"),
        }),
    );
    assert_eq!(status, 422);
    assert_eq!(reasons(&body, "1"), ["missing_input"]);
    assert_eq!(body["error"]["details"]["node_errors"]["1"][0]["field"], "string_b");
}

#[test]
fn links_to_absent_nodes_or_outputs_are_bad_linked_input() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}},
            "2": {"class_type": "StringConcatenate", "inputs": {"string_a": ["9", 0], "string_b": ["1", 3], "delimiter": ""}},
            "3": save("2"),
        }),
    );
    assert_eq!(reasons(&body, "2"), ["bad_linked_input", "bad_linked_input"]);
}

#[test]
fn a_linked_output_of_the_wrong_type_is_return_type_mismatch() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
            "2": {"class_type": "StringLength", "inputs": {"string": ["1", 0]}},
            "3": {"class_type": "PreviewAny", "inputs": {"source": ["2", 0]}},
        }),
    );
    assert_eq!(reasons(&body, "2"), ["return_type_mismatch"]);
    let message = body["error"]["details"]["node_errors"]["2"][0]["message"]
        .as_str()
        .unwrap();
    assert!(message.contains("STRING") && message.contains("IMAGE"), "{message}");
}

#[test]
fn a_literal_of_the_wrong_type_is_invalid_input_type() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "PrimitiveInt", "inputs": {"value": "seven"}},
            "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
            "3": {"class_type": "ImageInvert", "inputs": {"image": "not a link"}},
            "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}},
        }),
    );
    assert_eq!(reasons(&body, "1"), ["invalid_input_type"]);
    assert_eq!(reasons(&body, "3"), ["invalid_input_type"]);
}

#[test]
fn values_outside_min_and_max_are_reported() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": 0, "height": 99999999, "batch_size": 1, "color": 0}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}},
        }),
    );
    assert_eq!(reasons(&body, "1"), ["value_smaller_than_min", "value_bigger_than_max"]);
}

#[test]
fn a_combo_value_not_in_its_list_is_value_not_in_list() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "CaseConverter", "inputs": {"string": "x", "mode": "SHOUTING"}},
            "2": save("1"),
        }),
    );
    assert_eq!(reasons(&body, "1"), ["value_not_in_list"]);
    assert!(body["error"]["details"]["node_errors"]["1"][0]["message"]
        .as_str()
        .unwrap()
        .contains("UPPERCASE"));
}

#[test]
fn a_cycle_names_every_node_on_it() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "StringConcatenate", "inputs": {"string_a": ["3", 0], "string_b": "b", "delimiter": ""}},
            "2": {"class_type": "StringConcatenate", "inputs": {"string_a": ["1", 0], "string_b": "b", "delimiter": ""}},
            "3": {"class_type": "StringConcatenate", "inputs": {"string_a": ["2", 0], "string_b": "b", "delimiter": ""}},
            "4": save("3"),
        }),
    );
    for id in ["1", "2", "3"] {
        assert_eq!(reasons(&body, id), ["dependency_cycle"], "{body}");
    }
    assert!(reasons(&body, "4").is_empty());
}

#[test]
fn a_workflow_without_an_output_node_is_rejected() {
    let server = Server::start();
    let (status, body) = submit_err(
        &server,
        json!({"1": {"class_type": "PrimitiveString", "inputs": {"value": "x"}}}),
    );
    assert_eq!(status, 422);
    assert_eq!(error_code(&body), "invalid_workflow");
    assert_eq!(body["error"]["details"]["errors"][0]["reason"], "prompt_no_outputs");
}

#[test]
fn a_workflow_that_is_not_an_object_is_invalid() {
    let server = Server::start();
    for workflow in [json!([1, 2]), json!("text"), json!(null)] {
        let (status, body) = submit_err(&server, workflow);
        assert_eq!(status, 422, "{body}");
        assert_eq!(error_code(&body), "invalid_workflow");
    }
}

#[test]
fn every_error_is_reported_in_one_answer() {
    let server = Server::start();
    let (_, body) = submit_err(
        &server,
        json!({
            "1": {"class_type": "Nope", "inputs": {}},
            "2": {"class_type": "CaseConverter", "inputs": {"string": 5, "mode": "bad"}},
            "3": {"class_type": "EmptyImage", "inputs": {"width": -1, "height": 8, "batch_size": 1}},
            "4": save("2"),
            "5": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "x"}},
        }),
    );
    assert_eq!(reasons(&body, "1"), ["unknown_class"]);
    assert_eq!(reasons(&body, "2"), ["invalid_input_type", "value_not_in_list"]);
    assert_eq!(reasons(&body, "3"), ["value_smaller_than_min", "missing_input"]);
}

#[test]
fn the_ui_format_is_rejected_with_a_hint_to_export_the_api_format() {
    let server = Server::start();
    let (status, body) = submit_err(&server, json!({"last_node_id": 3, "nodes": [{"id": 1}], "links": []}));
    assert_eq!(status, 422);
    assert_eq!(error_code(&body), "workflow_format_ui");
    assert!(body["error"]["message"].as_str().unwrap().contains("API"), "{body}");
}

#[test]
fn validating_runs_no_guest_and_a_valid_graph_is_accepted() {
    // A node whose execution would fail (bad regex) validates fine: validation uses the
    // definitions only.
    let server = Server::start();
    let job = server.submit(json!({
        "1": {"class_type": "RegexMatch", "inputs": {"string": "x", "regex_pattern": "(", "case_insensitive": true, "multiline": false, "dotall": false}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }));
    assert_eq!(server.wait(job["id"].as_str().unwrap())["status"], "failed");
}

#[test]
fn only_the_nodes_that_outputs_need_run() {
    let server = Server::start();
    let job = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "kept"}},
        "2": save("1"),
        // Unconnected and broken: never validated deeply, never run.
        "3": {"class_type": "RegexMatch", "inputs": {"string": "x", "regex_pattern": "("}},
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    assert_eq!(job["progress"]["nodes_total"], 2);
    assert_eq!(job["progress"]["nodes_done"], 2);
    assert_eq!(job["progress"]["value"], 1.0);
}

#[test]
fn a_node_failure_fails_the_job_and_keeps_earlier_outputs() {
    // One node call at a time: nodes 2 and 3 both wait for node 1, then run in plan order,
    // so node 2's output is committed before node 3 fails (with more workers they would run
    // side by side, and node 3's failure would stop node 2).
    let server = Server::with(Options {
        args: vec!["--workers".into(), "1".into()],
        ..Default::default()
    });
    let job = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "before"}},
        "2": save("1"),
        "3": {"class_type": "RegexMatch", "inputs": {"string": ["1", 0], "regex_pattern": "(", "case_insensitive": true, "multiline": false, "dotall": false}},
        "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
    }));
    assert_eq!(job["status"], "failed");
    let error = &job["error"];
    assert_eq!(error["code"], "node_execution_error");
    assert_eq!(error["node_id"], "3");
    assert_eq!(error["class_type"], "RegexMatch");
    assert!(error.get("traceback").is_some());
    let outputs = job["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 1, "the output committed before the failure stays: {job}");
    assert_eq!(outputs[0]["node_id"], "2");
}

#[test]
fn large_values_pass_between_nodes_as_host_handles() {
    // 4096x4096x3 float pixels are 192 MiB: more than the guest memory cap, so the job can
    // only succeed if the image never enters the guests that pass it on.
    let server = Server::with(Options {
        args: vec!["--node-memory-mib".into(), "32".into()],
        ..Default::default()
    });
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 4096, "height": 4096, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "ImageScale", "inputs": {"image": ["2", 0], "upscale_method": "area", "width": 16, "height": 16, "crop": "disabled"}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "big"}},
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
}

fn metric(server: &Server, name: &str) -> f64 {
    metric_of(server.get("/metrics"), name)
}

/// The value of metric `name` in a `/metrics` answer (0 when it is not listed yet).
fn metric_of(response: reqwest::blocking::Response, name: &str) -> f64 {
    assert_eq!(response.status().as_u16(), 200, "/metrics refused");
    let text = response.text().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .map_or(0.0, |v| v.trim().parse().unwrap())
}

fn chain(text: &str) -> Value {
    json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": text}},
        "2": {"class_type": "CaseConverter", "inputs": {"string": ["1", 0], "mode": "UPPERCASE"}},
        "3": {"class_type": "StringConcatenate", "inputs": {"string_a": ["2", 0], "string_b": "!", "delimiter": ""}},
        "4": {"class_type": "SaveText", "inputs": {"text": ["3", 0], "filename_prefix": "c"}},
    })
}

#[test]
fn a_repeated_job_runs_nothing_again_and_its_outputs_have_the_same_hashes() {
    let server = Server::start();
    let first = server.run(chain("same"));
    let hits = metric(&server, "weft_node_cache_hits_total");
    let second = server.run(chain("same"));
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        4.0,
        "every node came from the cache"
    );
    assert_eq!(first["outputs"][0]["hash"], second["outputs"][0]["hash"]);
    assert_ne!(
        first["outputs"][0]["id"], second["outputs"][0]["id"],
        "each job has its own output asset"
    );
    assert_eq!(second["progress"]["nodes_done"], 4, "cached nodes count as done");
    assert_eq!(second["progress"]["value"], 1.0);
}

#[test]
fn cached_results_left_unused_for_the_idle_time_are_dropped_and_their_nodes_run_again() {
    let server = Server::with(Options {
        args: vec!["--cache-idle-secs".into(), "5".into()],
        ..Default::default()
    });
    server.run(chain("aging"));
    let hits = metric(&server, "weft_node_cache_hits_total");
    server.run(chain("aging"));
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        4.0,
        "a result used again at once is still cached"
    );
    // Left alone, the entries age out: the gauges fall to zero.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while metric(&server, "weft_node_cache_entries") > 0.0 {
        assert!(std::time::Instant::now() < deadline, "the cache never aged out");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(metric(&server, "weft_node_cache_bytes"), 0.0);
    let hits = metric(&server, "weft_node_cache_hits_total");
    let job = server.run(chain("aging"));
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        0.0,
        "every node ran again"
    );
    assert_eq!(server.download(job["outputs"][0]["url"].as_str().unwrap()), b"AGING!");
}

#[test]
fn a_changed_input_reruns_only_that_node_and_what_depends_on_it() {
    let server = Server::start();
    server.run(chain("one"));
    let mut changed = chain("one");
    changed["3"]["inputs"]["string_b"] = json!("?");
    let hits = metric(&server, "weft_node_cache_hits_total");
    let job = server.run(changed);
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        2.0,
        "nodes 1 and 2 are cached, 3 and 4 re-run"
    );
    assert_eq!(server.download(job["outputs"][0]["url"].as_str().unwrap()), b"ONE?");
}

#[test]
fn a_non_deterministic_node_is_never_cached() {
    let server = Server::start();
    let workflow = json!({
        "1": {"class_type": "LogText", "inputs": {"text": "again"}},
        "2": save("1"),
    });
    server.run(workflow.clone());
    let hits = metric(&server, "weft_node_cache_hits_total");
    server.run(workflow);
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        0.0,
        "LogText and its dependants run every time"
    );
}

#[test]
fn the_cache_never_serves_one_tenant_to_another() {
    let data = tempfile::tempdir().unwrap();
    let key = |tenant: &str| support::new_key(data.path(), tenant);
    let (a, b) = (key("alpha"), key("beta"));
    let opts = |token: String| Options {
        data_dir: Some(data.path().to_path_buf()),
        args: vec!["--auth".into(), "keys".into(), "--admin-token".into(), "ADM".into()],
        token: Some(token),
        ..Default::default()
    };
    let server = Server::with(opts(a.clone()));
    // Under keys auth the metrics are the operator's.
    let metric = |server: &Server, name: &str| {
        metric_of(
            server
                .http
                .get(server.url("/metrics"))
                .bearer_auth("ADM")
                .send()
                .unwrap(),
            name,
        )
    };
    server.run(chain("shared"));
    let hits = metric(&server, "weft_node_cache_hits_total");
    server.set_token(Some(&b));
    server.run(chain("shared"));
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        0.0,
        "tenant beta computes its own results"
    );
    server.set_token(Some(&a));
    server.run(chain("shared"));
    assert_eq!(
        metric(&server, "weft_node_cache_hits_total") - hits,
        4.0,
        "tenant alpha still hits its own entries"
    );
}
