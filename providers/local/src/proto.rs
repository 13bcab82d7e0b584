//! The crate-private protocol between the host library and the in-sandbox
//! init, over the unix socket `<state_dir>/control.sock`.
//!
//! Frame: `u32 little-endian payload length`, `u8 kind`, payload. Control
//! payloads are JSON; output chunks are raw bytes; an exec request is
//! `u32 LE json length`, the JSON [`ExecSpec`], then the stdin bytes.
//! On accept, the init speaks first with a [`Hello`] (sandbox id and nonce) so
//! the host verifies identity without an extra round trip.
use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

pub const MAX_FRAME: usize = 64 << 20;

pub const HELLO: u8 = b'H';
pub const EXEC: u8 = b'X';
pub const KILL_ALL: u8 = b'K';
pub const STATUS: u8 = b'S';
pub const STDOUT: u8 = b'O';
pub const STDERR: u8 = b'E';
pub const RESULT: u8 = b'R';
pub const FAIL: u8 = b'F';
pub const OK: u8 = b'A';
/// Like [`EXEC`], but run in the sandbox's persistent session shell (see
/// `init::server::session`); an empty `cwd` keeps the session's directory.
pub const SESSION_EXEC: u8 = b'Y';
/// A chunk of stdin for this connection's running exec, when its spec set
/// `stdin_stream`; an empty chunk is the end of input.
pub const STDIN: u8 = b'I';

// Duplex channels. A connection that sends `PTY_OPEN` or `TCP_OPEN` becomes
// that channel's own: the init answers `OK` with [`ChanOpened`] (or `FAIL`),
// then both sides send `CHAN_DATA` (raw bytes); the host may send
// `CHAN_RESIZE` (u16 LE cols, u16 LE rows) and `CHAN_EOF` (no more input);
// the init sends `CHAN_EOF` when a TCP peer ended its output, and exactly
// one `RESULT` with [`ChanExit`] last. `CHAN_KILL` ([`ChanKill`]) arrives on
// a fresh connection, so it works even while the channel's own is backlogged.
/// Open a pty channel: [`PtySpec`] JSON.
pub const PTY_OPEN: u8 = b'P';
/// Open a TCP channel: [`TcpSpec`] JSON.
pub const TCP_OPEN: u8 = b'T';
pub const CHAN_DATA: u8 = b'D';
pub const CHAN_RESIZE: u8 = b'W';
pub const CHAN_EOF: u8 = b'C';
pub const CHAN_KILL: u8 = b'Q';

#[derive(Debug, Serialize, Deserialize)]
pub struct Hello {
    pub id: String,
    pub nonce: String,
    pub version: u32,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ExecSpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
    pub grace_ms: u64,
    pub max_output: u64,
    /// More stdin follows in [`STDIN`] frames (the exec frame's stdin is the start).
    #[serde(default)]
    pub stdin_stream: bool,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ExecDone {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
    pub duration_us: u64,
    /// Session exec only: this command started a new session shell (first use,
    /// or the previous shell ended: cwd and exported variables were reset).
    #[serde(default)]
    pub session_started: bool,
    /// Session exec only: the session shell ended during this command (it
    /// exited, or was killed after a timeout); the next command starts a new one.
    #[serde(default)]
    pub session_ended: bool,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Fail {
    pub code: String,
    pub message: String,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub id: String,
    pub processes: u32,
    pub running_execs: u32,
    pub uptime_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PtySpec {
    pub argv: Vec<String>,
    pub cwd: String,
    pub env: Vec<(String, String)>,
    pub cols: u16,
    pub rows: u16,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct TcpSpec {
    pub port: u16,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ChanOpened {
    /// Names the channel in a later [`ChanKill`].
    pub token: u64,
    /// Pty only: the command's pid inside the sandbox and its terminal.
    pub pid: Option<i32>,
    pub tty: Option<String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
pub struct ChanExit {
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct ChanKill {
    pub token: u64,
}

pub fn encode(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(5 + payload.len());
    v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    v.push(kind);
    v.extend_from_slice(payload);
    v
}

pub fn write_frame(w: &mut impl Write, kind: u8, payload: &[u8]) -> io::Result<()> {
    w.write_all(&encode(kind, payload))
}

pub fn read_frame(r: &mut impl Read) -> io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 5];
    r.read_exact(&mut h)?;
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    let mut p = vec![0u8; len];
    r.read_exact(&mut p)?;
    Ok((h[4], p))
}

/// Try to split one complete frame off the front of `buf`.
pub fn take_frame(buf: &mut Vec<u8>) -> io::Result<Option<(u8, Vec<u8>)>> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame too large",
        ));
    }
    if buf.len() < 5 + len {
        return Ok(None);
    }
    let kind = buf[4];
    let payload = buf[5..5 + len].to_vec();
    buf.drain(..5 + len);
    Ok(Some((kind, payload)))
}

pub fn encode_exec(spec: &ExecSpec, stdin: &[u8]) -> Vec<u8> {
    let json = serde_json::to_vec(spec).expect("serializable");
    let mut p = Vec::with_capacity(4 + json.len() + stdin.len());
    p.extend_from_slice(&(json.len() as u32).to_le_bytes());
    p.extend_from_slice(&json);
    p.extend_from_slice(stdin);
    p
}

pub fn decode_exec(p: &[u8]) -> Result<(ExecSpec, Vec<u8>), String> {
    if p.len() < 4 {
        return Err("short exec frame".into());
    }
    let n = u32::from_le_bytes([p[0], p[1], p[2], p[3]]) as usize;
    if p.len() < 4 + n {
        return Err("short exec frame".into());
    }
    let spec = serde_json::from_slice(&p[4..4 + n]).map_err(|e| format!("bad exec spec: {e}"))?;
    Ok((spec, p[4 + n..].to_vec()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_split() {
        let mut buf = encode(STDOUT, b"abc");
        buf.extend(encode(RESULT, b"{}"));
        buf.push(0);
        assert_eq!(
            take_frame(&mut buf).unwrap(),
            Some((STDOUT, b"abc".to_vec()))
        );
        assert_eq!(
            take_frame(&mut buf).unwrap(),
            Some((RESULT, b"{}".to_vec()))
        );
        assert_eq!(take_frame(&mut buf).unwrap(), None);
        let spec = ExecSpec {
            argv: vec!["a".into()],
            cwd: "/".into(),
            env: vec![],
            timeout_ms: None,
            grace_ms: 1,
            max_output: 2,
            stdin_stream: false,
        };
        let (s, stdin) = decode_exec(&encode_exec(&spec, b"in")).unwrap();
        assert_eq!(s.argv, spec.argv);
        assert_eq!(stdin, b"in");
    }
}
