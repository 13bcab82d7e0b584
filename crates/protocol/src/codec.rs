//! The NDJSON codec: one JSON-RPC message per line, with a maximum frame size.
//!
//! - [`decode_frame`] is pure (bytes in, message or typed error out) and never
//!   panics on any input: the fuzz target calls it directly.
//! - [`FrameReader`] splits an async byte stream into lines. A line longer than
//!   its limit is discarded up to its newline without being buffered and is
//!   reported as [`FrameError::FrameTooLarge`]; the reader keeps going.
//! - [`FrameWriter`] writes one compact JSON object and a `\n` per message.
//!   Compact JSON never contains a raw newline, so framing is unambiguous.

use crate::error::FrameError;
use crate::jsonrpc::{Id, Message, Notification, Request, Response, ResponsePayload, RpcError, V2};
use serde_json::{Map, Value};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};

/// The default maximum frame size: 16 MiB.
pub const DEFAULT_MAX_FRAME_LEN: usize = 16 * 1024 * 1024;

/// Decodes one frame (a line, with or without its trailing newline).
///
/// Errors: [`FrameError::Parse`] for bytes that are not JSON (answer -32700),
/// [`FrameError::InvalidRequest`] for JSON that is not a JSON-RPC 2.0 message
/// (answer -32600, with the id when one could be read).
pub fn decode_frame(bytes: &[u8]) -> Result<Message, FrameError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| FrameError::Parse {
        detail: e.to_string(),
    })?;
    message_from_value(value)
}

fn invalid(detail: impl Into<String>, id: Option<Id>) -> FrameError {
    FrameError::InvalidRequest {
        detail: detail.into(),
        id,
    }
}

/// Turns a parsed JSON value into a message, with the same rules as [`decode_frame`].
pub fn message_from_value(value: Value) -> Result<Message, FrameError> {
    let Value::Object(mut obj) = value else {
        return Err(invalid("a message must be a json object", None));
    };
    let readable_id = obj.get("id").and_then(Id::from_value);
    match obj.get("jsonrpc") {
        Some(Value::String(v)) if v == "2.0" => {}
        Some(other) => {
            return Err(invalid(
                format!("`jsonrpc` must be \"2.0\", found {other}"),
                readable_id,
            ))
        }
        None => return Err(invalid("missing `jsonrpc` member", readable_id)),
    }
    if let Some(method) = obj.remove("method") {
        let Value::String(method) = method else {
            return Err(invalid("`method` must be a string", readable_id));
        };
        let params = match obj.remove("params") {
            None | Some(Value::Null) => None,
            Some(p @ (Value::Object(_) | Value::Array(_))) => Some(p),
            Some(_) => {
                return Err(invalid(
                    "`params` must be an object or an array",
                    readable_id,
                ))
            }
        };
        return match obj.get("id") {
            None => Ok(Message::Notification(Notification {
                jsonrpc: V2,
                method,
                params,
            })),
            Some(_) => match readable_id {
                Some(id) => Ok(Message::Request(Request {
                    jsonrpc: V2,
                    id,
                    method,
                    params,
                })),
                None => Err(invalid("`id` must be a number or a string", None)),
            },
        };
    }
    response_from_object(obj, readable_id)
}

fn response_from_object(
    mut obj: Map<String, Value>,
    id: Option<Id>,
) -> Result<Message, FrameError> {
    match obj.get("id") {
        Some(Value::Null) => {}
        Some(_) if id.is_some() => {}
        Some(_) => return Err(invalid("`id` must be a number, a string or null", None)),
        None => return Err(invalid("message has no `method` and no `id`", None)),
    }
    let payload = match (obj.remove("result"), obj.remove("error")) {
        (Some(_), Some(_)) => {
            return Err(invalid("a response has both `result` and `error`", id));
        }
        (Some(result), None) => ResponsePayload::Result(result),
        (None, Some(error)) => {
            let error: RpcError = serde_json::from_value(error)
                .map_err(|e| invalid(format!("malformed `error` member: {e}"), id.clone()))?;
            ResponsePayload::Error(error)
        }
        (None, None) => return Err(invalid("message has no `method`, `result` or `error`", id)),
    };
    Ok(Message::Response(Response {
        jsonrpc: V2,
        id,
        payload,
    }))
}

/// Encodes a message as one compact JSON line ending in `\n`.
pub fn encode_message(message: &Message) -> Result<Vec<u8>, FrameError> {
    let mut out = serde_json::to_vec(message).map_err(|e| FrameError::Encode {
        detail: e.to_string(),
    })?;
    out.push(b'\n');
    Ok(out)
}

/// Reads newline-delimited frames from an async reader, bounded by a maximum size.
#[derive(Debug)]
pub struct FrameReader<R> {
    inner: BufReader<R>,
    max_frame_len: usize,
    line: Vec<u8>,
    /// `Some(n)` while discarding an oversized line of which `n` bytes were seen.
    discarding: Option<usize>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader with the default 16 MiB limit.
    pub fn new(reader: R) -> Self {
        Self::with_max_frame_len(reader, DEFAULT_MAX_FRAME_LEN)
    }

    /// A reader whose frames (without the newline) may be at most `max_frame_len` bytes.
    pub fn with_max_frame_len(reader: R, max_frame_len: usize) -> Self {
        FrameReader {
            inner: BufReader::new(reader),
            max_frame_len,
            line: Vec::new(),
            discarding: None,
        }
    }

    pub fn max_frame_len(&self) -> usize {
        self.max_frame_len
    }

    /// The next non-blank line without its `\n` (and `\r`), `None` at end of stream.
    ///
    /// A final line without a newline is returned at end of stream.
    pub async fn next_frame(&mut self) -> Option<Result<Vec<u8>, FrameError>> {
        loop {
            let available = match self.inner.fill_buf().await {
                Ok(b) => b,
                Err(e) => return Some(Err(FrameError::Io(e))),
            };
            if available.is_empty() {
                if let Some(len) = self.discarding.take() {
                    return Some(Err(self.too_large(len)));
                }
                let line = std::mem::take(&mut self.line);
                return finish_line(line).map(Ok);
            }
            let newline = available.iter().position(|&b| b == b'\n');
            let take = newline.unwrap_or(available.len());
            if let Some(seen) = self.discarding.as_mut() {
                *seen += take;
            } else if self.line.len() + take > self.max_frame_len {
                self.discarding = Some(self.line.len() + take);
                self.line.clear();
            } else {
                self.line.extend_from_slice(&available[..take]);
            }
            let consumed = take + usize::from(newline.is_some());
            self.inner.consume(consumed);
            if newline.is_none() {
                continue;
            }
            if let Some(len) = self.discarding.take() {
                return Some(Err(self.too_large(len)));
            }
            let line = std::mem::take(&mut self.line);
            if let Some(line) = finish_line(line) {
                return Some(Ok(line));
            }
        }
    }

    /// The next decoded message, `None` at end of stream.
    pub async fn next_message(&mut self) -> Option<Result<Message, FrameError>> {
        match self.next_frame().await? {
            Ok(line) => Some(decode_frame(&line)),
            Err(e) => Some(Err(e)),
        }
    }

    fn too_large(&self, len: usize) -> FrameError {
        FrameError::FrameTooLarge {
            len,
            limit: self.max_frame_len,
        }
    }
}

/// Strips a trailing `\r`; `None` for a blank line.
fn finish_line(mut line: Vec<u8>) -> Option<Vec<u8>> {
    if line.last() == Some(&b'\r') {
        line.pop();
    }
    if line.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(line)
    }
}

/// Writes messages as NDJSON lines, flushing after each.
#[derive(Debug)]
pub struct FrameWriter<W> {
    inner: W,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    pub fn new(writer: W) -> Self {
        FrameWriter { inner: writer }
    }

    pub async fn write_message(&mut self, message: &Message) -> Result<(), FrameError> {
        let bytes = encode_message(message)?;
        self.write_encoded(&bytes).await
    }

    /// Writes an already encoded line (see [`encode_message`]).
    pub async fn write_encoded(&mut self, line: &[u8]) -> Result<(), FrameError> {
        self.inner.write_all(line).await?;
        self.inner.flush().await?;
        Ok(())
    }

    pub fn into_inner(self) -> W {
        self.inner
    }
}
