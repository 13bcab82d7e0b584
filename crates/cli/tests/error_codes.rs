//! Every error code is mapped once across the workspace and documented.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if p.is_dir() && !name.starts_with("target") && name != "tests" && name != "fuzz" {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `Variant => "E1234"` and `ErrorCode("E1234")` sites: the code mappings.
fn mappings() -> BTreeMap<String, Vec<String>> {
    let mut files = Vec::new();
    for d in ["crates", "providers"] {
        rust_files(&root().join(d), &mut files);
    }
    let mut found: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (n, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.starts_with("//") || t.starts_with("assert") {
                continue;
            }
            for pat in ["=> \"E", "ErrorCode(\"E"] {
                if let Some(i) = t.find(pat) {
                    let code: String = t[i + pat.len() - 1..].chars().take(5).collect();
                    if code.len() == 5 && code[1..].chars().all(|c| c.is_ascii_digit()) {
                        found
                            .entry(code)
                            .or_default()
                            .push(format!("{}:{}", f.display(), n + 1));
                    }
                }
            }
        }
    }
    found
}

#[test]
fn no_two_error_mappings_share_a_code() {
    let dupes: Vec<_> = mappings()
        .into_iter()
        .filter(|(_, sites)| sites.len() > 1)
        .collect();
    assert!(dupes.is_empty(), "codes mapped more than once: {dupes:#?}");
}

#[test]
fn every_mapped_error_code_is_documented_in_docs_errors_md() {
    let doc = std::fs::read_to_string(root().join("docs/ERRORS.md")).unwrap();
    let map = mappings();
    assert!(
        map.len() > 50,
        "the scan found too few codes: {}",
        map.len()
    );
    let missing: Vec<_> = map
        .keys()
        .filter(|c| !doc.contains(&format!("| {c} |")))
        .collect();
    assert!(missing.is_empty(), "undocumented codes: {missing:?}");
}
