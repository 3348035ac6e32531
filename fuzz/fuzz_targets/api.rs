//! Random programs of public-API calls on a CPU context; nothing may panic
//! (the interpreter is in tests/robust/fuzz_checks.rs, shared with the
//! corpus replay test).
#![no_main]

#[allow(dead_code)]
#[path = "../../tests/robust/fuzz_checks.rs"]
mod fuzz_checks;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = fuzz_checks::api(data);
});
