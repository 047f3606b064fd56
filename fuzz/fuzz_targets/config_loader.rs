//! Arbitrary bytes as a config file: the loader answers rules or errors with a file, line and
//! reason, never a panic or a hang.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Err(error) = tollgate::config::file::parse(std::path::Path::new("fuzz.yaml"), text) {
            // Every error renders (file:line: path: reason).
            assert!(error.to_string().starts_with("fuzz.yaml:"));
        }
    }
});
