//! Fuzz target: see `weft::fuzzing::workflow`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::workflow(data));
