//! ComfyUI's official web editor (the PyPI package `comfyui-frontend-package`, installed
//! with `weft comfyui-frontend install`) served by `weft serve --comfyui-frontend`, in
//! Debian's headless chromium: it loads with no failed request to weft, shows the default
//! graph, queues it on a tiny checkpoint placed under the default graph's checkpoint name,
//! and shows the image. A screenshot is kept in the test's temp dir.

mod support;

#[path = "support/browser.rs"]
mod browser;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
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

fn tiny_checkpoint(path: &Path) {
    let status = Command::new(weft_bin())
        .args(["models", "tiny-sd", "--seed", "0", "--out"])
        .arg(path)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "weft models tiny-sd failed");
}

/// Runs `script` in the page until it returns something other than null or false.
async fn wait_for(client: &fantoccini::Client, what: &str, script: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let value = client.execute(script, vec![]).await.unwrap_or(Value::Null);
        if !value.is_null() && value != json!(false) {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "not yet run to completion: the editor loads and shows the default graph in a manual run; queueing and the image are unverified"]
async fn the_editor_loads_shows_the_default_graph_queues_it_and_shows_the_image() {
    let frontend = frontend_dir();
    let models = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(models.path().join("checkpoints")).unwrap();
    tiny_checkpoint(&models.path().join("checkpoints").join(CHECKPOINT));
    let server = tokio::task::spawn_blocking(move || {
        Server::with(Options {
            args: vec![
                "--models-dir".into(),
                models.path().display().to_string(),
                "--comfyui-frontend".into(),
                frontend.display().to_string(),
            ],
            ..Default::default()
        })
        .with_models(models)
    })
    .await
    .unwrap();
    // A returning user: no first-run template picker, no release-notes fetch from the
    // internet; the default graph opens.
    let base = server.server.base.clone();
    let settings = json!({"Comfy.TutorialCompleted": true, "Comfy.Notification.ShowVersionUpdates": false});
    let r = tokio::task::spawn_blocking(move || {
        reqwest::blocking::Client::new()
            .post(format!("{base}/api/settings"))
            .json(&settings)
            .send()
            .unwrap()
            .status()
    })
    .await
    .unwrap();
    assert!(r.is_success());

    let browser = browser::open().await;
    let client = &browser.client;
    client.goto(&format!("{}/", server.server.base)).await.unwrap();
    let types = wait_for(
        client,
        "the default graph",
        "const g = window.app && window.app.graph; \
         return g && g._nodes.length >= 7 ? g._nodes.map(n => n.type).sort() : null",
    )
    .await;
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
    let checkpoint = client
        .execute(
            "return app.graph._nodes.find(n => n.type === 'CheckpointLoaderSimple').widgets[0].value",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        checkpoint, CHECKPOINT,
        "the default graph names the checkpoint weft lists"
    );

    // Every request the editor made to weft while loading succeeded.
    let failed = client
        .execute(
            "return performance.getEntriesByType('resource') \
               .filter(e => e.name.startsWith(location.origin) && (e.responseStatus >= 400)) \
               .map(e => e.name + ' ' + e.responseStatus)",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(failed, json!([]), "failed requests on load");

    // The default graph, at a size and step count a debug build samples quickly.
    client
        .execute(
            "const set = (type, name, v) => app.graph._nodes.find(n => n.type === type) \
               .widgets.find(w => w.name === name).value = v; \
             set('EmptyLatentImage', 'width', 64); set('EmptyLatentImage', 'height', 64); \
             set('KSampler', 'steps', 2); return true",
            vec![],
        )
        .await
        .unwrap();
    client
        .execute("app.queuePrompt(0, 1); return true", vec![])
        .await
        .unwrap();
    let size = wait_for(
        client,
        "the image in the SaveImage node",
        "const n = app.graph._nodes.find(n => n.type === 'SaveImage'); \
         const img = n && n.imgs && n.imgs[0]; \
         return img && img.complete && img.naturalWidth > 0 ? [img.naturalWidth, img.naturalHeight] : null",
    )
    .await;
    assert_eq!(size, json!([64, 64]));
    let history: Value = {
        let base = server.server.base.clone();
        tokio::task::spawn_blocking(move || {
            reqwest::blocking::get(format!("{base}/api/history"))
                .unwrap()
                .json()
                .unwrap()
        })
        .await
        .unwrap()
    };
    assert_eq!(
        history.as_object().unwrap().len(),
        1,
        "the editor's prompt ran as one job"
    );

    tokio::time::sleep(Duration::from_millis(500)).await;
    let shot = client.screenshot().await.unwrap();
    let kept = tempfile::Builder::new()
        .prefix("weft-comfy-editor-")
        .tempdir()
        .unwrap()
        .keep();
    let path = kept.join("editor.png");
    std::fs::write(&path, &shot).unwrap();
    println!("screenshot: {}", path.display());
    let image = image::load_from_memory(&shot).unwrap().to_rgb8();
    let mut colors = std::collections::HashSet::new();
    for pixel in image.pixels() {
        colors.insert(pixel.0);
    }
    assert!(
        colors.len() > 50,
        "the screenshot is not blank ({} colours)",
        colors.len()
    );
    drop(browser);
    drop(server);
}

/// The server and the models directory it reads, dropped together.
struct WithModels {
    server: Server,
    _models: tempfile::TempDir,
}

trait KeepModels {
    fn with_models(self, models: tempfile::TempDir) -> WithModels;
}

impl KeepModels for Server {
    fn with_models(self, models: tempfile::TempDir) -> WithModels {
        WithModels {
            server: self,
            _models: models,
        }
    }
}
