//! The `code` capability: Python source run in a stateful context that keeps
//! variables, functions and imports between calls.
//!
//! The context is a small Python kernel process inside the sandbox, started
//! on first use and reached over a unix socket in the working directory. Each
//! call runs a short client through the ordinary exec path (so it streams or
//! polls like any command); the client forwards the source, relays the
//! kernel's stdout and stderr, and reports an exception as one marked last
//! line of stderr, which this module strips and parses. The kernel exits
//! when its socket disappears (the sandbox's workspace is destroyed). It
//! needs `python3` inside the sandbox.

use sandhost_contract::CommandCapability;
use sandhost_runtime::exec::{exec, Collected, ExecRequest};
use serde_json::Value;

use crate::{Error, Sandbox};

/// The kernel: serves one connection at a time; each carries one cell.
const KERNEL: &str = r#"
import io, json, os, socket, struct, sys, traceback
path = sys.argv[1]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(8)
srv.settimeout(1.0)
scope = {"__name__": "__main__"}
class Pipe(io.TextIOBase):
    def __init__(self, send, tag): self.send, self.tag = send, tag
    def writable(self): return True
    def write(self, d):
        if d: self.send({"t": self.tag, "d": d})
        return len(d)
while True:
    try:
        conn, _ = srv.accept()
    except socket.timeout:
        if not os.path.exists(path): sys.exit(0)
        continue
    f = conn.makefile("rwb")
    def send(obj, f=f):
        b = json.dumps(obj).encode()
        f.write(struct.pack(">I", len(b)) + b); f.flush()
    try:
        n = struct.unpack(">I", f.read(4))[0]
        src = f.read(n).decode()
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = Pipe(send, "out"), Pipe(send, "err")
        error = None
        try:
            exec(compile(src, "<cell>", "exec"), scope)
        except BaseException as e:
            error = {"name": type(e).__name__, "value": str(e), "traceback": traceback.format_exc()}
        finally:
            sys.stdout, sys.stderr = saved
        send({"t": "done", "error": error})
    except Exception:
        pass
    finally:
        try: conn.close()
        except Exception: pass
"#;

/// The client: argv = socket path, kernel source; the cell on stdin.
const CLIENT: &str = r#"
import json, os, socket, struct, subprocess, sys, time
path, kernel = sys.argv[1], sys.argv[2]
def connect():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    return s
try:
    s = connect()
except OSError:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    try: os.unlink(path)
    except OSError: pass
    subprocess.Popen([sys.executable, "-c", kernel, path], stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    for _ in range(100):
        try:
            s = connect(); break
        except OSError:
            time.sleep(0.05)
    else:
        sys.stderr.write("code kernel did not start\n"); sys.exit(3)
src = sys.stdin.read().encode()
s.sendall(struct.pack(">I", len(src)) + src)
f = s.makefile("rb")
while True:
    head = f.read(4)
    if len(head) < 4:
        sys.stderr.write("code kernel ended unexpectedly\n"); sys.exit(3)
    msg = json.loads(f.read(struct.unpack(">I", head)[0]))
    if msg["t"] == "out":
        sys.stdout.write(msg["d"]); sys.stdout.flush()
    elif msg["t"] == "err":
        sys.stderr.write(msg["d"]); sys.stderr.flush()
    else:
        if msg["error"] is not None:
            sys.stderr.write("\n\x1esandhost-code-error " + json.dumps(msg["error"]) + "\n")
            sys.exit(1)
        sys.exit(0)
"#;

const MARKER: &str = "\x1esandhost-code-error ";

/// An exception raised by a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeError {
    pub name: String,
    pub value: String,
    pub traceback: String,
}

/// What one cell did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Execution {
    pub stdout: String,
    pub stderr: String,
    pub error: Option<CodeError>,
}

/// A stateful Python context in a sandbox.
#[derive(Debug, Clone)]
pub struct Code {
    sandbox: Sandbox,
    context: String,
}

/// Split the kernel's error marker off stderr.
fn take_error(stderr: &str) -> (String, Option<CodeError>) {
    let Some(at) = stderr.rfind(MARKER) else {
        return (stderr.to_string(), None);
    };
    let json = stderr[at + MARKER.len()..].trim_end();
    let v: Value = serde_json::from_str(json).unwrap_or(Value::Null);
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let err = CodeError {
        name: s("name"),
        value: s("value"),
        traceback: s("traceback"),
    };
    let mut rest = stderr[..at].to_string();
    if rest.ends_with('\n') {
        rest.pop();
    }
    (rest, Some(err))
}

impl Code {
    pub(crate) fn new(sandbox: Sandbox, context: &str) -> Self {
        Self {
            sandbox,
            context: context.to_string(),
        }
    }

    /// Another, independent context (its own variables).
    pub fn context(&self, name: &str) -> Result<Code, Error> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(Error::Kernel(format!("invalid context name `{name}`")));
        }
        Ok(Self::new(self.sandbox.clone(), name))
    }

    /// Run Python source in this context.
    pub async fn run(&self, source: &str) -> Result<Execution, Error> {
        self.sandbox.gate(CommandCapability::Code)?;
        let socket = format!(".sandhost-code/{}.sock", self.context);
        let req = ExecRequest {
            argv: vec![
                "python3".into(),
                "-c".into(),
                CLIENT.into(),
                socket,
                KERNEL.into(),
            ],
            stdin: Some(source.to_string()),
            // the context lives in the kernel, not the shell: a long cell
            // must not hold the session other commands share
            beside_session: true,
            ..ExecRequest::default()
        };
        let mut out = Collected::default();
        let o = exec(&self.sandbox.runtime().ctx, &req, &mut out).await?;
        let (stderr, error) = take_error(&out.stderr);
        match (o.exit_code, &error) {
            (Some(0), _) | (Some(1), Some(_)) => Ok(Execution {
                stdout: out.stdout,
                stderr,
                error,
            }),
            (code, _) => Err(Error::Kernel(format!(
                "python3 client exited {code:?}: {}",
                stderr.trim()
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_marker_is_split_off_stderr_and_parsed() {
        let s = "warn\n\n\x1esandhost-code-error {\"name\": \"ZeroDivisionError\", \"value\": \"division by zero\", \"traceback\": \"Traceback...\"}\n";
        let (rest, err) = take_error(s);
        assert_eq!(rest, "warn\n");
        let err = err.unwrap();
        assert_eq!(err.name, "ZeroDivisionError");
        assert_eq!(err.value, "division by zero");
        assert_eq!(take_error("plain\n"), ("plain\n".to_string(), None));
    }
}
