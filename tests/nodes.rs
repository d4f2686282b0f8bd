//! Contract tests for the built-in nodes (ComfyUI's class and input names, so existing
//! workflows run), the catalogue in ComfyUI's `/object_info` shape, and a plugin written in
//! other languages (Python, built with componentize-py; JavaScript, built with
//! componentize-js and `sdk/js`).

mod support;

use serde_json::{json, Map, Value};
use support::{Options, Server};

/// Runs every (class, inputs, expected text) case in one job, each feeding a PreviewAny.
fn check_text_cases(server: &Server, cases: &[(&str, Value, &str)]) {
    let mut workflow = Map::new();
    for (i, (class, inputs, _)) in cases.iter().enumerate() {
        workflow.insert(format!("c{i}"), json!({"class_type": class, "inputs": inputs}));
        workflow.insert(
            format!("p{i}"),
            json!({"class_type": "PreviewAny", "inputs": {"source": [format!("c{i}"), 0]}}),
        );
    }
    let job = server.run(Value::Object(workflow));
    assert_eq!(job["status"], "succeeded", "{job}");
    for (i, (class, _, expected)) in cases.iter().enumerate() {
        let output = job["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["node_id"] == format!("p{i}"))
            .unwrap_or_else(|| panic!("no output for {class}: {job}"));
        assert_eq!(output["type"], "text");
        let text = String::from_utf8(server.download(output["url"].as_str().unwrap())).unwrap();
        assert_eq!(text, *expected, "{class} case {i}");
    }
}

#[test]
fn primitive_and_string_nodes_follow_comfyui() {
    let server = Server::start();
    check_text_cases(
        &server,
        &[
            ("PrimitiveString", json!({"value": "abc"}), "abc"),
            ("PrimitiveInt", json!({"value": 42}), "42"),
            ("PrimitiveFloat", json!({"value": 1.5}), "1.5"),
            ("PrimitiveBoolean", json!({"value": true}), "true"),
            (
                "StringConcatenate",
                json!({"string_a": "a", "string_b": "b", "delimiter": "-"}),
                "a-b",
            ),
            (
                "StringSubstring",
                json!({"string": "hello world", "start": 0, "end": 5}),
                "hello",
            ),
            (
                "StringSubstring",
                json!({"string": "hello world", "start": -5, "end": 11}),
                "world",
            ),
            ("StringLength", json!({"string": "hello"}), "5"),
            (
                "CaseConverter",
                json!({"string": "hello world", "mode": "UPPERCASE"}),
                "HELLO WORLD",
            ),
            (
                "CaseConverter",
                json!({"string": "HELLO world", "mode": "lowercase"}),
                "hello world",
            ),
            (
                "CaseConverter",
                json!({"string": "hello world", "mode": "Capitalize"}),
                "Hello world",
            ),
            (
                "CaseConverter",
                json!({"string": "hello world", "mode": "Title Case"}),
                "Hello World",
            ),
            ("StringTrim", json!({"string": "  x  ", "mode": "Both"}), "x"),
            ("StringTrim", json!({"string": "  x  ", "mode": "Left"}), "x  "),
            ("StringTrim", json!({"string": "  x  ", "mode": "Right"}), "  x"),
            (
                "StringReplace",
                json!({"string": "aXbX", "find": "X", "replace": "-"}),
                "a-b-",
            ),
            (
                "StringContains",
                json!({"string": "Hello", "substring": "hell", "case_sensitive": false}),
                "true",
            ),
            (
                "StringContains",
                json!({"string": "Hello", "substring": "hell", "case_sensitive": true}),
                "false",
            ),
            (
                "StringCompare",
                json!({"string_a": "abc", "string_b": "ab", "mode": "Starts With", "case_sensitive": true}),
                "true",
            ),
            (
                "StringCompare",
                json!({"string_a": "abc", "string_b": "ABC", "mode": "Equal", "case_sensitive": false}),
                "true",
            ),
            (
                "RegexMatch",
                json!({"string": "abc123", "regex_pattern": "\\d+", "case_insensitive": true, "multiline": false, "dotall": false}),
                "true",
            ),
            (
                "RegexExtract",
                json!({"string": "a1b22", "regex_pattern": "\\d+", "mode": "All Matches", "case_insensitive": true,
                       "multiline": false, "dotall": false, "group_index": 1}),
                "1\n22",
            ),
            (
                "RegexExtract",
                json!({"string": "key=value", "regex_pattern": "(\\w+)=(\\w+)", "mode": "First Group", "case_insensitive": true,
                       "multiline": false, "dotall": false, "group_index": 2}),
                "value",
            ),
            ("LogText", json!({"text": "logged"}), "logged"),
        ],
    );
}

#[test]
fn an_invalid_regex_is_a_node_error() {
    let server = Server::start();
    let job = server.run(json!({
        "1": {"class_type": "RegexMatch", "inputs": {"string": "x", "regex_pattern": "(", "case_insensitive": true, "multiline": false, "dotall": false}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    }));
    assert_eq!(job["status"], "failed");
    assert_eq!(job["error"]["code"], "node_execution_error");
    assert_eq!(job["error"]["class_type"], "RegexMatch");
    assert!(
        job["error"]["message"].as_str().unwrap().contains("invalid_regex"),
        "{job}"
    );
}

#[test]
fn save_text_commits_a_text_output_named_after_its_prefix() {
    let server = Server::start();
    let job = server.run(json!({
        "1": {"class_type": "PrimitiveString", "inputs": {"value": "hello"}},
        "2": {"class_type": "SaveText", "inputs": {"text": ["1", 0], "filename_prefix": "notes/greeting"}}
    }));
    let output = &job["outputs"][0];
    assert_eq!(output["type"], "text");
    assert_eq!(output["name"], "notes/greeting_00001_.txt");
    assert!(output["content_type"].as_str().unwrap().starts_with("text/plain"));
    assert_eq!(output["size_bytes"], 5);
    assert_eq!(server.download(output["url"].as_str().unwrap()), b"hello");
}

fn decode_png(bytes: &[u8]) -> image::RgbaImage {
    image::load_from_memory_with_format(bytes, image::ImageFormat::Png)
        .unwrap()
        .to_rgba8()
}

#[test]
fn empty_image_invert_and_save_image_produce_pngs() {
    let server = Server::start();
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 4, "batch_size": 2, "color": 0xFF0000}},
        "2": {"class_type": "ImageInvert", "inputs": {"image": ["1", 0]}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "ComfyUI"}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let outputs = job["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 2, "one PNG per image of the batch");
    assert_eq!(outputs[0]["name"], "ComfyUI_00001_.png");
    assert_eq!(outputs[1]["name"], "ComfyUI_00002_.png");
    for output in outputs {
        assert_eq!(output["type"], "image");
        assert_eq!(output["content_type"], "image/png");
        let png = server.download(output["url"].as_str().unwrap());
        let img = decode_png(&png);
        assert_eq!(img.dimensions(), (8, 4));
        assert_eq!(img.get_pixel(3, 2).0, [0, 255, 255, 255]);
        let text = String::from_utf8_lossy(&png);
        assert!(
            text.contains("prompt"),
            "the workflow is in a PNG text chunk, as ComfyUI writes it"
        );
    }
}

#[test]
fn image_scale_resizes_with_each_method_and_crop() {
    let server = Server::start();
    let mut workflow = Map::new();
    workflow.insert(
        "src".into(),
        json!({"class_type": "EmptyImage", "inputs": {"width": 16, "height": 8, "batch_size": 1, "color": 0x336699}}),
    );
    for (i, method) in ["nearest-exact", "bilinear", "area", "bicubic", "lanczos"]
        .iter()
        .enumerate()
    {
        for (j, crop) in ["disabled", "center"].iter().enumerate() {
            let id = format!("s{i}{j}");
            workflow.insert(id.clone(), json!({"class_type": "ImageScale", "inputs": {"image": ["src", 0], "upscale_method": method, "width": 6, "height": 6, "crop": crop}}));
            workflow.insert(format!("o{i}{j}"), json!({"class_type": "SaveImage", "inputs": {"images": [id, 0], "filename_prefix": format!("{method}-{crop}")}}));
        }
    }
    let job = server.run(Value::Object(workflow));
    assert_eq!(job["status"], "succeeded", "{job}");
    let outputs = job["outputs"].as_array().unwrap();
    assert_eq!(outputs.len(), 10);
    for output in outputs {
        let img = decode_png(&server.download(output["url"].as_str().unwrap()));
        assert_eq!(img.dimensions(), (6, 6), "{}", output["name"]);
        let p = img.get_pixel(2, 2).0;
        assert!(
            (p[0] as i32 - 0x33).abs() <= 1 && (p[2] as i32 - 0x99).abs() <= 1,
            "{} keeps the colour: {p:?}",
            output["name"]
        );
    }
}

#[test]
fn load_image_reads_an_uploaded_asset_with_its_alpha_as_mask() {
    let server = Server::start();
    let mut img = image::RgbaImage::new(5, 3);
    for (x, _, p) in img.enumerate_pixels_mut() {
        *p = image::Rgba([10, 20, 30, if x < 2 { 0 } else { 255 }]);
    }
    let mut png = Vec::new();
    img.write_to(&mut std::io::Cursor::new(&mut png), image::ImageFormat::Png)
        .unwrap();
    let asset = server.upload("input.png", png);
    let reference = json!({"__type": "core/ASSET", "info": {"id": asset["id"]}});
    let job = server.run(json!({
        "1": {"class_type": "LoadImage", "inputs": {"image": reference}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "loaded"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let saved = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["node_id"] == "2")
        .unwrap();
    let out = decode_png(&server.download(saved["url"].as_str().unwrap()));
    assert_eq!(out.dimensions(), (5, 3));
    assert_eq!(out.get_pixel(4, 1).0, [10, 20, 30, 255]);
    let mask = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["node_id"] == "3")
        .unwrap();
    assert_eq!(
        String::from_utf8(server.download(mask["url"].as_str().unwrap())).unwrap(),
        "MASK 1x5x3"
    );
}

#[test]
fn the_catalogue_has_comfyui_object_info_shape() {
    let server = Server::start();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let concat = &nodes["StringConcatenate"];
    assert_eq!(concat["input"]["required"]["string_a"][0], "STRING");
    assert_eq!(concat["input"]["required"]["string_a"][1]["multiline"], true);
    assert_eq!(concat["output"], json!(["STRING"]));
    assert_eq!(concat["output_node"], false);
    let empty = &nodes["EmptyImage"];
    assert_eq!(empty["input"]["required"]["width"][0], "INT");
    assert_eq!(empty["input"]["required"]["width"][1]["default"], 512);
    assert!(empty["input"]["required"]["width"][1]["min"].is_number());
    assert!(empty["input"]["required"]["width"][1]["max"].is_number());
    assert!(empty["input"]["required"]["width"][1]["step"].is_number());
    let scale = &nodes["ImageScale"];
    assert_eq!(
        scale["input"]["required"]["upscale_method"][0],
        json!(["nearest-exact", "bilinear", "area", "bicubic", "lanczos"])
    );
    assert_eq!(
        scale["input_order"]["required"],
        json!(["image", "upscale_method", "width", "height", "crop"])
    );
    let save = &nodes["SaveImage"];
    assert_eq!(save["output_node"], true);
    assert_eq!(save["category"], "image");
    for class in [
        "PrimitiveString",
        "PrimitiveInt",
        "PrimitiveFloat",
        "PrimitiveBoolean",
        "StringConcatenate",
        "StringSubstring",
        "StringLength",
        "CaseConverter",
        "StringTrim",
        "StringReplace",
        "StringContains",
        "StringCompare",
        "RegexMatch",
        "RegexExtract",
        "SaveText",
        "LogText",
        "EmptyImage",
        "ImageInvert",
        "ImageScale",
        "LoadImage",
        "SaveImage",
    ] {
        assert!(nodes[class].is_object(), "{class} is in the catalogue");
        assert!(
            nodes[class]["description"].is_string() && nodes[class]["display_name"].is_string(),
            "{class}"
        );
    }
}

#[test]
fn weft_nodes_prints_the_catalogue() {
    let out = std::process::Command::new(support::weft_bin())
        .arg("nodes")
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("StringConcatenate") && text.contains("SaveImage"),
        "{text}"
    );
}

/// The Python example plugin, built by scripts/build-wasm.sh with componentize-py.
fn python_plugin_dir() -> tempfile::TempDir {
    let status = std::process::Command::new(support::root().join("scripts/build-wasm.sh"))
        .arg("python")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "building the Python plugin failed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        support::root().join("target/wasm/python/weft_python_example.wasm"),
        dir.path().join("python_example.wasm"),
    )
    .unwrap();
    dir
}

#[test]
fn a_plugin_written_in_python_runs_as_a_node() {
    let plugins = python_plugin_dir();
    let server = Server::with(Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        ..Default::default()
    });
    check_text_cases(
        &server,
        &[
            ("PyWordCount", json!({"text": "one two  three"}), "3"),
            ("PyReverse", json!({"text": "weft"}), "tfew"),
        ],
    );
}

/// The JavaScript example plugin, built by scripts/build-wasm.sh with componentize-js.
fn js_plugin_dir() -> tempfile::TempDir {
    let status = std::process::Command::new(support::root().join("scripts/build-wasm.sh"))
        .arg("js")
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(status.success(), "building the JavaScript plugin failed");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(
        support::root().join("target/wasm/js/weft_js_example.wasm"),
        dir.path().join("js_example.wasm"),
    )
    .unwrap();
    dir
}

/// The files of the compiled-code cache of `data_dir`, with their modification times.
fn cached_components(data_dir: &std::path::Path) -> Vec<(String, std::time::SystemTime)> {
    let mut files: Vec<_> = std::fs::read_dir(data_dir.join("cache"))
        .map(|entries| {
            entries
                .filter_map(|e| e.ok())
                .map(|e| {
                    let modified = e.metadata().unwrap().modified().unwrap();
                    (e.file_name().to_string_lossy().into_owned(), modified)
                })
                .collect()
        })
        .unwrap_or_default();
    files.sort();
    files
}

#[test]
fn a_plugin_written_in_javascript_runs_as_a_node_and_is_compiled_once() {
    let plugins = js_plugin_dir();
    let data = tempfile::tempdir().unwrap();
    // The data dir's own cache, which this test looks into.
    let cache = data.path().join("cache").to_string_lossy().into_owned();
    let options = Options {
        plugins_dir: Some(plugins.path().to_path_buf()),
        data_dir: Some(data.path().to_path_buf()),
        env: vec![("WEFT_COMPILE_CACHE".into(), cache)],
        ..Default::default()
    };
    let server = Server::with(options.clone());
    // Declared defaults fill the inputs a workflow leaves out (separator, max_length).
    check_text_cases(
        &server,
        &[
            ("JsSlugify", json!({"text": "Hello, World!"}), "hello-world"),
            (
                "JsSlugify",
                json!({"text": "A B C D", "separator": "_", "max_length": 3}),
                "a_b",
            ),
        ],
    );
    // The image node's pixels are made and inverted by host functions.
    let job = server.run(json!({
        "1": {"class_type": "JsInvertedFill", "inputs": {"width": 8, "height": 4, "color": 0}},
        "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "js"}},
        "3": {"class_type": "PreviewAny", "inputs": {"source": ["1", 1]}}
    }));
    assert_eq!(job["status"], "succeeded", "{job}");
    let outputs = job["outputs"].as_array().unwrap();
    let image = outputs.iter().find(|o| o["node_id"] == "2").expect("image output");
    let png = image::load_from_memory(&server.download(image["url"].as_str().unwrap()))
        .unwrap()
        .to_rgb8();
    assert_eq!(png.dimensions(), (8, 4));
    assert!(png.pixels().all(|p| p.0 == [255, 255, 255]), "black inverted is white");
    let size = outputs.iter().find(|o| o["node_id"] == "3").expect("size output");
    assert_eq!(server.download(size["url"].as_str().unwrap()), b"8x4");
    // A NodeError thrown by the plugin fails the job with its code and message.
    let job = server.run(support::single("JsSlugify", json!({"text": "!!!"})));
    assert_eq!(job["status"], "failed", "{job}");
    assert!(job.to_string().contains("empty_slug"), "{job}");

    // The 12 MB component is compiled once: a restart loads it from the cache untouched.
    let cached = cached_components(data.path());
    assert!(!cached.is_empty(), "the first start cached no compiled code");
    drop(server);
    let server = Server::with(options);
    assert_eq!(cached_components(data.path()), cached, "the restart compiled again");
    check_text_cases(&server, &[("JsSlugify", json!({"text": "again"}), "again")]);
}
