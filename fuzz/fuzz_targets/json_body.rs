//! Fuzz target: see `weft::fuzzing::json_body`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::json_body(data));
