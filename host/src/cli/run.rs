//! `weft run WORKFLOW.json`: submit a workflow (to `--server`, or to a server started in
//! this process on the embedded defaults), follow it with progress bars, and write its
//! outputs to `--out`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use serde_json::{json, Map, Value as Json};

use super::client::{exit, status_exit_code, Connection, Failure};
use super::follow::{follow_or_cancel, Display};
use super::ServerArgs;

/// `weft run`.
#[derive(Args)]
pub(crate) struct RunArgs {
    /// The workflow, in ComfyUI's API format (or `{"workflow": ..., "metadata": ...}`).
    workflow: PathBuf,
    #[command(flatten)]
    server: ServerArgs,
    /// Overrides a literal input: NODE.INPUT=VALUE (VALUE is read as JSON when it parses,
    /// else as a string). Repeatable.
    #[arg(long = "set", value_name = "NODE.INPUT=VALUE")]
    set: Vec<String>,
    /// Uploads FILE and puts its asset reference in NAME: an input `NODE.INPUT`, or every
    /// `core/ASSET` reference whose id is NAME. Repeatable.
    #[arg(long = "input", value_name = "NAME=FILE")]
    inputs: Vec<String>,
    /// A label on the job: KEY=VALUE. Repeatable.
    #[arg(long = "label", value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// Directory the outputs are written to.
    #[arg(long, default_value = ".")]
    out: PathBuf,
    /// Without --server: the data directory of the in-process server (default: a temporary
    /// one, removed afterwards).
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

/// Runs `weft run`; returns the exit code.
pub(crate) fn main(args: RunArgs, runtime: &tokio::runtime::Runtime) -> i32 {
    let json_output = args.server.json;
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(failure) => failure.report(json_output),
    }
}

/// A temporary data directory, removed on drop.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Starts a server in this process on a free loopback port, with `weft serve`'s defaults
/// (and its WEFT_* environment) and no authentication.
async fn embedded(data_dir: Option<PathBuf>) -> Result<(SocketAddr, Option<TempDir>), Failure> {
    let (dir, temp) = match data_dir {
        Some(dir) => (dir, None),
        None => {
            let dir = std::env::temp_dir().join(format!("weft-run-{}", uuid::Uuid::new_v4().simple()));
            (dir.clone(), Some(TempDir(dir)))
        }
    };
    let config = crate::embedded_serve_config(&dir).map_err(|e| Failure::new(exit::OTHER, format!("{e:#}")))?;
    let addr = weft::serve::start_embedded(config)
        .await
        .map_err(|e| Failure::new(exit::OTHER, format!("starting the in-process server: {e:#}")))?;
    Ok((addr, temp))
}

/// Reads the workflow file: the graph and any labels it carries.
fn read_workflow(path: &Path) -> Result<(Json, Map<String, Json>), Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Failure::validation(format!("cannot read {}: {e}", path.display())))?;
    let value: Json = serde_json::from_str(&text)
        .map_err(|e| Failure::validation(format!("{} is not valid JSON: {e}", path.display())))?;
    match value {
        Json::Object(mut body) if body.get("workflow").is_some_and(Json::is_object) => {
            let metadata = match body.remove("metadata") {
                Some(Json::Object(m)) => m,
                _ => Map::new(),
            };
            Ok((body.remove("workflow").unwrap_or_default(), metadata))
        }
        other => Ok((other, Map::new())),
    }
}

/// `NODE.INPUT` of `workflow`, which must name a node with inputs.
fn input_slot<'a>(workflow: &'a mut Json, target: &str) -> Result<&'a mut Json, Failure> {
    let (node, input) = target
        .split_once('.')
        .ok_or_else(|| Failure::validation(format!("{target:?} is not NODE.INPUT")))?;
    let inputs = workflow
        .get_mut(node)
        .and_then(|n| n.get_mut("inputs"))
        .and_then(Json::as_object_mut)
        .ok_or_else(|| Failure::validation(format!("the workflow has no node {node:?} with inputs")))?;
    Ok(inputs.entry(input.to_string()).or_insert(Json::Null))
}

/// Applies the `--set NODE.INPUT=VALUE` overrides.
fn apply_sets(workflow: &mut Json, sets: &[String]) -> Result<(), Failure> {
    for set in sets {
        let (target, value) = set
            .split_once('=')
            .ok_or_else(|| Failure::validation(format!("--set {set:?}: expected NODE.INPUT=VALUE")))?;
        let value = serde_json::from_str(value).unwrap_or_else(|_| Json::String(value.to_string()));
        *input_slot(workflow, target)? = value;
    }
    Ok(())
}

/// The interface's reference to asset `id`.
fn asset_ref(id: &str) -> Json {
    json!({"__type": "core/ASSET", "info": {"id": id}})
}

/// Puts asset `id` where `name` says: input `NODE.INPUT`, or every asset reference whose
/// id is `name`. Returns how many places took it.
fn substitute_asset(workflow: &mut Json, name: &str, id: &str) -> usize {
    if name.contains('.') {
        if let Ok(slot) = input_slot(workflow, name) {
            *slot = asset_ref(id);
            return 1;
        }
    }
    let mut count = 0;
    for node in workflow.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
        for value in node
            .get_mut("inputs")
            .and_then(Json::as_object_mut)
            .into_iter()
            .flat_map(|i| i.values_mut())
        {
            if value["__type"] == "core/ASSET" && value["info"]["id"] == name {
                *value = asset_ref(id);
                count += 1;
            }
        }
    }
    count
}

/// Submits, retrying a lost connection with the same idempotency key (a job the first try
/// did create is then found through the key).
async fn submit(conn: &Connection, body: &Json) -> Result<Json, Failure> {
    let key = uuid::Uuid::new_v4().to_string();
    let mut attempt = 0;
    loop {
        match conn.post("/jobs", body, Some(&key)).await {
            Ok(job) => return Ok(job),
            Err(f) if f.is_connection() && attempt < 3 => {
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(500 * attempt)).await;
            }
            Err(f) => {
                let reused = f.body.as_ref().and_then(|b| b["error"]["details"]["job_id"].as_str());
                if let (true, Some(id)) = (attempt > 0, reused) {
                    return conn.get(&format!("/jobs/{id}")).await;
                }
                return Err(f);
            }
        }
    }
}

/// A file name of this machine for an output's `name`: its last component, kept to safe
/// characters.
fn local_name(name: &str, fallback: &str) -> String {
    let last = name.rsplit(['/', '\\']).next().unwrap_or("");
    let clean: String = last
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.trim_matches('.').is_empty() {
        fallback.to_string()
    } else {
        clean
    }
}

/// Downloads the outputs of `job` into `out`; returns the files written.
pub(crate) async fn download_outputs(conn: &Connection, job: &Json, out: &Path) -> Result<Vec<PathBuf>, Failure> {
    let outputs = job["outputs"].as_array().cloned().unwrap_or_default();
    if outputs.is_empty() {
        return Ok(Vec::new());
    }
    std::fs::create_dir_all(out).map_err(|e| Failure::new(exit::OTHER, format!("creating {}: {e}", out.display())))?;
    let mut written: Vec<PathBuf> = Vec::new();
    for (i, output) in outputs.iter().enumerate() {
        let fallback = format!("output_{i}");
        let mut name = local_name(output["name"].as_str().unwrap_or(""), &fallback);
        if written
            .iter()
            .any(|p| p.file_name().is_some_and(|f| f.to_string_lossy() == name))
        {
            name = format!("{i}_{name}");
        }
        let dest = out.join(&name);
        let url = output["url"]
            .as_str()
            .ok_or_else(|| Failure::new(exit::OTHER, "an output has no url"))?;
        conn.download(url, &dest).await?;
        written.push(dest);
    }
    Ok(written)
}

/// Prints the end of a job: a summary (or the job as JSON with `files`).
pub(crate) fn print_result(job: &Json, files: &[PathBuf], json_output: bool) {
    if json_output {
        let mut body = job.clone();
        body["files"] = json!(files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>());
        println!("{body}");
        return;
    }
    let seconds = |v: &Json| v.as_f64().map(|ms| format!("{:.2} s", ms / 1000.0));
    let status = job["status"].as_str().unwrap_or("?");
    println!(
        "job {} {status}{}",
        job["id"].as_str().unwrap_or(""),
        match (
            seconds(&job["metrics"]["queue_ms"]),
            seconds(&job["metrics"]["execution_ms"])
        ) {
            (Some(q), Some(x)) => format!(" (queued {q}, ran {x})"),
            _ => String::new(),
        }
    );
    let outputs = job["outputs"].as_array().cloned().unwrap_or_default();
    for (output, file) in outputs.iter().zip(files) {
        println!(
            "  {}  {} bytes, {}",
            file.display(),
            output["size_bytes"].as_u64().unwrap_or(0),
            output["content_type"].as_str().unwrap_or("")
        );
    }
    if let Some(error) = job["error"].as_object() {
        eprintln!(
            "error: {}: {}{}",
            error.get("code").and_then(Json::as_str).unwrap_or(""),
            error.get("message").and_then(Json::as_str).unwrap_or(""),
            error
                .get("node_id")
                .and_then(Json::as_str)
                .map(|n| format!(" (node {n})"))
                .unwrap_or_default()
        );
        if let Some(traceback) = error.get("traceback").and_then(Json::as_str) {
            eprintln!("{traceback}");
        }
    }
}

async fn run(args: RunArgs) -> Result<i32, Failure> {
    let (mut workflow, mut metadata) = read_workflow(&args.workflow)?;
    apply_sets(&mut workflow, &args.set)?;
    for label in &args.labels {
        let (k, v) = label
            .split_once('=')
            .ok_or_else(|| Failure::validation(format!("--label {label:?}: expected KEY=VALUE")))?;
        metadata.insert(k.to_string(), json!(v));
    }
    let (conn, _temp) = match &args.server.server {
        Some(server) => (Connection::new(server, args.server.api_key.clone())?, None),
        None => {
            let (addr, temp) = embedded(args.data_dir.clone()).await?;
            (Connection::new(&format!("http://{addr}"), None)?, temp)
        }
    };
    for input in &args.inputs {
        let (name, file) = input
            .split_once('=')
            .ok_or_else(|| Failure::validation(format!("--input {input:?}: expected NAME=FILE")))?;
        let asset = conn.upload(Path::new(file)).await?;
        let id = asset["id"].as_str().unwrap_or("");
        if substitute_asset(&mut workflow, name, id) == 0 {
            return Err(Failure::validation(format!(
                "--input {name}: the workflow has no input {name} (NODE.INPUT) and no asset reference with id {name:?}"
            )));
        }
    }
    let job = submit(&conn, &json!({"workflow": workflow, "metadata": metadata})).await?;
    let id = job["id"].as_str().unwrap_or("").to_string();
    let display = Display::new(args.server.json);
    display.status(&job);
    let job = follow_or_cancel(&conn, &id, &display).await;
    display.finish();
    let job = job?;
    let files = download_outputs(&conn, &job, &args.out).await?;
    print_result(&job, &files, args.server.json);
    Ok(status_exit_code(job["status"].as_str().unwrap_or("")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_parse_json_or_take_strings() {
        let mut wf = json!({"1": {"class_type": "X", "inputs": {"a": 1}}});
        apply_sets(&mut wf, &["1.a=5".into(), "1.b=hello".into(), "1.c=[1,2]".into()]).unwrap();
        assert_eq!(wf["1"]["inputs"], json!({"a": 5, "b": "hello", "c": [1, 2]}));
        assert!(apply_sets(&mut wf, &["9.a=1".into()]).is_err());
        assert!(apply_sets(&mut wf, &["1a=1".into()]).is_err());
    }

    #[test]
    fn assets_go_into_named_inputs_or_placeholders() {
        let mut wf = json!({
            "1": {"class_type": "LoadImage", "inputs": {"image": asset_ref("photo")}},
            "2": {"class_type": "LoadImage", "inputs": {"image": null}}
        });
        assert_eq!(substitute_asset(&mut wf, "photo", "a1"), 1);
        assert_eq!(wf["1"]["inputs"]["image"]["info"]["id"], "a1");
        assert_eq!(substitute_asset(&mut wf, "2.image", "a2"), 1);
        assert_eq!(wf["2"]["inputs"]["image"]["info"]["id"], "a2");
        assert_eq!(substitute_asset(&mut wf, "nothing", "a3"), 0);
    }

    #[test]
    fn output_names_stay_in_the_out_dir() {
        assert_eq!(local_name("../../etc/passwd", "x"), "passwd");
        assert_eq!(local_name("a b.png", "x"), "a_b.png");
        assert_eq!(local_name("..", "x"), "x");
    }
}
