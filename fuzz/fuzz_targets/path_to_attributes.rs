//! Fuzz target: see `targets::path_to_attributes` for what it feeds and which invariants it checks.
#![no_main]

// Every target binary includes all the bodies and calls one of them.
#[allow(dead_code)]
#[path = "../targets.rs"]
mod targets;

libfuzzer_sys::fuzz_target!(|data: &[u8]| targets::path_to_attributes(data));
