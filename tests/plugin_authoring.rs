//! The node author's loop: `weft plugin check` on a good plugin and on each contract
//! problem, `weft plugin new` templates that build and run, and `weft serve --watch`
//! replacing a plugin while jobs run.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::{Options, Server};

/// Runs `weft plugin check` on `file`.
fn check(file: &Path) -> Output {
    Command::new(support::weft_bin())
        .args(["plugin", "check"])
        .arg(file)
        .env("WEFT_LOG", "warn")
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A component of the test build.
fn test_plugin(name: &str) -> PathBuf {
    support::test_plugins_dir().join(format!("{name}.wasm"))
}

#[test]
fn plugin_check_prints_classes_inputs_outputs_and_the_capabilities_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("counter.wasm");
    std::fs::copy(test_plugin("weft_test_counter"), &file).unwrap();
    std::fs::write(
        dir.path().join("counter.toml"),
        "[capabilities]\nenv = [\"COUNTER_MODE\"]\ndirs = [\"/srv/counts\"]\nnetwork = true\n",
    )
    .unwrap();
    let out = check(&file);
    let text = stdout(&out);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("contract: weft:node@0.2.0"), "{text}");
    assert!(
        text.contains("capabilities asked for: env:COUNTER_MODE, dir:/srv/counts, network"),
        "{text}"
    );
    assert!(text.contains("classes: 2"), "{text}");
    assert!(text.contains("SlowCounter") && text.contains("PoliteCounter"), "{text}");
    assert!(
        text.contains("in  seconds: FLOAT (required, default 5.0, min 0, max 3600)"),
        "{text}"
    );
    assert!(text.contains("out INT: INT"), "{text}");
    assert!(text.contains("no problems found"), "{text}");
}

#[test]
fn plugin_check_reports_each_contract_problem_with_a_failing_exit_code() {
    let out = check(&test_plugin("weft_test_bad_contract"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    for problem in [
        "class BadTwice is defined twice",
        "class stringlength collides with class StringLength of plugin core",
        "class BadDefault, input count: invalid default \"ten\": not an integer",
        "class BadDefault, input ratio: invalid default 5.0: above the maximum 1",
        "class BadRange, input steps: min 10 is greater than max 1",
        "class BadType, input picture: unknown type name \"IMAGEE\"",
    ] {
        assert!(text.contains(problem), "missing {problem:?} in\n{text}");
    }
    assert!(text.contains("problems: 6"), "{text}");
}

#[test]
fn plugin_check_reports_a_contract_version_the_host_does_not_serve() {
    let out = check(&test_plugin("weft_test_future_contract"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("unsupported contract version: it targets weft:node@0.9.0; this host serves weft:node@0.1.0 and weft:node@0.2.0"),
        "{text}"
    );
}

#[test]
fn plugin_check_reports_a_class_colliding_with_an_installed_plugin_and_bad_files() {
    // Installed beside the counter plugin, a copy of it under another name collides class
    // by class (a plugin is not checked against its own installed file).
    let installed = support::plugins_with(&["weft_test_counter"]);
    let copy = tempfile::tempdir().unwrap();
    let twin = copy.path().join("twin.wasm");
    std::fs::copy(test_plugin("weft_test_counter"), &twin).unwrap();
    let out = Command::new(support::weft_bin())
        .args(["plugin", "check", "--plugins-dir"])
        .arg(installed.path())
        .arg(&twin)
        .env("WEFT_LOG", "warn")
        .output()
        .unwrap();
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("class SlowCounter collides with class SlowCounter of plugin weft_test_counter"),
        "{text}"
    );
    // A file that is no component is a problem too, not a crash.
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk.wasm");
    std::fs::write(&junk, b"\0asm not really").unwrap();
    let out = check(&junk);
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(stdout(&out).contains("it is not a valid component"), "{}", stdout(&out));
}

/// Waits (up to 2 minutes) until `ready` holds for the catalogue of `server`.
fn wait_catalogue(server: &Server, what: &str, ready: impl Fn(&Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while Instant::now() < deadline {
        let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
        if ready(&nodes) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("the catalogue never {what}");
}

/// Replaces `path` with `bytes` the way a build does: a new file renamed into place.
fn install(path: &Path, bytes: &[u8]) {
    let tmp = path.with_extension("partial");
    std::fs::write(&tmp, bytes).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn watch_replacing_a_plugin_while_a_job_runs_keeps_the_job_on_its_version() {
    let plugins = tempfile::tempdir().unwrap();
    let slot = plugins.path().join("swap.wasm");
    std::fs::copy(test_plugin("weft_test_counter"), &slot).unwrap();
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        args: vec!["--watch".into()],
        ..Default::default()
    });
    let job = server.submit(support::slow_workflow(3.0));
    let id = job["id"].as_str().unwrap().to_string();
    support::wait_running(&server, &id);

    // The new build of `swap` has other classes: the counter's are gone from the
    // catalogue and from validation at once, and the new ones are there.
    install(&slot, &std::fs::read(test_plugin("weft_test_loud")).unwrap());
    wait_catalogue(&server, "switched to the new build", |nodes| {
        nodes.get("HostileLoudProgress").is_some()
    });
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    assert!(nodes.get("SlowCounter").is_none(), "old classes stayed");
    let refused = server.post("/api/v2/jobs", &json!({"workflow": support::slow_workflow(0.1)}));
    assert_eq!(refused.status().as_u16(), 422);

    // The job that was running finishes on the build it started with.
    let done = server.wait(&id);
    assert_eq!(done["status"], "succeeded", "{done}");
}

#[test]
fn watch_a_broken_new_version_keeps_the_old_one_loaded_with_a_clear_log_line() {
    let plugins = tempfile::tempdir().unwrap();
    let slot = plugins.path().join("counter.wasm");
    std::fs::copy(test_plugin("weft_test_counter"), &slot).unwrap();
    let log = tempfile::NamedTempFile::new().unwrap();
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        args: vec!["--watch".into()],
        log_file: Some(log.path().to_path_buf()),
        ..Default::default()
    });
    install(&slot, b"\0asm\x0d\0\x01\0 this is not a component");
    let deadline = Instant::now() + Duration::from_secs(60);
    let line = loop {
        let text = std::fs::read_to_string(log.path()).unwrap();
        if let Some(line) = text.lines().find(|l| l.contains("plugin reload refused")) {
            break line.to_string();
        }
        assert!(Instant::now() < deadline, "no refusal was logged:\n{text}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(line.contains("ERROR"), "{line}");
    assert!(line.contains("the previous one stays loaded"), "{line}");
    assert!(
        line.contains("plugin=counter") && line.contains("not a valid component"),
        "{line}"
    );
    // The old build still serves.
    let job = server.run(support::slow_workflow(0.05));
    assert_eq!(job["status"], "succeeded", "{job}");
}

/// Runs `program` in `dir`, failing the test with its output when it fails.
fn run_in(dir: &Path, program: &str, args: &[&str], env: &[(&str, &str)]) {
    let out = Command::new(program)
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {args:?} failed in {}:\n{}\n{}",
        dir.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `weft plugin new NAME --lang LANG` in `dir`.
fn new_plugin(dir: &Path, name: &str, lang: &str) -> Output {
    Command::new(support::weft_bin())
        .args(["plugin", "new", name, "--lang", lang, "--dir"])
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn every_plugin_new_template_builds_passes_its_test_and_its_node_runs() {
    let work = tempfile::tempdir().unwrap();
    let plugins = tempfile::tempdir().unwrap();
    for (name, lang) in [("rust-greeter", "rust"), ("py-greeter", "python"), ("js-greeter", "js")] {
        let out = new_plugin(work.path(), name, lang);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let readme = std::fs::read_to_string(work.path().join(name).join("README.md")).unwrap();
        assert!(readme.contains("Build"), "{readme}");
    }
    let root = support::root();
    // Rust: the build command of its README, into the shared wasm target dir.
    let rust = work.path().join("rust-greeter");
    let wasm_target = root.join("target/wasm");
    let wasm_target = wasm_target.to_str().unwrap();
    run_in(
        &rust,
        "cargo",
        &["build", "--release", "--target", "wasm32-wasip2"],
        &[("CARGO_TARGET_DIR", wasm_target)],
    );
    std::fs::copy(
        root.join("target/wasm/wasm32-wasip2/release/rust_greeter.wasm"),
        plugins.path().join("rust_greeter.wasm"),
    )
    .unwrap();
    // Python: its test, then its build command.
    let python = work.path().join("py-greeter");
    run_in(&python, "python3", &["-m", "unittest"], &[]);
    run_in(
        &python,
        "componentize-py",
        &[
            "-d",
            "wit",
            "-w",
            "plugin",
            "componentize",
            "app",
            "-p",
            ".",
            "-o",
            "py_greeter.wasm",
        ],
        &[],
    );
    std::fs::copy(python.join("py_greeter.wasm"), plugins.path().join("py_greeter.wasm")).unwrap();
    // JavaScript: its test with node, then its build with the pinned componentize-js.
    let js = work.path().join("js-greeter");
    run_in(&js, "node", &["--test"], &[]);
    run_in(&root, "scripts/js-toolchain/install.sh", &[], &[]);
    let componentize = root.join("target/js-toolchain/node_modules/.bin/componentize-js");
    run_in(
        &js,
        componentize.to_str().unwrap(),
        &[
            "plugin.js",
            "--wit",
            "wit",
            "--world-name",
            "plugin",
            "--disable",
            "http",
            "fetch-event",
            "--out",
            "js_greeter.wasm",
        ],
        &[],
    );
    std::fs::copy(js.join("js_greeter.wasm"), plugins.path().join("js_greeter.wasm")).unwrap();

    // Each one checks clean and its node runs through the job API.
    for file in ["rust_greeter", "py_greeter", "js_greeter"] {
        let out = check(&plugins.path().join(format!("{file}.wasm")));
        assert!(out.status.success(), "{file}: {}", stdout(&out));
    }
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    for class in ["RustGreeterGreet", "PyGreeterGreet", "JsGreeterGreet"] {
        let job = server.run(support::single(class, json!({"name": "Ada"})));
        assert_eq!(job["status"], "succeeded", "{class}: {job}");
        let url = job["outputs"][0]["url"].as_str().unwrap();
        assert_eq!(server.download(url), b"Hello, Ada!", "{class}");
    }
}

#[test]
fn plugin_new_refuses_a_bad_name_and_an_existing_folder() {
    let work = tempfile::tempdir().unwrap();
    let out = new_plugin(work.path(), "Bad Name", "rust");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("plugin name"));
    assert!(new_plugin(work.path(), "twice", "js").status.success());
    let out = new_plugin(work.path(), "twice", "python");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("already exists"));
}

#[test]
fn a_typescript_node_type_checks_against_the_js_helper_and_runs() {
    let root = support::root();
    run_in(&root, "scripts/js-toolchain/install.sh", &[], &[]);
    let dir = tempfile::tempdir().unwrap();
    for file in [
        "sdk/js/weft.js",
        "sdk/js/weft.d.ts",
        "tests/fixtures/ts-plugin/nodes.ts",
        "tests/fixtures/ts-plugin/check.mjs",
    ] {
        let path = root.join(file);
        std::fs::copy(&path, dir.path().join(path.file_name().unwrap())).unwrap();
    }
    std::fs::write(dir.path().join("package.json"), r#"{"type": "module"}"#).unwrap();
    let tsc = root.join("target/js-toolchain/node_modules/.bin/tsc");
    let flags = [
        "--strict",
        "--module",
        "es2022",
        "--target",
        "es2022",
        "--moduleResolution",
        "bundler",
    ];
    let mut args = flags.to_vec();
    args.push("nodes.ts");
    run_in(dir.path(), tsc.to_str().unwrap(), &args, &[]);
    let out = Command::new("node")
        .arg("check.mjs")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(result["classes"], json!(["TsRepeat"]));
    // The defaults of `times` (2) and `joiner` (the first choice) fill what was left out.
    assert_eq!(result["out"], json!([{"tag": "text", "val": "ab-ab"}]));
    assert_eq!(
        result["failure"],
        json!({"code": "empty_text", "message": "nothing to repeat"})
    );

    // A type error in a node is caught at compile time.
    let broken = std::fs::read_to_string(dir.path().join("nodes.ts"))
        .unwrap()
        .replace("length: times", "length: text");
    std::fs::write(dir.path().join("nodes.ts"), broken).unwrap();
    let out = Command::new(&tsc).args(args).current_dir(dir.path()).output().unwrap();
    assert!(!out.status.success(), "tsc accepted a string where a number belongs");
}
