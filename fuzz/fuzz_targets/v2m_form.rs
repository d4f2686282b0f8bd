//! Fuzz target: see `weft::fuzzing::v2m_form`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| weft::fuzzing::v2m_form(data));
