//! `parse_scenario` on arbitrary text, then resolution. Invariants:
//! - resolution is deterministic and every explain line agrees with its
//!   effective bit (`on...` exactly when the key is effective);
//! - an absent plugin, an absent worker or a failed handshake grants nothing;
//! - a key the driver declares false is never effective;
//! - a rejected scenario is an E1xxx error with a non-empty message and, when it
//!   has a JSON path, a path rooted at `$`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandhost_contract::capability::Declared;
use sandhost_contract::scenario::parse_scenario;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_scenario(text) {
        Ok(s) => {
            let r = s.resolve();
            let again = s.resolve();
            assert_eq!(r.effective, again.effective);
            assert_eq!(r.explain, again.explain);
            for (cap, on) in r.effective.iter() {
                let line = r.explain.get(cap);
                assert!(!line.is_empty(), "{cap}: empty explanation");
                assert_eq!(line.starts_with("on"), *on, "{cap}: {line}");
            }
            let grants_nothing =
                s.plugin.is_none() || s.worker.as_ref().is_none_or(|w| w.ok == Some(false));
            if grants_nothing {
                assert!(
                    r.effective.iter().all(|(_, on)| !on),
                    "granted without plugin/worker"
                );
            }
            if let Some(driver) = s.plugin.as_ref().and_then(|p| p.driver(&s.driver_key)) {
                for (cap, declared) in driver.declared.iter() {
                    if *declared == Declared::False {
                        assert!(
                            !r.effective.value(cap),
                            "{cap} declared false but effective"
                        );
                    }
                }
            }
        }
        Err(e) => {
            let code = e.code();
            assert!(
                code.as_str().starts_with("E1"),
                "{code} for a scenario error"
            );
            assert!(!e.to_string().is_empty());
            if let Some(path) = e.json_path() {
                assert!(path.starts_with('$'), "path {path:?}");
            }
            assert_eq!(parse_scenario(text).err(), Some(e));
        }
    }
});
