//! Every fuzz target's seeds and every input it ever crashed on (`fuzz/seeds/<target>/*`,
//! `fuzz/regressions/<target>/*`), replayed through the target's entry point in
//! `weft::fuzzing` as a plain test: each must be answered without a panic.

use std::path::PathBuf;

/// Replays every file kept for `target` through `run`, and returns how many there were.
fn replay(target: &str, run: fn(&[u8])) -> usize {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut count = 0;
    for folder in ["seeds", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(folder).join(target)) else {
            continue;
        };
        let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("a directory entry").path()).collect();
        paths.sort();
        for path in paths {
            let data = std::fs::read(&path).expect("reading a kept input");
            eprintln!("{}", path.display());
            run(&data);
            count += 1;
        }
    }
    assert!(count > 0, "no seeds or regressions kept for {target}");
    count
}

#[test]
fn workflows_that_once_crashed_the_validator_are_clean_errors() {
    replay("workflow", weft::fuzzing::workflow);
}

#[test]
fn upload_bodies_that_once_crashed_the_form_reader_are_clean_errors() {
    replay("upload_form", weft::fuzzing::upload_form);
}

#[test]
fn video_to_music_bodies_that_once_crashed_the_form_reader_are_clean_errors() {
    replay("v2m_form", weft::fuzzing::v2m_form);
}

#[test]
fn safetensors_files_that_once_crashed_the_readers_are_clean_errors() {
    replay("safetensors", weft::fuzzing::safetensors);
}

#[test]
fn image_files_that_once_crashed_the_decoder_are_clean_errors() {
    replay("image_decode", weft::fuzzing::image_decode);
}

#[test]
fn guest_results_that_once_crashed_the_wit_conversions_are_clean_errors() {
    replay("wit_values", weft::fuzzing::wit_values);
}

#[test]
fn comfy_protocol_requests_that_once_crashed_a_route_are_clean_errors() {
    replay("comfy_request", weft::fuzzing::comfy_request);
}

#[test]
fn json_bodies_whose_scan_once_disagreed_with_their_parse_are_counted_right() {
    replay("json_body", weft::fuzzing::json_body);
}
