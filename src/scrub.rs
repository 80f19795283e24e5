//! Taking what a message sent out of the text courier keeps about its attempts.
//!
//! An attempt's error (`last_error`, the attempt history) holds the start of a receiver's
//! error answer, stored plain and shown by the admin API, which never shows payloads. A
//! receiver that echoes its input would put the app's headers (its `Authorization`), the
//! per-message secret or body bytes there. So before the text is kept, every run of at
//! least [`MIN_RUN`] bytes of it that also occurs in something the attempt sent is replaced
//! by [`MARK`]: no piece of `MIN_RUN` bytes or more of them is left. Shorter pieces can be
//! (`MIN_RUN` trades hiding short values against keeping the words an answer shares with a
//! JSON body, such as `"error":`), and only literal echoes are found: a receiver that
//! escapes, encodes or re-cases what it echoes is not matched.
//!
//! Pure. Linear in what was sent: every 8-byte window of it is looked up among the text's
//! windows, through a bitmap that turns almost every lookup away in a few instructions.

use std::collections::HashSet;

/// The shortest run of sent bytes that is taken out (the window the search compares).
pub const MIN_RUN: usize = 8;
/// What stands for a run taken out.
pub const MARK: &str = "[sent data]";

/// Bits in the bitmap that screens windows (a power of two).
const BITMAP_BITS: usize = 1 << 16;

/// `text` with every run of at least [`MIN_RUN`] bytes that occurs in one of `sent`
/// replaced by [`MARK`] (overlapping and adjacent runs by one mark).
pub fn scrub(text: &str, sent: &[&[u8]]) -> String {
    let bytes = text.as_bytes();
    if bytes.len() < MIN_RUN {
        return text.to_string();
    }
    let windows: Vec<u64> = bytes.windows(MIN_RUN).map(window).collect();
    let wanted: HashSet<u64> = windows.iter().copied().collect();
    let mut bitmap = vec![0u64; BITMAP_BITS / 64];
    for w in &wanted {
        let b = slot(*w);
        bitmap[b / 64] |= 1 << (b % 64);
    }
    let mut found = HashSet::new();
    for source in sent {
        for w in source.windows(MIN_RUN).map(window) {
            let b = slot(w);
            if bitmap[b / 64] & (1 << (b % 64)) != 0 && wanted.contains(&w) {
                found.insert(w);
            }
        }
    }
    if found.is_empty() {
        return text.to_string();
    }
    let mut covered = vec![false; bytes.len()];
    for (i, w) in windows.iter().enumerate() {
        if found.contains(w) {
            covered[i..i + MIN_RUN].fill(true);
        }
    }
    let mut out = Vec::with_capacity(bytes.len());
    for (i, b) in bytes.iter().enumerate() {
        match covered[i] {
            false => out.push(*b),
            true if i == 0 || !covered[i - 1] => out.extend_from_slice(MARK.as_bytes()),
            true => {}
        }
    }
    // A run may end inside a character: what is left of it becomes U+FFFD.
    String::from_utf8_lossy(&out).into_owned()
}

fn window(w: &[u8]) -> u64 {
    u64::from_le_bytes(w.try_into().expect("MIN_RUN is 8 bytes"))
}

/// The window's bit in the bitmap: the top bits of a multiplicative hash.
fn slot(w: u64) -> usize {
    (w.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - BITMAP_BITS.trailing_zeros())) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every piece of `secret` of at least `MIN_RUN` bytes, as text.
    fn pieces(secret: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for start in 0..secret.len() {
            for end in start + MIN_RUN..=secret.len() {
                if let Some(p) = secret.get(start..end) {
                    out.push(p);
                }
            }
        }
        out
    }

    #[test]
    fn an_echoed_header_secret_or_body_leaves_no_piece_of_min_run_bytes() {
        let auth = "Bearer APP-TOKEN-k9Xw2";
        let secret = "whsec_cGVyLW1lc3NhZ2U=";
        let body = r#"{"customer":"ada@example.com","card":"4242424242424242"}"#;
        let sent: [&[u8]; 3] = [auth.as_bytes(), secret.as_bytes(), body.as_bytes()];
        let echo = format!("bad request: auth={auth} secret={secret} body={body}");
        let out = scrub(&echo, &sent);
        assert_eq!(out, "bad request: auth=[sent data] secret=[sent data] body=[sent data]");
        // Any part of them, anywhere, however it is cut.
        for (i, source) in [auth, secret, body].into_iter().enumerate() {
            for piece in pieces(source) {
                let out = scrub(&format!("<<{piece}>>"), &sent);
                assert_eq!(out, format!("<<{MARK}>>"), "source {i}, piece {piece:?}");
            }
        }
    }

    #[test]
    fn runs_shorter_than_min_run_and_text_not_sent_stay() {
        let body = b"{\"order\":1234567,\"status\":\"paid\"}";
        let sent: [&[u8]; 1] = [body];
        // Seven bytes of the body between text that is not from it.
        assert_eq!(scrub("x1234567x", &sent), "x1234567x");
        assert_eq!(scrub("x12345678x", &[b"12345678"]), format!("x{MARK}x"));
        assert_eq!(
            scrub("HTTP 500: upstream timed out", &sent),
            "HTTP 500: upstream timed out"
        );
        // Short texts, nothing sent, empty sources.
        assert_eq!(scrub("", &sent), "");
        assert_eq!(scrub("short", &sent), "short");
        assert_eq!(scrub("nothing was sent here", &[]), "nothing was sent here");
        assert_eq!(scrub("nothing was sent here", &[b"", b"abc"]), "nothing was sent here");
    }

    #[test]
    fn overlapping_and_adjacent_runs_become_one_mark_and_separate_ones_stay_apart() {
        let sent: [&[u8]; 2] = [b"AAAABBBBCCCC", b"DDDDEEEE"];
        // Two sources back to back: one covered run.
        assert_eq!(scrub("AAAABBBBCCCCDDDDEEEE", &sent), MARK);
        // The same run twice, with text between that was not sent.
        assert_eq!(scrub("AAAABBBB and AAAABBBB", &sent), format!("{MARK} and {MARK}"));
        // The text at the very start and end.
        assert_eq!(scrub("BBBBCCCC!", &sent), format!("{MARK}!"));
        assert_eq!(scrub("!BBBBCCCC", &sent), format!("!{MARK}"));
    }

    #[test]
    fn a_run_ending_inside_a_character_leaves_valid_text() {
        // The sent bytes end in the middle of "é" (2 bytes in UTF-8): its second byte is left,
        // and shows as U+FFFD.
        let text = "prefix-é-suffix";
        let out = scrub(text, &[&text.as_bytes()[..8]]);
        assert_eq!(out, format!("{MARK}\u{FFFD}-suffix"));
        // Starting inside it: the first byte is left.
        let out = scrub(text, &[&text.as_bytes()[8..]]);
        assert_eq!(out, format!("prefix-\u{FFFD}{MARK}"));
    }

    #[test]
    fn a_large_body_is_searched_whole() {
        let mut body = vec![b'.'; 4 << 20];
        body[3_000_000..3_000_016].copy_from_slice(b"FAR-IN-THE-BODY!");
        let out = scrub("got FAR-IN-THE-BODY! back", &[&body]);
        assert_eq!(out, format!("got {MARK} back"));
    }
}
