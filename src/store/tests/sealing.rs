//! Payloads sealed at rest: what the files hold, which keys a data dir needs, refusing a
//! start without them, rotation and rekeying both ways.

use super::*;

const A: [u8; 32] = [0xa1; 32];
const B: [u8; 32] = [0xb2; 32];

fn open_with(path: &std::path::Path, keys: &[[u8; 32]]) -> Result<Store, StoreError> {
    Store::open(
        path,
        StoreOptions {
            keyring: Keyring::new(keys),
            ..Default::default()
        },
    )
}

/// A message whose payload carries a marker in its body, a header and its secret.
fn marked(id: &str) -> NewMessage {
    let mut msg = message(id, &format!("evt_{id}"), 1_000);
    // (The marker does not end in the id: LZ4 would store that part as a reference to the
    // key, and a search of the files would miss a plain body.)
    msg.payload.body = format!("{{\"id\":\"{id}\",\"marker\":\"BODY-SECRET\"}}").into_bytes();
    msg.payload
        .headers
        .push(("authorization".into(), b"Bearer HEADER-TOKEN".to_vec()));
    msg.payload.signing = SigningChoice::Inline("whsec_SECRET".into());
    msg
}

fn accept(store: &Store, ids: &[&str]) {
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    for id in ids {
        rt.block_on(store.accept(marked(id))).unwrap();
    }
}

/// A clean stop, as courier's: the queued accepts answered, the log and tables flushed.
fn stop(store: Store) {
    store.close();
}

/// A store in `path` with `ids` accepted under `keys`, stopped.
fn filled(path: &std::path::Path, keys: &[[u8; 32]], ids: &[&str]) {
    let store = open_with(path, keys).unwrap();
    accept(&store, ids);
    stop(store);
}

fn raw(store: &Store, id: &str) -> Vec<u8> {
    store
        .db
        .get_cf(store.cf(keys::PAYLOADS), id.as_bytes())
        .unwrap()
        .unwrap()
}

fn shows(bytes: &[u8], needle: &str) -> bool {
    bytes.windows(needle.len()).any(|w| w == needle.as_bytes())
}

#[test]
fn a_sealed_payload_shows_nothing_stored_and_reads_back_whole() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir.path().join("data"), &[A]).unwrap();
    accept(&store, &["dlv_1"]);
    let stored = raw(&store, "dlv_1");
    assert_eq!(seal::sealed_with(&stored), Some(KeyId::of(&A)));
    for secret in ["BODY-SECRET", "HEADER-TOKEN", "whsec_SECRET", "authorization"] {
        assert!(!shows(&stored, secret), "{secret} is in the stored payload");
    }
    assert_eq!(store.payload("dlv_1").unwrap().unwrap(), marked("dlv_1").payload);
    // What the scheduler and admin read stays plain.
    assert_eq!(store.message("dlv_1").unwrap().unwrap().target, "https://r.example/h");
    let keys = store.keys_in_use().unwrap();
    assert_eq!((keys.sealing, keys.in_data), (Some(KeyId::of(&A)), vec![KeyId::of(&A)]));
}

#[test]
fn a_payload_moved_under_another_id_does_not_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir.path().join("data"), &[A]).unwrap();
    accept(&store, &["dlv_1", "dlv_2"]);
    let one = raw(&store, "dlv_1");
    store.db.put_cf(store.cf(keys::PAYLOADS), b"dlv_2", &one).unwrap();
    let err = store.payload("dlv_2").unwrap_err();
    assert_eq!(err.code(), "corrupt_record");
    assert!(err.to_string().contains("does not open with store key"), "{err}");
}

#[test]
fn a_start_without_a_key_the_data_needs_is_refused_naming_it_and_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_with(&path, &[A]).unwrap();
    accept(&store, &["dlv_1"]);
    let before = raw(&store, "dlv_1");
    stop(store);
    for keys in [&[B][..], &[]] {
        let err = open_with(&path, keys).unwrap_err();
        assert_eq!(err.code(), "store_key_missing");
        let line = err.to_string();
        assert!(
            line.contains(&format!("sealed with store key {}", KeyId::of(&A))),
            "{line}"
        );
        assert!(line.contains("nothing was changed") && !line.contains('\n'), "{line}");
    }
    // B was not recorded as a key the data needs: A alone opens the store again.
    let store = open_with(&path, &[A]).unwrap();
    assert_eq!(store.keys_in_use().unwrap().in_data, vec![KeyId::of(&A)]);
    assert_eq!(raw(&store, "dlv_1"), before);
    assert_eq!(store.payload("dlv_1").unwrap().unwrap(), marked("dlv_1").payload);
}

#[test]
fn a_new_first_key_seals_new_payloads_and_rekey_moves_the_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    filled(&path, &[A], &["dlv_1", "dlv_2"]);

    let store = open_with(&path, &[B, A]).unwrap();
    accept(&store, &["dlv_3"]);
    assert_eq!(seal::sealed_with(&raw(&store, "dlv_1")), Some(KeyId::of(&A)));
    assert_eq!(seal::sealed_with(&raw(&store, "dlv_3")), Some(KeyId::of(&B)));
    assert_eq!(store.keys_in_use().unwrap().in_data, vec![KeyId::of(&A), KeyId::of(&B)]);
    assert_eq!(
        store.rekey(false).unwrap(),
        Rekeyed {
            moved: 2,
            kept: 1,
            ..Default::default()
        }
    );
    assert_eq!(store.keys_in_use().unwrap().in_data, vec![KeyId::of(&B)]);
    stop(store);

    // The old key can go.
    let store = open_with(&path, &[B]).unwrap();
    for id in ["dlv_1", "dlv_2", "dlv_3"] {
        assert_eq!(seal::sealed_with(&raw(&store, id)), Some(KeyId::of(&B)));
        assert_eq!(store.payload(id).unwrap().unwrap(), marked(id).payload);
    }
}

#[test]
fn a_plain_store_takes_sealing_on_and_rekey_to_plain_takes_it_off() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_with(&path, &[]).unwrap();
    accept(&store, &["dlv_1"]);
    assert!(shows(&raw(&store, "dlv_1"), "BODY-SECRET"));
    assert_eq!(
        raw(&store, "dlv_1")[..2],
        [b'P', 1],
        "a small plain body is written as it is"
    );
    stop(store);

    // Sealing on: the plain payload still reads, new ones are sealed, a rekey seals the rest.
    let store = open_with(&path, &[A]).unwrap();
    accept(&store, &["dlv_2"]);
    assert_eq!(store.payload("dlv_1").unwrap().unwrap(), marked("dlv_1").payload);
    assert_eq!(seal::sealed_with(&raw(&store, "dlv_2")), Some(KeyId::of(&A)));
    assert_eq!(
        store.rekey(false).unwrap(),
        Rekeyed {
            moved: 1,
            kept: 1,
            ..Default::default()
        }
    );
    assert!(!shows(&raw(&store, "dlv_1"), "BODY-SECRET"));
    stop(store);

    // Off again only through a rekey to plain, with the key still listed.
    assert_eq!(open_with(&path, &[]).unwrap_err().code(), "store_key_missing");
    let store = open_with(&path, &[A]).unwrap();
    assert_eq!(
        store.rekey(true).unwrap(),
        Rekeyed {
            moved: 2,
            kept: 0,
            ..Default::default()
        }
    );
    stop(store);
    let store = open_with(&path, &[]).unwrap();
    assert_eq!(store.keys_in_use().unwrap().in_data, vec![]);
    for id in ["dlv_1", "dlv_2"] {
        assert!(shows(&raw(&store, id), "BODY-SECRET"));
        assert_eq!(store.payload(id).unwrap().unwrap(), marked(id).payload);
    }
}

#[test]
fn rekey_leaves_no_old_value_in_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    filled(&path, &[], &["dlv_1", "dlv_2"]);
    let store = open_with(&path, &[A]).unwrap();
    store.rekey(false).unwrap();
    stop(store);
    for entry in std::fs::read_dir(&path).unwrap() {
        let entry = entry.unwrap();
        let bytes = std::fs::read(entry.path()).unwrap();
        assert!(
            !shows(&bytes, "BODY-SECRET"),
            "{} holds a plain body",
            entry.path().display()
        );
    }
}

#[test]
fn a_payload_that_does_not_open_is_counted_and_left_and_the_rest_move() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_with(&path, &[A]).unwrap();
    accept(&store, &["dlv_1", "dlv_2"]);
    let one = raw(&store, "dlv_1");
    store.db.put_cf(store.cf(keys::PAYLOADS), b"dlv_2", &one).unwrap();
    stop(store);
    let store = open_with(&path, &[B, A]).unwrap();
    let done = store.rekey(false).unwrap();
    assert_eq!((done.moved, done.kept, done.unreadable), (1, 0, 1));
    assert_eq!(done.first_unreadable.as_deref(), Some("dlv_2"));
    assert_eq!(seal::sealed_with(&raw(&store, "dlv_1")), Some(KeyId::of(&B)));
}

#[test]
fn a_refused_start_leaves_every_file_of_the_data_dir_as_it_was() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    let store = open_with(&path, &[A]).unwrap();
    accept(&store, &["dlv_1"]);
    // (A start for writing would rewrite the manifest, the options and RocksDB's log.)
    stop(store);
    let files = || {
        let mut all: Vec<(String, Vec<u8>)> = std::fs::read_dir(&path)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        all.sort();
        all
    };
    let before = files();
    assert_eq!(open_with(&path, &[B]).unwrap_err().code(), "store_key_missing");
    assert!(before == files(), "the refused start changed the data dir");
}

/// A rekey from A to B of 600 payloads (two batches of 512) that the process dies in:
/// at the second batch (some payloads moved, the rest not), or at the record of the keys
/// the data needs (every payload moved, the record not). Every payload still opens, A is
/// still needed, and a second rekey finishes.
#[test]
fn a_rekey_cut_short_by_a_crash_leaves_every_payload_readable_and_the_old_key_needed() {
    for (writes, moved, left) in [(1, 512usize, 88usize), (2, 600, 0)] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data");
        let store = open_with(&path, &[A]).unwrap();
        let ids: Vec<String> = (0..600).map(|i| format!("dlv_{i:04}")).collect();
        accept(&store, &ids.iter().map(String::as_str).collect::<Vec<_>>());
        stop(store);
        let store = open_with(&path, &[B, A]).unwrap();
        store.faults().crash_after(writes);
        assert!(matches!(store.rekey(false), Err(StoreError::Injected)));
        drop(store);

        let store = open_with(&path, &[B, A]).unwrap();
        let under = |key: &[u8; 32]| {
            ids.iter()
                .filter(|id| seal::sealed_with(&raw(&store, id)) == Some(KeyId::of(key)))
                .count()
        };
        assert_eq!((under(&B), under(&A)), (moved, left), "crash at write {writes}");
        assert_eq!(
            store.keys_in_use().unwrap().in_data,
            vec![KeyId::of(&A), KeyId::of(&B)],
            "A is still needed"
        );
        for id in &ids {
            assert_eq!(store.payload(id).unwrap().unwrap(), marked(id).payload);
        }
        assert_eq!(store.rekey(false).unwrap().moved as usize, left);
        assert_eq!(store.keys_in_use().unwrap().in_data, vec![KeyId::of(&B)]);
    }
}

/// Two payloads that differ only in a guess at the app's token (or at its per-message
/// secret), one guess matching text the body carries: what the store writes for them.
fn guessed(store: &Store, id: &str, token: &str, secret: &str) -> Vec<u8> {
    let mut msg = marked(id);
    // The part of the body a sender chooses: the text it hopes the header or secret repeats.
    msg.payload.body = format!(
        "{{\"note\":\"{}\",\"probe\":\"Bearer HEADER-TOKEN whsec_SECRET\"}}",
        "n".repeat(300)
    )
    .into_bytes();
    msg.payload.headers = vec![("authorization".into(), token.as_bytes().to_vec())];
    msg.payload.signing = SigningChoice::Inline(secret.into());
    let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
    rt.block_on(store.accept(msg)).unwrap();
    raw(store, id)
}

#[test]
fn sealed_sizes_do_not_tell_whether_a_body_repeats_the_headers_or_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_with(&dir.path().join("data"), &[A]).unwrap();
    let right = guessed(&store, "dlv_1", "Bearer HEADER-TOKEN", "whsec_SECRET");
    let wrong = guessed(&store, "dlv_2", "Bearer ZQXJVKWPYBMQ", "whsec_ZQXJVK");
    assert_eq!(right.len(), wrong.len(), "a right guess seals to another length");
    // The body still compresses, on its own.
    assert!(right.len() < 300, "{}", right.len());
    assert_eq!(
        store.payload("dlv_1").unwrap().unwrap().headers[0].1,
        b"Bearer HEADER-TOKEN"
    );
}

#[test]
fn a_plain_payload_is_packed_when_that_at_least_halves_it() {
    use crate::store::sealing::stored_payload;
    let plain = Keyring::new(&[]);
    let mut payload = marked("dlv_1").payload;
    // An event with ids and numbers: packed alone it shrinks too little, and RocksDB's
    // block compression at flush does better with many of them.
    payload.body = (0..64u32)
        .map(|i| format!("{{\"n\":{},\"k\":\"{:08x}\"}}", i * 7919, i.wrapping_mul(2_654_435_761)))
        .collect::<String>()
        .into_bytes();
    let stored = stored_payload(&plain, false, b"k", &payload);
    assert_eq!(stored[..2], [b'P', 1]);
    assert_eq!(Payload::decode(&stored).unwrap(), payload);
    // A body that packs to less than half: packed, so the write-ahead log carries less.
    payload.body = [&b"{\"pad\":\""[..], &[b'x'; 990], b"\"}"].concat();
    let stored = stored_payload(&plain, false, b"k", &payload);
    assert_eq!(stored[..2], [b'P', 2]);
    assert!(stored.len() * 2 < payload.body.len(), "{}", stored.len());
    assert_eq!(Payload::decode(&stored).unwrap(), payload);
    // Sealing asked for but no sealing key: plain, by the same rule.
    assert_eq!(stored_payload(&plain, true, b"k", &payload), stored);
}

#[test]
fn a_rewritten_payload_moves_to_the_sealing_key_or_to_plain_and_stays_when_there() {
    use crate::store::sealing::{rewritten, stored_payload};
    let payload = marked("dlv_1").payload;
    let ring = Keyring::new(&[A, B]);
    let moves = |stored: &[u8], to_plain: bool| rewritten(&ring, b"k", stored, to_plain);
    let by_b = stored_payload(&Keyring::new(&[B]), true, b"k", &payload);
    let moved = moves(&by_b, false).unwrap().unwrap();
    assert_eq!(seal::sealed_with(&moved), Some(KeyId::of(&A)));
    assert_eq!(moves(&moved, false).unwrap(), None);
    let plain = moves(&moved, true).unwrap().unwrap();
    assert_eq!(
        plain,
        payload.encode(),
        "a plain body that does not pack to half is version 1"
    );
    // One packed plain (version 2) is already plain: it stays.
    assert_eq!(moves(&payload.encode_packed(), true).unwrap(), None);
    assert_eq!(moves(&plain, true).unwrap(), None);
    // Plain payloads are sealed by a rekey too, their body compressed alone.
    let sealed = moves(&plain, false).unwrap().unwrap();
    let opened = ring.open(keys::PAYLOADS, b"k", &sealed).unwrap();
    assert_eq!(opened[..2], [b'P', 2]);
    assert_eq!(Payload::decode(&opened).unwrap(), payload);
    // A payload whose key is gone cannot be moved; one that does not open neither.
    let lost = stored_payload(&Keyring::new(&[[1; 32]]), true, b"k", &payload);
    assert!(matches!(
        moves(&lost, false),
        Err(CodecError::Sealed(seal::SealError::UnknownKey(_)))
    ));
    assert!(rewritten(&ring, b"other", &by_b, false).is_err());
}
