//! Black-box tests of animated outputs: ComfyUI's `SaveAnimatedPNG`, against what ComfyUI
//! itself saved for the same frames (`tests/fixtures/animated-outputs`, made by
//! `make_animated_outputs.py` with ComfyUI imported as a library): the frames Pillow reads
//! back, how long each shows, the loop count, and the class's `/object_info` spec.

mod support;

use std::io::Cursor;

use image::AnimationDecoder;
use serde_json::{json, Value};
use support::Server;

fn fixture(name: &str) -> Value {
    let path = support::root().join("tests/fixtures/animated-outputs").join(name);
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// The graph of a case: one `EmptyImage` per colour, batched in order, saved animated.
fn workflow(case: &Value) -> Value {
    let (width, height) = (&case["width"], &case["height"]);
    let mut graph = serde_json::Map::new();
    let mut last: Option<String> = None;
    for (i, color) in case["colors"].as_array().unwrap().iter().enumerate() {
        let id = format!("image{i}");
        let inputs = json!({"width": width, "height": height, "batch_size": 1, "color": color});
        graph.insert(id.clone(), json!({"class_type": "EmptyImage", "inputs": inputs}));
        last = Some(match last {
            None => id,
            Some(previous) => {
                let batch = format!("batch{i}");
                let inputs = json!({"image1": [previous, 0], "image2": [id, 0]});
                graph.insert(batch.clone(), json!({"class_type": "ImageBatch", "inputs": inputs}));
                batch
            }
        });
    }
    let save = json!({"images": [last.unwrap(), 0], "filename_prefix": "anim",
                      "fps": case["fps"], "compress_level": case["compress_level"]});
    graph.insert("save".into(), json!({"class_type": "SaveAnimatedPNG", "inputs": save}));
    Value::Object(graph)
}

/// The frames of `file` as Pillow reports them: `{rgb, duration_ms}` of each (a plain PNG
/// is one frame of no duration), and whether it is animated.
fn frames_of(file: &[u8]) -> (Vec<Value>, bool) {
    let decoder = image::codecs::png::PngDecoder::new(Cursor::new(file)).unwrap();
    if !decoder.is_apng().unwrap() {
        let still = image::load_from_memory(file).unwrap().to_rgb8();
        return (vec![json!({"rgb": still.get_pixel(0, 0).0, "duration_ms": 0})], false);
    }
    let frames = decoder.apng().unwrap().into_frames().collect_frames().unwrap();
    let listed = frames
        .iter()
        .map(|frame| {
            let (num, den) = frame.delay().numer_denom_ms();
            let pixels = frame.buffer();
            let first = pixels.get_pixel(0, 0).0;
            assert!(pixels.pixels().all(|p| p.0 == first), "a solid frame stays solid");
            json!({"rgb": &first[..3], "duration_ms": f64::from(num) / f64::from(den)})
        })
        .collect();
    (listed, true)
}

#[test]
fn save_animated_png_saves_the_frames_and_timing_comfyui_saves() {
    let server = Server::start();
    for case in fixture("cases.json").as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let done = server.run(workflow(case));
        assert_eq!(done["status"], "succeeded", "{name}: {done}");
        let outputs = done["outputs"].as_array().unwrap();
        assert_eq!(outputs.len(), 1, "{name}: one file for the whole batch");
        let output = &outputs[0];
        assert_eq!(output["type"], "video", "{name}");
        assert_eq!(output["content_type"], "image/png", "{name}");
        assert!(output["name"].as_str().unwrap().ends_with(".png"), "{name}");
        let file = server.download(output["url"].as_str().unwrap());
        let (frames, animated) = frames_of(&file);
        let comfyui = &case["comfyui"];
        assert_eq!(Value::from(frames), comfyui["frames"], "{name}");
        assert_eq!(Value::from(animated), comfyui["animated"], "{name}");
    }
}

#[test]
fn comfyui_history_shows_an_animated_png_as_an_animated_image() {
    let server = Server::start();
    let case = &fixture("cases.json")[0];
    let queued: Value = server
        .post("/prompt", &json!({"prompt": workflow(case)}))
        .json()
        .unwrap();
    let id = queued["prompt_id"].as_str().unwrap().to_string();
    let mut history = Value::Null;
    for _ in 0..6000 {
        history = server.get(&format!("/history/{id}")).json().unwrap();
        if history.get(&id).is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let ui = &history[&id]["outputs"]["save"];
    assert_eq!(ui["animated"], json!(case["comfyui"]["ui_animated"]), "{history}");
    assert_eq!(ui["images"][0]["type"], "output", "{history}");
    assert!(ui["images"][0]["filename"].as_str().unwrap().starts_with("anim_"));
}

#[test]
fn save_animated_png_declares_comfyuis_exact_spec() {
    let server = Server::start();
    let catalogue: Value = server.get("/object_info").json().unwrap();
    support::specs::assert_catalogue_matches(&catalogue, &fixture("specs.json"));
}
