//! The public Python client `comfy-sdk` against the real server, used as a new user would:
//! upload, `core/ASSET` substitution, submit, events, result, download, typed errors and
//! `list_jobs`. Installs the client into a temporary venv (needs PyPI, or a pip cache).
//! `WEFT_COMFY_SDK_VENV=/path/to/venv` reuses a venv that already has it.

mod support;

use std::path::PathBuf;
use std::process::Command;

use support::Server;

/// The client version this test pins.
const COMFY_SDK: &str = "comfy-sdk==0.5.0";

const SCRIPT: &str = r#"
import struct, zlib, sys, uuid
import comfy_sdk
from comfy_sdk import Comfy
from comfy_sdk.exceptions import (
    InvalidWorkflow, IdempotencyKeyReuse, MissingAsset, NotFound, WorkflowFormatUi, ComfyError,
)

def png(width, height, rgb):
    raw = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    def chunk(kind, data):
        c = kind + data
        return struct.pack(">I", len(data)) + c + struct.pack(">I", zlib.crc32(c) & 0xFFFFFFFF)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))

steps = []
def step(name):
    steps.append(name)
    print("STEP", name, flush=True)

with Comfy() as client:
    # Upload (lazy, committed on submit) and core/ASSET substitution.
    image = client.assets.from_bytes(png(4, 3, (10, 20, 30)), filename="in.png")
    wf = client.workflows.from_json({
        "1": {"class_type": "LoadImage", "inputs": {"image": "placeholder"}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "sdk"}},
    })
    wf.set_input("1", "image", image)
    job = client.submit(wf, metadata={"suite": "sdk", "run": "a"})
    step("submit")
    assert image.id, "asset not committed"
    # The same bytes again: dedup through HEAD by-hash + from-hash.
    again = client.assets.from_bytes(png(4, 3, (10, 20, 30)), filename="again.png")
    again.commit()
    assert again.id and again.id != image.id
    step("dedup")

    kinds = []
    for ev in job.events():
        kinds.append(type(ev).__name__)
    assert kinds and kinds[-1] == "StatusChange", kinds
    step("events " + ",".join(sorted(set(kinds))))

    done = job.result()
    assert done.status == "succeeded", done.status
    outs = done.get_outputs("3")
    assert len(outs) == 1, outs
    data = outs[0].to_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:16]
    assert outs[0].size_bytes == len(data)
    head = outs[0].to_bytes(range=(0, 7))
    assert head == data[:8], head
    step("download")

    wfj = done.get_workflow()
    assert wfj.format == "api" and "3" in wfj.graph
    step("workflow")

    # Typed errors.
    try:
        client.submit(client.workflows.from_json({"1": {"class_type": "NoSuchNode", "inputs": {}}}))
        raise SystemExit("no InvalidWorkflow")
    except InvalidWorkflow:
        step("invalid_workflow")
    key = str(uuid.uuid4())
    ok = client.submit(client.workflows.from_json({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "k"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}},
    }), idempotency_key=key, metadata={"suite": "sdk", "run": "b"})
    try:
        client.submit(client.workflows.from_json({
            "1": {"class_type": "PrimitiveString", "inputs": {"value": "k"}},
            "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}},
        }), idempotency_key=key)
        raise SystemExit("no IdempotencyKeyReuse")
    except IdempotencyKeyReuse:
        step("idempotency_key_reuse")
    try:
        client.submit(client.workflows.from_json({
            "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": str(uuid.uuid4())}}}},
            "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "x"}},
        }))
        raise SystemExit("no MissingAsset")
    except MissingAsset:
        step("missing_asset")
    try:
        client.jobs.get(str(uuid.uuid4()))
        raise SystemExit("no NotFound")
    except NotFound:
        step("not_found")
    try:
        client.submit(client.workflows.from_json({"nodes": [], "links": [], "last_node_id": 0}))
        raise SystemExit("no WorkflowFormatUi")
    except WorkflowFormatUi:
        step("workflow_format_ui")
    ok.result()

    # list_jobs: newest first, label filters.
    mine = list(client.list_jobs(metadata={"suite": "sdk"}))
    assert [j.id for j in mine] == [ok.id, job.id], [j.id for j in mine]
    only_a = list(client.list_jobs(metadata={"run": "a"}))
    assert [j.id for j in only_a] == [job.id]
    every = list(client.list_jobs(limit=2))
    assert len(every) >= 2
    step("list_jobs")

    # Cancel of a terminal job returns it unchanged.
    assert ok.cancel().status == "succeeded"
    step("cancel")
print("ALL OK", " ".join(steps))
"#;

fn venv() -> PathBuf {
    if let Ok(v) = std::env::var("WEFT_COMFY_SDK_VENV") {
        return PathBuf::from(v);
    }
    let dir = tempfile::tempdir().unwrap().keep();
    let venv = dir.join("venv");
    let status = Command::new("python3")
        .args(["-m", "venv"])
        .arg(&venv)
        .status()
        .expect("python3");
    assert!(status.success(), "python3 -m venv failed");
    let out = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", COMFY_SDK])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "pip install {COMFY_SDK} failed: {}",
        String::from_utf8_lossy(&out.stderr)
            .chars()
            .take(2000)
            .collect::<String>()
    );
    venv
}

#[test]
fn comfy_sdk_client_runs_a_workflow_end_to_end() {
    let venv = venv();
    let server = Server::start();
    let out = Command::new(venv.join("bin/python"))
        .args(["-c", SCRIPT])
        .env("COMFY_BASE_URL", &server.base)
        .env_remove("COMFY_API_KEY")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let tail = |s: &str| {
        s.chars()
            .rev()
            .take(3000)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<String>()
    };
    assert!(
        out.status.success() && stdout.contains("ALL OK"),
        "the client failed\nstdout: {}\nstderr: {}",
        tail(&stdout),
        tail(&stderr)
    );
}
