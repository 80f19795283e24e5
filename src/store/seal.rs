//! Values sealed at rest (`[store] encryption_key_files`): what a message carries that is
//! the app's or its customers' — the body, the headers it forwards (its `Authorization` for
//! the receiver), a per-message signing secret, an alert's body — is stored encrypted, so a
//! copy of the data dir (a node disk, a backup, a PVC snapshot) does not give it away.
//!
//! # Format
//! A sealed value is `S 1 ‖ key id (4) ‖ nonce (24) ‖ ciphertext ‖ tag (16)`, with a fresh
//! random 192-bit nonce per value, split as XAES-256-GCM splits its nonce (but derived with
//! HMAC where XAES uses AES-CMAC: not compatible with it): the first 12 bytes derive the
//! value's own key (HMAC-SHA256 of the store key over a label and them), the last 12 are the
//! AES-256-GCM nonce under that key (ring's AES-GCM, with AES-NI where the CPU has it).
//! With random 96-bit nonces under one key, NIST allows 2^32 values per key; with a key per
//! value there is no limit a busy store could reach. The column family and the record's
//! key are the associated data, so a sealed value copied under another id, or into another
//! column family, does not open. A plain record starts with its own kind byte (`P` for a
//! payload), never `S`, so plain values written before sealing was turned on read as they
//! are.
//!
//! The plaintext is a flag byte and the value as it is (flag 0). Values sealed by earlier
//! couriers may carry flag 1 (a 4-byte little-endian length, then an LZ4 block of the
//! whole value) and still open; nothing is sealed so any more. Compressing a whole payload
//! made its sealed size depend on how well the app's headers and secrets match its body,
//! which someone who chooses part of a body can measure (CRIME): a payload compresses its
//! body alone, before it is sealed (`codec`, payload version 2), so what the seal hides
//! never shares a compression context with anything else.
//!
//! # Key ids
//! A key's id is the first 4 bytes of SHA-256 over a label and the key: enough to tell an
//! operator which of their key files a value needs, and to find the key without trying
//! each; it says nothing usable about the key.
//!
//! Pure: no I/O; the nonces' randomness comes from the thread's CSPRNG (`clock::rng`),
//! which is cryptographically secure and reseeded from the operating system.

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use rand::RngCore;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM};
use ring::hmac;
use sha2::{Digest, Sha256};

/// Bytes in a store key.
pub const KEY_LEN: usize = 32;
const SEALED_V1: [u8; 2] = [b'S', 1];
const ID_LEN: usize = 4;
/// The nonce: the part the value's key is derived from, then the AES-GCM nonce.
const NONCE_LEN: usize = 24;
const DERIVE_LEN: usize = 12;
const HEADER_LEN: usize = 2 + ID_LEN + NONCE_LEN;
const TAG_LEN: usize = 16;
/// What a value's key is derived with, beside the first part of its nonce.
const VALUE_KEY_LABEL: &[u8] = b"courier payload key v1\0";
/// The plaintext's flag byte.
const RAW: u8 = 0;
/// Written by earlier couriers only (the whole value LZ4-compressed); still opened.
const LZ4: u8 = 1;

/// Which key sealed a value (shown as 8 hex digits).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KeyId(
    /// The first bytes of SHA-256 over a label and the key (as stored in a sealed value).
    pub [u8; ID_LEN],
);

impl KeyId {
    /// The id of `key`.
    pub fn of(key: &[u8; KEY_LEN]) -> KeyId {
        let digest = Sha256::new()
            .chain_update(b"courier store key id\0")
            .chain_update(key)
            .finalize();
        KeyId(digest[..ID_LEN].try_into().expect("4 bytes"))
    }
}

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&hex::encode(self.0))
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// Why a stored value does not open.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SealError {
    /// Sealed with a key none of the configured ones is.
    #[error("sealed with store key {0}, which no configured key file holds")]
    UnknownKey(KeyId),
    /// The key is there, but the value does not authenticate under it.
    #[error("does not open with store key {0} (altered, truncated, or moved from another record)")]
    Forged(KeyId),
}

struct StoreKey {
    id: KeyId,
    /// The store key, as the HMAC key each value's key is derived with.
    kdf: hmac::Key,
}

impl StoreKey {
    /// The AES-256-GCM key and nonce of the value with `nonce`.
    fn value_key(&self, nonce: &[u8]) -> (LessSafeKey, Nonce) {
        let (derive, gcm) = nonce.split_at(DERIVE_LEN);
        let mut ctx = hmac::Context::with_key(&self.kdf);
        ctx.update(VALUE_KEY_LABEL);
        ctx.update(derive);
        let derived = ctx.sign();
        let key = UnboundKey::new(&AES_256_GCM, derived.as_ref()).expect("HMAC-SHA256 gives 32 bytes");
        let nonce = Nonce::try_assume_unique_for_key(gcm).expect("12 bytes");
        (LessSafeKey::new(key), nonce)
    }
}

/// The configured store keys: the first seals new values, every one opens. Empty: values
/// are stored plain. Cheap to clone.
#[derive(Clone, Default)]
pub struct Keyring {
    keys: Arc<[StoreKey]>,
}

impl fmt::Debug for Keyring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.ids()).finish()
    }
}

impl Keyring {
    /// A keyring of `keys`, the first sealing.
    pub fn new(keys: &[[u8; KEY_LEN]]) -> Keyring {
        let keys = keys
            .iter()
            .map(|k| StoreKey {
                id: KeyId::of(k),
                kdf: hmac::Key::new(hmac::HMAC_SHA256, k),
            })
            .collect();
        Keyring { keys }
    }

    /// The key new values are sealed with (`None`: stored plain).
    pub fn sealing(&self) -> Option<KeyId> {
        self.keys.first().map(|k| k.id)
    }

    /// Every configured key's id, the sealing one first.
    pub fn ids(&self) -> Vec<KeyId> {
        self.keys.iter().map(|k| k.id).collect()
    }

    /// Whether `id` is configured.
    pub fn has(&self, id: KeyId) -> bool {
        self.keys.iter().any(|k| k.id == id)
    }

    /// `plain`, sealed with the first key for the record `key` of column family `cf`; as it
    /// is when no key is configured.
    pub fn seal(&self, cf: &str, key: &[u8], plain: Vec<u8>) -> Vec<u8> {
        match self.keys.first() {
            Some(k) => seal_with(k, cf, key, RAW, &plain),
            None => plain,
        }
    }

    /// The plain value of `stored` (the record `key` of `cf`): opened when sealed, as it is
    /// when it was written plain.
    pub fn open<'a>(&self, cf: &str, key: &[u8], stored: &'a [u8]) -> Result<Cow<'a, [u8]>, SealError> {
        let Some(id) = sealed_with(stored) else {
            return Ok(Cow::Borrowed(stored));
        };
        let k = self.keys.iter().find(|k| k.id == id).ok_or(SealError::UnknownKey(id))?;
        let (nonce, sealed) = stored[2 + ID_LEN..].split_at(NONCE_LEN);
        let mut buf = sealed.to_vec();
        let (value_key, nonce) = k.value_key(nonce);
        let plain = value_key
            .open_in_place(nonce, Aad::from(associated(cf, key)), &mut buf)
            .map_err(|_| SealError::Forged(id))?;
        match plain.split_first() {
            Some((&RAW, value)) => Ok(Cow::Owned(value.to_vec())),
            Some((&LZ4, packed)) => unpack(packed).map(Cow::Owned).ok_or(SealError::Forged(id)),
            _ => Err(SealError::Forged(id)),
        }
    }
}

/// `plain` as an LZ4 block with its length (4 bytes, little-endian) in front: a payload's
/// body in `codec` (version 2), and the whole value sealed by earlier couriers (flag 1).
///
/// The compressor's 8 KiB hash table is kept per thread: allocated (and zeroed) for every
/// accept, it was one of the largest allocations a message made.
pub(super) fn pack(plain: &[u8]) -> Vec<u8> {
    use lz4_flex::block::{compress_into_with_table, get_maximum_output_size, CompressTable};
    thread_local! {
        static TABLE: std::cell::RefCell<CompressTable> = std::cell::RefCell::new(CompressTable::small());
    }
    let mut out = vec![0u8; 4 + get_maximum_output_size(plain.len())];
    out[..4].copy_from_slice(&(plain.len() as u32).to_le_bytes());
    let len = TABLE
        .with_borrow_mut(|table| compress_into_with_table(plain, &mut out[4..], table))
        .expect("the output holds LZ4's largest block for this input");
    out.truncate(4 + len);
    out
}

/// The value of an LZ4 block with its length in front ([`pack`]); `None` when it is not one.
/// The length is checked against what LZ4 can reach (255 bytes out per byte in) before it
/// is allocated.
pub(super) fn unpack(packed: &[u8]) -> Option<Vec<u8>> {
    let (len, block) = packed.split_first_chunk::<4>()?;
    let len = u32::from_le_bytes(*len) as usize;
    if len > block.len().saturating_mul(255) {
        return None;
    }
    lz4_flex::block::decompress(block, len).ok()
}

/// The key that sealed `stored`, or `None` when it was written plain.
pub fn sealed_with(stored: &[u8]) -> Option<KeyId> {
    if stored.len() < HEADER_LEN || stored[..2] != SEALED_V1 {
        return None;
    }
    Some(KeyId(stored[2..2 + ID_LEN].try_into().expect("4 bytes")))
}

/// `flag ‖ body` sealed with `k` for the record `key` of `cf`. Courier seals only `RAW`
/// values: the value's own length is all the sealed one says.
fn seal_with(k: &StoreKey, cf: &str, key: &[u8], flag: u8, body: &[u8]) -> Vec<u8> {
    let mut nonce = [0u8; NONCE_LEN];
    crate::clock::rng().fill_bytes(&mut nonce);
    let mut out = Vec::with_capacity(HEADER_LEN + 1 + body.len() + TAG_LEN);
    out.extend_from_slice(&SEALED_V1);
    out.extend_from_slice(&k.id.0);
    out.extend_from_slice(&nonce);
    out.push(flag);
    out.extend_from_slice(body);
    let (value_key, nonce) = k.value_key(&nonce);
    let tag = value_key
        .seal_in_place_separate_tag(nonce, Aad::from(associated(cf, key)), &mut out[HEADER_LEN..])
        .expect("AES-256-GCM seals any length courier stores");
    out.extend_from_slice(tag.as_ref());
    out
}

/// `cf ‖ 0 ‖ key`: where the value lives, bound into its tag.
fn associated(cf: &str, key: &[u8]) -> Vec<u8> {
    [cf.as_bytes(), &[0], key].concat()
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: [u8; 32] = [7; 32];
    const B: [u8; 32] = [9; 32];

    #[test]
    fn a_sealed_value_opens_only_where_it_was_written_and_with_its_key() {
        let ring = Keyring::new(&[A]);
        let plain = b"P\x01 body marker".to_vec();
        let sealed = ring.seal("payloads", b"dlv_1", plain.clone());
        assert_eq!(sealed_with(&sealed), Some(KeyId::of(&A)));
        assert!(!sealed.windows(6).any(|w| w == b"marker"));
        assert_eq!(ring.open("payloads", b"dlv_1", &sealed).unwrap(), plain);
        // Another record, another column family: the tag does not match.
        assert_eq!(
            ring.open("payloads", b"dlv_2", &sealed),
            Err(SealError::Forged(KeyId::of(&A)))
        );
        assert_eq!(
            ring.open("messages", b"dlv_1", &sealed),
            Err(SealError::Forged(KeyId::of(&A)))
        );
        // One flipped bit anywhere after the header.
        for i in HEADER_LEN - NONCE_LEN..sealed.len() {
            let mut bad = sealed.clone();
            bad[i] ^= 1;
            assert!(ring.open("payloads", b"dlv_1", &bad).is_err(), "bit flip at {i}");
        }
        // A keyring without the key names the one it needs.
        let other = Keyring::new(&[B]);
        assert_eq!(
            other.open("payloads", b"dlv_1", &sealed),
            Err(SealError::UnknownKey(KeyId::of(&A)))
        );
        assert_eq!(
            SealError::UnknownKey(KeyId::of(&A)).to_string(),
            format!(
                "sealed with store key {}, which no configured key file holds",
                KeyId::of(&A)
            )
        );
    }

    #[test]
    fn every_value_gets_a_fresh_nonce_and_a_key_of_its_own() {
        let ring = Keyring::new(&[A]);
        let one = ring.seal("payloads", b"k", b"same".to_vec());
        let two = ring.seal("payloads", b"k", b"same".to_vec());
        assert_ne!(one[2 + ID_LEN..HEADER_LEN], two[2 + ID_LEN..HEADER_LEN], "nonces");
        assert_ne!(one[HEADER_LEN..], two[HEADER_LEN..]);
        // The flag and the value as they are.
        assert_eq!(one.len(), HEADER_LEN + 1 + 4 + TAG_LEN);
    }

    #[test]
    fn a_value_is_sealed_uncompressed_and_one_compressed_by_an_older_courier_still_opens() {
        let ring = Keyring::new(&[A]);
        let plain = [&b"P\x01"[..], &[b'x'; 4000][..]].concat();
        let sealed = ring.seal("payloads", b"k", plain.clone());
        // Its length is the value's, however well it would compress.
        assert_eq!(sealed.len(), HEADER_LEN + 1 + plain.len() + TAG_LEN);
        assert_eq!(ring.open("payloads", b"k", &sealed).unwrap(), plain);
        let empty = ring.seal("payloads", b"k", Vec::new());
        assert_eq!(ring.open("payloads", b"k", &empty).unwrap(), &b""[..]);
        // As earlier couriers sealed it: the whole value LZ4-compressed.
        let old = seal_with(&ring.keys[0], "payloads", b"k", LZ4, &pack(&plain));
        assert!(old.len() < 200, "{}", old.len());
        assert_eq!(ring.open("payloads", b"k", &old).unwrap(), plain);
        // A compressed value whose block does not decode does not open.
        let bad = seal_with(&ring.keys[0], "payloads", b"k", LZ4, b"\xff\xff\xff\x7fxx");
        assert_eq!(ring.open("payloads", b"k", &bad), Err(SealError::Forged(KeyId::of(&A))));
    }

    #[test]
    fn plain_values_read_as_they_are_and_no_keys_store_plain() {
        let plain = b"P\x01plain".to_vec();
        for ring in [Keyring::default(), Keyring::new(&[A])] {
            assert_eq!(ring.open("payloads", b"k", &plain).unwrap(), plain);
        }
        assert_eq!(Keyring::default().seal("payloads", b"k", plain.clone()), plain);
        assert_eq!(Keyring::default().sealing(), None);
        // Short or other-kind values are never taken for sealed ones.
        assert_eq!(sealed_with(b"S\x01abc"), None);
        assert_eq!(sealed_with(&[b'S', 2].repeat(20)), None);
    }

    #[test]
    fn the_first_key_seals_and_every_key_opens() {
        let old = Keyring::new(&[B]);
        let by_old = old.seal("payloads", b"k", b"v".to_vec());
        let ring = Keyring::new(&[A, B]);
        assert_eq!(ring.sealing(), Some(KeyId::of(&A)));
        assert_eq!(ring.ids(), vec![KeyId::of(&A), KeyId::of(&B)]);
        assert_eq!(ring.open("payloads", b"k", &by_old).unwrap(), &b"v"[..]);
        assert_eq!(
            sealed_with(&ring.seal("payloads", b"k", b"v".to_vec())),
            Some(KeyId::of(&A))
        );
    }

    /// The kept table gives the same blocks as a fresh one, for small and large bodies in
    /// any order (a large one upgrades the thread's table), so stored payloads are unchanged.
    #[test]
    fn packing_with_the_kept_table_writes_what_a_fresh_table_writes() {
        let json = br#"{"type":"order.created","data":{"id":42,"items":["a","b","a","b"]}}"#.repeat(40);
        let large: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8 ^ (i / 997) as u8).collect();
        for body in [&b""[..], b"x", &json, &large, &json, b"tiny"] {
            assert_eq!(pack(body), lz4_flex::block::compress_prepend_size(body));
            assert_eq!(unpack(&pack(body)).unwrap(), body);
        }
    }

    #[test]
    fn a_length_lz4_could_not_reach_is_refused_before_it_is_allocated() {
        let packed = pack(&[b'x'; 1000]);
        assert_eq!(unpack(&packed).unwrap(), vec![b'x'; 1000]);
        let mut huge = packed.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(unpack(&huge), None);
        assert_eq!(unpack(&packed[..3]), None);
    }

    #[test]
    fn key_ids_are_stable_and_distinct() {
        assert_eq!(KeyId::of(&A).to_string().len(), 8);
        assert_eq!(KeyId::of(&A), KeyId::of(&A));
        assert_ne!(KeyId::of(&A), KeyId::of(&B));
    }
}
