//! The command capability model (spec: command-capability-model.md) and the
//! template.yaml contract (CLI.md, Templates): vocabulary, the one default
//! baseline, template parsing and validation, and the E3004 gate.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use sandhost_contract::command::{
    missing_provider_methods, provider_methods_for, servable, CommandCapability, CommandSet,
    DEFAULT_CAPABILITIES,
};
use sandhost_contract::gate::{gate, CapabilityNotSupportedError};
use sandhost_contract::template::{
    effective_capabilities, parse_cpus, parse_duration, parse_size, parse_template, Network,
    Resources, Template,
};
use sandhost_contract::ContractError;

use CommandCapability::{Code, Files, Ports, Shell, Terminal};

const DUPLEX: [&str; 3] = [
    "duplexChannelOpen",
    "duplexChannelWrite",
    "duplexChannelClose",
];

fn fixture(name: &str) -> &'static str {
    match name {
        "omitted-capabilities" => include_str!("fixtures/templates/omitted-capabilities.yaml"),
        "files-only" => include_str!("fixtures/templates/files-only.yaml"),
        "baseline-plus-terminal" => include_str!("fixtures/templates/baseline-plus-terminal.yaml"),
        "full" => include_str!("fixtures/templates/full.yaml"),
        "unknown-capability" => include_str!("fixtures/templates/unknown-capability.yaml"),
        "unknown-field" => include_str!("fixtures/templates/unknown-field.yaml"),
        "malformed" => include_str!("fixtures/templates/malformed.yaml"),
        "missing-name" => include_str!("fixtures/templates/missing-name.yaml"),
        "duplicate-capability" => include_str!("fixtures/templates/duplicate-capability.yaml"),
        "empty" => include_str!("fixtures/templates/empty.yaml"),
        other => panic!("no fixture {other}"),
    }
}

fn ok(text: &str) -> Template {
    parse_template(text).unwrap_or_else(|e| panic!("{text:?} should parse, got {e} ({})", e.code()))
}

fn err(text: &str) -> ContractError {
    match parse_template(text) {
        Ok(t) => panic!("{text:?} should be rejected, parsed as {t:?}"),
        Err(e) => e,
    }
}

fn location(e: &ContractError) -> &str {
    match e {
        ContractError::TemplateSyntax { location, .. }
        | ContractError::UnknownCommandCapability { location, .. }
        | ContractError::UnknownTemplateField { location, .. }
        | ContractError::InvalidTemplateField { location, .. } => location,
        _ => "",
    }
}

fn set(caps: &[CommandCapability]) -> CommandSet {
    caps.iter().copied().collect()
}

/// Every subset of the vocabulary.
fn all_subsets() -> Vec<CommandSet> {
    let n = CommandCapability::ALL.len();
    (0u32..(1 << n))
        .map(|mask| {
            CommandCapability::ALL
                .iter()
                .enumerate()
                .filter(|(i, _)| mask & (1 << i) != 0)
                .map(|(_, c)| *c)
                .collect()
        })
        .collect()
}

fn assert_message_style(msg: &str) {
    assert!(!msg.is_empty(), "empty message");
    assert!(!msg.ends_with('.'), "message ends with a period: {msg}");
    let first = msg.chars().next().unwrap();
    assert!(!first.is_uppercase(), "message starts uppercase: {msg}");
}

// ---------------------------------------------------------------------------
// vocabulary and the baseline constant

#[test]
fn vocabulary_is_shell_files_code_terminal_ports_in_that_order() {
    let tokens: Vec<&str> = CommandCapability::ALL.iter().map(|c| c.as_str()).collect();
    assert_eq!(tokens, ["shell", "files", "code", "terminal", "ports"]);
    assert_eq!(
        CommandCapability::vocabulary_list(),
        "shell, files, code, terminal, ports"
    );
}

#[test]
fn every_token_round_trips_through_parse_and_display() {
    for cap in CommandCapability::ALL {
        assert_eq!(CommandCapability::parse(cap.as_str()), Some(*cap));
        assert_eq!(cap.to_string(), cap.as_str());
    }
}

#[test]
fn tokens_outside_the_vocabulary_do_not_parse() {
    for token in [
        "", "Shell", "SHELL", " shell", "shell ", "termnal", "pty", "port", "file", "*",
    ] {
        assert_eq!(CommandCapability::parse(token), None, "{token:?}");
    }
}

#[test]
fn default_capabilities_is_exactly_shell_files_code() {
    assert_eq!(DEFAULT_CAPABILITIES, set(&[Shell, Files, Code]));
    assert_eq!(DEFAULT_CAPABILITIES.len(), 3);
    assert_eq!(DEFAULT_CAPABILITIES.tokens(), ["shell", "files", "code"]);
    assert_eq!(DEFAULT_CAPABILITIES.to_string(), "{shell, files, code}");
}

#[test]
fn terminal_and_ports_are_not_in_the_baseline() {
    assert!(!DEFAULT_CAPABILITIES.contains(Terminal));
    assert!(!DEFAULT_CAPABILITIES.contains(Ports));
    let baseline: Vec<bool> = CommandCapability::ALL
        .iter()
        .map(|c| c.is_baseline())
        .collect();
    assert_eq!(baseline, [true, true, true, false, false]);
}

#[test]
fn default_capabilities_is_usable_in_const_context() {
    const BASELINE_PLUS_TERMINAL: CommandSet = DEFAULT_CAPABILITIES.with(Terminal);
    const HAS_TERMINAL: bool = BASELINE_PLUS_TERMINAL.contains(Terminal);
    const _: () = assert!(HAS_TERMINAL && !DEFAULT_CAPABILITIES.contains(Terminal));
    assert_eq!(BASELINE_PLUS_TERMINAL.len(), 4);
}

// ---------------------------------------------------------------------------
// CommandSet

#[test]
fn command_set_iterates_in_vocabulary_order_whatever_the_insertion_order() {
    let s = set(&[Ports, Shell, Terminal, Files]);
    let order: Vec<CommandCapability> = s.iter().collect();
    assert_eq!(order, [Shell, Files, Terminal, Ports]);
    assert_eq!(s.to_yaml_flow(), "[shell, files, terminal, ports]");
}

#[test]
fn command_set_insert_reports_new_members_and_len_counts_them_once() {
    let mut s = CommandSet::new();
    assert!(s.is_empty());
    assert_eq!(s.len(), 0);
    assert!(s.insert(Code));
    assert!(!s.insert(Code));
    assert!(s.insert(Ports));
    assert_eq!(s.len(), 2);
    assert!(s.contains(Code) && s.contains(Ports) && !s.contains(Shell));
    assert!(s.remove(Code));
    assert!(!s.remove(Code));
    assert_eq!(s, set(&[Ports]));
}

#[test]
fn command_set_algebra_matches_set_semantics() {
    for a in all_subsets() {
        for b in all_subsets() {
            for cap in CommandCapability::ALL.iter().copied() {
                assert_eq!(a.union(b).contains(cap), a.contains(cap) || b.contains(cap));
                assert_eq!(
                    a.intersection(b).contains(cap),
                    a.contains(cap) && b.contains(cap)
                );
                assert_eq!(
                    a.difference(b).contains(cap),
                    a.contains(cap) && !b.contains(cap)
                );
            }
            assert_eq!(a.is_subset(&b), a.iter().all(|c| b.contains(c)));
        }
    }
}

#[test]
fn command_set_from_tokens_names_the_first_unknown_token() {
    assert_eq!(
        CommandSet::from_tokens(["files", "shell"]),
        Ok(set(&[Shell, Files]))
    );
    assert_eq!(
        CommandSet::from_tokens(["files", "termnal", "x"]),
        Err("termnal")
    );
    assert_eq!(CommandSet::from_tokens([]), Ok(CommandSet::EMPTY));
}

#[test]
fn empty_command_set_displays_as_empty_braces() {
    assert_eq!(CommandSet::EMPTY.to_string(), "{}");
    assert_eq!(CommandSet::EMPTY.to_yaml_flow(), "[]");
    assert_eq!(format!("{:?}", set(&[Files])), r#"{"files"}"#);
}

// ---------------------------------------------------------------------------
// provider methods per command capability

#[test]
fn shell_files_and_code_need_environment_execute() {
    for cap in [Shell, Files, Code] {
        assert_eq!(provider_methods_for(cap), ["environmentExecute"], "{cap}");
    }
}

#[test]
fn terminal_and_ports_need_the_duplex_channel_family() {
    for cap in [Terminal, Ports] {
        assert_eq!(provider_methods_for(cap), DUPLEX, "{cap}");
    }
}

#[test]
fn every_capability_needs_at_least_one_provider_method() {
    for cap in CommandCapability::ALL {
        assert!(!provider_methods_for(*cap).is_empty(), "{cap}");
    }
}

#[test]
fn missing_provider_methods_is_empty_when_the_provider_serves_the_whole_set() {
    let everything = |_: &str| true;
    for s in all_subsets() {
        assert!(missing_provider_methods(&s, &everything).is_empty());
        assert_eq!(servable(&s, &everything), s);
    }
}

#[test]
fn terminal_on_an_execute_only_provider_names_each_missing_duplex_method() {
    let execute_only = |m: &str| m == "environmentExecute";
    let missing = missing_provider_methods(&DEFAULT_CAPABILITIES.with(Terminal), &execute_only);
    let expected: Vec<(CommandCapability, &str)> = DUPLEX.iter().map(|m| (Terminal, *m)).collect();
    assert_eq!(missing, expected);
    assert!(missing_provider_methods(&DEFAULT_CAPABILITIES, &execute_only).is_empty());
    assert_eq!(
        servable(&CommandSet::all(), &execute_only),
        DEFAULT_CAPABILITIES
    );
}

#[test]
fn a_partial_duplex_family_does_not_serve_terminal_or_ports() {
    let no_close = |m: &str| m != "duplexChannelClose";
    let missing = missing_provider_methods(&set(&[Terminal, Ports, Shell]), &no_close);
    assert_eq!(
        missing,
        [
            (Terminal, "duplexChannelClose"),
            (Ports, "duplexChannelClose")
        ]
    );
    assert_eq!(
        servable(&CommandSet::all(), &no_close),
        DEFAULT_CAPABILITIES
    );
}

#[test]
fn a_provider_without_execute_cannot_serve_the_baseline() {
    let duplex_only = |m: &str| DUPLEX.contains(&m);
    let missing = missing_provider_methods(&DEFAULT_CAPABILITIES, &duplex_only);
    assert_eq!(
        missing,
        [
            (Shell, "environmentExecute"),
            (Files, "environmentExecute"),
            (Code, "environmentExecute")
        ]
    );
}

// ---------------------------------------------------------------------------
// acceptance: effective set resolution

#[test]
fn omitting_capabilities_yields_default_capabilities() {
    let t = ok(fixture("omitted-capabilities"));
    assert_eq!(t.name, "plain");
    assert_eq!(t.declared_capabilities, None);
    assert_eq!(t.effective_capabilities(), DEFAULT_CAPABILITIES);
    assert_eq!(t.effective_capabilities(), set(&[Shell, Files, Code]));
    assert_eq!(effective_capabilities(Some(&t)), DEFAULT_CAPABILITIES);
}

#[test]
fn declared_subset_files_only_validates_and_is_the_effective_set() {
    let t = ok(fixture("files-only"));
    assert_eq!(t.declared_capabilities, Some(set(&[Files])));
    assert_eq!(t.effective_capabilities(), set(&[Files]));
    assert!(t.effective_capabilities().is_subset(&DEFAULT_CAPABILITIES));
}

#[test]
fn declared_superset_baseline_plus_terminal_validates() {
    let t = ok(fixture("baseline-plus-terminal"));
    assert_eq!(
        t.declared_capabilities,
        Some(set(&[Shell, Files, Code, Terminal]))
    );
    assert_eq!(
        t.effective_capabilities(),
        DEFAULT_CAPABILITIES.with(Terminal)
    );
}

#[test]
fn declared_sets_validate_for_every_nonempty_subset_of_the_vocabulary() {
    for s in all_subsets().into_iter().filter(|s| !s.is_empty()) {
        // Reverse order, flow and block style: the set is what counts.
        let mut tokens = s.tokens();
        tokens.reverse();
        let flow = format!("name: t\ncapabilities: [{}]\n", tokens.join(", "));
        let block: String = std::iter::once("name: t\ncapabilities:\n".to_owned())
            .chain(tokens.iter().map(|t| format!("  - {t}\n")))
            .collect();
        for text in [flow, block] {
            let t = ok(&text);
            assert_eq!(t.declared_capabilities, Some(s), "{text}");
            assert_eq!(t.effective_capabilities(), s);
        }
    }
}

#[test]
fn baseline_plus_ports_validates() {
    let t = ok("name: web\ncapabilities: [shell, files, code, ports]\n");
    assert_eq!(t.effective_capabilities(), DEFAULT_CAPABILITIES.with(Ports));
}

#[test]
fn metadata_unavailable_yields_default_capabilities() {
    assert_eq!(effective_capabilities(None), DEFAULT_CAPABILITIES);
}

#[test]
fn available_metadata_yields_its_declared_set() {
    let t = ok(fixture("files-only"));
    assert_eq!(effective_capabilities(Some(&t)), set(&[Files]));
}

#[test]
fn builtin_template_is_named_default_declares_nothing_and_has_the_baseline() {
    let t = Template::builtin();
    assert_eq!(t.name, "default");
    assert_eq!(t.declared_capabilities, None);
    assert_eq!(t.effective_capabilities(), DEFAULT_CAPABILITIES);
    assert_eq!(t.provider, None);
    assert_eq!(t.image, None);
    assert_eq!(t.rootfs, None);
    assert!(t.env.is_empty());
    assert_eq!(t.workdir, None);
    assert_eq!(t.resources, Resources::default());
    assert_eq!(t.network, Network::None);
    assert_eq!(t.timeout, None);
}

#[test]
fn full_template_parses_every_field() {
    let t = ok(fixture("full"));
    let env: BTreeMap<String, String> = [
        ("PYTHONUNBUFFERED", "1"),
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("_PRIVATE", ""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    let expected = Template {
        name: "python-dev".into(),
        declared_capabilities: Some(CommandSet::all()),
        provider: Some("docker".into()),
        image: Some("python:3.12-slim".into()),
        rootfs: Some("/var/lib/sandhost/rootfs/python".into()),
        env,
        workdir: Some("/workspace".into()),
        resources: Resources {
            memory_bytes: Some(512 * 1024 * 1024),
            cpus_milli: Some(1500),
            pids: Some(256),
            disk_bytes: Some(1024 * 1024 * 1024),
        },
        network: Network::Egress,
        timeout: Some(Duration::from_secs(300)),
    };
    assert_eq!(t, expected);
}

#[test]
fn optional_fields_default_when_omitted() {
    let t = ok("name: minimal\n");
    assert_eq!(
        Template {
            name: "minimal".into(),
            ..Template::builtin()
        },
        t
    );
}

// ---------------------------------------------------------------------------
// acceptance: unknown tokens rejected

#[test]
fn unknown_capability_token_is_rejected_naming_the_token_and_its_line() {
    let e = err(fixture("unknown-capability"));
    assert_eq!(e.code().as_str(), "E2002");
    assert_eq!(e.offending(), Some("termnal"));
    assert_eq!(location(&e), " at line 4");
    let msg = e.to_string();
    assert!(msg.contains("`termnal`") && msg.contains("line 4"), "{msg}");
    assert!(msg.contains("shell, files, code, terminal, ports"), "{msg}");
}

#[test]
fn unknown_capability_tokens_are_rejected_table() {
    // (capabilities value, offending token, line)
    let cases = [
        ("[termnal]", "termnal", 2),
        ("[Shell]", "Shell", 2),
        ("[SHELL, files]", "SHELL", 2),
        ("[shell, pty]", "pty", 2),
        ("[\"shell \"]", "shell ", 2),
        ("[\"\"]", "", 2),
        ("['*']", "*", 2),
        ("[files, port]", "port", 2),
        ("\n  - files\n  - ports\n  - gpu", "gpu", 5),
    ];
    for (value, token, line) in cases {
        let text = format!("name: t\ncapabilities: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2002", "{text}");
        assert_eq!(e.offending(), Some(token), "{text}");
        assert_eq!(location(&e), format!(" at line {line}"), "{text}");
    }
}

#[test]
fn non_string_capability_items_are_rejected() {
    for value in [
        "[1]",
        "[true]",
        "[[shell]]",
        "[{shell: true}]",
        "[shell, ~]",
        "[1.5]",
    ] {
        let text = format!("name: t\ncapabilities: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert!(
            e.offending().unwrap().starts_with("capabilities["),
            "{text}: {e}"
        );
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn duplicate_capability_tokens_are_rejected_not_deduplicated() {
    let e = err(fixture("duplicate-capability"));
    assert_eq!(e.code().as_str(), "E2005");
    assert_eq!(e.offending(), Some("capabilities"));
    assert_eq!(location(&e), " at line 5");
    assert!(
        e.to_string()
            .contains("`files` is listed twice (first at line 3)"),
        "{e}"
    );
}

#[test]
fn capabilities_must_be_a_nonempty_list() {
    for value in [
        "shell",
        "\"shell, files\"",
        "{shell: true}",
        "[]",
        "1",
        "true",
    ] {
        let text = format!("name: t\ncapabilities: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some("capabilities"), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn empty_capabilities_list_is_rejected_with_a_pointer_to_the_default() {
    let e = err("name: t\ncapabilities: []\n");
    assert!(
        e.to_string()
            .contains("omit the field to inherit the default"),
        "{e}"
    );
}

// ---------------------------------------------------------------------------
// acceptance: E3004 gate

#[test]
fn invoking_a_capability_outside_the_effective_set_raises_e3004_with_a_populated_suggestion() {
    for effective in all_subsets() {
        for cap in CommandCapability::ALL.iter().copied() {
            let result = gate(&effective, cap, Some("tmpl"));
            if effective.contains(cap) {
                assert_eq!(result, Ok(()), "{cap} in {effective}");
                continue;
            }
            let e = result.expect_err("outside the effective set");
            assert_eq!(e.code().as_str(), "E3004");
            assert_eq!(e.capability, cap);
            assert_eq!(e.available, effective);
            assert_eq!(e.template.as_deref(), Some("tmpl"));
            assert!(!e.suggestion.is_empty());
            for available in effective.iter() {
                assert!(
                    e.suggestion.contains(available.as_str()),
                    "{}",
                    e.suggestion
                );
            }
            let how = format!(
                "add \"{cap}\" to capabilities: in template.yaml of template `tmpl` \
                 (capabilities: {})",
                effective.with(cap).to_yaml_flow()
            );
            assert!(e.suggestion.contains(&how), "{}\nlacks {how}", e.suggestion);
            let contract: ContractError = e.clone().into();
            assert_eq!(contract.code().as_str(), "E3004");
            assert_eq!(contract.offending(), Some(cap.as_str()));
            assert_eq!(contract.to_string(), e.to_string());
        }
    }
}

#[test]
fn gate_on_the_baseline_refuses_terminal_and_says_it_must_be_declared_explicitly() {
    let e = gate(&DEFAULT_CAPABILITIES, Terminal, None).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sandbox does not support the `terminal` capability"
    );
    assert_eq!(
        e.suggestion,
        "available capabilities: shell, files, code; add \"terminal\" to capabilities: in \
         template.yaml (capabilities: [shell, files, code, terminal]); `terminal` is not in the \
         default baseline {shell, files, code}, so it must be declared explicitly, and the \
         sandbox's provider must implement duplexChannelOpen, duplexChannelWrite, \
         duplexChannelClose"
    );
}

#[test]
fn gate_on_the_baseline_allows_shell_files_and_code() {
    for cap in [Shell, Files, Code] {
        assert_eq!(gate(&DEFAULT_CAPABILITIES, cap, None), Ok(()));
    }
    assert!(gate(&DEFAULT_CAPABILITIES, Ports, None).is_err());
}

#[test]
fn gate_on_a_template_that_opted_out_of_a_baseline_capability_says_so() {
    let t = ok(fixture("files-only"));
    let e = gate(&t.effective_capabilities(), Shell, Some(&t.name)).unwrap_err();
    assert_eq!(
        e.to_string(),
        "sandbox does not support the `shell` capability (template `files-only`)"
    );
    assert!(
        e.suggestion.starts_with("available capabilities: files;"),
        "{}",
        e.suggestion
    );
    assert!(
        e.suggestion.contains("(capabilities: [shell, files])"),
        "{}",
        e.suggestion
    );
    assert!(
        e.suggestion.contains("is in the default baseline"),
        "{}",
        e.suggestion
    );
    assert!(
        !e.suggestion.contains("must be declared explicitly"),
        "{}",
        e.suggestion
    );
}

#[test]
fn gate_on_an_empty_set_says_nothing_is_available() {
    let e = gate(&CommandSet::EMPTY, Code, None).unwrap_err();
    assert!(e
        .suggestion
        .starts_with("this sandbox offers no command capabilities;"));
    assert!(e.suggestion.contains("(capabilities: [code])"));
}

#[test]
fn gate_without_metadata_uses_the_baseline() {
    let effective = effective_capabilities(None);
    assert_eq!(gate(&effective, Shell, None), Ok(()));
    let e = gate(&effective, Ports, None).unwrap_err();
    assert_eq!(e.code().as_str(), "E3004");
    assert!(e.suggestion.contains("must be declared explicitly"));
}

#[test]
fn gate_messages_are_lowercase_without_a_final_period() {
    for effective in all_subsets() {
        for cap in CommandCapability::ALL.iter().copied() {
            if let Err(e) = gate(&effective, cap, Some("t")) {
                assert_message_style(&e.to_string());
                assert_message_style(&e.suggestion);
            }
        }
    }
}

#[test]
fn capability_not_supported_error_new_matches_gate() {
    let via_gate = gate(&set(&[Files]), Ports, Some("x")).unwrap_err();
    let direct = CapabilityNotSupportedError::new(Ports, set(&[Files]), Some("x"));
    assert_eq!(via_gate, direct);
}

// ---------------------------------------------------------------------------
// fail closed

#[test]
fn malformed_template_fails_closed_and_never_falls_back_to_the_default() {
    let cases: Vec<(&str, &str)> = vec![
        (fixture("malformed"), "E2001"),
        (fixture("empty"), "E2001"),
        (fixture("missing-name"), "E2004"),
        (fixture("unknown-field"), "E2003"),
        (fixture("unknown-capability"), "E2002"),
        (fixture("duplicate-capability"), "E2005"),
        ("", "E2001"),
        ("   \n", "E2001"),
        ("name: [unclosed\n", "E2001"),
        ("name: x\ncapabilities: [shell\n", "E2001"),
        ("name: x\n  bad indent: 1\n", "E2001"),
        ("- name: x\n", "E2001"),
        ("just a string\n", "E2001"),
        ("42\n", "E2001"),
        ("name: x\nname: y\n", "E2001"),
        ("name: x\n---\nname: y\n", "E2001"),
        ("name: x\ncapabilities: !custom [shell]\n", "E2001"),
        ("base: &b {name: x}\n<<: *b\n", "E2001"),
        (
            "name: x\ncapabilities: [shell, files, terminal, oops]\n",
            "E2002",
        ),
        ("name: x\ncapabilities:\n", "E2005"),
        ("name: x\ncapabilities: ~\n", "E2005"),
    ];
    for (text, code) in cases {
        let result = parse_template(text);
        assert!(result.is_err(), "{text:?} must fail closed, got {result:?}");
        let e = result.unwrap_err();
        assert_eq!(e.code().as_str(), code, "{text:?}: {e}");
        assert_message_style(&e.to_string());
    }
}

#[test]
fn a_malformed_file_that_declares_capabilities_is_still_rejected() {
    // Even when the valid prefix declares a reduced set, nothing is returned.
    let e = err("name: x\ncapabilities: [files]\nresources: {memory: lots}\n");
    assert_eq!(e.code().as_str(), "E2005");
    assert_eq!(e.offending(), Some("resources.memory"));
}

#[test]
fn yaml_syntax_errors_carry_line_and_column() {
    let e = err(fixture("malformed"));
    let loc = location(&e);
    assert!(
        loc.starts_with(" at line ") && loc.contains(", column "),
        "{loc:?}"
    );
    let e = err("name: x\nname: y\n");
    assert_eq!(location(&e), " at line 2, column 1");
    assert!(e.to_string().contains("duplicate"), "{e}");
}

#[test]
fn oversized_template_is_rejected_before_parsing() {
    let text = format!("name: big\n#{}\n", "x".repeat(1024 * 1024));
    assert_eq!(err(&text).code().as_str(), "E2001");
}

#[test]
fn deeply_nested_yaml_is_rejected_not_overflowed() {
    let text = format!("name: x\nenv: {}{}\n", "[".repeat(500), "]".repeat(500));
    assert_eq!(err(&text).code().as_str(), "E2001");
}

// ---------------------------------------------------------------------------
// every field's validation

#[test]
fn missing_name_is_rejected_naming_the_field() {
    let e = err(fixture("missing-name"));
    assert_eq!(e, ContractError::MissingTemplateField { field: "name" });
    assert_eq!(e.code().as_str(), "E2004");
    assert_eq!(e.offending(), Some("name"));
}

#[test]
fn name_validation_table() {
    for good in [
        "a",
        "files-only",
        "python3.12",
        "my_template",
        "A-1.b_c",
        &"x".repeat(128),
    ] {
        assert_eq!(ok(&format!("name: \"{good}\"\n")).name, good);
    }
    let bad = [
        "\"\"",
        "\"has space\"",
        "\"../escape\"",
        "\"a/b\"",
        "-dash",
        ".hidden",
        "\"tab\\there\"",
        "\"nul\\0\"",
        "123",
        "true",
        "[a]",
        "{a: b}",
        "\"é\"",
    ];
    for value in bad
        .iter()
        .map(|s| s.to_string())
        .chain([format!("\"{}\"", "x".repeat(129))])
    {
        let text = format!("capabilities: [shell]\nname: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some("name"), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn unknown_top_level_field_is_rejected_with_its_name_and_line() {
    let e = err(fixture("unknown-field"));
    assert_eq!(e.code().as_str(), "E2003");
    assert_eq!(e.offending(), Some("capabilites"));
    assert_eq!(
        e.to_string(),
        "unknown template field `capabilites` at line 2"
    );
    for (text, field, line) in [
        ("name: x\nimg: python\n", "img", 2),
        ("name: x\nNetwork: none\n", "Network", 2),
        ("name: x\ndescription: hi\n", "description", 2),
        ("name: x\n1: one\n", "1", 2),
        (
            "name: x\nresources:\n  cpus: 1\n  memroy: 1Gi\n",
            "resources.memroy",
            4,
        ),
        ("name: x\nresources:\n  cpu: 1\n", "resources.cpu", 3),
    ] {
        let e = err(text);
        assert_eq!(e.code().as_str(), "E2003", "{text}");
        assert_eq!(e.offending(), Some(field), "{text}");
        assert_eq!(location(&e), format!(" at line {line}"), "{text}");
    }
}

#[test]
fn null_field_values_are_rejected_rather_than_treated_as_unset() {
    for field in [
        "provider",
        "image",
        "rootfs",
        "env",
        "workdir",
        "resources",
        "network",
        "timeout",
    ] {
        let text = format!("name: x\n{field}: ~\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some(field), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
    let e = err("name: x\nresources:\n  pids:\n");
    assert_eq!(e.offending(), Some("resources.pids"));
}

#[test]
fn provider_image_and_rootfs_validation_table() {
    let t =
        ok("name: x\nprovider: local\nimage: ghcr.io/a/b:1.0@sha256:ab\nrootfs: /srv/my rootfs\n");
    assert_eq!(t.provider.as_deref(), Some("local"));
    assert_eq!(t.image.as_deref(), Some("ghcr.io/a/b:1.0@sha256:ab"));
    assert_eq!(t.rootfs.as_deref(), Some("/srv/my rootfs"));
    for (field, value) in [
        ("provider", "\"\""),
        ("provider", "\"two words\""),
        ("provider", "1"),
        ("provider", "[local]"),
        ("image", "\"\""),
        ("image", "\"py thon\""),
        ("image", "\"a\\nb\""),
        ("image", "false"),
        ("rootfs", "\"\""),
        ("rootfs", "\"/a\\0b\""),
        ("rootfs", "{path: /x}"),
    ] {
        let text = format!("name: x\n{field}: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some(field), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn env_accepts_a_map_of_valid_names_to_strings() {
    let t = ok("name: x\nenv:\n  A: \"1\"\n  _b2: hello world\n  EMPTY: \"\"\n  EQ: \"a=b\"\n");
    assert_eq!(t.env.len(), 4);
    assert_eq!(t.env["A"], "1");
    assert_eq!(t.env["_b2"], "hello world");
    assert_eq!(t.env["EMPTY"], "");
    assert_eq!(t.env["EQ"], "a=b");
    assert!(ok("name: x\nenv: {}\n").env.is_empty());
}

#[test]
fn env_validation_table() {
    // (env block, offending field, line)
    let cases = [
        ("env: [A]", "env", 2),
        ("env: A=1", "env", 2),
        ("env:\n  \"A=B\": x", "env.A=B", 3),
        ("env:\n  1A: x", "env.1A", 3),
        ("env:\n  \"A B\": x", "env.A B", 3),
        ("env:\n  \"\": x", "env.", 3),
        ("env:\n  \"A\\0\": x", "env.A\\0", 3),
        ("env:\n  1: x", "env", 3),
        ("env:\n  A: 1", "env.A", 3),
        ("env:\n  A: true", "env.A", 3),
        ("env:\n  A:", "env.A", 3),
        ("env:\n  A: [x]", "env.A", 3),
        ("env:\n  A: \"x\\0y\"", "env.A", 3),
    ];
    for (block, field, line) in cases {
        let text = format!("name: x\n{block}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}: {e}");
        assert_eq!(e.offending(), Some(field), "{text}");
        assert_eq!(location(&e), format!(" at line {line}"), "{text}");
    }
    // A repeated variable is a YAML duplicate key.
    let e = err("name: x\nenv:\n  A: a\n  A: b\n");
    assert_eq!(e.code().as_str(), "E2001");
    assert_eq!(location(&e), " at line 4, column 3");
}

#[test]
fn workdir_validation_table() {
    assert_eq!(ok("name: x\nworkdir: /\n").workdir.as_deref(), Some("/"));
    assert_eq!(
        ok("name: x\nworkdir: /a/b.c/..d\n").workdir.as_deref(),
        Some("/a/b.c/..d")
    );
    for value in [
        "workspace",
        "./w",
        "\"\"",
        "/a/../b",
        "/..",
        "\"/a\\0\"",
        "1",
        "[/a]",
        "~/x",
    ] {
        let text = format!("name: x\nworkdir: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some("workdir"), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn memory_and_disk_accept_sizes_and_plain_bytes() {
    let cases: [(&str, u64); 14] = [
        ("512Mi", 512 << 20),
        ("1Gi", 1 << 30),
        ("100M", 100_000_000),
        ("1048576", 1_048_576),
        ("\"2048\"", 2048),
        ("1", 1),
        ("4Ki", 4096),
        ("4k", 4000),
        ("4K", 4000),
        ("2G", 2_000_000_000),
        ("1Ti", 1 << 40),
        ("3T", 3_000_000_000_000),
        ("1Pi", 1 << 50),
        ("15Ei", 15 << 60),
    ];
    for (value, bytes) in cases {
        for field in ["memory", "disk"] {
            let r = ok(&format!("name: x\nresources:\n  {field}: {value}\n")).resources;
            let got = if field == "memory" {
                r.memory_bytes
            } else {
                r.disk_bytes
            };
            assert_eq!(got, Some(bytes), "{field}: {value}");
        }
    }
}

#[test]
fn memory_and_disk_reject_malformed_sizes() {
    let bad = [
        "0",
        "-1",
        "\"0Mi\"",
        "512MB",
        "1.5Gi",
        "Mi",
        "\"\"",
        "1.5",
        "16Ei",
        "99999999999999999999",
        "\" 1Gi\"",
        "1gi",
        "1 Gi",
        "true",
        "[1]",
    ];
    for value in bad {
        for field in ["memory", "disk"] {
            let text = format!("name: x\nresources:\n  {field}: {value}\n");
            let e = err(&text);
            assert_eq!(e.code().as_str(), "E2005", "{text}: {e}");
            assert_eq!(
                e.offending(),
                Some(format!("resources.{field}").as_str()),
                "{text}"
            );
            assert_eq!(location(&e), " at line 3", "{text}");
        }
    }
}

#[test]
fn cpus_accept_fractions_integers_and_strings() {
    for (value, milli) in [
        ("0.5", 500),
        ("1", 1000),
        ("\"1.5\"", 1500),
        ("2", 2000),
        ("0.001", 1),
        ("\"250m\"", 250),
        ("\".5\"", 500),
        ("1.25", 1250),
        ("\"3\"", 3000),
        ("64", 64_000),
    ] {
        let t = ok(&format!("name: x\nresources: {{cpus: {value}}}\n"));
        assert_eq!(t.resources.cpus_milli, Some(milli), "{value}");
    }
}

#[test]
fn cpus_reject_zero_negative_overprecise_and_non_numbers() {
    for value in [
        "0",
        "0.0",
        "-1",
        "-0.5",
        "\"0\"",
        "0.0001",
        "\"1.2345\"",
        "\"abc\"",
        "\"1.\"",
        "\"m\"",
        "\"0m\"",
        ".nan",
        ".inf",
        "true",
        "\"\"",
        "\"1,5\"",
        "5000000",
        "[1]",
    ] {
        let text = format!("name: x\nresources:\n  cpus: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}: {e}");
        assert_eq!(e.offending(), Some("resources.cpus"), "{text}");
        assert_eq!(location(&e), " at line 3", "{text}");
    }
}

#[test]
fn pids_must_be_a_positive_integer() {
    assert_eq!(
        ok("name: x\nresources: {pids: 256}\n").resources.pids,
        Some(256)
    );
    assert_eq!(
        ok("name: x\nresources: {pids: 1}\n").resources.pids,
        Some(1)
    );
    for value in ["0", "-1", "\"256\"", "1.5", "4294967296", "true"] {
        let text = format!("name: x\nresources:\n  pids: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some("resources.pids"), "{text}");
        assert_eq!(location(&e), " at line 3", "{text}");
    }
}

#[test]
fn resources_must_be_a_mapping_of_known_fields() {
    assert_eq!(
        ok("name: x\nresources: {}\n").resources,
        Resources::default()
    );
    for value in ["[memory]", "1Gi", "true"] {
        let e = err(&format!("name: x\nresources: {value}\n"));
        assert_eq!(e.code().as_str(), "E2005");
        assert_eq!(e.offending(), Some("resources"));
    }
}

#[test]
fn network_is_none_by_default_and_accepts_only_none_or_egress() {
    assert_eq!(ok("name: x\n").network, Network::None);
    assert_eq!(ok("name: x\nnetwork: none\n").network, Network::None);
    assert_eq!(ok("name: x\nnetwork: egress\n").network, Network::Egress);
    for value in [
        "None", "open", "host", "true", "false", "1", "\"\"", "[egress]",
    ] {
        let text = format!("name: x\nnetwork: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}");
        assert_eq!(e.offending(), Some("network"), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn timeout_accepts_seconds_and_duration_strings() {
    for (value, expected) in [
        ("300", Duration::from_secs(300)),
        ("1", Duration::from_secs(1)),
        ("\"90\"", Duration::from_secs(90)),
        ("30s", Duration::from_secs(30)),
        ("5m", Duration::from_secs(300)),
        ("2h", Duration::from_secs(7200)),
        ("1h30m", Duration::from_secs(5400)),
        ("1m30s", Duration::from_secs(90)),
        ("500ms", Duration::from_millis(500)),
        ("1s500ms", Duration::from_millis(1500)),
    ] {
        assert_eq!(
            ok(&format!("name: x\ntimeout: {value}\n")).timeout,
            Some(expected),
            "{value}"
        );
    }
}

#[test]
fn timeout_rejects_zero_negative_fractional_and_malformed_values() {
    for value in [
        "0",
        "\"0s\"",
        "-5",
        "1.5",
        "\"5 m\"",
        "5x",
        "\"\"",
        "m",
        "s30",
        "1.5m",
        "true",
        "[30]",
        "99999999999999999999",
        "\"99999999999999999999h\"",
        "5M",
    ] {
        let text = format!("name: x\ntimeout: {value}\n");
        let e = err(&text);
        assert_eq!(e.code().as_str(), "E2005", "{text}: {e}");
        assert_eq!(e.offending(), Some("timeout"), "{text}");
        assert_eq!(location(&e), " at line 2", "{text}");
    }
}

#[test]
fn duplicate_top_level_fields_are_rejected_with_their_line() {
    let e = err("name: x\ncapabilities: [shell]\ncapabilities: [terminal]\n");
    assert_eq!(e.code().as_str(), "E2001");
    assert_eq!(location(&e), " at line 3, column 1");
}

#[test]
fn every_template_error_is_lowercase_without_a_final_period_and_has_a_code_in_e2() {
    let texts = [
        fixture("malformed"),
        fixture("missing-name"),
        fixture("unknown-field"),
        fixture("unknown-capability"),
        fixture("duplicate-capability"),
        fixture("empty"),
        "name: x\nresources: {memory: 0}\n",
        "name: x\ntimeout: 0\n",
        "name: x\nenv: {\"A=B\": x}\n",
        "name: x\nworkdir: rel\n",
        "name: \"\"\n",
        "[1, 2]",
        "name: x\n\"a\": !!binary aGVsbG8=\n",
    ];
    for text in texts {
        let e = err(text);
        assert!(
            e.code().as_str().starts_with("E2"),
            "{text:?}: {}",
            e.code()
        );
        assert_message_style(&e.to_string());
    }
}

// ---------------------------------------------------------------------------
// the value parsers on their own

#[test]
fn parse_size_parse_cpus_and_parse_duration_agree_with_the_template_fields() {
    assert_eq!(parse_size("512Mi"), Ok(512 << 20));
    assert!(parse_size("0").is_err());
    assert!(parse_size("16Ei").is_err());
    assert_eq!(parse_cpus("1.5"), Ok(1500));
    assert_eq!(parse_cpus("250m"), Ok(250));
    assert!(parse_cpus("0.0004").is_err());
    assert_eq!(parse_duration("1h1m1s"), Ok(Duration::from_secs(3661)));
    assert!(parse_duration("").is_err());
}

// ---------------------------------------------------------------------------
// properties

fn any_set() -> impl Strategy<Value = CommandSet> {
    prop::collection::vec(prop::sample::select(CommandCapability::ALL), 0..8)
        .prop_map(|v| v.into_iter().collect())
}

proptest! {
    #[test]
    fn gate_allows_exactly_the_members_of_the_effective_set(s in any_set(), i in 0usize..5) {
        let cap = CommandCapability::ALL[i];
        let allowed = gate(&s, cap, None).is_ok();
        prop_assert_eq!(allowed, s.contains(cap));
    }

    #[test]
    fn parse_template_never_panics_and_errors_are_e2(text in "\\PC{0,200}") {
        if let Err(e) = parse_template(&text) {
            prop_assert!(e.code().as_str().starts_with("E2"));
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn templates_built_from_fields_round_trip_their_capabilities(
        s in any_set().prop_filter("nonempty", |s| !s.is_empty()),
        name in "[a-z][a-z0-9-]{0,20}",
    ) {
        let text = format!("name: {name}\ncapabilities: {}\n", s.to_yaml_flow());
        let t = parse_template(&text).unwrap();
        prop_assert_eq!(t.name, name);
        prop_assert_eq!(t.declared_capabilities, Some(s));
    }
}

// ---------------------------------------------------------------------------
// canonical form

#[test]
fn canonical_yaml_round_trips_every_field() {
    for text in [
        fixture("full"),
        fixture("files-only"),
        fixture("omitted-capabilities"),
        "name: x\nenv: {A: \"tab\\there \\\" quote \\\\ back é ☃ \\U0001F600\"}\nrootfs: \"/r\\u00e9\"\n",
        "name: y\nresources: {cpus: 0.001}\ntimeout: 1h1ms\n",
    ] {
        let t = ok(text);
        let again = ok(&t.to_yaml());
        assert_eq!(again, t, "{}", t.to_yaml());
    }
    assert_eq!(Template::builtin().to_yaml(), "name: \"default\"\n");
}

proptest! {
    #[test]
    fn canonical_yaml_round_trips_generated_templates(
        caps in prop::option::of(any_set().prop_filter("nonempty", |s| !s.is_empty())),
        env in prop::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,8}", "\\PC{0,12}", 0..4),
        workdir in prop::option::of("/[a-z/]{0,10}"),
        memory in prop::option::of(1u64..),
        cpus in prop::option::of(1u32..),
        pids in prop::option::of(1u32..),
        timeout_ms in prop::option::of(1u64..1_000_000_000),
        egress in any::<bool>(),
    ) {
        let workdir = workdir.filter(|w| !w.split('/').any(|p| p == ".."));
        let t = Template {
            name: "gen".into(),
            declared_capabilities: caps,
            env,
            workdir,
            resources: Resources { memory_bytes: memory, cpus_milli: cpus, pids, disk_bytes: memory },
            network: if egress { Network::Egress } else { Network::None },
            timeout: timeout_ms.map(Duration::from_millis),
            ..Template::builtin()
        };
        prop_assert_eq!(parse_template(&t.to_yaml()), Ok(t));
    }
}
