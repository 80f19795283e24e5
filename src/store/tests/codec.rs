//! Tests of the record codec: every record round-trips, old versions still read, unknown
//! versions and damage are errors.

use super::*;

fn message() -> MessageRecord {
    MessageRecord {
        id: "dlv_01".into(),
        event_id: "evt_1".into(),
        target: "https://r.example/h?x=1".into(),
        endpoint: "https://r.example/h".into(),
        host: "r.example:443".into(),
        route: Some("billing".into()),
        fifo: None,
        last_attempt: None,
        state: State::Dead,
        attempts: 3,
        history_len: 5,
        max_attempts: 16,
        accepted_at_ms: 1,
        next_attempt_at_ms: 2,
        give_up_at_ms: 3,
        finished_at_ms: 4,
        dead_reason: Some(DeadReason::PermanentStatus),
        last_status: Some(410),
        last_error: Some("gone".into()),
    }
}

#[test]
fn every_message_version_round_trips() {
    let m = message();
    assert_eq!(MessageRecord::decode(&m.encode()), Ok(m.clone()));
    let open = MessageRecord {
        state: State::Pending,
        dead_reason: None,
        last_status: None,
        last_error: None,
        route: None,
        ..m.clone()
    };
    assert_eq!(MessageRecord::decode(&open.encode()), Ok(open.clone()));
    assert_eq!(open.encode()[..2], [b'M', 1], "unordered, no route: still version 1");
    // Each combination of a fifo place and a route, in the oldest version that holds it.
    let place = Fifo {
        on_dead: OnDead::Block,
        pos: 7,
    };
    // A record that kept its last attempt is version 4, with or without the others.
    let last = LastAttempt {
        at_ms: 11,
        duration_ms: 12,
        policy_revision: Some(13),
        span_id: Some("00f067aa0ba902b7".into()),
    };
    let bare_last = LastAttempt {
        policy_revision: None,
        span_id: None,
        ..last.clone()
    };
    for (fifo, route, last, version) in [
        (Some(place), None, None, 2),
        (None, Some("billing"), None, 3),
        (Some(place), Some("billing"), None, 3),
        (Some(Fifo { pos: 0, ..place }), Some(""), None, 3),
        (None, None, Some(&last), 4),
        (Some(place), None, Some(&bare_last), 4),
        (None, Some("billing"), Some(&last), 4),
        (Some(place), Some("billing"), Some(&bare_last), 4),
    ] {
        let rec = MessageRecord {
            fifo,
            route: route.map(str::to_string),
            last_attempt: last.cloned(),
            ..open.clone()
        };
        let buf = rec.encode();
        assert_eq!(buf[..2], [b'M', version], "{fifo:?} {route:?}");
        assert_eq!(MessageRecord::decode(&buf), Ok(rec), "{fifo:?} {route:?}");
        for cut in 0..buf.len() {
            assert!(MessageRecord::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }
}

#[test]
fn a_record_is_encoded_into_one_allocation_that_never_grows() {
    // Every field present (a fifo place, a route, a status, an error and the last attempt): the room made
    // before writing is all it writes; grown, the buffer's capacity would be about twice
    // its length.
    let full = MessageRecord {
        fifo: Some(Fifo {
            on_dead: OnDead::Skip,
            pos: u64::MAX,
        }),
        last_attempt: Some(LastAttempt {
            at_ms: u64::MAX,
            duration_ms: u32::MAX,
            policy_revision: Some(u32::MAX),
            span_id: Some("00f067aa0ba902b7".into()),
        }),
        ..message()
    };
    let buf = full.encode();
    assert_eq!(buf.capacity(), buf.len());
    assert_eq!(MessageRecord::decode(&buf), Ok(full));
    let bare = MessageRecord {
        route: None,
        last_error: None,
        last_status: None,
        ..message()
    };
    let buf = bare.encode();
    assert!(
        buf.capacity() < buf.len() + 32,
        "room for absent fields only, not a regrowth"
    );
}

#[test]
fn payloads_attempts_endpoints_and_routing_round_trip() {
    for signing in [
        SigningChoice::Default,
        SigningChoice::Key("billing".into()),
        SigningChoice::Inline("whsec_x".into()),
    ] {
        let p = Payload {
            method: "POST".into(),
            headers: vec![
                ("content-type".into(), b"application/json".to_vec()),
                ("x-a".into(), vec![0xff, 0]),
            ],
            body: (0..=255u8).collect(),
            scheme: Some(SignatureScheme::Stripe),
            signing,
        };
        assert_eq!(Payload::decode(&p.encode()), Ok(p));
    }
    let a = AttemptRecord {
        at_ms: 9,
        status: None,
        error: Some("connection refused".into()),
        duration_ms: 12,
        policy_revision: Some(0xdead_beef),
        span_id: Some("00f067aa0ba902b7".into()),
    };
    assert_eq!(AttemptRecord::decode(&a.encode()), Ok(a.clone()));
    let unknown = AttemptRecord {
        policy_revision: None,
        span_id: None,
        ..a
    };
    assert_eq!(AttemptRecord::decode(&unknown.encode()), Ok(unknown));
    let e = EndpointRecord {
        paused: true,
        streak: 100,
        last_status: Some(410),
    };
    assert_eq!(EndpointRecord::decode_stamped(&e.encode_at(77)), Ok((e.clone(), 77)));
    // A version-1 record (no time) still reads, as written at 0.
    let mut v1 = vec![b'E', 1, 1];
    v1.extend_from_slice(&100u32.to_le_bytes());
    v1.extend_from_slice(&e.encode_at(0)[7..10]);
    assert_eq!(EndpointRecord::decode_stamped(&v1), Ok((e, 0)));
    let r = Routing {
        host: "h:443".into(),
        endpoint: "https://h/x".into(),
    };
    assert_eq!(Routing::decode(&r.encode()), Ok(r));
}

#[test]
fn a_packed_payload_compresses_its_body_alone_and_reads_back_whole() {
    let payload = |auth: &[u8], body: Vec<u8>| Payload {
        method: "POST".into(),
        headers: vec![("authorization".into(), auth.to_vec())],
        body,
        scheme: None,
        signing: SigningChoice::Inline("whsec_c2VjcmV0".into()),
    };
    let json = b"{\"a\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}".repeat(20);
    for body in [json.clone(), Vec::new(), (0..=255u8).collect()] {
        let p = payload(b"Bearer t", body.clone());
        let buf = p.encode_packed();
        assert_eq!(buf[..2], [b'P', 2]);
        assert_eq!(Payload::decode(&buf), Ok(p.clone()));
        assert_eq!(Payload::decode(&p.encode()), Ok(p.clone()), "version 1 still reads");
        for cut in 0..buf.len() {
            assert!(Payload::decode(&buf[..cut]).is_err(), "cut at {cut}");
        }
    }
    // A compressible body shrinks; the record's length does not depend on whether the
    // header or the secret repeat text of the body.
    let p = payload(b"Bearer t", json.clone());
    assert!(p.encode_packed().len() < json.len() / 4, "{}", p.encode_packed().len());
    let guess = |auth: &[u8], secret: &str| {
        let mut p = payload(auth, [&json[..], b"Bearer s3cr3t-token whsec_guessedsecret"].concat());
        p.signing = SigningChoice::Inline(secret.into());
        p.encode_packed().len()
    };
    assert_eq!(
        guess(b"Bearer s3cr3t-token", "whsec_guessedsecret"),
        guess(b"Bearer zzzzzzzzzzzz", "whsec_zzzzzzzzzzzzz")
    );
    // A flag no courier writes, or a block that does not decode, is an error.
    let mut bad = payload(b"t", json).encode_packed();
    // Kind and version, the method, the header count, the header's name and value.
    let body_flag = 2 + (4 + 4) + 4 + (4 + 13) + (4 + 1);
    assert_eq!(bad[body_flag], 1, "the body's flag");
    bad[body_flag] = 2;
    assert!(Payload::decode(&bad).is_err());
    bad[body_flag] = 1;
    let block = body_flag + 1 + 4;
    bad[block..block + 4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(Payload::decode(&bad).is_err());
}

#[test]
fn unknown_versions_are_errors_not_silence() {
    let mut buf = message().encode();
    buf[1] = 9;
    assert_eq!(
        MessageRecord::decode(&buf),
        Err(CodecError::UnknownVersion {
            kind: "message",
            version: 9
        })
    );
}

#[test]
fn truncation_and_garbage_are_errors() {
    let buf = message().encode();
    for cut in 0..buf.len() {
        assert!(MessageRecord::decode(&buf[..cut]).is_err(), "cut at {cut}");
    }
    let mut long = buf.clone();
    long.push(0);
    assert!(MessageRecord::decode(&long).is_err());
    assert!(Payload::decode(&buf).is_err(), "a message is not a payload");
    assert!(Payload::decode(&[b'P', 1, 0xff, 0xff, 0xff, 0xff]).is_err());
}

#[test]
fn inline_secrets_do_not_show_in_debug_output() {
    let s = format!("{:?}", SigningChoice::Inline("whsec_c2VjcmV0".into()));
    assert!(!s.contains("c2VjcmV0"), "{s}");
}

/// What a courier before routes and revisions wrote: the fields of version 1, in order.
fn message_v1(m: &MessageRecord) -> Vec<u8> {
    let mut w = Writer::new(MESSAGE_V1, 128);
    w.str(&m.id);
    w.str(&m.event_id);
    w.str(&m.target);
    w.str(&m.endpoint);
    w.str(&m.host);
    w.u8(m.state.to_byte());
    w.u32(m.attempts);
    w.u32(m.history_len);
    w.u32(m.max_attempts);
    w.u64(m.accepted_at_ms);
    w.u64(m.next_attempt_at_ms);
    w.u64(m.give_up_at_ms);
    w.u64(m.finished_at_ms);
    w.u8(place_byte(&REASONS, m.dead_reason));
    w.opt_u16(m.last_status);
    w.opt_str(m.last_error.as_deref());
    w.0
}

#[test]
fn version_1_records_still_read() {
    let m = MessageRecord {
        route: None,
        ..message()
    };
    let v1 = message_v1(&m);
    assert_eq!(&v1[..2], &[b'M', 1]);
    assert_eq!(MessageRecord::decode(&v1), Ok(m.clone()));
    assert_eq!(
        &message().encode()[..2],
        &[b'M', 3],
        "a record with a route is version 3"
    );
    for cut in 0..v1.len() {
        assert!(MessageRecord::decode(&v1[..cut]).is_err(), "cut at {cut}");
    }
    let mut long = v1.clone();
    long.push(0);
    assert!(MessageRecord::decode(&long).is_err(), "trailing bytes");

    let mut w = Writer::new(ATTEMPT_V1, 32);
    w.u64(9);
    w.opt_u16(Some(503));
    w.opt_str(None);
    w.u32(12);
    assert_eq!(
        AttemptRecord::decode(&w.0),
        Ok(AttemptRecord {
            at_ms: 9,
            status: Some(503),
            error: None,
            duration_ms: 12,
            policy_revision: None,
            span_id: None,
        })
    );
    // Version 2: a policy revision, no span id.
    let mut w = Writer::new(ATTEMPT_V2, 32);
    w.u64(9);
    w.opt_u16(Some(200));
    w.opt_str(None);
    w.u32(12);
    w.u8(1);
    w.u32(7);
    assert_eq!(
        AttemptRecord::decode(&w.0),
        Ok(AttemptRecord {
            at_ms: 9,
            status: Some(200),
            error: None,
            duration_ms: 12,
            policy_revision: Some(7),
            span_id: None,
        })
    );
    let a = AttemptRecord {
        at_ms: 1,
        status: None,
        error: None,
        duration_ms: 0,
        policy_revision: Some(7),
        span_id: Some("00f067aa0ba902b7".into()),
    }
    .encode();
    assert_eq!(&a[..2], &[b'A', 3]);
    for cut in 0..a.len() {
        assert!(AttemptRecord::decode(&a[..cut]).is_err(), "cut at {cut}");
    }
}

/// The bytes dead reasons and signature schemes are stored as are on disk: pinned.
#[test]
fn reason_and_scheme_bytes_are_pinned() {
    use crate::model::SignatureScheme;
    let reasons = [
        (None, 0),
        (Some(DeadReason::MaxAttempts), 1),
        (Some(DeadReason::Expired), 2),
        (Some(DeadReason::PermanentStatus), 3),
        (Some(DeadReason::EgressDenied), 4),
    ];
    for (r, b) in reasons {
        assert_eq!(place_byte(&REASONS, r), b);
        assert_eq!(from_place(&REASONS, b, "message", "x"), Ok(r));
    }
    let schemes = [
        (None, 0),
        (Some(SignatureScheme::Standard), 1),
        (Some(SignatureScheme::Stripe), 2),
        (Some(SignatureScheme::Github), 3),
        (Some(SignatureScheme::None), 4),
    ];
    for (s, b) in schemes {
        assert_eq!(place_byte(&SCHEMES, s), b);
        assert_eq!(from_place(&SCHEMES, b, "payload", "x"), Ok(s));
    }
    assert!(from_place(&REASONS, 5, "message", "x").is_err());
    assert!(from_place(&SCHEMES, 5, "payload", "x").is_err());
}
