//! `.kir` text → parse → verify → print → parse → print (the checks are in
//! tests/robust/fuzz_checks.rs, shared with the corpus replay test).
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/robust/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| fuzz_checks::kir_roundtrip(data));
