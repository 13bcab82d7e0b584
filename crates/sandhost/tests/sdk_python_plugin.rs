//! The SDK's five capability handles through the examples/ Python plugin
//! (a real worker process). Terminal and ports need duplex channels, which
//! that plugin lacks: a template declaring them is refused at create.

use std::path::{Path, PathBuf};
use std::time::Duration;

use sandhost::{
    parse_template, CommandCapability, CommandEvent, EntryKind, Host, HostOptions, RunOptions,
    Sandbox, SandboxOptions,
};

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider")
}

async fn host(home: &Path) -> Host {
    let mut o = HostOptions::new(home).plugin_dir(plugin_dir());
    o.plugin_path_env = false;
    Host::open(o).await.unwrap()
}

async fn sandbox(host: &Host, template: Option<&str>) -> Sandbox {
    host.create(SandboxOptions {
        template: template.map(|t| parse_template(t).unwrap()),
        provider: Some("python-tempdir".into()),
        ..SandboxOptions::default()
    })
    .await
    .unwrap()
}

#[tokio::test]
async fn commands_run_to_completion_with_stdin_env_and_exit_status() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h, None).await;
    let mut opts = RunOptions {
        stdin: Some("from stdin".into()),
        ..RunOptions::default()
    };
    opts.env.insert("WHO".into(), "sdk".into());
    let out = s
        .commands()
        .unwrap()
        .run(&["sh", "-c", "cat; echo \" $WHO\"; exit 4"], opts)
        .await
        .unwrap();
    assert_eq!(out.stdout, "from stdin sdk\n");
    assert_eq!(out.exit_code, Some(4));
    assert!(!out.success());
    s.kill().await.unwrap();
}

#[tokio::test]
async fn a_spawned_command_streams_events_and_can_be_killed() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h, None).await;
    let cmds = s.commands().unwrap();
    let mut p = cmds
        .spawn(
            &["sh", "-c", "echo started; sleep 30; echo never"],
            RunOptions::default(),
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(Duration::from_secs(10), p.next())
        .await
        .unwrap();
    assert_eq!(first, Some(CommandEvent::Stdout("started\n".into())));
    p.kill(Duration::from_millis(200)).await.unwrap();
    let out = tokio::time::timeout(Duration::from_secs(10), p.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(!out.stdout.contains("never"));
    assert!(out.exit_code != Some(0) || out.signal.is_some(), "{out:?}");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn files_write_read_stat_list_mkdir_and_remove() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h, None).await;
    let f = s.files().unwrap();
    f.mkdir("d/e").await.unwrap();
    f.write("d/a.txt", b"alpha").await.unwrap();
    assert_eq!(f.read("d/a.txt").await.unwrap(), b"alpha");
    let st = f.stat("d/a.txt").await.unwrap();
    assert_eq!((st.kind, st.size), (EntryKind::File, 5));
    let names: Vec<(String, EntryKind)> = f
        .list("d")
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.kind))
        .collect();
    assert_eq!(
        names,
        vec![
            ("a.txt".into(), EntryKind::File),
            ("e".into(), EntryKind::Directory)
        ]
    );
    assert!(f.exists("d/a.txt").await.unwrap());
    f.remove("d", true).await.unwrap();
    assert!(!f.exists("d").await.unwrap());
    let err = f.read("d/a.txt").await.unwrap_err();
    assert!(err.code().as_str().starts_with("E51"), "{err}");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn code_keeps_variables_functions_and_imports_between_calls_and_reports_errors() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h, None).await;
    let code = s.code().unwrap();
    let r = code
        .run("import math\nx = 40\ndef twice(v):\n    return v * 2\nprint('ready')")
        .await
        .unwrap();
    assert_eq!(
        (r.stdout.as_str(), r.error.is_none()),
        ("ready\n", true),
        "{r:?}"
    );
    let r = code
        .run("print(twice(x) + int(math.sqrt(4)))")
        .await
        .unwrap();
    assert_eq!(r.stdout, "82\n", "{r:?}");
    let r = code
        .run("import sys\nprint('oops', file=sys.stderr)\n1/0")
        .await
        .unwrap();
    let e = r.error.expect("an error");
    assert_eq!(e.name, "ZeroDivisionError");
    assert!(e.traceback.contains("ZeroDivisionError"));
    assert_eq!(r.stderr, "oops\n");
    // another context does not see this one's variables
    let other = code
        .context("other")
        .unwrap()
        .run("print('x' in globals())")
        .await
        .unwrap();
    assert_eq!(other.stdout, "False\n");
    s.kill().await.unwrap();
}

#[tokio::test]
async fn every_handle_outside_the_template_fails_with_e3004_and_a_suggestion() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let s = sandbox(&h, Some("name: files-only\ncapabilities: [files]\n")).await;
    assert!(s.files().is_ok());
    for (cap, err) in [
        (CommandCapability::Shell, s.commands().unwrap_err()),
        (CommandCapability::Code, s.code().unwrap_err()),
        (CommandCapability::Terminal, s.terminal().unwrap_err()),
        (CommandCapability::Ports, s.ports().unwrap_err()),
    ] {
        assert_eq!(err.code().as_str(), "E3004", "{cap}: {err}");
        let suggestion = err.suggestion().unwrap();
        assert!(
            suggestion.contains(cap.as_str()) && suggestion.contains("capabilities"),
            "{suggestion}"
        );
    }
    s.kill().await.unwrap();
}

#[tokio::test]
async fn a_template_asking_for_terminal_on_a_provider_without_duplex_is_refused_at_create() {
    let home = tempfile::tempdir().unwrap();
    let h = host(home.path()).await;
    let err = h
        .create(SandboxOptions {
            template: Some(parse_template("name: t\ncapabilities: [shell, terminal]\n").unwrap()),
            provider: Some("python-tempdir".into()),
            ..SandboxOptions::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code().as_str(), "E5203", "{err}");
    assert!(err.to_string().contains("duplexChannelOpen"));
}

#[tokio::test]
async fn a_sandbox_created_by_one_host_is_reached_by_another_on_the_same_home() {
    let home = tempfile::tempdir().unwrap();
    let id = {
        let h = host(home.path()).await;
        let s = sandbox(&h, None).await;
        s.files()
            .unwrap()
            .write("kept.txt", b"still here")
            .await
            .unwrap();
        s.id().to_string()
    };
    let h = host(home.path()).await;
    assert_eq!(h.list().unwrap().len(), 1);
    let s = h.connect(&id).await.unwrap();
    assert_eq!(
        s.files().unwrap().read("kept.txt").await.unwrap(),
        b"still here"
    );
    h.kill(&id).await.unwrap();
    assert!(h.list().unwrap().is_empty());
}
