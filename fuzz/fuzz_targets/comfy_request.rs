//! Fuzz target: see `weft::fuzzing::comfy_request`. The server is built in `init`, before
//! libFuzzer's per-input timeout applies (compiling the built-in plugins takes longer than
//! one input may).
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: weft::fuzzing::prepare_comfy_request(),
    |data: &[u8]| weft::fuzzing::comfy_request(data)
);
