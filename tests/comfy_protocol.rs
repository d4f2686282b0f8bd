//! ComfyUI's native server protocol against the real server: every route at the root and
//! under `/api`, ComfyUI's error shapes, history outputs per node, `/view` and uploads over
//! the tenant's assets, file-name rules, the `/ws` messages (binary previews included), and
//! tenant isolation under `--auth keys`.

mod support;

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Options, Server};
use tungstenite::client::IntoClientRequest;
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

/// A 3-node image graph: a 16x16 image, inverted, saved.
fn image_graph(color: u32) -> Value {
    json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 16, "height": 16, "batch_size": 1, "color": color}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "ComfyUI"}}
    })
}

/// POSTs a prompt to `prefix/prompt`, returning the status and body.
fn post_prompt(server: &Server, prefix: &str, prompt: Value) -> (u16, Value) {
    let r = server.post(
        &format!("{prefix}/prompt"),
        &json!({"prompt": prompt, "client_id": "test"}),
    );
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// Polls `/history/{id}` until the prompt is in it.
fn wait_history(server: &Server, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let history: Value = server.get(&format!("/history/{id}")).json().unwrap();
        if history.get(id).is_some() {
            return history[id].clone();
        }
        assert!(Instant::now() < deadline, "prompt {id} did not finish");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn view(server: &Server, file: &Value) -> reqwest::blocking::Response {
    server
        .request(reqwest::Method::GET, "/view")
        .query(&[
            ("filename", file["filename"].as_str().unwrap()),
            ("subfolder", file["subfolder"].as_str().unwrap()),
            ("type", file["type"].as_str().unwrap()),
        ])
        .send()
        .unwrap()
}

fn png(width: u32, height: u32, pixel: [u8; 4]) -> Vec<u8> {
    let image = image::RgbaImage::from_pixel(width, height, image::Rgba(pixel));
    let mut out = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

/// Uploads `bytes` through `/upload/{route}` with ComfyUI's fields.
fn upload(server: &Server, route: &str, name: &str, bytes: Vec<u8>, fields: &[(&str, &str)]) -> (u16, Value) {
    let mut form = reqwest::blocking::multipart::Form::new().part(
        "image",
        reqwest::blocking::multipart::Part::bytes(bytes)
            .file_name(name.to_string())
            .mime_str("image/png")
            .unwrap(),
    );
    for (k, v) in fields {
        form = form.text(k.to_string(), v.to_string());
    }
    let r = server
        .request(reqwest::Method::POST, &format!("/upload/{route}"))
        .multipart(form)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().unwrap_or(Value::Null))
}

/// A `/ws` connection.
struct Socket {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    /// Binary frames received so far.
    binary: Vec<Vec<u8>>,
}

impl Socket {
    fn open(server: &Server, query: &str, token: Option<&str>) -> Result<Socket, u16> {
        let url = format!("{}/ws{query}", server.base.replacen("http://", "ws://", 1));
        let mut request = url.into_client_request().unwrap();
        if let Some(token) = token {
            request
                .headers_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        match tungstenite::connect(request) {
            Ok((ws, _)) => {
                if let MaybeTlsStream::Plain(stream) = ws.get_ref() {
                    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                }
                Ok(Socket { ws, binary: Vec::new() })
            }
            Err(tungstenite::Error::Http(response)) => Err(response.status().as_u16()),
            Err(e) => panic!("connecting to /ws: {e}"),
        }
    }

    /// The next text message, `None` when none came within `wait`.
    fn next(&mut self, wait: Duration) -> Option<Value> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            match self.ws.read() {
                Ok(Message::Text(text)) => return Some(serde_json::from_str(&text).unwrap()),
                Ok(Message::Binary(bytes)) => self.binary.push(bytes),
                Ok(_) => {}
                Err(tungstenite::Error::Io(e))
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(e) => panic!("reading /ws: {e}"),
            }
        }
        None
    }

    /// Messages until one for which `done` holds (included), within 240 s.
    fn until(&mut self, done: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut seen = Vec::new();
        while Instant::now() < deadline {
            if let Some(message) = self.next(Duration::from_millis(500)) {
                let stop = done(&message);
                seen.push(message);
                if stop {
                    return seen;
                }
            }
        }
        panic!("the awaited message never came; saw {seen:?}");
    }
}

fn types(messages: &[Value], prompt_id: &str) -> Vec<String> {
    messages
        .iter()
        .filter(|m| m["data"]["prompt_id"] == prompt_id)
        .map(|m| m["type"].as_str().unwrap().to_string())
        .collect()
}

fn is_end(message: &Value, prompt_id: &str) -> bool {
    message["type"] == "executing" && message["data"]["node"].is_null() && message["data"]["prompt_id"] == prompt_id
}

#[test]
fn a_prompt_is_a_weft_job_and_history_lists_its_outputs_per_node_at_the_root_and_under_api() {
    let server = Server::start();
    for prefix in ["", "/api"] {
        let (status, body) = post_prompt(&server, prefix, image_graph(0x102030));
        assert_eq!(status, 200, "{body}");
        let id = body["prompt_id"].as_str().unwrap().to_string();
        assert!(body["number"].is_number(), "{body}");
        assert_eq!(body["node_errors"], json!({}));
        // The same job through the v2 API.
        let listed: Value = server.get("/api/v2/jobs").json().unwrap();
        assert!(listed["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|j| j["id"] == id.as_str()));
        let entry = wait_history(&server, &id);
        assert_eq!(entry["status"]["status_str"], "success", "{entry}");
        assert_eq!(entry["status"]["completed"], true);
        assert_eq!(entry["prompt"][1], id.as_str());
        assert_eq!(entry["prompt"][4], json!(["3"]));
        let images = entry["outputs"]["3"]["images"].as_array().unwrap();
        assert_eq!(images.len(), 1);
        assert_eq!(images[0]["type"], "output");
        assert_eq!(images[0]["subfolder"], id.as_str());
        assert!(images[0]["filename"].as_str().unwrap().ends_with(".png"));
        let bytes = view(&server, &images[0]).bytes().unwrap().to_vec();
        let job = server.wait(&id);
        assert_eq!(
            bytes,
            server.download(job["outputs"][0]["url"].as_str().unwrap()),
            "/view serves the job's output"
        );
        let all: Value = server.get(&format!("{prefix}/history")).json().unwrap();
        assert!(all.get(&id).is_some());
    }
}

#[test]
fn text_and_preview_outputs_are_listed_as_comfyui_lists_them() {
    let server = Server::start();
    let prompt = json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "PreviewImage", "inputs": {"images": ["1", 0]}},
        "3": {"class_type": "SaveText", "inputs": {"text": "hello comfy", "filename_prefix": "t"}}
    });
    let (status, body) = post_prompt(&server, "", prompt);
    assert_eq!(status, 200, "{body}");
    let entry = wait_history(&server, body["prompt_id"].as_str().unwrap());
    assert_eq!(entry["outputs"]["2"]["images"][0]["type"], "temp", "{entry}");
    assert_eq!(
        view(&server, &entry["outputs"]["2"]["images"][0]).status().as_u16(),
        200
    );
    assert_eq!(entry["outputs"]["3"]["text"], json!(["hello comfy"]), "{entry}");
}

#[test]
fn invalid_prompts_are_a_400_in_comfyuis_shape_with_node_errors() {
    let server = Server::start();
    let r = server.post("/prompt", &json!({"client_id": "x"}));
    assert_eq!(r.status().as_u16(), 400);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["type"], "no_prompt");
    assert_eq!(body["node_errors"], json!({}));

    let mut bad = image_graph(0);
    bad["1"]["inputs"]["width"] = json!(-5);
    let (status, body) = post_prompt(&server, "/api", bad);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["type"], "prompt_outputs_failed_validation");
    for key in ["message", "details", "extra_info"] {
        assert!(body["error"].get(key).is_some(), "{body}");
    }
    let node = &body["node_errors"]["1"];
    assert_eq!(node["class_type"], "EmptyImage", "{body}");
    assert_eq!(node["dependent_outputs"], json!(["3"]));
    let error = &node["errors"][0];
    for key in ["type", "message", "details", "extra_info"] {
        assert!(error.get(key).is_some(), "{error}");
    }
    assert_eq!(error["extra_info"]["input_name"], "width");
    assert_eq!(error["extra_info"]["received_value"], -5);
    let mut unlinked = image_graph(0);
    unlinked["2"]["inputs"]["image"] = json!(["9", 0]);
    let (status, body) = post_prompt(&server, "", unlinked);
    assert_eq!(status, 400);
    assert_eq!(body["node_errors"]["2"]["class_type"], "ImageInvert", "{body}");
    assert_eq!(body["node_errors"]["2"]["errors"][0]["type"], "bad_linked_input");

    let (status, body) = post_prompt(&server, "", json!({"1": {"class_type": "NoSuchNode", "inputs": {}}}));
    assert_eq!(status, 400);
    assert!(
        body["error"]["type"].is_string() && body["node_errors"].is_object(),
        "{body}"
    );
    let listed: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(listed["jobs"], json!([]), "refused prompts make no job");
}

#[test]
fn uploads_become_load_image_choices_and_load_image_reads_them() {
    let server = Server::start();
    let red = png(4, 4, [255, 0, 0, 255]);
    let (status, body) = upload(&server, "image", "photo.png", red.clone(), &[]);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, json!({"name": "photo.png", "subfolder": "", "type": "input"}));
    // The same bytes again keep the name; other bytes under it get a numbered name, unless
    // overwrite is asked for.
    let (_, again) = upload(&server, "image", "photo.png", red.clone(), &[]);
    assert_eq!(again["name"], "photo.png");
    let blue = png(4, 4, [0, 0, 255, 255]);
    let (_, other) = upload(&server, "image", "photo.png", blue.clone(), &[]);
    assert_eq!(other["name"], "photo (1).png");
    let (_, sub) = upload(
        &server,
        "image",
        "s.png",
        blue.clone(),
        &[("subfolder", "pasted"), ("overwrite", "true")],
    );
    assert_eq!(sub, json!({"name": "s.png", "subfolder": "pasted", "type": "input"}));

    let info: Value = server.get("/object_info/LoadImage").json().unwrap();
    let spec = &info["LoadImage"]["input"]["required"]["image"];
    let names: Vec<&str> = spec[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    for name in ["photo.png", "photo (1).png", "pasted/s.png"] {
        assert!(names.contains(&name), "{name} in {names:?}");
    }
    assert_eq!(spec[1]["image_upload"], true);
    let input = json!({"filename": "photo.png", "subfolder": "", "type": "input"});
    assert_eq!(view(&server, &input).bytes().unwrap().to_vec(), red);

    let prompt = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "pasted/s.png"}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "loaded"}}
    });
    let (status, body) = post_prompt(&server, "", prompt);
    assert_eq!(status, 200, "{body}");
    let entry = wait_history(&server, body["prompt_id"].as_str().unwrap());
    assert_eq!(entry["status"]["status_str"], "success", "{entry}");
    let saved = view(&server, &entry["outputs"]["2"]["images"][0]).bytes().unwrap();
    let saved = image::load_from_memory(&saved).unwrap().to_rgb8();
    assert_eq!(saved.get_pixel(0, 0).0, [0, 0, 255], "LoadImage read the uploaded file");

    let missing = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "never-uploaded.png"}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}
    });
    let (status, body) = post_prompt(&server, "", missing);
    assert_eq!(status, 400);
    assert_eq!(
        body["node_errors"]["1"]["errors"][0]["type"], "value_not_in_list",
        "{body}"
    );

    // A mask upload puts the mask's alpha on the original image.
    let mask = png(4, 4, [0, 0, 0, 7]);
    let original = r#"{"filename": "photo.png", "subfolder": "", "type": "input"}"#;
    let (status, body) = upload(&server, "mask", "photo-mask.png", mask, &[("original_ref", original)]);
    assert_eq!(status, 200, "{body}");
    let masked = view(
        &server,
        &json!({"filename": body["name"], "subfolder": "", "type": "input"}),
    )
    .bytes()
    .unwrap();
    let masked = image::load_from_memory(&masked).unwrap().to_rgba8();
    assert_eq!(masked.get_pixel(1, 1).0, [255, 0, 0, 7]);
}

#[test]
fn file_names_with_dot_dot_absolute_paths_or_nul_are_refused() {
    let server = Server::start();
    for (filename, subfolder) in [
        ("../weft.db", ""),
        ("x.png", "../.."),
        ("/etc/passwd", ""),
        ("x.png", "/etc"),
        ("a\0b.png", ""),
        ("C:\\x.png", ""),
    ] {
        for kind in ["input", "output", "temp"] {
            let r = view(
                &server,
                &json!({"filename": filename, "subfolder": subfolder, "type": kind}),
            );
            assert_eq!(r.status().as_u16(), 400, "{filename:?} {subfolder:?} {kind}");
        }
    }
    let r = view(
        &server,
        &json!({"filename": "x.png", "subfolder": "", "type": "secrets"}),
    );
    assert_eq!(r.status().as_u16(), 400);
    let r = view(
        &server,
        &json!({"filename": "weft.db", "subfolder": "", "type": "output"}),
    );
    assert_eq!(r.status().as_u16(), 404, "names are assets, never files of the server");
    for (name, fields) in [
        ("../evil.png", vec![]),
        ("/abs.png", vec![]),
        ("ok.png", vec![("subfolder", "../up")]),
        ("ok.png", vec![("subfolder", "/root")]),
    ] {
        let (status, _) = upload(&server, "image", name, png(1, 1, [0; 4]), &fields);
        assert_eq!(status, 400, "{name} {fields:?}");
    }
    let (status, _) = upload(
        &server,
        "mask",
        "m.png",
        png(1, 1, [0; 4]),
        &[("original_ref", r#"{"filename": "../weft.db"}"#)],
    );
    assert_eq!(status, 400);
}

#[test]
fn informational_routes_answer_in_comfyuis_shapes() {
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("embeddings")).unwrap();
    std::fs::write(models.path().join("embeddings").join("good.safetensors"), b"x").unwrap();
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.path().display().to_string()],
        ..Default::default()
    });
    for prefix in ["", "/api"] {
        let get = |path: &str| -> Value {
            let r = server.get(&format!("{prefix}{path}"));
            assert_eq!(r.status().as_u16(), 200, "{path}");
            r.json().unwrap()
        };
        let all = get("/object_info");
        assert!(all["SaveImage"]["input"]["required"]["images"].is_array());
        assert_eq!(all["SaveImage"]["output_node"], true);
        let one = get("/object_info/KSampler");
        assert_eq!(one.as_object().unwrap().len(), 1);
        assert_eq!(get("/object_info/NoSuchClass"), json!({}));
        let stats = get("/system_stats");
        assert!(stats["system"]["comfyui_version"].is_string());
        assert!(stats["devices"].is_array());
        assert_eq!(get("/embeddings"), json!(["good"]));
        assert!(get("/extensions").is_array());
        let folders = get("/models");
        assert!(folders.as_array().unwrap().iter().any(|f| f == "checkpoints"));
        assert_eq!(get("/models/embeddings"), json!(["good.safetensors"]));
        assert_eq!(server.get(&format!("{prefix}/models/nope")).status().as_u16(), 404);
        assert_eq!(get("/prompt"), json!({"exec_info": {"queue_remaining": 0}}));
        assert_eq!(get("/queue"), json!({"queue_running": [], "queue_pending": []}));
        // The editor's log console: the server's log is not shown to callers.
        assert_eq!(get("/internal/logs"), json!(""));
        assert_eq!(get("/internal/logs/raw")["entries"], json!([]));
        let r = server.post(
            &format!("{prefix}/free"),
            &json!({"unload_models": true, "free_memory": true}),
        );
        assert_eq!(r.status().as_u16(), 200);
    }
}

#[test]
fn object_info_lists_the_core_loaders_the_editor_requires_as_deprecated_and_prompts_using_them_are_refused() {
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("checkpoints")).unwrap();
    std::fs::write(models.path().join("checkpoints").join("svd.safetensors"), b"x").unwrap();
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.path().display().to_string()],
        ..Default::default()
    });
    let all: Value = server.get("/object_info").json().unwrap();
    // ComfyUI's editor 1.27 reads these ten classes when it builds a model combo.
    for class in [
        "CheckpointLoaderSimple",
        "ImageOnlyCheckpointLoader",
        "LoraLoader",
        "LoraLoaderModelOnly",
        "VAELoader",
        "ControlNetLoader",
        "UNETLoader",
        "UpscaleModelLoader",
        "StyleModelLoader",
        "GLIGENLoader",
    ] {
        assert_eq!(all[class]["name"], class, "{class} is not listed");
    }
    // Those weft runs are not deprecated; the others are, with ComfyUI's signature and the
    // files weft lists in their folder.
    assert!(all["CheckpointLoaderSimple"].get("deprecated").is_none());
    let one: Value = server.get("/api/object_info/ImageOnlyCheckpointLoader").json().unwrap();
    assert_eq!(one.as_object().unwrap().len(), 1);
    let loader = &one["ImageOnlyCheckpointLoader"];
    assert_eq!(loader["deprecated"], true);
    assert_eq!(loader["input"]["required"]["ckpt_name"][0], json!(["svd.safetensors"]));
    assert_eq!(loader["output"], json!(["MODEL", "CLIP_VISION", "VAE"]));

    let (status, body) = post_prompt(
        &server,
        "",
        json!({"1": {"class_type": "ImageOnlyCheckpointLoader", "inputs": {"ckpt_name": "svd.safetensors"}}}),
    );
    assert_eq!(status, 400, "{body}");
    assert!(body["error"]["type"].is_string(), "{body}");
    let listed: Value = server.get("/api/v2/jobs").json().unwrap();
    assert_eq!(listed["jobs"], json!([]));
}

/// A server with the counter plugin (a slow node that reports progress) and one worker.
fn slow_server(args: &[&str]) -> (Server, tempfile::TempDir) {
    let mut all = vec!["--workers", "1"];
    all.extend(args);
    support::slow_server(&all)
}

fn slow_prompt(seconds: f64) -> Value {
    support::slow_workflow(seconds)
}

#[test]
fn the_queue_lists_and_deletes_pending_prompts_and_interrupt_stops_the_running_one() {
    let (server, _plugins) = slow_server(&[]);
    let (status, running) = post_prompt(&server, "", slow_prompt(60.0));
    assert_eq!(status, 200, "{running}");
    let (_, pending) = post_prompt(&server, "", slow_prompt(60.0));
    let (running, pending) = (
        running["prompt_id"].as_str().unwrap(),
        pending["prompt_id"].as_str().unwrap(),
    );
    support::wait_running(&server, running);
    let queue: Value = server.get("/queue").json().unwrap();
    assert_eq!(queue["queue_running"][0][1], running, "{queue}");
    assert_eq!(queue["queue_pending"][0][1], pending, "{queue}");
    assert_eq!(queue["queue_pending"][0][2], slow_prompt(60.0));
    let info: Value = server.get("/prompt").json().unwrap();
    assert_eq!(info["exec_info"]["queue_remaining"], 2);

    assert_eq!(
        server.post("/queue", &json!({"delete": [pending]})).status().as_u16(),
        200
    );
    assert_eq!(server.wait(pending)["status"], "canceled");
    assert_eq!(server.post("/interrupt", &json!({})).status().as_u16(), 200);
    let entry = wait_history(&server, running);
    assert_eq!(entry["status"]["status_str"], "error");
    assert_eq!(entry["status"]["messages"][1][0], "execution_interrupted", "{entry}");

    let (_, a) = post_prompt(&server, "", slow_prompt(60.0));
    let (_, b) = post_prompt(&server, "", slow_prompt(60.0));
    support::wait_running(&server, a["prompt_id"].as_str().unwrap());
    // An interrupt naming another prompt leaves the running one alone.
    let r = server.post("/interrupt", &json!({"prompt_id": b["prompt_id"]}));
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(server.post("/queue", &json!({"clear": true})).status().as_u16(), 200);
    assert_eq!(server.wait(b["prompt_id"].as_str().unwrap())["status"], "canceled");
    let job: Value = server
        .get(&format!("/api/v2/jobs/{}", a["prompt_id"].as_str().unwrap()))
        .json()
        .unwrap();
    assert_eq!(job["status"], "running");
    server.post("/interrupt", &json!({"prompt_id": a["prompt_id"]}));
    assert_eq!(server.wait(a["prompt_id"].as_str().unwrap())["status"], "canceled");

    // History delete and clear remove finished prompts.
    let before: Value = server.get("/history").json().unwrap();
    assert!(before.get(running).is_some());
    server.post("/history", &json!({"delete": [running]}));
    let after: Value = server.get("/history").json().unwrap();
    assert!(after.get(running).is_none() && after.get(pending).is_some(), "{after}");
    server.post("/history", &json!({"clear": true}));
    assert_eq!(server.get("/history").json::<Value>().unwrap(), json!({}));
    assert_eq!(server.get(&format!("/api/v2/jobs/{running}")).status().as_u16(), 404);
}

#[test]
fn the_socket_sends_comfyuis_messages_for_prompts_and_for_v2_jobs() {
    let server = Server::start();
    let mut socket = Socket::open(&server, "?clientId=test", None).unwrap();
    let hello = socket.next(Duration::from_secs(10)).unwrap();
    assert_eq!(hello["type"], "status");
    assert_eq!(hello["data"]["sid"], "test");
    assert_eq!(hello["data"]["status"]["exec_info"]["queue_remaining"], 0);
    let mut bystander = Socket::open(&server, "?clientId=someone-else", None).unwrap();
    bystander.next(Duration::from_secs(10)).unwrap();

    // post_prompt queues as client "test": its messages go to that client's socket only.
    let (_, body) = post_prompt(&server, "", image_graph(7));
    let id = body["prompt_id"].as_str().unwrap().to_string();
    let seen = socket.until(|m| is_end(m, &id));
    let kinds = types(&seen, &id);
    assert_eq!(kinds.first().map(String::as_str), Some("execution_start"), "{kinds:?}");
    for kind in ["executing", "executed", "execution_success"] {
        assert!(kinds.contains(&kind.to_string()), "{kind} in {kinds:?}");
    }
    let executed = seen.iter().find(|m| m["type"] == "executed").unwrap();
    assert_eq!(executed["data"]["node"], "3");
    let image = &executed["data"]["output"]["images"][0];
    assert_eq!(view(&server, image).status().as_u16(), 200);
    assert!(
        seen.iter().any(|m| m["type"] == "status"),
        "the queue's changes are sent"
    );

    let queue: Value = server.get("/queue").json().unwrap();
    assert!(queue["queue_running"].is_array());
    let heard: Vec<Value> = std::iter::from_fn(|| bystander.next(Duration::from_millis(300))).collect();
    assert!(
        heard.iter().all(|m| m["data"]["prompt_id"] != id.as_str()),
        "another client hears no message of the prompt: {heard:?}"
    );
    assert!(
        heard.iter().any(|m| m["type"] == "status"),
        "but hears the queue change: {heard:?}"
    );

    // The same prompt again is served from the node cache.
    let (_, body) = post_prompt(&server, "/api", image_graph(7));
    let id = body["prompt_id"].as_str().unwrap().to_string();
    let seen = socket.until(|m| is_end(m, &id));
    assert!(types(&seen, &id).contains(&"execution_cached".to_string()), "{seen:?}");

    // A v2 job's progress is on the socket too; a failing one ends with execution_error.
    let v2 = server.submit(image_graph(9));
    let v2_id = v2["id"].as_str().unwrap().to_string();
    let seen = socket.until(|m| is_end(m, &v2_id));
    assert!(
        types(&seen, &v2_id).contains(&"execution_success".to_string()),
        "{seen:?}"
    );
    let heard = bystander.until(|m| is_end(m, &v2_id));
    assert!(
        types(&heard, &v2_id).contains(&"execution_start".to_string()),
        "a job queued with no client id is heard by every socket: {heard:?}"
    );
    let text = server.upload("not-an-image.png", b"plain text".to_vec());
    let broken = server.submit(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": text["id"]}}}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}
    }));
    let broken_id = broken["id"].as_str().unwrap().to_string();
    let seen = socket.until(|m| is_end(m, &broken_id));
    let error = seen
        .iter()
        .find(|m| m["type"] == "execution_error")
        .expect("execution_error");
    assert_eq!(error["data"]["node_id"], "1", "{error}");
    assert_eq!(error["data"]["node_type"], "LoadImage");
    assert!(error["data"]["exception_message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[test]
fn the_socket_sends_sampler_progress_and_binary_preview_frames() {
    let models = tempfile::tempdir().unwrap();
    let checkpoints = models.path().join("checkpoints");
    std::fs::create_dir_all(&checkpoints).unwrap();
    support::tiny_checkpoint(&checkpoints.join("tiny.safetensors"), 0);
    let server = Server::with(Options {
        args: vec!["--models-dir".into(), models.path().display().to_string()],
        ..Default::default()
    });
    let mut socket = Socket::open(&server, "", None).unwrap();
    let hello = socket.next(Duration::from_secs(10)).unwrap();
    assert!(
        hello["data"]["sid"].as_str().is_some_and(|s| !s.is_empty()),
        "a sid is made up"
    );
    let prompt = json!({
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 8, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": 1, "steps": 3}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "tiny.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": 64, "width": 64}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a bottle"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "text"}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}}
    });
    // Queued as the editor does: with the sid the server gave as its client id.
    let sid = hello["data"]["sid"].as_str().unwrap();
    let r = server.post("/prompt", &json!({"prompt": prompt, "client_id": sid}));
    assert_eq!(r.status().as_u16(), 200);
    let body: Value = r.json().unwrap();
    let id = body["prompt_id"].as_str().unwrap().to_string();
    let seen = socket.until(|m| is_end(m, &id));
    let progress: Vec<&Value> = seen.iter().filter(|m| m["type"] == "progress").collect();
    assert!(!progress.is_empty(), "{seen:?}");
    assert_eq!(progress[0]["data"]["node"], "3");
    assert_eq!(progress[0]["data"]["max"], 3);
    assert!(!socket.binary.is_empty(), "preview frames were sent");
    for frame in &socket.binary {
        assert_eq!(&frame[..4], &[0, 0, 0, 1], "event type 1: a preview image");
        let format = u32::from_be_bytes(frame[4..8].try_into().unwrap());
        let image = &frame[8..];
        match format {
            1 => assert!(image.starts_with(&[0xFF, 0xD8])),
            2 => assert!(image.starts_with(b"\x89PNG")),
            other => panic!("image format {other}"),
        }
    }
}

#[test]
fn tenants_see_only_their_own_prompts_history_uploads_views_and_events() {
    let dir = tempfile::tempdir().unwrap();
    let a = support::new_key(dir.path(), "alice");
    let b = support::new_key(dir.path(), "bob");
    let server = Server::with(Options {
        args: vec!["--auth".into(), "keys".into()],
        data_dir: Some(dir.path().to_path_buf()),
        token: Some(a.clone()),
        ..Default::default()
    });
    // Without a key: every route and the socket are refused.
    server.set_token(None);
    for path in [
        "/prompt",
        "/queue",
        "/history",
        "/object_info",
        "/system_stats",
        "/api/embeddings",
        "/models",
    ] {
        assert_eq!(server.get(path).status().as_u16(), 401, "{path}");
    }
    assert_eq!(
        server
            .post("/prompt", &json!({"prompt": image_graph(1)}))
            .status()
            .as_u16(),
        401
    );
    assert_eq!(Socket::open(&server, "", None).err(), Some(401));
    assert_eq!(Socket::open(&server, "", Some("weft_wrong")).err(), Some(401));

    server.set_token(Some(&b));
    let mut bobs_socket = Socket::open(&server, "", Some(&b)).unwrap();
    bobs_socket.next(Duration::from_secs(10)).unwrap();

    server.set_token(Some(&a));
    let (status, _) = upload(&server, "image", "alice-secret.png", png(2, 2, [1, 2, 3, 255]), &[]);
    assert_eq!(status, 200);
    let (_, body) = post_prompt(&server, "", image_graph(3));
    let id = body["prompt_id"].as_str().unwrap().to_string();
    let entry = wait_history(&server, &id);
    let output = entry["outputs"]["3"]["images"][0].clone();
    assert_eq!(view(&server, &output).status().as_u16(), 200);

    server.set_token(Some(&b));
    assert_eq!(
        server.get(&format!("/history/{id}")).json::<Value>().unwrap(),
        json!({})
    );
    assert_eq!(server.get("/history").json::<Value>().unwrap(), json!({}));
    assert_eq!(view(&server, &output).status().as_u16(), 404);
    let input = json!({"filename": "alice-secret.png", "subfolder": "", "type": "input"});
    assert_eq!(view(&server, &input).status().as_u16(), 404);
    let info: Value = server.get("/object_info/LoadImage").json().unwrap();
    assert_eq!(info["LoadImage"]["input"]["required"]["image"][0], json!([]));
    let stats = server.get("/system_stats").text().unwrap();
    assert!(!stats.contains("alice") && !stats.contains(&id));
    server.post("/history", &json!({"delete": [id]}));
    server.post("/queue", &json!({"delete": [id]}));
    let loaded = json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": "alice-secret.png"}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}}
    });
    let (status, _) = post_prompt(&server, "", loaded);
    assert_eq!(status, 400, "bob cannot load alice's upload");
    let seen: Vec<Value> = std::iter::from_fn(|| bobs_socket.next(Duration::from_millis(500))).collect();
    assert!(
        seen.iter().all(|m| m["data"]["prompt_id"] != id.as_str()),
        "bob hears nothing of alice's prompt: {seen:?}"
    );

    server.set_token(Some(&a));
    assert!(
        server
            .get(&format!("/history/{id}"))
            .json::<Value>()
            .unwrap()
            .get(&id)
            .is_some(),
        "bob's deletes did nothing"
    );
}

#[test]
fn a_popular_python_comfyui_client_runs_a_workflow_unchanged() {
    let setup = Command::new(support::root().join("scripts/comfy-client.sh"))
        .output()
        .expect("running scripts/comfy-client.sh");
    assert!(
        setup.status.success(),
        "installing comfy-api-simplified failed: {}",
        String::from_utf8_lossy(&setup.stderr)
    );
    let python = support::root().join(String::from_utf8(setup.stdout).unwrap().trim());
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let input = work.path().join("input.png");
    std::fs::write(&input, png(6, 5, [10, 20, 30, 255])).unwrap();
    let out = work.path().join("out");
    std::fs::create_dir(&out).unwrap();
    let fixture = support::root().join("tests/fixtures/comfy-client");
    let run = Command::new(&python)
        .arg(fixture.join("run_workflow.py"))
        .arg(&server.base)
        .arg(fixture.join("workflow_api.json"))
        .arg(&input)
        .arg(&out)
        .output()
        .unwrap();
    assert!(
        run.status.success(),
        "the client failed: {}",
        String::from_utf8_lossy(&run.stderr)
    );
    let summary: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(summary["uploaded"]["name"], "input.png", "{summary}");
    assert_eq!(summary["object_info"], json!(["SaveImage"]));
    let names = summary["images"].as_array().unwrap();
    assert_eq!(names.len(), 1, "{summary}");
    let image = std::fs::read(out.join(names[0].as_str().unwrap())).unwrap();
    let image = image::load_from_memory(&image).unwrap().to_rgb8();
    assert_eq!(image.dimensions(), (6, 5));
    assert_eq!(image.get_pixel(2, 2).0, [245, 235, 225], "the uploaded image, inverted");
}

#[test]
fn view_converts_to_comfyuis_preview_formats_and_channels() {
    let server = Server::start();
    let (status, body) = upload(&server, "image", "rgba.png", png(3, 2, [200, 100, 50, 128]), &[]);
    assert_eq!(status, 200, "{body}");
    let view_as = |extra: &str| server.get(&format!("/view?filename=rgba.png&subfolder=&type=input{extra}"));
    let decoded = |r: reqwest::blocking::Response| {
        assert_eq!(r.status().as_u16(), 200);
        image::load_from_memory(&r.bytes().unwrap()).unwrap()
    };
    let stored = decoded(view_as(""));
    assert_eq!(stored.to_rgba8().get_pixel(0, 0).0, [200, 100, 50, 128], "as stored");

    let alpha = view_as("&channel=a");
    assert_eq!(alpha.headers()["content-type"], "image/png");
    assert_eq!(
        decoded(alpha).to_rgba8().get_pixel(2, 1).0,
        [0, 0, 0, 128],
        "the alpha alone"
    );
    let rgb = decoded(view_as("&channel=rgb"));
    assert_eq!(rgb.color(), image::ColorType::Rgb8);
    assert_eq!(rgb.to_rgb8().get_pixel(1, 1).0, [200, 100, 50]);

    let jpeg = view_as("&preview=jpeg;80");
    assert_eq!(jpeg.headers()["content-type"], "image/jpeg");
    let jpeg = decoded(jpeg);
    assert_eq!((jpeg.width(), jpeg.height()), (3, 2));
    let webp = view_as("&preview=webp;90");
    assert_eq!(webp.headers()["content-type"], "image/webp");
    assert_eq!(
        decoded(webp).to_rgba8().get_pixel(0, 1).0,
        [200, 100, 50, 128],
        "lossless"
    );

    for bad in ["&channel=bogus", "&preview=jpeg;0", "&preview=jpeg;x"] {
        assert_eq!(view_as(bad).status().as_u16(), 400, "{bad}");
    }
    let (_, text) = upload(&server, "image", "notes.png", b"plain text".to_vec(), &[]);
    let r = server.get(&format!(
        "/view?filename={}&type=input&channel=rgb",
        text["name"].as_str().unwrap()
    ));
    assert_eq!(r.status().as_u16(), 400, "a file that is no image is not converted");
}
