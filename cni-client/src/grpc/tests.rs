//! The client against scripted daemons on a socket pair. The real daemon (tonic/hyper) is the
//! other side in the server crate's tests, which exec the plugin for every verb and version.

use super::conn::{Call, MAX_FRAME, STREAM};
use super::frames::*;
use super::reply::percent_decode;
use super::*;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::thread;
use std::time::Duration;

const METHOD: &str = "/ipool.v1.Cni/Add";

/// A frame as the scripted daemon reads it.
#[derive(Debug)]
struct Frame {
    kind: u8,
    flags: u8,
    stream: u32,
    payload: Vec<u8>,
}

fn read_frame(s: &mut UnixStream) -> Option<Frame> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h).ok()?;
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let mut payload = vec![0u8; len];
    s.read_exact(&mut payload).ok()?;
    Some(Frame {
        kind: h[3],
        flags: h[4],
        stream: u32::from_be_bytes([h[5], h[6], h[7], h[8]]),
        payload,
    })
}

/// Reads the preface and the request; returns its header fields and its DATA (the gRPC
/// message with its prefix).
fn read_request(s: &mut UnixStream) -> (Vec<(String, String)>, Vec<u8>) {
    let mut preface = [0u8; 24];
    s.read_exact(&mut preface).expect("preface");
    assert_eq!(&preface[..], PREFACE);
    let mut dec = httlib_hpack::Decoder::default();
    let (mut fields, mut body) = (Vec::new(), Vec::new());
    loop {
        let f = read_frame(s).expect("a request frame");
        match f.kind {
            HEADERS => {
                assert_eq!(f.stream, STREAM);
                let mut decoded = Vec::new();
                dec.decode(&mut f.payload.clone(), &mut decoded)
                    .expect("hpack");
                for (n, v, _) in decoded {
                    fields.push((
                        String::from_utf8(n).expect("utf8"),
                        String::from_utf8(v).expect("utf8"),
                    ));
                }
            }
            DATA => {
                body.extend_from_slice(&f.payload);
                if f.flags & END_STREAM != 0 {
                    return (fields, body);
                }
            }
            _ => {}
        }
    }
}

fn grpc_message(m: &[u8]) -> Vec<u8> {
    let mut v = vec![0];
    v.extend_from_slice(&(m.len() as u32).to_be_bytes());
    v.extend_from_slice(m);
    v
}

/// Encodes as h2 servers do: Huffman codes, and fields added to the dynamic table (so the
/// trailers after the headers refer back to it).
fn headers_block(enc: &mut httlib_hpack::Encoder, fields: &[(&str, &str)]) -> Vec<u8> {
    use httlib_hpack::Encoder;
    let flags = Encoder::HUFFMAN_NAME
        | Encoder::HUFFMAN_VALUE
        | Encoder::WITH_INDEXING
        | Encoder::BEST_FORMAT;
    let mut out = Vec::new();
    for (n, v) in fields {
        enc.encode(
            (n.as_bytes().to_vec(), v.as_bytes().to_vec(), flags),
            &mut out,
        )
        .expect("hpack encode");
    }
    out
}

/// Runs the client against `daemon` (which gets the other end of the socket); returns the
/// client's outcome and what the daemon returned.
fn against<T: Send + 'static>(
    timeout: Duration,
    message: &[u8],
    daemon: impl FnOnce(UnixStream) -> T + Send + 'static,
) -> (Result<Reply, CallError>, T) {
    let (client, server) = UnixStream::pair().expect("socketpair");
    let d = thread::spawn(move || daemon(server));
    let out = Call::new(client, Instant::now() + timeout).run(METHOD, message);
    (out, d.join().expect("the scripted daemon panicked"))
}

#[test]
fn a_reply_through_settings_ping_padding_and_trailers() {
    let (out, seen) = against(Duration::from_secs(5), b"request", |mut s| {
        let (fields, body) = read_request(&mut s);
        let field = |n: &str| fields.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
        assert_eq!(field(":method").as_deref(), Some("POST"));
        assert_eq!(field(":path").as_deref(), Some(METHOD));
        assert_eq!(field("content-type").as_deref(), Some("application/grpc"));
        assert_eq!(field("te").as_deref(), Some("trailers"));
        assert_eq!(body, grpc_message(b"request"));
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        let mut settings = Vec::new();
        settings.extend_from_slice(&SETTINGS_INITIAL_WINDOW_SIZE.to_be_bytes());
        settings.extend_from_slice(&(1u32 << 20).to_be_bytes());
        frame(&mut out, SETTINGS, 0, 0, &settings);
        frame(&mut out, PING, 0, 0, b"pingpong");
        s.write_all(&out).expect("write");
        out.clear();
        // The client, waiting for its reply, acknowledges both before it blocks.
        let mut acks = Vec::new();
        while acks.len() < 2 {
            let f = read_frame(&mut s).expect("an acknowledgement before the reply");
            if f.flags & ACK != 0 {
                acks.push((f.kind, f.payload));
            }
        }
        let h = headers_block(
            &mut enc,
            &[(":status", "200"), ("content-type", "application/grpc")],
        );
        frame(&mut out, HEADERS, END_HEADERS, STREAM, &h);
        let reply = grpc_message(b"the reply");
        // The first part padded with 3 bytes, the second plain.
        let mut padded = vec![3u8];
        padded.extend_from_slice(&reply[..4]);
        padded.extend_from_slice(&[0, 0, 0]);
        frame(&mut out, DATA, PADDED, STREAM, &padded);
        frame(&mut out, DATA, 0, STREAM, &reply[4..]);
        let t = headers_block(&mut enc, &[("grpc-status", "0")]);
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &t);
        s.write_all(&out).expect("write");
        // Nothing more is owed once the reply is complete.
        assert!(read_frame(&mut s).is_none(), "a frame after the reply");
        acks
    });
    let reply = out.expect("a reply");
    assert_eq!(reply.code, 0);
    assert_eq!(reply.body, b"the reply");
    assert_eq!(seen, vec![(SETTINGS, vec![]), (PING, b"pingpong".to_vec())]);
}

/// The daemon's SETTINGS and the whole reply in one write: the client reads it all and closes
/// without writing again (acknowledging SETTINGS on a connection it is closing would only
/// wake the daemon).
#[test]
fn a_reply_that_arrives_whole_is_read_without_another_write() {
    let (out, after) = against(Duration::from_secs(5), b"request", |mut s| {
        read_request(&mut s);
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        frame(&mut out, SETTINGS, 0, 0, &[]);
        let h = headers_block(
            &mut enc,
            &[(":status", "200"), ("content-type", "application/grpc")],
        );
        frame(&mut out, HEADERS, END_HEADERS, STREAM, &h);
        frame(&mut out, DATA, 0, STREAM, &grpc_message(b"whole"));
        let t = headers_block(&mut enc, &[("grpc-status", "0")]);
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &t);
        s.write_all(&out).expect("write");
        let mut after = Vec::new();
        s.read_to_end(&mut after).expect("read to the close");
        after
    });
    assert_eq!(out.expect("a reply").body, b"whole");
    assert!(after.is_empty(), "{after:?}");
}

#[test]
fn an_error_in_a_trailers_only_reply_split_by_continuation() {
    let (out, ()) = against(Duration::from_secs(5), b"x", |mut s| {
        read_request(&mut s);
        let mut enc = httlib_hpack::Encoder::default();
        let block = headers_block(
            &mut enc,
            &[
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "5"),
                (
                    "grpc-message",
                    "no%20attachment%20n%2Fc1%2Feth0%20%E2%9C%93",
                ),
            ],
        );
        let (a, b) = block.split_at(block.len() / 2);
        let mut out = Vec::new();
        frame(&mut out, HEADERS, END_STREAM, STREAM, a);
        frame(&mut out, CONTINUATION, END_HEADERS, STREAM, b);
        s.write_all(&out).expect("write");
    });
    let reply = out.expect("a reply");
    assert_eq!(reply.code, 5);
    assert_eq!(reply.message, "no attachment n/c1/eth0 \u{2713}");
}

/// A request bigger than the initial windows waits for WINDOW_UPDATEs and never sends more
/// than it was granted.
#[test]
fn a_big_request_keeps_to_the_flow_control_windows() {
    let message: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let expected = grpc_message(&message);
    let (out, granted_times) = against(Duration::from_secs(10), &message, move |mut s| {
        let mut preface = [0u8; 24];
        s.read_exact(&mut preface).expect("preface");
        let (mut got, mut granted, mut grants) = (Vec::new(), 65_535usize, 0);
        loop {
            let f = read_frame(&mut s).expect("frame");
            if f.kind != DATA {
                continue;
            }
            assert!(f.payload.len() <= MAX_FRAME);
            got.extend_from_slice(&f.payload);
            assert!(
                got.len() <= granted,
                "{} bytes sent, {granted} granted",
                got.len()
            );
            if f.flags & END_STREAM != 0 {
                break;
            }
            if got.len() == granted {
                let mut out = Vec::new();
                frame(&mut out, WINDOW_UPDATE, 0, 0, &30_000u32.to_be_bytes());
                frame(&mut out, WINDOW_UPDATE, 0, STREAM, &30_000u32.to_be_bytes());
                s.write_all(&out).expect("write");
                granted += 30_000;
                grants += 1;
            }
        }
        assert_eq!(got, expected);
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        let block = headers_block(
            &mut enc,
            &[
                (":status", "200"),
                ("content-type", "application/grpc"),
                ("grpc-status", "0"),
            ],
        );
        frame(&mut out, DATA, 0, STREAM, &grpc_message(b"ok"));
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &block);
        s.write_all(&out).expect("write");
        grants
    });
    assert_eq!(out.expect("a reply").body, b"ok");
    assert!(granted_times >= 4, "{granted_times}");
}

fn broken_by(script: impl FnOnce(&mut UnixStream) + Send + 'static) -> String {
    let (out, ()) = against(Duration::from_secs(5), b"x", move |mut s| {
        read_request(&mut s);
        script(&mut s);
    });
    match out {
        Err(CallError::Broken(why)) => why,
        other => panic!("expected a broken call, got {other:?}"),
    }
}

#[test]
fn a_reset_a_goaway_a_close_or_a_bad_frame_is_a_broken_call() {
    let why = broken_by(|s| {
        let mut out = Vec::new();
        frame(&mut out, RST_STREAM, 0, STREAM, &2u32.to_be_bytes());
        s.write_all(&out).expect("write");
    });
    assert!(why.contains("reset") && why.contains('2'), "{why}");
    let why = broken_by(|s| {
        let mut out = Vec::new();
        let mut p = 0u32.to_be_bytes().to_vec();
        p.extend_from_slice(&0u32.to_be_bytes());
        frame(&mut out, GOAWAY, 0, 0, &p);
        s.write_all(&out).expect("write");
    });
    assert!(why.contains("GOAWAY"), "{why}");
    let why = broken_by(|s| drop(s.shutdown(std::net::Shutdown::Both)));
    assert!(why.contains("closed"), "{why}");
    let why = broken_by(|s| {
        // A header that announces a 20 000-byte frame.
        s.write_all(&[0, 0x4e, 0x20, DATA, 0, 0, 0, 0, 1])
            .expect("write");
    });
    assert!(why.contains("20000-byte frame"), "{why}");
    let why = broken_by(|s| {
        let mut out = Vec::new();
        frame(&mut out, HEADERS, END_STREAM | END_HEADERS, STREAM, &[0xff]);
        s.write_all(&out).expect("write");
    });
    assert!(why.contains("headers"), "{why}");
}

#[test]
fn an_http_error_status_is_a_grpc_code() {
    let (out, ()) = against(Duration::from_secs(5), b"x", |mut s| {
        read_request(&mut s);
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        let block = headers_block(&mut enc, &[(":status", "503")]);
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &block);
        s.write_all(&out).expect("write");
    });
    let reply = out.expect("a reply");
    assert_eq!(reply.code, 14);
    assert!(reply.message.contains("503"), "{}", reply.message);
}

#[test]
fn a_silent_daemon_runs_into_the_deadline() {
    let started = Instant::now();
    let (out, ()) = against(Duration::from_millis(200), b"x", |mut s| {
        read_request(&mut s);
        // Holds the connection open and never answers, until the client gives up.
        let mut sink = Vec::new();
        let _ = s.read_to_end(&mut sink);
    });
    assert!(matches!(out, Err(CallError::Deadline)), "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn connecting_to_nothing_or_to_an_impossible_path_fails_before_sending() {
    let dir = tempfile::tempdir().expect("tempdir");
    let deadline = Instant::now() + Duration::from_secs(1);
    match connect(&dir.path().join("absent.sock"), deadline) {
        Err(CallError::Connect(e)) => assert_eq!(e.kind(), io::ErrorKind::NotFound),
        other => panic!("{other:?}"),
    }
    let long = Path::new("/").join("x".repeat(200));
    match connect(&long, deadline) {
        Err(CallError::Connect(e)) => assert_eq!(e.kind(), io::ErrorKind::InvalidInput),
        other => panic!("{other:?}"),
    }
}

#[test]
fn grpc_messages_are_percent_decoded() {
    assert_eq!(percent_decode("a%20b"), "a b");
    assert_eq!(percent_decode("%E2%9C%93"), "\u{2713}");
    // Not an escape: kept as is.
    assert_eq!(percent_decode("100%"), "100%");
    assert_eq!(percent_decode("%zz%4"), "%zz%4");
}

proptest::proptest! {
    /// Whatever a broken daemon sends back, the call ends with an outcome, not a panic.
    #[test]
    fn any_reply_bytes_end_the_call_cleanly(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300)) {
        let (_out, ()) = against(Duration::from_millis(300), b"x", move |mut s| {
            read_request(&mut s);
            let _ = s.write_all(&bytes);
        });
    }
}

/// The client's SETTINGS: no push, the stream window raised, and the header list size the
/// HPACK decoder holds replies to.
#[test]
fn the_settings_announce_the_header_list_size() {
    let (_, settings) = against(Duration::from_secs(5), b"x", |mut s| {
        let mut preface = [0u8; 24];
        s.read_exact(&mut preface).expect("preface");
        let f = read_frame(&mut s).expect("SETTINGS");
        assert_eq!((f.kind, f.flags, f.stream), (SETTINGS, 0, 0));
        f.payload
            .chunks_exact(6)
            .map(|p| {
                (
                    u16::from_be_bytes([p[0], p[1]]),
                    u32::from_be_bytes([p[2], p[3], p[4], p[5]]),
                )
            })
            .collect::<Vec<_>>()
    });
    assert_eq!(
        settings,
        vec![
            (SETTINGS_ENABLE_PUSH, 0),
            (SETTINGS_INITIAL_WINDOW_SIZE, 16 << 20),
            (SETTINGS_MAX_HEADER_LIST_SIZE, 16_384),
        ]
    );
}

/// A reply whose every frame (SETTINGS, HEADERS with a CONTINUATION, padded DATA, trailers)
/// arrives a byte at a time, so that frame headers and payloads are split across reads.
#[test]
fn frames_split_across_reads_are_decoded() {
    let (out, ()) = against(Duration::from_secs(10), b"x", |mut s| {
        read_request(&mut s);
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        frame(&mut out, SETTINGS, 0, 0, &[]);
        let h = headers_block(
            &mut enc,
            &[(":status", "200"), ("content-type", "application/grpc")],
        );
        let (a, b) = h.split_at(h.len() / 2);
        frame(&mut out, HEADERS, 0, STREAM, a);
        frame(&mut out, CONTINUATION, END_HEADERS, STREAM, b);
        let reply = grpc_message(b"a reply in pieces");
        let mut padded = vec![2u8];
        padded.extend_from_slice(&reply[..7]);
        padded.extend_from_slice(&[0, 0]);
        frame(&mut out, DATA, PADDED, STREAM, &padded);
        frame(&mut out, DATA, 0, STREAM, &reply[7..]);
        let t = headers_block(&mut enc, &[("grpc-status", "0"), ("grpc-message", "ok")]);
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &t);
        for byte in out {
            // The client may have gone once it has its reply: the last write may fail.
            if s.write_all(&[byte]).is_err() {
                break;
            }
            thread::sleep(Duration::from_micros(300));
        }
    });
    let reply = out.expect("a reply");
    assert_eq!(reply.code, 0);
    assert_eq!(reply.message, "ok");
    assert_eq!(reply.body, b"a reply in pieces");
}

/// A HEADERS frame of 4 KiB whose fields decode to 20 KiB (:status, a 4 033-byte table entry,
/// then four references to it): refused as over the announced 16 KiB, a broken call (CNI 11).
#[test]
fn a_header_block_that_decodes_past_the_list_size_is_refused() {
    let why = broken_by(|s| {
        let mut block = vec![0x88]; // :status: 200 (static 8)
        block.push(0x40); // a literal with indexing, new name
        block.push(1);
        block.push(b'x');
        hpack_int(&mut block, 0, 7, 4000);
        block.extend_from_slice(&[b'a'; 4000]);
        block.extend_from_slice(&[0x80 | 62; 4]);
        let mut out = Vec::new();
        frame(&mut out, HEADERS, END_HEADERS | END_STREAM, STREAM, &block);
        s.write_all(&out).expect("write");
    });
    assert!(
        why.contains("headers") && why.contains("over 16384 bytes"),
        "{why}"
    );
}

/// Header blocks without end (HEADERS frames that never end the stream): refused at the
/// fifth, not decoded and kept until the deadline.
#[test]
fn more_than_four_header_blocks_are_refused() {
    let why = broken_by(|s| {
        let mut enc = httlib_hpack::Encoder::default();
        let mut out = Vec::new();
        for _ in 0..5 {
            let h = headers_block(&mut enc, &[(":status", "100")]);
            frame(&mut out, HEADERS, END_HEADERS, STREAM, &h);
        }
        s.write_all(&out).expect("write");
    });
    assert!(why.contains("more than 4 header blocks"), "{why}");
}
