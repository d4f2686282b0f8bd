//! ComfyUI's core image and mask nodes, black-box: their catalogue entries against
//! ComfyUI's own declarations (`tests/fixtures/image-nodes/specs.json`), graphs through
//! HTTP with decoded PNG pixels, and the memory bound on what they make. The pixel
//! arithmetic itself is compared with ComfyUI in weft-compute's unit tests.

mod support;

use serde_json::{json, Value};
use support::{assert_failed_at_node, Options, Server};

/// ComfyUI's `/object_info` entries of the new classes, dumped by the fixture script.
fn comfy_specs() -> Value {
    let path = support::root().join("tests/fixtures/image-nodes/specs.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// An option of an input spec as a number, for comparing `1` with `1.0`.
fn number(options: &Value, key: &str) -> Option<f64> {
    options.get(key).and_then(Value::as_f64)
}

/// Checks the inputs of `section` (`required`, `optional`) of weft's entry `got` against
/// ComfyUI's `want` list of `[name, type, {default, min, max, step}]`.
fn check_inputs(class: &str, section: &str, got: &Value, want: &Value) {
    let want = want.as_array().unwrap();
    let names: Vec<&str> = want.iter().map(|w| w[0].as_str().unwrap()).collect();
    let order = got["input_order"].get(section).cloned().unwrap_or(json!([]));
    assert_eq!(order, json!(names), "{class}: {section} inputs and their order");
    for field in want {
        let name = field[0].as_str().unwrap();
        let entry = &got["input"][section][name];
        assert_eq!(entry[0], field[1], "{class}.{name}: type or choices");
        let (options, want_options) = (&entry[1], &field[2]);
        if let Some(default) = want_options.get("default") {
            match default.as_f64() {
                Some(n) => assert_eq!(number(options, "default"), Some(n), "{class}.{name}: default"),
                None => assert_eq!(&options["default"], default, "{class}.{name}: default"),
            }
        }
        for key in ["min", "max", "step"] {
            let want = match number(want_options, key) {
                // Seeds: the contract's integers are signed 64-bit, so weft's largest seed is
                // `i64::MAX` where ComfyUI's is `2^64 - 1` (torch keeps the low 32 bits of either).
                Some(max) if key == "max" && max == u64::MAX as f64 => Some(i64::MAX as f64),
                other => other,
            };
            assert_eq!(number(options, key), want, "{class}.{name}: {key}");
        }
    }
}

#[test]
fn every_image_and_mask_class_declares_comfyuis_exact_spec() {
    let server = Server::start();
    let nodes: Value = server.get("/api/v2/nodes").json().unwrap();
    let specs = comfy_specs();
    for (class, want) in specs.as_object().unwrap() {
        let got = &nodes[class];
        assert!(got.is_object(), "{class} is in the catalogue");
        assert_eq!(got["display_name"], want["display_name"], "{class}: display name");
        assert_eq!(got["category"], want["category"], "{class}: category");
        assert_eq!(got["output"], want["output"], "{class}: outputs");
        assert_eq!(got["output_name"], want["output_name"], "{class}: output names");
        check_inputs(class, "required", got, &want["required"]);
        check_inputs(class, "optional", got, &want["optional"]);
    }
}

/// The PNGs a finished job saved, decoded, in output order.
fn saved_pngs(server: &Server, job: &Value, node: &str) -> Vec<image::RgbaImage> {
    assert_eq!(job["status"], "succeeded", "{job}");
    job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|o| o["node_id"] == node)
        .map(|o| {
            let bytes = server.download(o["url"].as_str().unwrap());
            image::load_from_memory_with_format(&bytes, image::ImageFormat::Png)
                .unwrap()
                .to_rgba8()
        })
        .collect()
}

/// The text a `PreviewAny` node `node` of a finished job committed.
fn previewed(server: &Server, job: &Value, node: &str) -> String {
    let output = job["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["node_id"] == node)
        .unwrap_or_else(|| panic!("node {node} committed an output: {job}"));
    String::from_utf8(server.download(output["url"].as_str().unwrap())).unwrap()
}

/// Asserts an 8-bit pixel is `want` within one step (resampling a flat colour may land a
/// float32 rounding below it, which PNG encoding truncates).
fn assert_near(pixel: [u8; 4], want: [u8; 3], what: &str) {
    for (got, want) in pixel.iter().zip(want) {
        assert!((i32::from(*got) - i32::from(want)).abs() <= 1, "{what}: {pixel:?}");
    }
}

#[test]
fn batch_repeat_select_crop_and_rotate_chain_as_comfyui() {
    let server = Server::start();
    let job = server.run(json!({
        "red": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 1, "color": 0xFF0000}},
        "blue": {"class_type": "EmptyImage", "inputs": {"width": 3, "height": 2, "batch_size": 1, "color": 0x0000FF}},
        "both": {"class_type": "ImageBatch", "inputs": {"image1": ["red", 0], "image2": ["blue", 0]}},
        "many": {"class_type": "RepeatImageBatch", "inputs": {"image": ["both", 0], "amount": 2}},
        "pick": {"class_type": "ImageFromBatch", "inputs": {"image": ["many", 0], "batch_index": 1, "length": 2}},
        "crop": {"class_type": "ImageCrop", "inputs": {"image": ["pick", 0], "width": 5, "height": 3, "x": 2, "y": 0}},
        "turn": {"class_type": "ImageRotate", "inputs": {"image": ["crop", 0], "rotation": "90 degrees"}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["turn", 0], "filename_prefix": "chain"}},
        "size": {"class_type": "GetImageSize", "inputs": {"image": ["turn", 0]}},
        "width": {"class_type": "PreviewAny", "inputs": {"source": ["size", 0]}},
        "count": {"class_type": "PreviewAny", "inputs": {"source": ["size", 2]}}
    }));
    let images = saved_pngs(&server, &job, "save");
    assert_eq!(images.len(), 2, "images 1 and 2 of red, blue, red, blue");
    // The crop is cut at the right edge (4 of 5 columns), then turned a quarter.
    assert!(images.iter().all(|i| i.dimensions() == (3, 4)));
    assert_near(images[0].get_pixel(1, 1).0, [0, 0, 255], "the resized blue image");
    assert_near(images[1].get_pixel(1, 1).0, [255, 0, 0], "red");
    assert_eq!(previewed(&server, &job, "width"), "3");
    assert_eq!(previewed(&server, &job, "count"), "2");
}

#[test]
fn a_masked_composite_pastes_only_where_the_mask_is_set() {
    let server = Server::start();
    let job = server.run(json!({
        "dest": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 1, "color": 0xFF0000}},
        "src": {"class_type": "EmptyImage", "inputs": {"width": 3, "height": 3, "batch_size": 1, "color": 0x00FF00}},
        "full": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 3, "height": 3}},
        "hole": {"class_type": "SolidMask", "inputs": {"value": 0.0, "width": 1, "height": 1}},
        "mask": {"class_type": "MaskComposite", "inputs": {"destination": ["full", 0], "source": ["hole", 0], "x": 1, "y": 1, "operation": "multiply"}},
        "paste": {"class_type": "ImageCompositeMasked", "inputs": {"destination": ["dest", 0], "source": ["src", 0], "x": 2, "y": 1, "resize_source": false, "mask": ["mask", 0]}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["paste", 0], "filename_prefix": "paste"}}
    }));
    let image = &saved_pngs(&server, &job, "save")[0];
    assert_eq!(image.get_pixel(0, 0).0, [255, 0, 0, 255], "outside the source");
    assert_eq!(image.get_pixel(2, 1).0, [0, 255, 0, 255], "inside the source");
    assert_eq!(image.get_pixel(3, 2).0, [255, 0, 0, 255], "under the mask's hole");
}

#[test]
fn mask_nodes_chain_into_an_image() {
    let server = Server::start();
    let job = server.run(json!({
        "img": {"class_type": "EmptyImage", "inputs": {"width": 5, "height": 5, "batch_size": 1, "color": 0x336699}},
        "pad": {"class_type": "ImagePadForOutpaint", "inputs": {"image": ["img", 0], "left": 8, "top": 0, "right": 0, "bottom": 0, "feathering": 0}},
        "blue": {"class_type": "ImageToMask", "inputs": {"image": ["pad", 0], "channel": "blue"}},
        "cut": {"class_type": "ThresholdMask", "inputs": {"mask": ["blue", 0], "value": 0.55}},
        "grow": {"class_type": "GrowMask", "inputs": {"mask": ["cut", 0], "expand": 1, "tapered_corners": true}},
        "inv": {"class_type": "InvertMask", "inputs": {"mask": ["grow", 0]}},
        "pic": {"class_type": "MaskToImage", "inputs": {"mask": ["inv", 0]}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["pic", 0], "filename_prefix": "mask"}},
        "padmask": {"class_type": "MaskToImage", "inputs": {"mask": ["pad", 1]}},
        "savemask": {"class_type": "SaveImage", "inputs": {"images": ["padmask", 0], "filename_prefix": "padmask"}}
    }));
    let image = &saved_pngs(&server, &job, "save")[0];
    assert_eq!(image.dimensions(), (13, 5));
    // Blue 0x99 is above 0.55 in the image; the grey padding (0.5) is not. Grown by one
    // pixel into the padding, then inverted.
    assert_eq!(image.get_pixel(10, 2).0, [0, 0, 0, 255]);
    assert_eq!(image.get_pixel(7, 2).0, [0, 0, 0, 255], "grown one pixel");
    assert_eq!(image.get_pixel(6, 2).0, [255, 255, 255, 255]);
    let padmask = &saved_pngs(&server, &job, "savemask")[0];
    assert_eq!(padmask.get_pixel(0, 0).0, [255, 255, 255, 255], "the padding is masked");
    assert_eq!(padmask.get_pixel(9, 0).0, [0, 0, 0, 255], "the image is not");
}

#[test]
fn blend_blur_sharpen_and_flip_keep_a_flat_colour() {
    let server = Server::start();
    let job = server.run(json!({
        "a": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 6, "batch_size": 2, "color": 0x406080}},
        "b": {"class_type": "EmptyImage", "inputs": {"width": 5, "height": 5, "batch_size": 1, "color": 0x406080}},
        "mix": {"class_type": "ImageBlend", "inputs": {"image1": ["a", 0], "image2": ["b", 0], "blend_factor": 0.5, "blend_mode": "normal"}},
        "blur": {"class_type": "ImageBlur", "inputs": {"image": ["mix", 0], "blur_radius": 2, "sigma": 1.0}},
        "sharp": {"class_type": "ImageSharpen", "inputs": {"image": ["blur", 0], "sharpen_radius": 1, "sigma": 1.0, "alpha": 1.0}},
        "flip": {"class_type": "ImageFlip", "inputs": {"image": ["sharp", 0], "flip_method": "y-axis: horizontally"}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["flip", 0], "filename_prefix": "flat"}}
    }));
    let images = saved_pngs(&server, &job, "save");
    assert_eq!(images.len(), 2, "the batch of one is broadcast over the batch of two");
    for image in images {
        assert_eq!(image.dimensions(), (8, 6));
        image
            .pixels()
            .for_each(|p| assert_near(p.0, [0x40, 0x60, 0x80], "a flat colour"));
    }
}

#[test]
fn scaling_nodes_make_comfyuis_sizes() {
    let server = Server::start();
    let path = support::root().join("tests/fixtures/image-nodes/cases.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    // The sizes (width, height) of the fixture's input images.
    let sides = |name: &str| match name {
        "a" => (7, 5),
        "c" => (4, 6),
        other => panic!("no size for input {other}"),
    };
    let scaling = [
        "ImageScaleToTotalPixels",
        "ImageScaleToMaxDimension",
        "ResizeAndPadImage",
    ];
    let cases = fixture["cases"].as_array().unwrap().iter();
    for case in cases.filter(|c| scaling.contains(&c["node"].as_str().unwrap())) {
        let (width, height) = sides(case["inputs"]["image"]["tensor"].as_str().unwrap());
        let mut inputs = case["inputs"].clone();
        inputs["image"] = json!(["1", 0]);
        let shape = &case["outputs"][0]["shape"];
        let job = server.run(json!({
            "1": {"class_type": "EmptyImage", "inputs": {"width": width, "height": height, "batch_size": 1, "color": 0}},
            "2": {"class_type": case["node"], "inputs": inputs},
            "3": {"class_type": "GetImageSize", "inputs": {"image": ["2", 0]}},
            "4": {"class_type": "PreviewAny", "inputs": {"source": ["3", 0]}},
            "5": {"class_type": "PreviewAny", "inputs": {"source": ["3", 1]}}
        }));
        assert_eq!(job["status"], "succeeded", "{job}");
        assert_eq!(
            previewed(&server, &job, "4"),
            shape[2].to_string(),
            "{}: width",
            case["node"]
        );
        assert_eq!(
            previewed(&server, &job, "5"),
            shape[1].to_string(),
            "{}: height",
            case["node"]
        );
    }
}

#[test]
fn resize_and_pad_centres_the_fitted_image_on_the_padding_colour() {
    let server = Server::start();
    let job = server.run(json!({
        "wide": {"class_type": "EmptyImage", "inputs": {"width": 7, "height": 5, "batch_size": 1, "color": 0xFF0000}},
        "fit": {"class_type": "ResizeAndPadImage", "inputs": {"image": ["wide", 0], "target_width": 9, "target_height": 9, "padding_color": "white", "interpolation": "nearest-exact"}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["fit", 0], "filename_prefix": "fit"}},
        "tall": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 6, "batch_size": 1, "color": 0xFF0000}},
        "fit2": {"class_type": "ResizeAndPadImage", "inputs": {"image": ["tall", 0], "target_width": 9, "target_height": 5, "padding_color": "black", "interpolation": "nearest-exact"}},
        "save2": {"class_type": "SaveImage", "inputs": {"images": ["fit2", 0], "filename_prefix": "fit2"}}
    }));
    // 7x5 scaled by 9/7 is 9x6 (6.43 truncated), one row down; 4x6 by 5/6 is 3x5, three
    // columns in.
    let wide = &saved_pngs(&server, &job, "save")[0];
    assert_eq!(wide.get_pixel(4, 0).0, [255, 255, 255, 255]);
    assert_eq!(wide.get_pixel(4, 1).0, [255, 0, 0, 255]);
    assert_eq!(wide.get_pixel(4, 6).0, [255, 0, 0, 255]);
    assert_eq!(wide.get_pixel(4, 7).0, [255, 255, 255, 255]);
    let tall = &saved_pngs(&server, &job, "save2")[0];
    assert_eq!(tall.get_pixel(2, 2).0, [0, 0, 0, 255]);
    assert_eq!(tall.get_pixel(3, 2).0, [255, 0, 0, 255]);
    assert_eq!(tall.get_pixel(5, 2).0, [255, 0, 0, 255]);
    assert_eq!(tall.get_pixel(6, 2).0, [0, 0, 0, 255]);
}

#[test]
fn huge_repeats_pads_edge_maps_stitches_and_noise_end_with_the_memory_limit() {
    let server = Server::with(Options {
        args: ["--job-memory-mib", "64", "--cache-mib", "0"]
            .map(String::from)
            .to_vec(),
        ..Default::default()
    });
    let repeat = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 512, "height": 512, "batch_size": 1, "color": 0}},
        "2": {"class_type": "RepeatImageBatch", "inputs": {"image": ["1", 0], "amount": 4096}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&repeat, "node_memory_limit", "2");
    let pad = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImagePadForOutpaint", "inputs": {"image": ["1", 0], "left": 16384, "top": 16384, "right": 16384, "bottom": 16384, "feathering": 0}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&pad, "node_memory_limit", "2");
    let grow = server.run(json!({
        "1": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 8192, "height": 8192}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}}
    }));
    assert_failed_at_node(&grow, "node_memory_limit", "1");
    let edges = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 1024, "batch_size": 1, "color": 0}},
        "2": {"class_type": "Canny", "inputs": {"image": ["1", 0], "low_threshold": 0.4, "high_threshold": 0.8}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&edges, "node_memory_limit", "2");
    let stitched = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 2048, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageStitch", "inputs": {"image1": ["1", 0], "image2": ["1", 0], "direction": "right", "match_image_size": true, "spacing_width": 0, "spacing_color": "white"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&stitched, "node_memory_limit", "2");
    let noisy = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 2048, "height": 1536, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageAddNoise", "inputs": {"image": ["1", 0], "seed": 1, "strength": 0.5}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "huge"}}
    }));
    assert_failed_at_node(&noisy, "node_memory_limit", "2");
}

#[test]
fn a_joined_alpha_saves_as_an_rgba_png_and_splits_back() {
    let server = Server::start();
    let job = server.run(json!({
        "img": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 3, "batch_size": 2, "color": 0x336699}},
        "alpha": {"class_type": "SolidMask", "inputs": {"value": 0.25, "width": 2, "height": 2}},
        "join": {"class_type": "JoinImageWithAlpha", "inputs": {"image": ["img", 0], "alpha": ["alpha", 0]}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["join", 0], "filename_prefix": "rgba"}},
        "split": {"class_type": "SplitImageWithAlpha", "inputs": {"image": ["join", 0]}},
        "pic": {"class_type": "MaskToImage", "inputs": {"mask": ["split", 1]}},
        "savemask": {"class_type": "SaveImage", "inputs": {"images": ["pic", 0], "filename_prefix": "alpha"}}
    }));
    let images = saved_pngs(&server, &job, "save");
    assert_eq!(images.len(), 1, "as many images as the shorter batch");
    let pixel = images[0].get_pixel(3, 2).0;
    assert_near(pixel, [0x33, 0x66, 0x99], "the colour");
    assert!((i32::from(pixel[3]) - 191).abs() <= 1, "alpha is 1 - 0.25: {pixel:?}");
    let mask = &saved_pngs(&server, &job, "savemask")[0];
    assert_near(mask.get_pixel(0, 0).0, [63, 63, 63], "the mask is 1 - alpha again");
}

#[test]
fn porter_duff_source_over_keeps_an_opaque_source_and_its_alpha() {
    let server = Server::start();
    let job = server.run(json!({
        "src": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 4, "batch_size": 1, "color": 0x00FF00}},
        "dst": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 1, "color": 0xFF0000}},
        "opaque": {"class_type": "SolidMask", "inputs": {"value": 0.0, "width": 4, "height": 4}},
        "clear": {"class_type": "SolidMask", "inputs": {"value": 1.0, "width": 6, "height": 4}},
        "over": {"class_type": "PorterDuffImageComposite", "inputs": {"source": ["src", 0], "source_alpha": ["opaque", 0], "destination": ["dst", 0], "destination_alpha": ["clear", 0], "mode": "SRC_OVER"}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["over", 0], "filename_prefix": "over"}},
        "alpha": {"class_type": "MaskToImage", "inputs": {"mask": ["over", 1]}},
        "savealpha": {"class_type": "SaveImage", "inputs": {"images": ["alpha", 0], "filename_prefix": "alpha"}}
    }));
    let image = &saved_pngs(&server, &job, "save")[0];
    assert_eq!(image.dimensions(), (6, 4), "the destination's size");
    assert_near(image.get_pixel(3, 2).0, [0, 255, 0], "the source, resized to cover it");
    let alpha = &saved_pngs(&server, &job, "savealpha")[0];
    assert_near(alpha.get_pixel(3, 2).0, [0, 0, 0], "opaque");
}

/// Tensor `name` of the image-node fixture as the bytes a saved PNG holds (`255 v`
/// clipped and truncated; large images on the 8-bit grid are stored as those bytes).
fn fixture_bytes(name: &str) -> (Vec<usize>, Vec<u8>) {
    let path = support::root().join("tests/fixtures/image-nodes/image_nodes.safetensors");
    let file = std::fs::read(path).unwrap();
    let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
    let entry = &header[name];
    let shape = entry["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let offsets = entry["data_offsets"].as_array().unwrap();
    let (start, end) = (
        offsets[0].as_u64().unwrap() as usize,
        offsets[1].as_u64().unwrap() as usize,
    );
    let raw = &file[8 + header_len + start..8 + header_len + end];
    let bytes = match entry["dtype"].as_str() {
        Some("U8") => raw.to_vec(),
        Some("F32") => raw
            .chunks_exact(4)
            .map(|b| (f32::from_le_bytes(b.try_into().unwrap()) * 255.0).clamp(0.0, 255.0) as u8)
            .collect(),
        other => panic!("{name}: unexpected dtype {other:?}"),
    };
    (shape, bytes)
}

/// The fixture's case of class `node` whose input `input` is the tensor `tensor`.
fn fixture_case(node: &str, input: &str, tensor: &str) -> Value {
    let path = support::root().join("tests/fixtures/image-nodes/cases.json");
    let fixture: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    fixture["cases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["node"] == node && c["inputs"][input]["tensor"] == tensor)
        .cloned()
        .unwrap_or_else(|| panic!("the fixture has a {node} case on {tensor}"))
}

/// A PNG of the first RGB image of a `[batch, height, width, 3]` byte tensor.
fn png_of(shape: &[usize], bytes: &[u8]) -> Vec<u8> {
    let (height, width) = (shape[1] as u32, shape[2] as u32);
    let frame = image::RgbImage::from_raw(width, height, bytes[..shape[1] * shape[2] * 3].to_vec()).unwrap();
    let mut out = std::io::Cursor::new(Vec::new());
    frame.write_to(&mut out, image::ImageFormat::Png).unwrap();
    out.into_inner()
}

#[test]
fn canny_on_an_uploaded_photo_finds_comfyuis_edges_pixel_for_pixel() {
    let server = Server::start();
    let case = fixture_case("Canny", "image", "big");
    let (shape, pixels) = fixture_bytes("in.big");
    let asset = server.upload("shapes.png", png_of(&shape, &pixels));
    let job = server.run(json!({
        "load": {"class_type": "LoadImage", "inputs": {"image": {"__type": "core/ASSET", "info": {"id": asset["id"]}}}},
        "edges": {"class_type": "Canny", "inputs": {"image": ["load", 0], "low_threshold": case["inputs"]["low_threshold"], "high_threshold": case["inputs"]["high_threshold"]}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["edges", 0], "filename_prefix": "edges"}}
    }));
    let saved = &saved_pngs(&server, &job, "save")[0];
    let (want_shape, want) = fixture_bytes(case["outputs"][0]["tensor"].as_str().unwrap());
    assert_eq!(saved.dimensions(), (want_shape[2] as u32, want_shape[1] as u32));
    let got: Vec<u8> = saved.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect();
    assert!(got == want, "the edges differ from ComfyUI's");
    assert!(got.contains(&255) && got.contains(&0), "some edges, not all");
}

/// Asserts `job` failed at `node` with a guest error naming `invalid_input` (the host
/// reports a guest's error as `node_execution_error`, its own code in the message).
fn assert_invalid_input_at(job: &Value, node: &str) {
    assert_failed_at_node(job, "node_execution_error", node);
    let message = job["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("(invalid_input)"), "{job}");
}

#[test]
fn canny_refuses_crossed_thresholds_and_alpha_images_as_invalid_input() {
    let server = Server::start();
    let crossed = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "2": {"class_type": "Canny", "inputs": {"image": ["1", 0], "low_threshold": 0.9, "high_threshold": 0.2}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}}
    }));
    assert_invalid_input_at(&crossed, "2");
    let alpha = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 8, "height": 8, "batch_size": 1, "color": 0}},
        "m": {"class_type": "SolidMask", "inputs": {"value": 0.5, "width": 8, "height": 8}},
        "a": {"class_type": "JoinImageWithAlpha", "inputs": {"image": ["1", 0], "alpha": ["m", 0]}},
        "2": {"class_type": "Canny", "inputs": {"image": ["a", 0], "low_threshold": 0.4, "high_threshold": 0.8}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}}
    }));
    assert_invalid_input_at(&alpha, "2");
}

#[test]
fn image_stitch_lays_out_resizes_pads_and_spaces_as_comfyui() {
    let server = Server::start();
    let job = server.run(json!({
        "red": {"class_type": "EmptyImage", "inputs": {"width": 6, "height": 4, "batch_size": 2, "color": 0xFF0000}},
        "blue": {"class_type": "EmptyImage", "inputs": {"width": 3, "height": 2, "batch_size": 1, "color": 0x0000FF}},
        "beside": {"class_type": "ImageStitch", "inputs": {"image1": ["red", 0], "image2": ["blue", 0], "direction": "right", "match_image_size": true, "spacing_width": 2, "spacing_color": "green"}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["beside", 0], "filename_prefix": "beside"}},
        "above": {"class_type": "ImageStitch", "inputs": {"image1": ["red", 0], "image2": ["blue", 0], "direction": "up", "match_image_size": false, "spacing_width": 4, "spacing_color": "white"}},
        "save2": {"class_type": "SaveImage", "inputs": {"images": ["above", 0], "filename_prefix": "above"}},
        "alone": {"class_type": "ImageStitch", "inputs": {"image1": ["blue", 0], "direction": "left", "match_image_size": true, "spacing_width": 0, "spacing_color": "white"}},
        "save3": {"class_type": "SaveImage", "inputs": {"images": ["alone", 0], "filename_prefix": "alone"}}
    }));
    // Blue 3x2 resized to red's height keeps its aspect: 6x4, after a 2-pixel green strip.
    let beside = saved_pngs(&server, &job, "save");
    assert_eq!(beside.len(), 2, "the single blue image repeats over red's batch");
    for image in &beside {
        assert_eq!(image.dimensions(), (14, 4));
        assert_near(image.get_pixel(5, 3).0, [255, 0, 0], "red");
        assert_eq!(image.get_pixel(6, 0).0, [0, 255, 0, 255], "the strip");
        assert_eq!(image.get_pixel(7, 3).0, [0, 255, 0, 255], "the strip");
        assert_near(image.get_pixel(8, 0).0, [0, 0, 255], "the resized blue");
        assert_near(image.get_pixel(13, 3).0, [0, 0, 255], "the resized blue");
    }
    // Unmatched, above: blue centred on red's width (one column of white padding left).
    let above = &saved_pngs(&server, &job, "save2")[0];
    assert_eq!(above.dimensions(), (6, 10));
    assert_eq!(above.get_pixel(0, 0).0, [255, 255, 255, 255], "padding");
    assert_eq!(above.get_pixel(1, 1).0, [0, 0, 255, 255], "blue");
    assert_eq!(above.get_pixel(4, 1).0, [255, 255, 255, 255], "padding");
    assert_eq!(above.get_pixel(3, 4).0, [255, 255, 255, 255], "the strip");
    assert_eq!(above.get_pixel(3, 6).0, [255, 0, 0, 255], "red");
    let alone = &saved_pngs(&server, &job, "save3")[0];
    assert_eq!(alone.dimensions(), (3, 2), "without image2, image1 unchanged");
}

#[test]
fn a_stitch_wider_than_the_largest_side_is_invalid_input() {
    let server = Server::start();
    let job = server.run(json!({
        "1": {"class_type": "EmptyImage", "inputs": {"width": 16384, "height": 1, "batch_size": 1, "color": 0}},
        "2": {"class_type": "ImageStitch", "inputs": {"image1": ["1", 0], "image2": ["1", 0], "direction": "right", "match_image_size": false, "spacing_width": 0, "spacing_color": "white"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "x"}}
    }));
    assert_invalid_input_at(&job, "2");
}

#[test]
fn image_add_noise_saves_comfyuis_seeded_noise_byte_for_byte() {
    let server = Server::start();
    let case = fixture_case("ImageAddNoise", "image", "flat");
    let job = server.run(json!({
        "flat": {"class_type": "EmptyImage", "inputs": {"width": 4, "height": 3, "batch_size": 2, "color": 0x336699}},
        "noisy": {"class_type": "ImageAddNoise", "inputs": {"image": ["flat", 0], "seed": case["inputs"]["seed"], "strength": case["inputs"]["strength"]}},
        "save": {"class_type": "SaveImage", "inputs": {"images": ["noisy", 0], "filename_prefix": "noisy"}},
        "still": {"class_type": "ImageAddNoise", "inputs": {"image": ["flat", 0], "seed": 4_000_000_000_000u64, "strength": 0.0}},
        "save2": {"class_type": "SaveImage", "inputs": {"images": ["still", 0], "filename_prefix": "still"}}
    }));
    let (_, want) = fixture_bytes(case["outputs"][0]["tensor"].as_str().unwrap());
    let got: Vec<u8> = saved_pngs(&server, &job, "save")
        .iter()
        .flat_map(|image| image.pixels().flat_map(|p| [p[0], p[1], p[2]]).collect::<Vec<_>>())
        .collect();
    assert!(got == want, "the noisy pixels differ from ComfyUI's");
    let still = &saved_pngs(&server, &job, "save2")[0];
    assert_near(still.get_pixel(2, 1).0, [0x33, 0x66, 0x99], "no strength, no noise");
}
