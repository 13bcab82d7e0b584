//! `parse_template` on arbitrary text. Invariants:
//! - an accepted template is well formed (non-empty name, a declared set is
//!   never empty, the effective set is the declared one or the baseline) and
//!   its canonical form parses back to the same template;
//! - a rejected one is an E2xxx error with a one-line, non-empty message:
//!   never a template with default capabilities (fail closed).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandhost_contract::template::{parse_template, Network};
use sandhost_contract::DEFAULT_CAPABILITIES;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse_template(text) {
        Ok(t) => {
            assert!(!t.name.is_empty());
            match t.declared_capabilities {
                Some(declared) => {
                    assert!(!declared.is_empty());
                    assert_eq!(t.effective_capabilities(), declared);
                }
                None => assert_eq!(t.effective_capabilities(), DEFAULT_CAPABILITIES),
            }
            if let Some(w) = &t.workdir {
                assert!(w.starts_with('/'));
            }
            for (k, v) in &t.env {
                assert!(!k.is_empty() && !k.contains('=') && !k.contains('\0'));
                assert!(!v.contains('\0'));
            }
            let r = t.resources;
            assert!(r.memory_bytes != Some(0) && r.disk_bytes != Some(0));
            assert!(r.cpus_milli != Some(0) && r.pids != Some(0));
            assert!(t.timeout.is_none_or(|d| !d.is_zero()));
            assert!(matches!(t.network, Network::None | Network::Egress));
            let canonical = t.to_yaml();
            assert_eq!(
                parse_template(&canonical),
                Ok(t),
                "canonical form:\n{canonical}"
            );
        }
        Err(e) => {
            let code = e.code();
            assert!(
                code.as_str().starts_with("E2"),
                "{code} for a template error"
            );
            let msg = e.to_string();
            assert!(!msg.is_empty());
            assert!(!msg.contains('\n'), "multi-line message: {msg:?}");
            // Deterministic: the same text gives the same error.
            assert_eq!(parse_template(text), Err(e));
        }
    }
});
