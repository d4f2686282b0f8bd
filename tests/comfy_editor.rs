//! ComfyUI's official web editor (the PyPI package `comfyui-frontend-package`, installed
//! with `weft comfyui-frontend install`) served by `weft serve --comfyui-frontend`, in
//! Debian's headless chromium: it loads with no failed request to weft, shows the default
//! graph, queues it on a tiny checkpoint placed under the default graph's checkpoint name,
//! and shows the image. A screenshot is kept in the test's temp dir.

mod support;

use std::path::PathBuf;
use std::process::Command;

use serde_json::{json, Value};
use support::browser::Browser;
use support::{weft_bin, Options, Server};

/// The checkpoint name of ComfyUI's default graph.
const CHECKPOINT: &str = "v1-5-pruned-emaonly-fp16.safetensors";
/// The editor version `weft comfyui-frontend install` installs by default.
const FRONTEND_VERSION: &str = "1.27.10";

/// The editor's files under target/, installed with `weft comfyui-frontend install` the
/// first time.
fn frontend_dir() -> PathBuf {
    let dir = support::root().join(format!("target/comfyui-frontend-{FRONTEND_VERSION}"));
    if !dir.join("index.html").is_file() {
        let status = Command::new(weft_bin())
            .args(["comfyui-frontend", "install", "--version", FRONTEND_VERSION])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(status.success(), "weft comfyui-frontend install failed");
    }
    dir
}

/// Runs `script` (an expression) in the page until it is neither null nor false, and
/// returns it.
fn wait_for_value(browser: &Browser, what: &str, script: &str) -> Value {
    browser.wait_for(
        240,
        what,
        &format!("const v = (() => {{ {script} }})(); return v !== null && v !== false && v !== undefined"),
    );
    browser.eval(script)
}

/// A server with the editor and a tiny checkpoint under the default graph's checkpoint
/// name, for a returning user; and the editor open on it with the default graph shown.
fn editor() -> (Server, tempfile::TempDir, Browser) {
    let frontend = frontend_dir();
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("checkpoints")).unwrap();
    support::tiny_checkpoint(&models.path().join("checkpoints").join(CHECKPOINT), 0);
    let server = Server::with(Options {
        args: vec![
            "--models-dir".into(),
            models.path().display().to_string(),
            "--comfyui-frontend".into(),
            frontend.display().to_string(),
        ],
        ..Default::default()
    });
    // A returning user: no first-run template picker, no release-notes fetch from the
    // internet; the default graph opens.
    let settings = json!({"Comfy.TutorialCompleted": true, "Comfy.Notification.ShowVersionUpdates": false});
    let r = server
        .http
        .post(server.url("/api/settings"))
        .json(&settings)
        .send()
        .unwrap();
    assert!(r.status().is_success());

    let browser = Browser::start();
    browser.goto(&format!("{}/", server.base));
    let types = wait_for_value(
        &browser,
        "the default graph",
        "const g = window.app && window.app.graph; \
         return g && g._nodes.length >= 7 ? g._nodes.map(n => n.type).sort() : null",
    );
    assert_eq!(
        types,
        json!([
            "CLIPTextEncode",
            "CLIPTextEncode",
            "CheckpointLoaderSimple",
            "EmptyLatentImage",
            "KSampler",
            "SaveImage",
            "VAEDecode"
        ])
    );
    // The loader is fully built from weft's definition: its class and its `ckpt_name` combo,
    // set to the checkpoint weft lists.
    let loader = browser.eval(
        "const n = app.graph._nodes.find(n => n.type === 'CheckpointLoaderSimple'); \
         return [n.comfyClass, n.widgets.map(w => w.name), n.widgets[0].value]",
    );
    assert_eq!(
        loader,
        json!(["CheckpointLoaderSimple", ["ckpt_name"], CHECKPOINT]),
        "the default graph's checkpoint loader"
    );

    // Every request the editor made to weft while loading succeeded (a network error has
    // status 0).
    let failed = browser.eval(
        "return performance.getEntriesByType('resource') \
           .filter(e => e.name.startsWith(location.origin) && (e.responseStatus === 0 || e.responseStatus >= 400)) \
           .map(e => e.name + ' ' + e.responseStatus)",
    );
    assert_eq!(failed, json!([]), "failed requests on load");

    (server, models, browser)
}

/// Keeps a screenshot of the editor in a temp dir of its own, checked as not blank.
fn keep_screenshot(browser: &Browser, name: &str) {
    std::thread::sleep(std::time::Duration::from_millis(500));
    let kept = tempfile::Builder::new()
        .prefix("weft-comfy-editor-")
        .tempdir()
        .unwrap()
        .keep();
    let shot = browser.screenshot(&kept, name);
    println!("screenshot: {}", shot.display());
}

#[test]
fn the_editor_loads_from_weft_with_no_failed_request_and_shows_the_default_graph() {
    let (_server, _models, browser) = editor();
    keep_screenshot(&browser, "editor-loaded");
}

#[test]
fn the_editor_queues_the_default_graph_and_shows_the_image() {
    let (server, _models, browser) = editor();
    // The default graph, at a size and step count a debug build samples quickly.
    browser.eval(
        "const set = (type, name, v) => app.graph._nodes.find(n => n.type === type) \
           .widgets.find(w => w.name === name).value = v; \
         set('EmptyLatentImage', 'width', 64); set('EmptyLatentImage', 'height', 64); \
         set('KSampler', 'steps', 2); return true",
    );
    // The editor loads a node's images when it draws the node: fit the whole graph in the
    // window, as the `.` key does, so the SaveImage node is on screen.
    browser.eval("app.extensionManager.command.execute('Comfy.Canvas.FitView'); return true");
    browser.eval("app.queuePrompt(0, 1); return true");
    let shown = wait_for_value(
        &browser,
        "the image in the SaveImage node",
        "const n = app.graph._nodes.find(n => n.type === 'SaveImage'); \
         const img = n && n.imgs && n.imgs[0]; \
         return img && img.complete && img.naturalWidth > 0 ? [img.src, img.naturalWidth, img.naturalHeight] : null",
    );
    let history: Value = server
        .http
        .get(server.url("/api/history"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let runs = history.as_object().unwrap();
    assert_eq!(runs.len(), 1, "the editor's prompt ran as one job");
    let (prompt_id, run) = runs.iter().next().unwrap();
    assert_eq!(run["status"]["status_str"], "success", "{run}");
    let saved = &run["outputs"]["9"]["images"][0];
    assert_eq!(saved["subfolder"], prompt_id.as_str(), "{run}");
    // The editor shows the image the SaveImage node saved, at its size (the tiny
    // checkpoint's decoder scales the latent less than SD's 8×).
    let src = shown[0].as_str().unwrap();
    let filename = saved["filename"].as_str().unwrap();
    assert!(
        src.contains("/view?") && src.contains(&format!("filename={filename}")) && src.contains(prompt_id),
        "the editor shows {src}, not {saved}"
    );
    let bytes = server
        .http
        .get(server.url("/api/view"))
        .query(&[("filename", filename), ("subfolder", prompt_id), ("type", "output")])
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let image = image::load_from_memory(&bytes).unwrap();
    assert_eq!(
        (shown[1].as_u64(), shown[2].as_u64()),
        (Some(u64::from(image.width())), Some(u64::from(image.height())))
    );

    keep_screenshot(&browser, "editor-image");
}
