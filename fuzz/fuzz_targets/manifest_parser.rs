//! `parse_manifest` on arbitrary text. Invariants:
//! - an accepted manifest re-validates from its JSON value to the same result,
//!   has a non-empty id, a non-empty worker argv without empty elements, and
//!   driver lookup by key finds a driver with that key;
//! - a rejected one is an E1xxx error with a non-empty message and, when it
//!   has a JSON path, a path rooted at `$`; the same text gives the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandhost_contract::manifest::{parse_manifest, validate_manifest};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_manifest(text) {
        Ok(m) => {
            let value: serde_json::Value =
                serde_json::from_str(text).expect("accepted text is JSON");
            assert_eq!(
                validate_manifest(&value).as_ref(),
                Ok(&m),
                "re-validation differs"
            );
            assert!(!m.id.is_empty());
            assert!(!m.worker.command.is_empty());
            assert!(m.worker.command.iter().all(|a| !a.is_empty()));
            for d in &m.environment_drivers {
                let found = m.driver(&d.driver_key).expect("declared driver is found");
                assert_eq!(found.driver_key, d.driver_key);
            }
        }
        Err(e) => {
            let code = e.code();
            assert!(
                code.as_str().starts_with("E1"),
                "{code} for a manifest error"
            );
            assert!(!e.to_string().is_empty());
            if let Some(path) = e.json_path() {
                assert!(path.starts_with('$'), "path {path:?}");
            }
            assert_eq!(parse_manifest(text).err(), Some(e));
        }
    }
});
