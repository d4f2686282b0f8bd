//! Fuzz target: see `weft::fuzzing::wit_values`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::wit_values(data));
