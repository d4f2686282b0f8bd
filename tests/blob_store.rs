//! Black-box tests of weft with its blobs in S3 (`--blob-dir s3://bucket/prefix`), against
//! moto's S3-compatible server started by each test (installed by `scripts/moto.sh`). The
//! local folder backend, shared by several processes, is what every other test file uses
//! (`tests/scaleout.rs` shares one across processes).

mod support;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Options, Server};

/// moto's S3 server on a free port, killed on drop.
struct Moto {
    child: Child,
    endpoint: String,
    http: reqwest::blocking::Client,
}

impl Moto {
    fn start() -> Moto {
        let setup = Command::new(support::root().join("scripts/moto.sh"))
            .output()
            .expect("running scripts/moto.sh");
        assert!(
            setup.status.success(),
            "scripts/moto.sh failed: {}",
            String::from_utf8_lossy(&setup.stderr)
        );
        let binary = support::root().join(String::from_utf8(setup.stdout).unwrap().trim());
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(binary)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting moto_server");
        let moto = Moto {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            http: reqwest::blocking::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while moto.http.get(&moto.endpoint).send().is_err() {
            assert!(Instant::now() < deadline, "moto_server did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        moto
    }

    /// Creates `bucket` (moto takes unsigned requests).
    fn create_bucket(&self, bucket: &str) {
        let r = self.http.put(format!("{}/{bucket}", self.endpoint)).send().unwrap();
        assert!(r.status().is_success(), "creating bucket {bucket}: {}", r.status());
    }

    /// The keys in `bucket`.
    fn keys(&self, bucket: &str) -> Vec<String> {
        let text = self
            .http
            .get(format!("{}/{bucket}?list-type=2", self.endpoint))
            .send()
            .unwrap()
            .text()
            .unwrap();
        let key = regex::Regex::new("<Key>([^<]*)</Key>").unwrap();
        key.captures_iter(&text).map(|c| c[1].to_string()).collect()
    }

    /// `weft serve` with its blobs in `s3://bucket/blobs`, plus `args`.
    /// The variables that point weft at this server.
    fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT_URL", self.endpoint.as_str()),
            ("AWS_ACCESS_KEY_ID", "test"),
            ("AWS_SECRET_ACCESS_KEY", "test"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ALLOW_HTTP", "true"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    fn weft(&self, bucket: &str, args: &[&str]) -> Server {
        let mut all = vec!["--blob-dir".to_string(), format!("s3://{bucket}/blobs")];
        all.extend(args.iter().map(|a| a.to_string()));
        Server::with(Options {
            args: all,
            env: self.env(),
            ..Default::default()
        })
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The S3 key of blob `hash` (`blake3:<hex>`) under the `blobs` prefix.
fn key_of(hash: &Value) -> String {
    let hex = hash.as_str().unwrap().trim_start_matches("blake3:");
    format!("blobs/{}/{hex}", &hex[..2])
}

fn png(pixel: [u8; 4]) -> Vec<u8> {
    let image = image::RgbaImage::from_pixel(4, 3, image::Rgba(pixel));
    let mut out = Vec::new();
    image
        .write_to(&mut std::io::Cursor::new(&mut out), image::ImageFormat::Png)
        .unwrap();
    out
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn uploads_job_inputs_outputs_and_ranged_reads_go_through_s3_and_deleting_removes_the_object() {
    let moto = Moto::start();
    moto.create_bucket("weft");
    // Every output an object (no output kept inline in the database).
    let server = moto.weft("weft", &["--inline-output-kib", "0"]);

    let picture = png([0, 0, 255, 255]);
    let asset = server.upload("photo.png", picture.clone());
    let asset_key = key_of(&asset["hash"]);
    assert!(
        moto.keys("weft").contains(&asset_key),
        "the upload is an object: {:?}",
        moto.keys("weft")
    );

    // The job reads its input from S3 and writes its output there.
    let job = server.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset["id"]}}}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "copy"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let output = &job["outputs"][0];
    assert!(moto.keys("weft").contains(&key_of(&output["hash"])));
    let saved = server.download(output["url"].as_str().unwrap());
    let decoded = image::load_from_memory(&saved).unwrap().to_rgba8();
    assert_eq!(decoded.get_pixel(0, 0).0, [0, 0, 255, 255]);

    // Ranged reads are served from the object.
    let content = format!("/api/v2/assets/{}/content", asset["id"].as_str().unwrap());
    let r = server
        .request(reqwest::Method::GET, &content)
        .header("Range", "bytes=1-3")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 206);
    assert_eq!(
        r.headers()["content-range"],
        format!("bytes 1-3/{}", picture.len()).as_str()
    );
    assert_eq!(r.bytes().unwrap().as_ref(), b"PNG");
    let whole = server.request(reqwest::Method::GET, &content).send().unwrap();
    assert_eq!(whole.bytes().unwrap().as_ref(), picture.as_slice());

    // Deleting the only asset over a blob deletes its object.
    let r = server
        .request(
            reqwest::Method::DELETE,
            &format!("/api/v2/assets/{}", asset["id"].as_str().unwrap()),
        )
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 204);
    assert!(!moto.keys("weft").contains(&asset_key));
    assert!(moto.keys("weft").contains(&key_of(&output["hash"])), "the output stays");
}

#[test]
fn retention_removes_an_expired_jobs_output_object() {
    let moto = Moto::start();
    moto.create_bucket("weft");
    let server = moto.weft(
        "weft",
        &[
            "--inline-output-kib",
            "0",
            "--retention-secs",
            "1",
            "--expired-grace-secs",
            "0",
            "--sweep-interval-secs",
            "1",
        ],
    );
    let job = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "kept for a second"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "t"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let key = key_of(&job["outputs"][0]["hash"]);
    assert!(moto.keys("weft").contains(&key));
    wait_until("retention removed the output's object", || {
        !moto.keys("weft").contains(&key)
    });
}

#[test]
fn an_unreachable_object_store_is_a_clear_error_not_a_crash() {
    let moto = Moto::start();
    if support::on_postgres() {
        // Processes sharing a database sign links with a key kept beside the blobs, so a
        // process that cannot reach the blobs at start cannot serve links the others accept:
        // it refuses to start, saying why, rather than serve with a key of its own.
        let refusal = refused_start(&moto, "missing");
        assert!(refusal.contains("link-signing key"), "{refusal}");
        assert!(refusal.contains("NoSuchBucket"), "the store's own reason: {refusal}");
        return;
    }
    // No bucket: every request to the store fails.
    let server = moto.weft("missing", &[]);
    let (status, body) = server.try_upload("x.txt", b"x".to_vec());
    assert!(status >= 500, "{status} {body}");
    assert!(body["error"]["code"].is_string(), "weft's error shape: {body}");
    // The server is still up.
    assert_eq!(server.get("/healthz").status().as_u16(), 200);
}

/// Starts `weft serve` on `bucket`, expecting it to exit with an error: its stderr.
fn refused_start(moto: &Moto, bucket: &str) -> String {
    let data = tempfile::tempdir().unwrap();
    let mut args = vec![
        "serve".to_string(),
        "--addr".into(),
        "127.0.0.1:0".into(),
        "--data-dir".into(),
        data.path().display().to_string(),
        "--blob-dir".into(),
        format!("s3://{bucket}/blobs"),
    ];
    args.extend(support::database_args(data.path()));
    let mut child = Command::new(support::weft_bin())
        .args(&args)
        .envs(moto.env())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("weft kept running on an unreachable blob store");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let output = child.wait_with_output().unwrap();
    assert!(!output.status.success(), "weft exits with an error");
    String::from_utf8_lossy(&output.stderr).into_owned()
}
