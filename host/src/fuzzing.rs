//! Entry points for the fuzz targets in `fuzz/` and for their regression replays
//! (`tests/fuzz_regressions.rs`). Each takes arbitrary bytes, feeds them to one reader of
//! untrusted input the way a request or a guest does, and checks what must hold of the
//! answer. A panic in any of them is a bug: bad input must be a clean error.
//!
//! The readers that need context share one per process: a data directory under the system
//! temporary directory (`weft-fuzz-<pid>`), a single-threaded Tokio runtime, the asset store,
//! and the built-in plugins' catalogue (compiled once, cached in `weft-fuzz-cache`).

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use arbitrary::{Arbitrary, Unstructured};
use bytes::Bytes;
use wasmtime::component::{Resource, ResourceTable};
use weft_compute::image::{ImageBatch, MaskBatch};
use weft_compute::values::{AudioClip, LatentBatch};

use crate::jobs::assets::Assets;
use crate::jobs::outputs::{self, JobFiles};
use crate::runtime::worlds::v0_2::{wit, V0_2};
use crate::runtime::worlds::{lift_result, lower};
use crate::runtime::{Catalog, Held, JobMemory, NodeDef, Runtime, RuntimeConfig, Value};
use crate::store::blobs::LocalBlobs;

/// The boundary the multipart targets' bodies are framed with.
pub const BOUNDARY: &str = "weftfuzzboundary";

/// Largest file part the multipart targets accept (small, so the size checks are reached).
const MAX_UPLOAD: u64 = 64 * 1024;

/// The allocation cap of the image decode target (a tenant's budget is larger; the checks
/// are the same).
const MAX_DECODE_ALLOC: u64 = 32 * 1024 * 1024;

/// Bytes of guest results the WIT target lets through (the call limit, small).
const RETURNED_LIMIT: usize = 64 * 1024;

/// What the targets that need a server's pieces share.
struct Context {
    dir: PathBuf,
    tokio: tokio::runtime::Runtime,
    store: Arc<dyn crate::store::Store>,
    assets: Arc<Assets>,
}

fn context() -> &'static Context {
    static CONTEXT: OnceLock<Context> = OnceLock::new();
    CONTEXT.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("weft-fuzz-{}", std::process::id()));
        let tokio = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a Tokio runtime");
        std::fs::create_dir_all(&dir).expect("creating the fuzz directory");
        let store = tokio
            .block_on(crate::serve::open_store(&crate::store::Database::parse(None, &dir)))
            .expect("opening the fuzz store");
        let blobs = Arc::new(LocalBlobs::open(&dir.join("blobs")).expect("opening the fuzz blobs"));
        std::fs::create_dir_all(dir.join("v2m-tmp")).expect("creating the v2m temporary directory");
        Context {
            assets: Arc::new(Assets::new(store.clone(), blobs)),
            store,
            dir,
            tokio,
        }
    })
}

fn runtime() -> &'static Arc<Runtime> {
    static RUNTIME: OnceLock<Arc<Runtime>> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        let config = RuntimeConfig {
            cache_dir: Some(std::env::temp_dir().join("weft-fuzz-cache")),
            concurrent_calls: 1,
            ..RuntimeConfig::default()
        };
        Runtime::load(config).expect("loading the built-in plugins")
    })
}

fn catalog() -> &'static Catalog {
    static CATALOG: OnceLock<Catalog> = OnceLock::new();
    CATALOG.get_or_init(|| runtime().catalog().into_owned())
}

/// Builds what [`comfy_request`] shares across inputs (the data directory, the store, the
/// built-in plugins compiled and the routes), so a fuzz target's `init` pays for it once,
/// before libFuzzer's per-input timeout starts.
pub fn prepare_comfy_request() {
    server_routes();
}

/// Loads the built-in plugins' catalogue that [`workflow`] validates against, for a fuzz
/// target's `init` (see [`prepare_comfy_request`]).
pub fn prepare_workflow() {
    catalog();
}

/// The workflow parser and validator: `data` as a submitted workflow, checked against the
/// built-in catalogue. An invalid workflow lists at most the validator's cap of errors.
pub fn workflow(data: &[u8]) {
    let Ok(json) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let _ = crate::graph::asset_refs(&json);
    if let Err(crate::graph::GraphError::Invalid {
        node_errors, errors, ..
    }) = crate::graph::validate(&json, catalog())
    {
        let listed = node_errors.values().map(Vec::len).sum::<usize>() + errors.len();
        assert!(listed <= 100, "{listed} errors listed, over the cap");
        let body = serde_json::to_string(&node_errors).expect("errors serialise");
        assert!(
            body.len() <= 64 * 1024 + 16 * data.len(),
            "{} bytes of errors for a {}-byte workflow",
            body.len(),
            data.len()
        );
    }
}

/// The upload form reader (`POST /api/v2/assets`): `data` as a `multipart/form-data` body
/// framed with [`BOUNDARY`], read through warp's multipart filter into the asset store.
pub fn upload_form(data: &[u8]) {
    let context = context();
    context.tokio.block_on(async {
        let filter = warp::multipart::form().max_length(None);
        let form = warp::test::request()
            .method("POST")
            .header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"))
            .body(data)
            .filter(&filter)
            .await;
        let Ok(form) = form else { return };
        if let Ok((upload, details)) =
            crate::api::assets::read_upload_form(&context.assets, MAX_UPLOAD, "fuzz".into(), form).await
        {
            assert!(upload.size() <= MAX_UPLOAD, "an upload over the limit was accepted");
            assert!(!details.file_path.is_empty());
        }
    });
}

/// The video-to-music form reader (`POST /api/v2/video-to-music`): after a first byte that
/// picks a chunk size, `data` as a `multipart/form-data` body framed with [`BOUNDARY`],
/// arriving in chunks of that size (so part boundaries fall across chunks).
pub fn v2m_form(data: &[u8]) {
    let Some((&chunk, body)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let chunks: Vec<Result<Bytes, warp::Error>> = body.chunks(chunk).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
    let context = context();
    let temp = weft_v2m::TempVideo::new(&context.dir.join("v2m-tmp"));
    let content_type = format!("multipart/form-data; boundary={BOUNDARY}");
    context.tokio.block_on(async {
        let form =
            crate::api::v2m::form::read_form(temp, MAX_UPLOAD, Some(&content_type), futures::stream::iter(chunks))
                .await;
        if let Ok(form) = form {
            if let Some((video, _)) = &form.upload {
                let size = std::fs::metadata(video.path()).map(|m| m.len()).unwrap_or(0);
                assert!(size <= MAX_UPLOAD, "a {size}-byte video over the limit was kept");
            }
        }
    });
}

/// The safetensors readers: `data` as a checkpoint file (header index and SD1 layout
/// detection, as `weft models` and the checkpoint loaders read it) and as a ComfyUI
/// `.latent` file (`LoadLatent`).
pub fn safetensors(data: &[u8]) {
    let path = context()
        .dir
        .join(format!("checkpoint-{:?}.safetensors", std::thread::current().id()));
    std::fs::write(&path, data).expect("writing the fuzz checkpoint");
    if let Ok(index) = weft_compute::models::SafetensorsIndex::open(&path, 1024 * 1024) {
        for info in index.tensors.values() {
            assert!(
                info.range.0 <= info.range.1 && info.range.1 <= index.file_len,
                "a tensor outside the file was accepted"
            );
        }
    }
    let _ = weft_compute::diffusion::detect_layout(&path);
    if let Ok(latent) = weft_compute::diffusion::latent::read_latent_file(data) {
        let values: u64 = latent.shape.iter().map(|&d| u64::from(d)).product();
        assert_eq!(
            values,
            latent.data.len() as u64,
            "a latent's data does not match its shape"
        );
    }
}

/// The image decode path of `LoadImage`: the peak estimate read from the header, then the
/// decode itself under an allocation cap.
pub fn image_decode(data: &[u8]) {
    let _ = weft_compute::image::decode_peak_bytes(data);
    if let Ok((image, mask)) = weft_compute::image::decode(data, MAX_DECODE_ALLOC) {
        let pixels = image.width as usize * image.height as usize;
        assert_eq!(image.data.len(), pixels * 3);
        assert_eq!(mask.data.len(), pixels);
    }
}

/// The value conversions at the WIT boundary (`weft:node@0.2.0`): host values lowered into
/// a call's resource table, then a guest result built from `data` (with the handles it was
/// given, forged ones and the wrong kinds) lifted back, its files named as the output commit
/// names them; and a guest's node definition converted for the catalogue.
pub fn wit_values(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = wit_values_from(&mut u);
}

fn wit_values_from(u: &mut Unstructured) -> arbitrary::Result<()> {
    let mut table = ResourceTable::new();
    let mut given = Vec::new();
    for _ in 0..u.int_in_range(0..=4)? {
        let value = host_value(u)?;
        given.push(
            lower::<V0_2>(&mut table, value)
                .expect("a fresh table takes a handle")
                .expect("0.2.0 carries every value"),
        );
    }
    let mut reps: Vec<u32> = given.iter().filter_map(rep_of).collect();
    reps.push(u32::arbitrary(u)?);
    let result = wit::NodeResult {
        outputs: (0..u.int_in_range(0..=6)?)
            .map(|_| guest_value(u, &reps))
            .collect::<arbitrary::Result<_>>()?,
        files: (0..u.int_in_range(0..=4)?)
            .map(|_| guest_file(u, &reps))
            .collect::<arbitrary::Result<_>>()?,
    };
    if let Ok(Ok(output)) = lift_result::<V0_2>(&mut table, result, RETURNED_LIMIT) {
        let mut job = JobFiles::default();
        for file in &output.files {
            for index in 0..file.data.files().min(4) {
                if let Ok(f) = outputs::encode(file, index, &mut job, "{}", weft_compute::interrupt::Interrupt::NEVER) {
                    assert!(
                        !f.name.starts_with('/') && f.name.split('/').all(|s| !s.is_empty() && s != "." && s != ".."),
                        "output name {:?} escapes its folder",
                        f.name
                    );
                    assert!(
                        !f.name.chars().any(char::is_control),
                        "output name {:?} has a control",
                        f.name
                    );
                }
            }
        }
    }
    let def = wit::NodeDef {
        class_type: String::arbitrary(u)?,
        display_name: String::arbitrary(u)?,
        category: String::arbitrary(u)?,
        description: String::arbitrary(u)?,
        inputs: (0..u.int_in_range(0..=3)?)
            .map(|_| input_spec(u))
            .collect::<arbitrary::Result<_>>()?,
        outputs: (0..u.int_in_range(0..=3)?)
            .map(|_| {
                Ok(wit::OutputSpec {
                    type_name: String::arbitrary(u)?,
                    name: String::arbitrary(u)?,
                    is_list: bool::arbitrary(u)?,
                    tooltip: Option::arbitrary(u)?,
                })
            })
            .collect::<arbitrary::Result<_>>()?,
        output_node: bool::arbitrary(u)?,
        deterministic: bool::arbitrary(u)?,
    };
    if let Ok(def) = NodeDef::from_wit(def, "fuzz") {
        let _ = def.object_info();
    }
    Ok(())
}

fn input_spec(u: &mut Unstructured) -> arbitrary::Result<wit::InputSpec> {
    Ok(wit::InputSpec {
        name: String::arbitrary(u)?,
        type_name: String::arbitrary(u)?,
        required: bool::arbitrary(u)?,
        default: Option::arbitrary(u)?,
        min: Option::arbitrary(u)?,
        max: Option::arbitrary(u)?,
        step: Option::arbitrary(u)?,
        options: Vec::arbitrary(u)?,
        multiline: bool::arbitrary(u)?,
        tooltip: Option::arbitrary(u)?,
        model_folder: Option::arbitrary(u)?,
    })
}

/// A small host value of any kind, as a node input.
fn host_value(u: &mut Unstructured) -> arbitrary::Result<Value> {
    let charge = |bytes: u64| {
        JobMemory::unlimited()
            .charge(bytes, String::new)
            .expect("an unlimited budget")
    };
    let side = u.int_in_range(1..=4u32)?;
    let batch = u.int_in_range(1..=3u32)?;
    let pixels = (side * side * batch) as usize;
    Ok(match u.int_in_range(0..=7)? {
        0 => Value::Int(i64::arbitrary(u)?),
        1 => Value::Float(f64::arbitrary(u)?),
        2 => Value::Text(String::arbitrary(u)?),
        3 => Value::Image(Arc::new(Held::new(
            ImageBatch {
                width: side,
                height: side,
                batch,
                channels: 3,
                data: vec![0.5; pixels * 3],
            },
            charge(pixels as u64 * 12),
        ))),
        4 => Value::Mask(Arc::new(Held::new(
            MaskBatch {
                width: side,
                height: side,
                batch,
                data: vec![0.5; pixels],
            },
            charge(pixels as u64 * 4),
        ))),
        5 => Value::Latent(Arc::new(Held::new(
            LatentBatch {
                shape: [batch, 4, side, side],
                data: vec![0.5; pixels * 4],
                noise_mask: None,
                batch_index: None,
            },
            charge(pixels as u64 * 16),
        ))),
        6 => Value::Audio(Arc::new(Held::new(
            AudioClip {
                sample_rate: 8000,
                channels: batch,
                samples: vec![0.25; pixels],
            },
            charge(pixels as u64 * 4),
        ))),
        _ => Value::Bool(bool::arbitrary(u)?),
    })
}

/// The table index of a lowered handle.
fn rep_of(value: &wit::Value) -> Option<u32> {
    match value {
        wit::Value::Image(r) => Some(r.rep()),
        wit::Value::Latent(r) => Some(r.rep()),
        wit::Value::Mask(r) => Some(r.rep()),
        wit::Value::Audio(r) => Some(r.rep()),
        wit::Value::Handle(r) => Some(r.rep()),
        _ => None,
    }
}

/// A handle a guest could send: one it was given, or a forged one, of a kind picked by the
/// caller (so of the wrong kind too). Always owned: the canonical ABI lifts a result's
/// `own<T>` handles as owned (a borrowed one there was a harness bug the fuzzer found,
/// kept in `fuzz/regressions/wit_values`).
fn handle<T: 'static>(u: &mut Unstructured, reps: &[u32]) -> arbitrary::Result<Resource<T>> {
    Ok(Resource::new_own(*u.choose(reps)?))
}

fn guest_value(u: &mut Unstructured, reps: &[u32]) -> arbitrary::Result<wit::Value> {
    Ok(match u.int_in_range(0..=10)? {
        0 => wit::Value::Int(i64::arbitrary(u)?),
        1 => wit::Value::Float(f64::arbitrary(u)?),
        2 => wit::Value::Boolean(bool::arbitrary(u)?),
        3 => wit::Value::Text(String::arbitrary(u)?),
        4 => wit::Value::Json(String::arbitrary(u)?),
        5 => wit::Value::Asset(wit::AssetRef {
            id: String::arbitrary(u)?,
            hash: Option::arbitrary(u)?,
            file_path: Option::arbitrary(u)?,
        }),
        6 => wit::Value::Image(handle(u, reps)?),
        7 => wit::Value::Latent(handle(u, reps)?),
        8 => wit::Value::Mask(handle(u, reps)?),
        9 => wit::Value::Audio(handle(u, reps)?),
        _ => wit::Value::Handle(handle(u, reps)?),
    })
}

fn guest_file(u: &mut Unstructured, reps: &[u32]) -> arbitrary::Result<wit::OutputFile> {
    let kind = *u.choose(&[
        wit::OutputKind::Image,
        wit::OutputKind::Video,
        wit::OutputKind::Audio,
        wit::OutputKind::Text,
        wit::OutputKind::File,
        wit::OutputKind::Latent,
    ])?;
    let data = match u.int_in_range(0..=4)? {
        0 => wit::FileData::Bytes(Vec::arbitrary(u)?),
        1 => wit::FileData::Png(handle(u, reps)?),
        2 => wit::FileData::Wav(handle(u, reps)?),
        3 => wit::FileData::AnimatedPng(wit::ApngFrames {
            frames: handle(u, reps)?,
            frame_ms: u32::arbitrary(u)?,
            compress_level: u8::arbitrary(u)?,
        }),
        _ => wit::FileData::Latent(handle(u, reps)?),
    };
    Ok(wit::OutputFile {
        kind,
        filename_prefix: String::arbitrary(u)?,
        extension: String::arbitrary(u)?,
        content_type: String::arbitrary(u)?,
        data,
        temporary: bool::arbitrary(u)?,
    })
}

/// The server's routes on the fuzz context's store, with a job service that queues jobs and
/// never runs them: what a ComfyUI client reaches over HTTP.
fn server_routes() -> &'static warp::filters::BoxedFilter<(warp::reply::Response,)> {
    static ROUTES: OnceLock<warp::filters::BoxedFilter<(warp::reply::Response,)>> = OnceLock::new();
    ROUTES.get_or_init(|| {
        let context = context();
        let (assets, store) = (context.assets.clone(), context.store.clone());
        let config = crate::api::ApiConfig {
            auth: crate::api::AuthMode::None,
            surface: crate::api::Surface::SelfHosted,
            public_demo: false,
            mount_prefix: String::new(),
            max_upload_bytes: MAX_UPLOAD,
            max_json_bytes: 1 << 20,
            json_parse_budget_bytes: 64 << 20,
            max_streams: 16,
            tenant_max_streams: 16,
            public_url: None,
            allowed_origins: Vec::new(),
            admin_token: None,
            v2m: Default::default(),
            comfyui_frontend: None,
        };
        let state = Arc::new(crate::api::AppState {
            json_budget: crate::api::body::ParseBudget::new(config.json_parse_budget_bytes),
            config,
            store: store.clone(),
            assets: assets.clone(),
            jobs: OnceLock::new(),
            links: crate::api::links::Links::new(
                "http://127.0.0.1:8188",
                "",
                [7; 32],
                std::time::Duration::from_secs(60),
            ),
            streams: Default::default(),
            tenant_streams: Default::default(),
            stopped: Default::default(),
            v2m: None,
            sessions: Default::default(),
            logins: Default::default(),
            settings_locks: Default::default(),
        });
        let jobs = context.tokio.block_on(async {
            let config = crate::jobs::JobsConfig {
                queue_depth: 64,
                tenant_queue_depth: 64,
                ..Default::default()
            };
            crate::jobs::Jobs::new(store, assets, runtime().clone(), config)
        });
        let _ = state.jobs.set(jobs);
        crate::api::routes(state)
    })
}

/// What [`comfy_request`] sends, picked by the input's first byte; `{}` is replaced by the
/// input's first line, the rest of the input is the body.
const COMFY_REQUESTS: &[(&str, &str)] = &[
    ("POST", "/prompt"),
    ("POST", "/userdata/{}?overwrite=true"),
    ("GET", "/userdata?dir={}&recurse=true&split=true"),
    ("GET", "/userdata/{}"),
    ("POST", "/userdata/{}/move/renamed.json"),
    ("DELETE", "/userdata/{}"),
    ("GET", "/v2/userdata?path={}"),
    ("POST", "/settings"),
    ("POST", "/settings/{}"),
    ("POST", "/upload/image"),
    ("POST", "/upload/mask"),
    ("GET", "/view?{}"),
    ("POST", "/queue"),
    ("POST", "/interrupt"),
    ("POST", "/history"),
    ("GET", "/history?{}"),
    ("POST", "/api/v2/jobs"),
    ("WS", "/ws?{}"),
];

/// ComfyUI's protocol as a client speaks it: `/prompt` bodies, user-data paths and files,
/// settings, upload forms (framed with [`BOUNDARY`]), `/view` queries and `/ws` frames, sent
/// to the real routes. No answer may be a 5xx, and no user-data file may be stored under a
/// name the path rules refuse.
pub fn comfy_request(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let (method, template) = COMFY_REQUESTS[usize::from(pick) % COMFY_REQUESTS.len()];
    let (arg, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(i) => (&rest[..i], &rest[i + 1..]),
        None => (rest, &[][..]),
    };
    let Ok(arg) = std::str::from_utf8(arg) else {
        return;
    };
    let path = template.replace("{}", arg);
    if path.parse::<warp::http::Uri>().is_err() {
        return;
    }
    let routes = server_routes();
    let context = context();
    context.tokio.block_on(async {
        if method == "WS" {
            return websocket_frames(routes, &path, body).await;
        }
        let mut request = warp::test::request().method(method).path(&path).body(body);
        if path.starts_with("/upload/") {
            request = request.header("content-type", format!("multipart/form-data; boundary={BOUNDARY}"));
        }
        let response = request.reply(routes).await;
        assert!(
            !response.status().is_server_error(),
            "{method} {path} answered {}: {}",
            response.status(),
            String::from_utf8_lossy(response.body())
        );
        if template.starts_with("/userdata/") && method == "POST" {
            let files = context
                .store
                .user_files("default", "")
                .await
                .expect("listing user files");
            for file in files {
                assert!(
                    crate::api::comfy::user_path_is_allowed(&file.path),
                    "a user file was stored as {:?}",
                    file.path
                );
            }
        }
    });
}

/// Opens `/ws` at `path`, sends `frame` as a client's text frame and as a binary one, reads
/// what the server sends first, then closes the socket and waits for the server to close
/// its side (warp's test client panics if it is dropped while the server still sends).
async fn websocket_frames(routes: &warp::filters::BoxedFilter<(warp::reply::Response,)>, path: &str, frame: &[u8]) {
    let Ok(mut socket) = warp::test::ws().path(path).handshake(routes.clone()).await else {
        return;
    };
    socket.send_text(String::from_utf8_lossy(frame)).await;
    socket.send(warp::ws::Message::binary(frame.to_vec())).await;
    socket.send(warp::ws::Message::close()).await;
    let wait = std::time::Duration::from_secs(2);
    loop {
        match tokio::time::timeout(wait, socket.recv()).await {
            Ok(Ok(_)) => continue,
            Ok(Err(_)) => return,
            Err(_) => {
                // The server did not close within the wait: keep the client, so that what it
                // still sends has somewhere to go.
                std::mem::forget(socket);
                return;
            }
        }
    }
}

/// The scan that bounds a JSON body before it is parsed: it never panics, and for any text
/// that parses, it counts what the parse holds (keys, values and the widest object), so the
/// bounds and the memory estimate are those of the real value. Duplicate keys are the one
/// difference: a parse keeps one of them (and its value), the scan counts each, so it never
/// counts less.
pub fn json_body(data: &[u8]) {
    let scanned = crate::api::body::Shape::scan(data);
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    let parsed = crate::api::body::Shape::of(&value);
    let text = || String::from_utf8_lossy(data).into_owned();
    assert!(
        scanned.keys >= parsed.keys && scanned.widest_object >= parsed.widest_object && scanned.values >= parsed.values,
        "scanned {scanned:?}, parsed {parsed:?}: {}",
        text()
    );
    if scanned.keys == parsed.keys {
        assert_eq!(scanned, parsed, "{}", text());
    }
}
