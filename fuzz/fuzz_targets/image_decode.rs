//! Fuzz target: see `weft::fuzzing::image_decode`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::image_decode(data));
