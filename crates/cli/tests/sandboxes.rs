//! run / create / exec / ls / kill through the built binary, on a fresh home,
//! against the examples/ Python plugin (real worker processes over pipes).
//! The same commands run on the built-in providers in `builtin_providers.rs`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

struct Env {
    home: tempfile::TempDir,
}

fn plugin_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/python-provider")
}

impl Env {
    fn new() -> Self {
        Self {
            home: tempfile::tempdir().unwrap(),
        }
    }

    fn cmd(&self) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_sandhost"));
        c.env_remove("SANDHOST_PLUGIN_PATH")
            .arg("--home")
            .arg(self.home.path())
            .arg("--plugin-dir")
            .arg(plugin_dir());
        c
    }

    fn sandhost(&self, args: &[&str]) -> Output {
        self.cmd().args(args).output().unwrap()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

const PY: &str = "python-tempdir";

#[test]
fn run_streams_stdout_and_stderr_and_exits_with_the_command_status() {
    let e = Env::new();
    let o = e.sandhost(&[
        "run",
        "--provider",
        PY,
        "--",
        "sh",
        "-c",
        "echo hello; echo oops >&2; exit 3",
    ]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "hello\n");
    assert!(text(&o.stderr).contains("oops"));
}

#[test]
fn run_leaves_no_sandbox_behind() {
    let e = Env::new();
    let o = e.sandhost(&["run", "--provider", PY, "--", "true"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let ls = e.sandhost(&["--json", "ls"]);
    let v: Value = serde_json::from_slice(&ls.stdout).unwrap();
    assert_eq!(v, Value::Array(vec![]));
}

#[test]
fn run_past_its_timeout_exits_124() {
    let e = Env::new();
    let o = e.sandhost(&[
        "run",
        "--provider",
        PY,
        "--timeout",
        "1",
        "--",
        "sleep",
        "30",
    ]);
    assert_eq!(o.status.code(), Some(124), "{}", text(&o.stderr));
}

#[test]
fn run_passes_env_and_cwd() {
    let e = Env::new();
    let o = e.sandhost(&[
        "run",
        "--provider",
        PY,
        "--env",
        "GREETING=hi there",
        "--",
        "sh",
        "-c",
        "echo \"$GREETING\"",
    ]);
    assert_eq!(text(&o.stdout), "hi there\n", "{}", text(&o.stderr));
}

#[test]
fn run_with_a_template_without_shell_fails_with_e3004_and_exit_125() {
    let e = Env::new();
    let t = e.home.path().join("files-only.yaml");
    std::fs::write(&t, "name: files-only\ncapabilities: [files]\n").unwrap();
    let o = e.sandhost(&[
        "run",
        "--provider",
        PY,
        "--template",
        t.to_str().unwrap(),
        "--",
        "echo",
        "x",
    ]);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("E3004") && err.contains("shell"), "{err}");
    assert!(
        err.contains("suggestion") && err.contains("capabilities"),
        "{err}"
    );
    assert!(o.stdout.is_empty(), "nothing ran");
}

#[test]
fn a_template_asking_for_terminal_on_a_provider_without_duplex_is_refused_at_create() {
    let e = Env::new();
    let t = e.home.path().join("term.yaml");
    std::fs::write(&t, "name: term\ncapabilities: [shell, terminal]\n").unwrap();
    let o = e.sandhost(&[
        "create",
        "--provider",
        PY,
        "--template",
        t.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(
        err.contains("E5203") && err.contains("duplexChannelOpen"),
        "{err}"
    );
}

#[test]
fn an_unknown_provider_is_a_typed_error_listing_the_available_ones() {
    let e = Env::new();
    let o = e.sandhost(&["run", "--provider", "nope", "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("E5201") && err.contains(PY), "{err}");
}

#[test]
fn create_then_exec_from_another_process_then_kill() {
    let e = Env::new();
    let o = e.sandhost(&["--json", "create", "--provider", PY, "--ttl", "600"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let created: Value = serde_json::from_slice(&o.stdout).unwrap();
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["provider"], PY);
    assert!(created["expires"].is_string());

    // each sandhost invocation is its own process with its own worker
    let o = e.sandhost(&["exec", &id, "--", "sh", "-c", "echo state > kept.txt"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = e.sandhost(&["exec", &id, "--", "cat", "kept.txt"]);
    assert_eq!(text(&o.stdout), "state\n", "{}", text(&o.stderr));

    let ls: Value = serde_json::from_slice(&e.sandhost(&["--json", "ls"]).stdout).unwrap();
    assert_eq!(ls.as_array().unwrap().len(), 1);
    assert_eq!(ls[0]["id"], id.as_str());

    let o = e.sandhost(&["kill", &id]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let ls: Value = serde_json::from_slice(&e.sandhost(&["--json", "ls"]).stdout).unwrap();
    assert_eq!(ls, Value::Array(vec![]));
    let o = e.sandhost(&["exec", &id, "--", "true"]);
    assert_eq!(o.status.code(), Some(125));
    assert!(text(&o.stderr).contains("E5004"));
}

#[test]
fn exec_after_the_plugin_is_gone_is_refused_with_an_identity_error() {
    let e = Env::new();
    let o = e.sandhost(&["create", "--provider", PY]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_string();
    // the same home without the plugin directory
    let o = Command::new(env!("CARGO_BIN_EXE_sandhost"))
        .env_remove("SANDHOST_PLUGIN_PATH")
        .arg("--home")
        .arg(e.home.path())
        .args(["exec", &id, "--", "true"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(
        err.contains("E5204") && err.contains("sandhost-example-python"),
        "{err}"
    );
}

#[test]
fn run_put_then_get_round_trips_a_directory_through_the_sandbox() {
    let e = Env::new();
    let src = e.home.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("a.txt"), "alpha\n").unwrap();
    std::fs::write(src.join("sub/b.txt"), "beta\n").unwrap();
    let out = e.home.path().join("out");
    let put = format!("{}:data", src.display());
    let get = format!("data:{}", out.display());
    let o = e.sandhost(&[
        "run",
        "--provider",
        PY,
        "--put",
        &put,
        "--get",
        &get,
        "--",
        "sh",
        "-c",
        "cat data/a.txt data/sub/b.txt > data/both.txt",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(
        std::fs::read_to_string(out.join("both.txt")).unwrap(),
        "alpha\nbeta\n"
    );
    assert_eq!(
        std::fs::read_to_string(out.join("sub/b.txt")).unwrap(),
        "beta\n"
    );
}

#[test]
fn cp_copies_a_file_in_and_out_of_a_long_lived_sandbox() {
    let e = Env::new();
    let o = e.sandhost(&["create", "--provider", PY]);
    let id = text(&o.stdout).trim().to_string();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let f = e.home.path().join("in.txt");
    std::fs::write(&f, "payload").unwrap();
    let o = e.sandhost(&["cp", f.to_str().unwrap(), &format!("{id}:in.txt")]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let o = e.sandhost(&[
        "exec",
        &id,
        "--",
        "sh",
        "-c",
        "tr a-z A-Z < in.txt > out.txt",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let back = e.home.path().join("back.txt");
    let o = e.sandhost(&["cp", &format!("{id}:out.txt"), back.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "PAYLOAD");
    e.sandhost(&["kill", &id]);
}

#[test]
fn cp_into_a_sandbox_whose_template_lacks_files_fails_with_e3004() {
    let e = Env::new();
    let t = e.home.path().join("shell-only.yaml");
    std::fs::write(&t, "name: shell-only\ncapabilities: [shell]\n").unwrap();
    let o = e.sandhost(&[
        "create",
        "--provider",
        PY,
        "--template",
        t.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let id = text(&o.stdout).trim().to_string();
    let f = e.home.path().join("x");
    std::fs::write(&f, "x").unwrap();
    let o = e.sandhost(&["cp", f.to_str().unwrap(), &format!("{id}:x")]);
    assert_eq!(o.status.code(), Some(125));
    let err = text(&o.stderr);
    assert!(err.contains("E3004") && err.contains("files"), "{err}");
    e.sandhost(&["kill", &id]);
}
