//! `decode_frame` on arbitrary bytes: what a worker may write on its stdout.
//! Invariants:
//! - it never panics, and the same bytes decode the same way twice;
//! - an accepted frame re-encodes to one line that decodes to the same
//!   message (what the host forwards is what it read);
//! - a rejected frame is an E40xx error whose JSON-RPC answer carries that
//!   code, so a peer always gets a typed answer.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sandhost_protocol::{decode_frame, encode_message};

fuzz_target!(|data: &[u8]| {
    let first = decode_frame(data);
    let again = decode_frame(data);
    match (&first, &again) {
        (Ok(a), Ok(b)) => assert_eq!(a, b, "decoding is not deterministic"),
        (Err(a), Err(b)) => assert_eq!(a.code(), b.code()),
        _ => panic!("decoding is not deterministic"),
    }
    match first {
        Ok(msg) => {
            let line = encode_message(&msg).expect("a decoded message encodes");
            assert_eq!(line.last(), Some(&b'\n'), "an encoded frame ends its line");
            assert_eq!(
                line.iter().filter(|b| **b == b'\n').count(),
                1,
                "an encoded frame is one line"
            );
            let back = decode_frame(&line[..line.len() - 1]).expect("re-encoded frame decodes");
            assert_eq!(back, msg, "round trip changed the message");
        }
        Err(e) => {
            assert!(
                e.code().starts_with("E40"),
                "{} for a frame error",
                e.code()
            );
            let rpc = e.to_rpc_error();
            assert_eq!(
                rpc.data.as_ref().and_then(|d| d["code"].as_str()),
                Some(e.code())
            );
        }
    }
});
