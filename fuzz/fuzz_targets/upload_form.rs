//! Fuzz target: see `weft::fuzzing::upload_form`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::upload_form(data));
