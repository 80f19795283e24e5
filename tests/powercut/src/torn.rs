//! Torn mode's parts: a file's unsynced changes, in order, and the seeded choice of which
//! prefix of them a cut keeps (see the crate's doc).

/// One unsynced change to a file's bytes.
pub enum Change {
    /// Bytes written at an offset.
    Write(usize, Vec<u8>),
    /// A truncate or an extend.
    SetLen(usize),
}

/// How much of a file's unsynced changes a cut keeps: the first `whole`, then `torn` bytes
/// of the next (a write).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keep {
    /// Changes kept whole.
    pub whole: usize,
    /// Bytes kept of the write after them.
    pub torn: usize,
}

/// SplitMix64: small, seeded, and the same on every machine.
pub struct Rng(pub u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    /// What a torn cut keeps of `changes`: k whole from 0 to all, then, when k is not all
    /// and the next is a write, a prefix of it short of its last byte.
    pub fn keep(&mut self, changes: &[Change]) -> Keep {
        let whole = self.below(changes.len() + 1);
        let torn = match changes.get(whole) {
            Some(Change::Write(_, bytes)) => self.below(bytes.len()),
            _ => 0,
        };
        Keep { whole, torn }
    }
}

impl Change {
    /// The bytes it writes.
    pub fn written(&self) -> usize {
        match self {
            Change::Write(_, bytes) => bytes.len(),
            Change::SetLen(_) => 0,
        }
    }

    /// Applies it to `data`: a write's first `part` bytes (all of a length change).
    pub fn apply(&self, data: &mut Vec<u8>, part: usize) {
        match self {
            Change::SetLen(len) => data.resize(*len, 0),
            Change::Write(offset, bytes) => {
                let end = offset + part;
                if data.len() < end {
                    data.resize(end, 0);
                }
                data[*offset..end].copy_from_slice(&bytes[..part]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn torn_mode_is_seeded_and_keeps_at_most_every_change() {
        let changes = || (0..5).map(|i| Change::Write(i * 3, vec![b'x'; 3])).collect::<Vec<_>>();
        let draws = |seed| {
            let mut rng = Rng(seed);
            (0..50).map(|_| rng.keep(&changes())).collect::<Vec<_>>()
        };
        assert_eq!(draws(7), draws(7), "the same seed, the same cuts");
        let all = draws(7);
        assert!(all
            .iter()
            .all(|k| k.whole <= 5 && k.torn < 3 && (k.whole < 5 || k.torn == 0)));
        assert!(all.iter().any(|k| k.whole == 0) && all.iter().any(|k| k.whole == 5));
        assert!(all.iter().any(|k| k.torn > 0), "some writes are torn");
    }
}
