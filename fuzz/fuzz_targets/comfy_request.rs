//! Fuzz target: see `weft::fuzzing::comfy_request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::comfy_request(data));
