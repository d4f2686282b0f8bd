//! Fuzz target: see `weft::fuzzing::safetensors`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::safetensors(data));
