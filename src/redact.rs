//! What courier shows of text it did not write: URLs with credentials in them, and text
//! from receivers or callers that could disguise itself on an operator's terminal.
//!
//! - [`url_for_log`]: a URL as a log line may carry it: no userinfo, every query value
//!   masked (`?token=***`), because query strings are where credentials end up.
//! - [`alert_key`]: what stands for `alert_url` wherever courier would show it (its
//!   endpoint key, the target of its messages): the origin only. Chat-style alert URLs carry
//!   their credential in the path.
//! - [`clean`]: text kept from a response (`last_error`) or an error: control characters,
//!   Unicode bidi controls (which reorder what a terminal shows: "Trojan Source") and
//!   zero-width characters (which hide text) are dropped.
//! - [`escape`]: what the CLI prints: the same characters written as `\u{…}` escapes, so
//!   an operator sees they are there.
//!
//! Pure: no I/O.

use url::Url;

/// Whether `c` is a character that changes how the text around it is shown without being
/// visible itself: bidi embeddings, overrides, isolates and marks, and zero-width ones.
pub fn is_invisible_control(c: char) -> bool {
    matches!(c,
        '\u{061C}'              // Arabic letter mark
        | '\u{200B}'..='\u{200F}' // zero-width space/non-joiner/joiner, LRM, RLM
        | '\u{202A}'..='\u{202E}' // LRE, RLE, PDF, LRO, RLO
        | '\u{2060}'..='\u{2064}' // word joiner, invisible operators
        | '\u{2066}'..='\u{2069}' // LRI, RLI, FSI, PDI
        | '\u{FEFF}'              // zero-width no-break space (BOM)
        | '\u{180E}'              // Mongolian vowel separator
    )
}

fn unsafe_char(c: char) -> bool {
    c.is_control() || is_invisible_control(c)
}

/// `text` without control, bidi and zero-width characters.
pub fn clean(text: &str) -> String {
    text.chars().filter(|c| !unsafe_char(*c)).collect()
}

/// `text` with control, bidi and zero-width characters written as `\u{XXXX}`.
pub fn escape(text: &str) -> String {
    escape_as(text, unsafe_char, |c| format!("\\u{{{c:04X}}}"))
}

/// Escapes bidi and zero-width characters in JSON text as `\uXXXX` (still valid JSON;
/// serde_json already escapes the ASCII control characters).
pub fn escape_json(text: &str) -> String {
    escape_as(text, is_invisible_control, |c| format!("\\u{c:04x}"))
}

/// `text` with every character `hidden` picks written as `written` says.
fn escape_as(text: &str, hidden: fn(char) -> bool, written: fn(u32) -> String) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match hidden(c) {
            true => out.push_str(&written(c as u32)),
            false => out.push(c),
        }
    }
    out
}

/// A URL as a log line may show it: without userinfo, every query value masked.
/// Text that is not a URL keeps what precedes its `?` and has the rest masked the same way.
pub fn url_for_log(text: &str) -> String {
    let masked_query = |q: &str| -> String {
        q.split('&')
            .map(|pair| match pair.split_once('=') {
                Some((name, _)) => format!("{name}=***"),
                None if pair.is_empty() => String::new(),
                None => format!("{pair}=***"),
            })
            .collect::<Vec<_>>()
            .join("&")
    };
    match Url::parse(text) {
        Ok(mut url) if url.has_host() => {
            let _ = url.set_username("");
            let _ = url.set_password(None);
            let query = url.query().map(masked_query);
            url.set_query(None);
            url.set_fragment(None);
            let mut out = url.to_string();
            if let Some(q) = query {
                out.push('?');
                out.push_str(&q);
            }
            clean(&out)
        }
        _ => match text.split_once('?') {
            Some((head, q)) => clean(&format!("{head}?{}", masked_query(q))),
            None => clean(text),
        },
    }
}

/// What stands for `alert_url` wherever courier shows it: its origin and a marker.
pub fn alert_key(url: &Url) -> String {
    format!("{}/[alert_url]", url.origin().ascii_serialization())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_never_show_userinfo_or_query_values() {
        let cases = [
            (
                "https://user:pw@hooks.example/x?token=s3cr3t&a=1",
                "https://hooks.example/x?token=***&a=***",
            ),
            ("https://hooks.example/x", "https://hooks.example/x"),
            ("https://hooks.example/x?flag", "https://hooks.example/x?flag=***"),
            ("tenant-7?key=abc", "tenant-7?key=***"),
            ("plain-key", "plain-key"),
            ("https://h.example/a#frag", "https://h.example/a"),
        ];
        for (input, want) in cases {
            assert_eq!(url_for_log(input), want, "{input}");
        }
    }

    #[test]
    fn alert_urls_show_their_origin_only() {
        let url = Url::parse("https://hooks.slack.example/services/T000/B000/XXXX?x=1").unwrap();
        let key = alert_key(&url);
        assert_eq!(key, "https://hooks.slack.example/[alert_url]");
        assert!(!key.contains("T000"));
    }

    #[test]
    fn clean_drops_controls_bidi_and_zero_width() {
        let hostile = "ok\u{202E}gnp.exe\u{200B}\u{2066}x\u{2069}\x1b[31mred\r\n\u{FEFF}";
        assert_eq!(clean(hostile), "okgnp.exex[31mred");
        assert_eq!(clean("plain ascii, ünïcödé"), "plain ascii, ünïcödé");
    }

    #[test]
    fn escape_shows_what_was_hidden() {
        assert_eq!(escape("a\u{202E}b\x1bc"), "a\\u{202E}b\\u{001B}c");
        assert_eq!(escape("fine"), "fine");
        let json = serde_json::json!({ "e": "a\u{202E}b\u{7}" }).to_string();
        let escaped = escape_json(&json);
        assert_eq!(escaped, r#"{"e":"a\u202eb\u0007"}"#);
        let back: serde_json::Value = serde_json::from_str(&escaped).unwrap();
        assert_eq!(back["e"], "a\u{202E}b\u{7}");
    }
}
