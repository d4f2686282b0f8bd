//! `cargo bench -p weft --bench languages`: what a node costs in each plugin language.
//! For the Rust built-in `StringLength`, the Python example's `PyReverse` and the
//! JavaScript example's `JsSlugify` it prints
//! - the component's size and its cold compile time (no cache);
//! - the load time from the compiled-code cache (what a restart pays);
//! - the first call on a fresh instance, and the median and p99 of later calls (each call
//!   is a fresh store and instance, as in the server).
//!
//! Build the examples first: `scripts/build-wasm.sh python` and `scripts/build-wasm.sh js`.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use weft::runtime::{read_source, CallContext, CancelToken, PluginSource, Runtime, RuntimeConfig, TailLog, Value as V};

mod support;
use support::{percentile, Nothing};

weft_allocator::install!();

/// Loads `source` alone with the cache in `cache`, returning the runtime and the time taken.
fn load(source: &PluginSource, cache: &Path) -> (Arc<Runtime>, Duration) {
    let started = Instant::now();
    let runtime = Runtime::from_sources(
        RuntimeConfig {
            cache_dir: Some(cache.to_path_buf()),
            concurrent_calls: 1,
            ..Default::default()
        },
        vec![source.clone()],
    )
    .expect("loading the plugin");
    assert!(runtime.refused().is_empty(), "{:?}", runtime.refused());
    (runtime, started.elapsed())
}

fn measure(language: &str, file: &Path, class: &str, inputs: &[(&str, V)]) {
    let Ok(source) = read_source(file) else {
        println!("{language}: {} is not built; skipped", file.display());
        return;
    };
    let cache = tempfile::tempdir().unwrap();
    let (_, cold) = load(&source, cache.path());
    let (runtime, warm) = load(&source, cache.path());
    let ctx = CallContext {
        log: TailLog::new(64 << 10),
        cancel: CancelToken::new(),
        progress: Arc::new(Nothing),
        assets: Arc::new(Nothing),
        memory: runtime.job_memory(),
    };
    let call = || {
        let inputs = inputs.iter().map(|(n, v)| (n.to_string(), v.clone())).collect();
        let started = Instant::now();
        runtime.call(class, inputs, &ctx).expect("the call failed");
        started.elapsed()
    };
    let first = call();
    let mut samples: Vec<Duration> = (0..2_000).map(|_| call()).collect();
    samples.sort();
    println!(
        "{language:<10} {class:<14} {:>6.1} MB  compile {:>8.1} ms  cached load {:>7.1} ms  first call {:>7.3} ms  \
         per call median {:>7.1} µs, p99 {:>7.1} µs",
        source.bytes.len() as f64 / 1e6,
        cold.as_secs_f64() * 1e3,
        warm.as_secs_f64() * 1e3,
        first.as_secs_f64() * 1e3,
        percentile(&samples, 0.5).as_secs_f64() * 1e6,
        percentile(&samples, 0.99).as_secs_f64() * 1e6,
    );
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let wasm = root.join("target/wasm");
    measure(
        "Rust",
        &wasm.join("wasm32-wasip2/release/weft_plugin_core.wasm"),
        "StringLength",
        &[("string", V::Text("hello world".into()))],
    );
    measure(
        "Python",
        &wasm.join("python/weft_python_example.wasm"),
        "PyReverse",
        &[("text", V::Text("hello world".into()))],
    );
    measure(
        "JavaScript",
        &wasm.join("js/weft_js_example.wasm"),
        "JsSlugify",
        &[("text", V::Text("Hello, World!".into()))],
    );
}
