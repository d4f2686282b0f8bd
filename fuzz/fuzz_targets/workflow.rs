//! Fuzz target: see `weft::fuzzing::workflow`. The catalogue is loaded in `init`, before
//! libFuzzer's per-input timeout applies.
#![no_main]

libfuzzer_sys::fuzz_target!(
    init: weft::fuzzing::prepare_workflow(),
    |data: &[u8]| weft::fuzzing::workflow(data)
);
