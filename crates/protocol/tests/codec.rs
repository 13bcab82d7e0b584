//! Framing and malformed-input behaviour of the NDJSON codec.

use proptest::prelude::*;
use sandhost_protocol::*;
use serde_json::json;

#[test]
fn invalid_json_is_a_parse_error_answered_with_minus_32700() {
    let err = decode_frame(b"{not json").unwrap_err();
    assert!(matches!(err, FrameError::Parse { .. }));
    assert_eq!(err.code(), "E4002");
    assert_eq!(err.rpc_code().code(), -32700);
    assert_eq!(err.request_id(), None);
}

#[test]
fn non_object_json_is_an_invalid_request() {
    for frame in [&b"[1,2]"[..], b"42", b"\"x\"", b"null"] {
        let err = decode_frame(frame).unwrap_err();
        assert!(matches!(err, FrameError::InvalidRequest { .. }), "{err}");
        assert_eq!(err.code(), "E4003");
        assert_eq!(err.rpc_code().code(), -32600);
    }
}

#[test]
fn wrong_jsonrpc_version_is_an_invalid_request_that_keeps_the_id() {
    let err = decode_frame(br#"{"jsonrpc":"1.0","id":"abc","method":"health"}"#).unwrap_err();
    assert!(matches!(err, FrameError::InvalidRequest { .. }));
    assert_eq!(err.request_id(), Some(&Id::from("abc")));
    let err = decode_frame(br#"{"id":3,"method":"health"}"#).unwrap_err();
    assert_eq!(err.request_id(), Some(&Id::from(3u64)));
}

#[test]
fn request_with_object_id_or_non_string_method_is_invalid() {
    let err = decode_frame(br#"{"jsonrpc":"2.0","id":{},"method":"health"}"#).unwrap_err();
    assert!(matches!(err, FrameError::InvalidRequest { id: None, .. }));
    let err = decode_frame(br#"{"jsonrpc":"2.0","id":1,"method":7}"#).unwrap_err();
    assert!(matches!(err, FrameError::InvalidRequest { .. }));
    let err =
        decode_frame(br#"{"jsonrpc":"2.0","id":1,"method":"health","params":3}"#).unwrap_err();
    assert!(matches!(err, FrameError::InvalidRequest { .. }));
}

#[test]
fn response_with_both_result_and_error_is_invalid() {
    let frame = br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{"code":-32002,"message":"x"}}"#;
    assert!(matches!(
        decode_frame(frame),
        Err(FrameError::InvalidRequest { .. })
    ));
}

#[test]
fn ids_are_echoed_exactly() {
    for raw in ["7", "\"7\"", "1.5", "-12", "18446744073709551615"] {
        let frame = format!(r#"{{"jsonrpc":"2.0","id":{raw},"method":"health"}}"#);
        let Message::Request(request) = decode_frame(frame.as_bytes()).unwrap() else {
            panic!("not a request");
        };
        let response = Message::Response(Response::ok(request.id, json!(null)));
        let line = String::from_utf8(encode_message(&response).unwrap()).unwrap();
        assert!(
            line.contains(&format!(r#""id":{raw}"#)),
            "{raw} became {line}"
        );
    }
}

#[test]
fn message_kinds_are_told_apart() {
    assert!(matches!(
        decode_frame(br#"{"jsonrpc":"2.0","method":"execute.log","params":{}}"#),
        Ok(Message::Notification(_))
    ));
    assert!(matches!(
        decode_frame(br#"{"jsonrpc":"2.0","id":1,"result":null}"#),
        Ok(Message::Response(_))
    ));
    let Ok(Message::Response(r)) =
        decode_frame(br#"{"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"bad"}}"#)
    else {
        panic!("not a response")
    };
    assert_eq!(r.id, None);
    assert_eq!(r.into_result().unwrap_err().code, RpcErrorCode::ParseError);
}

#[test]
fn unknown_fields_are_tolerated_in_params_and_results() {
    let frame = br#"{"jsonrpc":"2.0","id":1,"method":"environmentExecute","extra":1,
        "params":{"driverKey":"d","companyId":"c","environmentId":"e","issueId":null,"config":{},
        "lease":{"providerLeaseId":"l","expiresAt":null,"future":true},
        "command":"ls","newField":{"a":1}}}"#;
    let Message::Request(r) = decode_frame(frame).unwrap() else {
        panic!("not a request")
    };
    let params = r.params_as::<methods::Execute>().unwrap();
    assert_eq!(params.command, "ls");
    assert_eq!(params.scope.issue_id, None);
    let result = json!({"exitCode": 0, "timedOut": false, "stdout": "", "stderr": "", "x": 1});
    assert_eq!(
        parse_result::<methods::Execute>(&result).unwrap().exit_code,
        Some(0)
    );
}

#[test]
fn missing_supported_methods_means_an_empty_list() {
    let result = parse_result::<methods::Initialize>(&json!({"ok": true})).unwrap();
    assert!(result.supported_methods.is_empty());
}

#[test]
fn invalid_params_have_their_own_code() {
    let request = Request::new(1u64, "environmentExecute", Some(json!({"command": 1})));
    let err = request.params_as::<methods::Execute>().unwrap_err();
    assert_eq!(err.code(), "E4005");
    assert_eq!(err.rpc_code().code(), -32602);
}

#[test]
fn file_mode_accepts_numbers_and_octal_strings() {
    let m: FileMode = serde_json::from_value(json!(420)).unwrap();
    assert_eq!(m, FileMode(0o644));
    let m: FileMode = serde_json::from_value(json!("0755")).unwrap();
    assert_eq!(m, FileMode(0o755));
    assert!(serde_json::from_value::<FileMode>(json!("999")).is_err());
    assert!(serde_json::from_value::<FileMode>(json!(0o17777)).is_err());
}

#[test]
fn execute_log_accepts_invocation_id_as_an_alias() {
    let params: ExecuteLogParams =
        serde_json::from_value(json!({"invocationId": "r1", "stream": "stderr", "chunk": "x"}))
            .unwrap();
    assert_eq!(params.request_id, Id::from("r1"));
}

#[test]
fn method_names_round_trip_and_optional_list_is_complete() {
    for m in Method::ALL {
        assert_eq!(m.as_str().parse::<Method>().unwrap(), *m);
    }
    assert!("environmentNope".parse::<Method>().is_err());
    assert_eq!(
        Method::REQUIRED.len() + Method::OPTIONAL.len() + Method::NOTIFICATIONS.len(),
        Method::ALL.len()
    );
    for m in Method::OPTIONAL {
        assert_eq!(m.kind(), MethodKind::Optional);
    }
    for c in RpcErrorCode::ALL {
        assert_eq!(RpcErrorCode::from_code(c.code()), c);
    }
    assert_eq!(RpcErrorCode::from_code(-1), RpcErrorCode::Other(-1));
}

async fn frames(input: &[u8], limit: usize) -> Vec<Result<Vec<u8>, String>> {
    let mut reader = FrameReader::with_max_frame_len(input, limit);
    let mut out = Vec::new();
    while let Some(frame) = reader.next_frame().await {
        out.push(frame.map_err(|e| e.code().to_owned()));
    }
    out
}

#[tokio::test]
async fn oversized_line_is_discarded_and_the_reader_continues() {
    let mut input = Vec::new();
    input.extend_from_slice(b"{\"a\":1}\n");
    input.extend(std::iter::repeat_n(b'x', 100));
    input.extend_from_slice(b"\n{\"b\":2}\n");
    let got = frames(&input, 32).await;
    assert_eq!(
        got,
        vec![
            Ok(b"{\"a\":1}".to_vec()),
            Err("E4001".into()),
            Ok(b"{\"b\":2}".to_vec())
        ]
    );
}

#[tokio::test]
async fn oversized_line_across_many_reads_reports_its_full_length() {
    let mut input = vec![b'y'; 200_000];
    input.extend_from_slice(b"\n{}\n");
    let mut reader = FrameReader::with_max_frame_len(&input[..], 1000);
    match reader.next_frame().await {
        Some(Err(FrameError::FrameTooLarge { len, limit })) => {
            assert_eq!((len, limit), (200_000, 1000));
        }
        other => panic!("unexpected {other:?}"),
    }
    assert_eq!(reader.next_frame().await.unwrap().unwrap(), b"{}");
    assert!(reader.next_frame().await.is_none());
}

#[tokio::test]
async fn blank_lines_crlf_and_a_final_line_without_newline_are_handled() {
    let got = frames(b"\n\r\n  \n{\"a\":1}\r\n{\"b\":2}", 64).await;
    assert_eq!(
        got,
        vec![Ok(b"{\"a\":1}".to_vec()), Ok(b"{\"b\":2}".to_vec())]
    );
}

#[tokio::test]
async fn a_line_exactly_at_the_limit_is_accepted() {
    let got = frames(b"0123456789\n01234567890\n", 10).await;
    assert_eq!(got, vec![Ok(b"0123456789".to_vec()), Err("E4001".into())]);
}

#[tokio::test]
async fn writer_and_reader_agree_on_many_messages() {
    let (a, b) = tokio::io::duplex(64);
    let sent: Vec<Message> = (0..50u64)
        .map(|i| Request::new(i, "health", Some(json!({"text": "line\nbreak"}))).into())
        .collect();
    let to_send = sent.clone();
    let writer = tokio::spawn(async move {
        let mut w = FrameWriter::new(a);
        for m in &to_send {
            w.write_message(m).await.unwrap();
        }
    });
    let mut reader = FrameReader::new(b);
    let mut got = Vec::new();
    for _ in 0..sent.len() {
        got.push(reader.next_message().await.unwrap().unwrap());
    }
    writer.await.unwrap();
    assert_eq!(got, sent);
}

proptest! {
    /// `decode_frame` is the function the fuzz target calls: it never panics.
    #[test]
    fn decode_frame_never_panics_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_frame(&bytes);
    }

    #[test]
    fn decode_frame_never_panics_on_json_like_input(s in r#"[\{\}\[\]":,0-9a-z\\. -]{0,200}"#) {
        let _ = decode_frame(s.as_bytes());
    }

    #[test]
    fn decode_frame_never_panics_on_envelope_shaped_input(
        id in prop_oneof![Just("1".to_owned()), Just("\"a\"".to_owned()), Just("null".to_owned()), Just("{}".to_owned())],
        body in r#"[\{\}\[\]":,0-9a-z]{0,40}"#,
    ) {
        let frame = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"environmentExecute","params":{body}}}"#);
        let _ = decode_frame(frame.as_bytes());
    }
}
