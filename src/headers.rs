//! Request headers at the two edges of courier: the `Courier-*` control headers read at
//! ingress (CONTRACT §2), the filter that decides which of the app's headers are stored and
//! forwarded, and the final filter applied on every attempt before fresh signature headers
//! are added (CONTRACT §3).
//!
//! Control headers are strict on purpose: a misspelt `Courier-Max-Atempts` that silently
//! did nothing would be found only when a message is retried for three days, so an unknown
//! or repeated control header is a 400. Values of `Courier-Signing-Secret` and
//! `Courier-Token` never appear in errors or `Debug` output.

use std::borrow::Cow;
use std::time::Duration;

use http::header::{HeaderMap, HeaderValue};

use crate::config::units::parse_duration;
use crate::model::SignatureScheme;
use crate::signing::Secret;

/// `Courier-Target`: the target URL (form 1).
pub const COURIER_TARGET: &str = "courier-target";
/// `Courier-Endpoint`: the endpoint key for rate limits, pausing and stats.
pub const COURIER_ENDPOINT: &str = "courier-endpoint";
/// `Courier-Signing-Secret`: a per-message secret.
pub const COURIER_SIGNING_SECRET: &str = "courier-signing-secret";
/// `Courier-Signing-Key`: the name of a configured secret.
pub const COURIER_SIGNING_KEY: &str = "courier-signing-key";
/// `Courier-Signature-Scheme`: `standard`, `stripe`, `github` or `none`.
pub const COURIER_SIGNATURE_SCHEME: &str = "courier-signature-scheme";
/// `Courier-Max-Attempts`: per-message override of `max_attempts`.
pub const COURIER_MAX_ATTEMPTS: &str = "courier-max-attempts";
/// `Courier-Give-Up-After`: per-message override of `give_up_after`.
pub const COURIER_GIVE_UP_AFTER: &str = "courier-give-up-after";
/// `Courier-Token`: the ingress token.
pub const COURIER_TOKEN: &str = "courier-token";

/// Largest accepted `Courier-Max-Attempts`.
pub const MAX_ATTEMPTS_LIMIT: u32 = 1000;
/// Longest accepted control header value, in bytes.
pub const MAX_CONTROL_VALUE_LEN: usize = 8192;

/// Headers courier itself puts on every attempt; a stored copy from the app is replaced.
const STANDARD_WEBHOOK_HEADERS: [&str; 3] = ["webhook-id", "webhook-timestamp", "webhook-signature"];

/// Headers that describe one connection, not the message (RFC 9110 §7.6.1), plus the ones
/// courier recomputes per attempt (`host`, `content-length`) or must not replay (`expect`).
const NEVER_FORWARDED: [&str; 11] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "http2-settings",
    "host",
    "content-length",
    "expect",
];

/// The control headers of one ingress request, each `None` when absent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlHeaders {
    /// `Courier-Target`, unparsed (see `target::resolve_target`).
    pub target: Option<String>,
    /// `Courier-Endpoint`.
    pub endpoint: Option<String>,
    /// `Courier-Signing-Secret` (secret: redacted in `Debug`).
    pub signing_secret: Option<Secret>,
    /// `Courier-Signing-Key`.
    pub signing_key: Option<String>,
    /// `Courier-Signature-Scheme`.
    pub scheme: Option<SignatureScheme>,
    /// `Courier-Max-Attempts`, in `1..=1000`.
    pub max_attempts: Option<u32>,
    /// `Courier-Give-Up-After`, greater than zero.
    pub give_up_after: Option<Duration>,
    /// `Courier-Token` (secret: redacted in `Debug`).
    pub token: Option<Secret>,
}

/// A control header that cannot be accepted: always the 400 code `invalid_control_header`;
/// the message names the header and the problem (an unknown `Courier-*` name, likely a
/// typo; one sent twice; a value that is not visible ASCII or means nothing for it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct HeaderError(String);

const KNOWN_LIST: &str = "Courier-Target, Courier-Endpoint, Courier-Signing-Secret, Courier-Signing-Key, \
                          Courier-Signature-Scheme, Courier-Max-Attempts, Courier-Give-Up-After, Courier-Token";

impl HeaderError {
    /// The machine-readable code of the ingress error answer.
    pub fn code(&self) -> &'static str {
        "invalid_control_header"
    }
}

/// Reads the `Courier-*` control headers. Names are matched case-insensitively (HTTP
/// header names are); each may appear at most once; unknown `Courier-*` names are errors.
pub fn parse_control_headers(headers: &HeaderMap) -> Result<ControlHeaders, HeaderError> {
    let mut out = ControlHeaders::default();
    for name in headers.keys() {
        let lower = name.as_str();
        if !is_courier_header(lower) {
            continue;
        }
        let shown = display_name(lower);
        if !KNOWN.contains(&lower) {
            return Err(unknown(&shown));
        }
        let mut values = headers.get_all(name).iter();
        let (Some(raw), None) = (values.next(), values.next()) else {
            return Err(HeaderError(format!("control header {shown} is sent more than once")));
        };
        let value = visible_ascii(raw).ok_or_else(|| {
            HeaderError(format!(
                "control header {shown} must be a non-empty value of visible ASCII characters (at most 8192)"
            ))
        })?;
        let bad = |problem: String| HeaderError(format!("control header {shown}: {problem}"));
        match lower {
            COURIER_TARGET => out.target = Some(value.to_string()),
            COURIER_ENDPOINT => out.endpoint = Some(value.to_string()),
            COURIER_SIGNING_SECRET => out.signing_secret = Some(Secret::new(value.to_string())),
            COURIER_SIGNING_KEY => out.signing_key = Some(value.to_string()),
            COURIER_TOKEN => out.token = Some(Secret::new(value.to_string())),
            COURIER_SIGNATURE_SCHEME => {
                out.scheme = Some(value.parse::<SignatureScheme>().map_err(|e| bad(e.to_string()))?);
            }
            COURIER_MAX_ATTEMPTS => {
                let n = value
                    .bytes()
                    .all(|b| b.is_ascii_digit())
                    .then(|| value.parse::<u32>().ok())
                    .flatten()
                    .filter(|n| (1..=MAX_ATTEMPTS_LIMIT).contains(n))
                    .ok_or_else(|| {
                        bad(format!(
                            "expected a whole number from 1 to {MAX_ATTEMPTS_LIMIT}, got {}",
                            quoted(value)
                        ))
                    })?;
                out.max_attempts = Some(n);
            }
            COURIER_GIVE_UP_AFTER => {
                let d = parse_duration(value).map_err(|e| bad(e.to_string()))?;
                if d.is_zero() {
                    return Err(bad("must be longer than zero".to_string()));
                }
                out.give_up_after = Some(d);
            }
            _ => return Err(unknown(&shown)),
        }
    }
    Ok(out)
}

fn unknown(shown: &str) -> HeaderError {
    HeaderError(format!(
        "unknown control header {shown}: courier reads only {KNOWN_LIST}"
    ))
}

/// Every control header courier reads.
pub(crate) const KNOWN: [&str; 8] = [
    COURIER_TARGET,
    COURIER_ENDPOINT,
    COURIER_SIGNING_SECRET,
    COURIER_SIGNING_KEY,
    COURIER_SIGNATURE_SCHEME,
    COURIER_MAX_ATTEMPTS,
    COURIER_GIVE_UP_AFTER,
    COURIER_TOKEN,
];

/// The request headers to store with a message and send on every attempt: lowercase names,
/// in the order the map holds them, repeated headers kept. Dropped: hop-by-hop headers
/// (including any named in `Connection`), `host`, `content-length`, `expect`, `courier-*`
/// and `proxy-*`. The app's `authorization` is meant for the receiver and always kept.
pub fn forwardable_headers(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    let connection_named: Vec<String> = headers
        .get_all(http::header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|token| token.trim().to_ascii_lowercase())
        .filter(|token| !token.is_empty() && token != "authorization")
        .collect();
    headers
        .iter()
        .filter(|(name, _)| {
            let name = name.as_str();
            !never_forwarded(name) && !connection_named.iter().any(|c| c == name)
        })
        .map(|(name, value)| (name.as_str().to_string(), value.as_bytes().to_vec()))
        .collect()
}

/// The stored headers as sent on one attempt: without `webhook-id`, `webhook-timestamp`,
/// `webhook-signature` (courier sets fresh ones) and without `drop_also` (the chosen scheme's
/// signature headers), compared case-insensitively. Headers that are never forwarded are
/// dropped again here, so a record written by an older or buggy writer cannot leak them.
pub fn outbound_headers(stored: &[(String, Vec<u8>)], drop_also: &[&str]) -> Vec<(Cow<'static, str>, Vec<u8>)> {
    stored
        .iter()
        .filter(|(name, _)| {
            // Stored names are lowercase (courier stores them from `http`'s): no copy then.
            let lower = lowercased(name);
            !never_forwarded(&lower)
                && !STANDARD_WEBHOOK_HEADERS.contains(&&*lower)
                && !drop_also.iter().any(|d| d.eq_ignore_ascii_case(&lower))
        })
        .map(|(name, value)| (Cow::Owned(name.clone()), value.clone()))
        .collect()
}

/// `text` in ASCII lowercase, borrowed when it already is (most header names and hosts on
/// the ingest and delivery paths), copied only when a letter must change.
pub fn lowercased(text: &str) -> Cow<'_, str> {
    match text.bytes().any(|b| b.is_ascii_uppercase()) {
        true => Cow::Owned(text.to_ascii_lowercase()),
        false => Cow::Borrowed(text),
    }
}

/// The ingress token of `Proxy-Authorization`: `Bearer <token>`, or `Basic` whose password
/// is the token (what a client sends for a proxy URL `http://courier:<token>@host`, the
/// only form most `HTTPS_PROXY` clients can send); the user is ignored. The scheme name is
/// case-insensitive; the first value that carries a token wins.
pub fn proxy_token(headers: &HeaderMap) -> Option<String> {
    use base64::Engine as _;
    headers
        .get_all(http::header::PROXY_AUTHORIZATION)
        .iter()
        .find_map(|value| {
            let text = visible_ascii_with_spaces(value)?;
            let (scheme, rest) = text.split_once(' ')?;
            let token = rest.trim_start_matches(' ');
            if token.is_empty() || token.contains(' ') {
                return None;
            }
            if scheme.eq_ignore_ascii_case("bearer") {
                return Some(token.to_string());
            }
            if !scheme.eq_ignore_ascii_case("basic") {
                return None;
            }
            let decoded = base64::engine::general_purpose::STANDARD.decode(token).ok()?;
            let pair = String::from_utf8(decoded).ok()?;
            let (_, password) = pair.split_once(':')?;
            (!password.is_empty()).then(|| password.to_string())
        })
}

fn is_courier_header(lower: &str) -> bool {
    lower.starts_with("courier-")
}

fn never_forwarded(lower: &str) -> bool {
    NEVER_FORWARDED.contains(&lower) || is_courier_header(lower) || lower.starts_with("proxy-")
}

/// The value without surrounding spaces and tabs, if the rest is non-empty visible ASCII.
fn visible_ascii(value: &HeaderValue) -> Option<&str> {
    let text = visible_ascii_with_spaces(value)?;
    (!text.is_empty() && text.len() <= MAX_CONTROL_VALUE_LEN && text.bytes().all(|b| b.is_ascii_graphic()))
        .then_some(text)
}

fn visible_ascii_with_spaces(value: &HeaderValue) -> Option<&str> {
    let text = std::str::from_utf8(value.as_bytes()).ok()?;
    let text = text.trim_matches(|c| c == ' ' || c == '\t');
    text.bytes().all(|b| b == b' ' || b.is_ascii_graphic()).then_some(text)
}

/// `courier-max-attempts` → `Courier-Max-Attempts`, as the contract writes header names.
fn display_name(lower: &str) -> String {
    let mut out = String::with_capacity(lower.len().min(64));
    let mut upper_next = true;
    for c in lower.chars().take(64) {
        out.push(if upper_next { c.to_ascii_uppercase() } else { c });
        upper_next = c == '-';
    }
    out
}

fn quoted(value: &str) -> String {
    let shown: String = value.chars().take(64).collect();
    format!("{shown:?}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

    fn header_name(s: &str) -> HeaderName {
        HeaderName::from_bytes(s.as_bytes()).unwrap()
    }

    type Check = fn(&ControlHeaders) -> bool;
    type Pairs<'a> = &'a [(&'a str, &'a [u8])];

    fn map(pairs: &[(&str, &[u8])]) -> HeaderMap {
        let mut m = HeaderMap::new();
        for (name, value) in pairs {
            m.append(header_name(name), HeaderValue::from_bytes(value).unwrap());
        }
        m
    }

    #[test]
    fn constants_are_lowercase_header_names() {
        for name in KNOWN {
            assert_eq!(header_name(name).as_str(), name);
        }
    }

    #[test]
    fn every_control_header_is_read() {
        let h = map(&[
            ("Courier-Target", b"https://r.example/h?x=1"),
            ("COURIER-ENDPOINT", b"billing-main"),
            ("courier-signing-secret", b"whsec_c2VjcmV0"),
            ("Courier-Signing-Key", b"billing"),
            ("Courier-Signature-Scheme", b"Stripe"),
            ("Courier-Max-Attempts", b"7"),
            ("Courier-Give-Up-After", b"1h30m"),
            ("Courier-Token", b"t0k3n"),
            ("Content-Type", b"application/json"),
            ("Authorization", b"Bearer app"),
        ]);
        let c = parse_control_headers(&h).unwrap();
        assert_eq!(
            c,
            ControlHeaders {
                target: Some("https://r.example/h?x=1".into()),
                endpoint: Some("billing-main".into()),
                signing_secret: Some(Secret::new("whsec_c2VjcmV0".into())),
                signing_key: Some("billing".into()),
                scheme: Some(SignatureScheme::Stripe),
                max_attempts: Some(7),
                give_up_after: Some(Duration::from_secs(5400)),
                token: Some(Secret::new("t0k3n".into())),
            }
        );
        assert_eq!(
            parse_control_headers(&HeaderMap::new()).unwrap(),
            ControlHeaders::default()
        );
    }

    #[test]
    fn good_values_parse() {
        let cases: &[(&str, &[u8], Check)] = &[
            ("courier-max-attempts", b"1", |c| c.max_attempts == Some(1)),
            ("courier-max-attempts", b"1000", |c| c.max_attempts == Some(1000)),
            ("courier-max-attempts", b"007", |c| c.max_attempts == Some(7)),
            ("courier-max-attempts", b" 3 ", |c| c.max_attempts == Some(3)),
            ("courier-give-up-after", b"250ms", |c| {
                c.give_up_after == Some(Duration::from_millis(250))
            }),
            ("courier-give-up-after", b"3d", |c| {
                c.give_up_after == Some(Duration::from_secs(259_200))
            }),
            ("courier-signature-scheme", b"none", |c| {
                c.scheme == Some(SignatureScheme::None)
            }),
            ("courier-signature-scheme", b"github", |c| {
                c.scheme == Some(SignatureScheme::Github)
            }),
            ("courier-signature-scheme", b"STANDARD", |c| {
                c.scheme == Some(SignatureScheme::Standard)
            }),
            ("courier-endpoint", b"https://r.example/h", |c| {
                c.endpoint.as_deref() == Some("https://r.example/h")
            }),
        ];
        for (name, value, check) in cases {
            let c = parse_control_headers(&map(&[(name, value)])).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(check(&c), "{name}: {:?} gave {c:?}", String::from_utf8_lossy(value));
        }
    }

    #[test]
    fn bad_control_headers_are_refused_naming_the_header() {
        let cases: &[(Pairs, &str)] = &[
            (&[("courier-max-atempts", b"3")], "Courier-Max-Atempts"),
            (&[("courier-delivery-id", b"x")], "Courier-Delivery-Id"),
            (&[("courier-", b"x")], "Courier-"),
            (&[("courier-max-attempts", b"0")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"1001")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"-1")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"+3")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"3.0")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"three")], "Courier-Max-Attempts"),
            (&[("courier-max-attempts", b"99999999999")], "Courier-Max-Attempts"),
            (&[("courier-give-up-after", b"0")], "Courier-Give-Up-After"),
            (&[("courier-give-up-after", b"0s")], "Courier-Give-Up-After"),
            (&[("courier-give-up-after", b"10")], "Courier-Give-Up-After"),
            (&[("courier-give-up-after", b"1w")], "Courier-Give-Up-After"),
            (&[("courier-signature-scheme", b"hmac")], "Courier-Signature-Scheme"),
            (&[("courier-target", b"")], "Courier-Target"),
            (&[("courier-target", b"   ")], "Courier-Target"),
            (&[("courier-endpoint", b"caf\xc3\xa9")], "Courier-Endpoint"),
            (&[("courier-endpoint", b"a b")], "Courier-Endpoint"),
            (&[("courier-endpoint", b"a\tb")], "Courier-Endpoint"),
            (&[("courier-signing-key", b"\xff")], "Courier-Signing-Key"),
            (&[("courier-token", b"a"), ("courier-token", b"b")], "Courier-Token"),
            (
                &[
                    ("courier-target", b"https://a.example"),
                    ("Courier-Target", b"https://b.example"),
                ],
                "Courier-Target",
            ),
        ];
        for (pairs, shown) in cases {
            let err = parse_control_headers(&map(pairs)).expect_err(&format!("{pairs:?} should fail"));
            assert_eq!(err.code(), "invalid_control_header");
            assert!(err.to_string().contains(shown), "{pairs:?}: {err}");
        }
        let long = vec![b'a'; MAX_CONTROL_VALUE_LEN + 1];
        assert!(parse_control_headers(&map(&[("courier-endpoint", &long)])).is_err());
    }

    #[test]
    fn secrets_never_reach_errors_or_debug() {
        for name in ["courier-signing-secret", "courier-token"] {
            let err = parse_control_headers(&map(&[(name, b"hunter2 x"), ("x", b"y")])).unwrap_err();
            assert!(!err.to_string().contains("hunter2"), "{err}");
            let err = parse_control_headers(&map(&[(name, b"hunter2"), (name, b"hunter3")])).unwrap_err();
            assert!(!err.to_string().contains("hunter"), "{err}");
        }
        let c = parse_control_headers(&map(&[
            ("courier-signing-secret", b"hunter2"),
            ("courier-token", b"hunter3"),
        ]))
        .unwrap();
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("hunter") && dbg.contains("Secret(***)"), "{dbg}");
    }

    #[test]
    fn forwardable_headers_drop_what_must_not_be_replayed() {
        let h = map(&[
            ("content-type", b"application/json"),
            ("authorization", b"Bearer for-the-receiver"),
            ("connection", b"keep-alive, X-Hop, Authorization"),
            ("keep-alive", b"timeout=5"),
            ("x-hop", b"1"),
            ("proxy-connection", b"keep-alive"),
            ("te", b"trailers"),
            ("trailer", b"x-checksum"),
            ("transfer-encoding", b"chunked"),
            ("upgrade", b"h2c"),
            ("http2-settings", b"AAA"),
            ("host", b"127.0.0.1:8787"),
            ("content-length", b"12"),
            ("expect", b"100-continue"),
            ("courier-target", b"https://r.example/"),
            ("courier-token", b"secret"),
            ("proxy-authorization", b"Bearer ingress"),
            ("proxy-authenticate", b"Basic"),
            ("x-request-id", b"abc"),
            ("webhook-id", b"evt_1"),
            ("Accept", b"*/*"),
            ("x-multi", b"1"),
            ("x-multi", b"2"),
            ("x-binary", b"\xfe\xff"),
        ]);
        let got = forwardable_headers(&h);
        let want: Vec<(String, Vec<u8>)> = [
            ("content-type", &b"application/json"[..]),
            ("authorization", b"Bearer for-the-receiver"),
            ("x-request-id", b"abc"),
            ("webhook-id", b"evt_1"),
            ("accept", b"*/*"),
            ("x-multi", b"1"),
            ("x-multi", b"2"),
            ("x-binary", b"\xfe\xff"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_vec()))
        .collect();
        assert_eq!(got, want);
        assert!(forwardable_headers(&HeaderMap::new()).is_empty());
    }

    #[test]
    fn connection_tokens_are_honoured_across_repeated_headers() {
        let h = map(&[
            ("connection", b"close"),
            ("connection", b" X-A ,,x-b"),
            ("x-a", b"1"),
            ("x-b", b"2"),
            ("x-c", b"3"),
        ]);
        assert_eq!(forwardable_headers(&h), vec![("x-c".to_string(), b"3".to_vec())]);
    }

    #[test]
    fn outbound_headers_drop_signatures_case_insensitively() {
        let stored: Vec<(String, Vec<u8>)> = [
            ("content-type", "application/json"),
            ("webhook-id", "evt_1"),
            ("Webhook-Timestamp", "1"),
            ("webhook-signature", "v1,old"),
            ("stripe-signature", "t=1,v1=old"),
            ("X-Hub-Signature-256", "sha256=old"),
            ("authorization", "Bearer x"),
            ("host", "stale.example"),
            ("courier-token", "leak"),
            ("proxy-authorization", "leak"),
            ("x-a", "1"),
            ("x-a", "2"),
        ]
        .iter()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
        let names =
            |v: Vec<(Cow<'static, str>, Vec<u8>)>| v.into_iter().map(|(n, _)| n.into_owned()).collect::<Vec<_>>();
        let cases: &[(&[&str], &[&str])] = &[
            (
                &[],
                &[
                    "content-type",
                    "stripe-signature",
                    "X-Hub-Signature-256",
                    "authorization",
                    "x-a",
                    "x-a",
                ],
            ),
            (
                &["Stripe-Signature"],
                &["content-type", "X-Hub-Signature-256", "authorization", "x-a", "x-a"],
            ),
            (
                &["x-hub-signature-256"],
                &["content-type", "stripe-signature", "authorization", "x-a", "x-a"],
            ),
            (
                &["X-A", "authorization"],
                &["content-type", "stripe-signature", "X-Hub-Signature-256"],
            ),
        ];
        for (drop, want) in cases {
            assert_eq!(names(outbound_headers(&stored, drop)), *want, "{drop:?}");
        }
        assert!(outbound_headers(&[], &["x"]).is_empty());
    }

    #[test]
    fn proxy_token_reads_bearer_tokens_and_basic_passwords() {
        let cases: &[(&[&[u8]], Option<&str>)] = &[
            (&[b"Bearer abc"], Some("abc")),
            (&[b"bearer abc"], Some("abc")),
            (&[b"BEARER   abc  "], Some("abc")),
            // base64("user:pw"), base64("courier:t:k"), base64("nopassword:"), base64("x")
            (&[b"Basic dXNlcjpwdw=="], Some("pw")),
            (&[b"basic Y291cmllcjp0Oms="], Some("t:k")),
            (&[b"Basic bm9wYXNzd29yZDo="], None),
            (&[b"Basic eA=="], None),
            (&[b"Basic !!!"], None),
            (&[b"Digest abc"], None),
            (&[b"Bearer"], None),
            (&[b"Bearer "], None),
            (&[b"Bearer a b"], None),
            (&[b"Bearerabc"], None),
            (&[b"Bearer \xff"], None),
            (&[b"Basic x", b"Bearer second"], Some("second")),
            (&[], None),
        ];
        for (values, want) in cases {
            let pairs: Vec<(&str, &[u8])> = values.iter().map(|v| ("proxy-authorization", *v)).collect();
            assert_eq!(proxy_token(&map(&pairs)).as_deref(), *want, "{values:?}");
        }
        assert_eq!(proxy_token(&map(&[("authorization", b"Bearer app")])), None);
    }
}
