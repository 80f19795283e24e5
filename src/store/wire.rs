//! The byte format every stored record shares: a kind byte, a version byte, then the
//! fields, little-endian, strings length-prefixed. [`Writer`] builds one, [`Reader`] reads
//! one back and says exactly what is wrong with a record it cannot read.

/// A stored record that cannot be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// The record ended before all its fields.
    #[error("{0} record is truncated")]
    Truncated(&'static str),
    /// Written by a courier with a newer record version.
    #[error("{kind} record has unknown version {version} (written by a newer courier?)")]
    UnknownVersion {
        /// Which record.
        kind: &'static str,
        /// The version byte found.
        version: u8,
    },
    /// A field holds a value no courier writes.
    #[error("{0} record is corrupt: {1}")]
    Corrupt(&'static str, &'static str),
    /// A sealed value that does not open (see `store::seal`).
    #[error("{0}")]
    Sealed(#[from] super::seal::SealError),
}

use super::seal::unpack;

/// Builds a record: a kind byte, a version byte, then the fields (shared with `lines`).
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn new(tag: [u8; 2], capacity: usize) -> Self {
        let mut v = Vec::with_capacity(capacity + 2);
        v.extend_from_slice(&tag);
        Writer(v)
    }
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub(super) fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub(super) fn bytes(&mut self, v: &[u8]) {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
    }
    pub(super) fn str(&mut self, v: &str) {
        self.bytes(v.as_bytes());
    }
    /// `v` as a flag and bytes: LZ4-compressed on its own (flag 1, `packed`, which is
    /// `seal::pack(v)`) when that makes it smaller, else as it is (flag 0).
    pub(super) fn packed(&mut self, v: &[u8], packed: &[u8]) {
        let (flag, bytes) = if packed.len() < v.len() { (1, packed) } else { (0, v) };
        self.u8(flag);
        self.bytes(bytes);
    }
    pub(super) fn opt_u16(&mut self, v: Option<u16>) {
        self.u8(u8::from(v.is_some()));
        if let Some(v) = v {
            self.0.extend_from_slice(&v.to_le_bytes());
        }
    }
    pub(super) fn opt_str(&mut self, v: Option<&str>) {
        self.u8(u8::from(v.is_some()));
        if let Some(v) = v {
            self.str(v);
        }
    }
}

/// Reads a record built by [`Writer`] (shared with `lines`).
pub(super) struct Reader<'a> {
    kind: &'static str,
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    pub(super) fn new(kind: &'static str, tag: [u8; 2], buf: &'a [u8]) -> Result<Self, CodecError> {
        match buf {
            [k, v, rest @ ..] if *k == tag[0] => {
                if *v != tag[1] {
                    return Err(CodecError::UnknownVersion { kind, version: *v });
                }
                Ok(Reader { kind, buf: rest })
            }
            [_, _, ..] => Err(CodecError::Corrupt(kind, "wrong record kind")),
            _ => Err(CodecError::Truncated(kind)),
        }
    }
    pub(super) fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.buf.len() < n {
            return Err(CodecError::Truncated(self.kind));
        }
        let (head, rest) = self.buf.split_at(n);
        self.buf = rest;
        Ok(head)
    }
    pub(super) fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    pub(super) fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().expect("4 bytes")))
    }
    pub(super) fn u64(&mut self) -> Result<u64, CodecError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().expect("8 bytes")))
    }
    pub(super) fn bytes(&mut self) -> Result<&'a [u8], CodecError> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    pub(super) fn string(&mut self) -> Result<String, CodecError> {
        let b = self.bytes()?;
        String::from_utf8(b.to_vec()).map_err(|_| CodecError::Corrupt(self.kind, "text is not UTF-8"))
    }
    /// Bytes written by [`Writer::packed`].
    pub(super) fn packed(&mut self) -> Result<Vec<u8>, CodecError> {
        let packed = self.flag()?;
        let bytes = self.bytes()?;
        match packed {
            false => Ok(bytes.to_vec()),
            true => unpack(bytes).ok_or(CodecError::Corrupt(self.kind, "bad LZ4 block")),
        }
    }
    pub(super) fn flag(&mut self) -> Result<bool, CodecError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(CodecError::Corrupt(self.kind, "bad flag byte")),
        }
    }
    pub(super) fn opt_u16(&mut self) -> Result<Option<u16>, CodecError> {
        if !self.flag()? {
            return Ok(None);
        }
        Ok(Some(u16::from_le_bytes(self.take(2)?.try_into().expect("2 bytes"))))
    }
    pub(super) fn opt_string(&mut self) -> Result<Option<String>, CodecError> {
        Ok(if self.flag()? { Some(self.string()?) } else { None })
    }
    pub(super) fn end(self) -> Result<(), CodecError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(CodecError::Corrupt(self.kind, "trailing bytes"))
        }
    }
}
