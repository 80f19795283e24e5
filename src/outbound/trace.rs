//! W3C Trace Context (`traceparent`, `tracestate`): the app's trace continues through
//! courier to the receiver. The app's `traceparent` is checked at ingress and kept with the
//! message's headers; every attempt is a child span of it, with a span id of its own, so a
//! tracing backend shows each attempt (and its retries) under the app's request.

use rand::Rng;

/// The header carrying the trace and parent span ids.
pub const TRACEPARENT: &str = "traceparent";
/// The vendor-specific trace state, forwarded unchanged with a valid `traceparent`.
pub const TRACESTATE: &str = "tracestate";

/// A valid `traceparent`: the ids as lowercase hex, and the flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceParent {
    /// 32 lowercase hex digits, not all zero.
    pub trace_id: String,
    /// 16 lowercase hex digits, not all zero: the span the app made the request in.
    pub parent_id: String,
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
}

impl TraceParent {
    /// Parses a `traceparent` value as the W3C spec says: `00-<trace>-<parent>-<flags>`,
    /// lowercase hex, neither id all zeros. A later version is read by its version-00 prefix
    /// (the spec's forward compatibility); version `ff` is invalid. `None` when invalid:
    /// a bad `traceparent` is the app's tracing problem, never a reason to refuse a webhook.
    pub fn parse(value: &str) -> Option<TraceParent> {
        let v = value.trim_matches([' ', '\t']);
        let version = v.get(..2)?;
        if !is_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 is exactly 55 characters; a later one may append "-<more>".
        let exact = version == "00";
        if v.len() < 55 || (exact && v.len() != 55) || (!exact && v.len() > 55 && v.as_bytes()[55] != b'-') {
            return None;
        }
        let b = v.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let (trace_id, parent_id, flags) = (&v[3..35], &v[36..52], &v[53..55]);
        if !is_hex(trace_id) || !is_hex(parent_id) || !is_hex(flags) || all_zero(trace_id) || all_zero(parent_id) {
            return None;
        }
        Some(TraceParent {
            trace_id: trace_id.to_string(),
            parent_id: parent_id.to_string(),
            flags: u8::from_str_radix(flags, 16).ok()?,
        })
    }

    /// The `traceparent` of a child span `span_id` in the same trace: what one attempt sends.
    pub fn child(&self, span_id: &str) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, span_id, self.flags)
    }

    /// The valid `traceparent` among stored headers, if there is exactly one.
    pub fn from_headers(headers: &[(String, Vec<u8>)]) -> Option<TraceParent> {
        let mut values = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(TRACEPARENT));
        let (_, value) = values.next()?;
        if values.next().is_some() {
            return None;
        }
        TraceParent::parse(std::str::from_utf8(value).ok()?)
    }
}

/// Keeps the trace context among the headers to store only when it is valid: an invalid
/// (or repeated) `traceparent` is dropped, and `tracestate` with it, since the spec says a
/// `tracestate` without a valid parent must not be propagated. Returns the kept parent.
pub fn keep_valid(headers: &mut Vec<(String, Vec<u8>)>) -> Option<TraceParent> {
    let parent = TraceParent::from_headers(headers);
    if parent.is_none() {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(TRACEPARENT) && !n.eq_ignore_ascii_case(TRACESTATE));
    }
    parent
}

/// A new span id: 16 lowercase hex digits, never all zeros (the spec's invalid value).
pub fn new_span_id(rng: &mut impl Rng) -> String {
    let id = rng.random_range(1..=u64::MAX);
    format!("{id:016x}")
}

fn is_hex(s: &str) -> bool {
    s.bytes().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn all_zero(s: &str) -> bool {
    s.bytes().all(|c| c == b'0')
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_valid_traceparent_parses() {
        let p = TraceParent::parse(GOOD).unwrap();
        assert_eq!(p.trace_id, "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(p.parent_id, "00f067aa0ba902b7");
        assert_eq!(p.flags, 1);
        assert_eq!(TraceParent::parse(&format!(" {GOOD}\t")), Some(p.clone()));
        // A later version is read by its version-00 prefix.
        let later = TraceParent::parse("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future");
        assert_eq!(later, Some(p.clone()));
        assert_eq!(
            TraceParent::parse("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
            Some(p)
        );
    }

    #[test]
    fn invalid_traceparents_are_refused() {
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0g-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01é",
        ] {
            assert_eq!(TraceParent::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_child_keeps_the_trace_and_flags_with_a_new_span() {
        let p = TraceParent::parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00").unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (a, b) = (new_span_id(&mut rng), new_span_id(&mut rng));
        assert_ne!(a, b);
        for span in [&a, &b] {
            assert_eq!(span.len(), 16);
            let child = TraceParent::parse(&p.child(span)).unwrap();
            assert_eq!(child.trace_id, p.trace_id);
            assert_eq!(&child.parent_id, span);
            assert_eq!(child.flags, 0);
        }
    }

    #[test]
    fn only_a_single_valid_traceparent_is_kept() {
        let h = |pairs: &[(&str, &str)]| -> Vec<(String, Vec<u8>)> {
            pairs
                .iter()
                .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        let mut good = h(&[("traceparent", GOOD), ("tracestate", "k=v"), ("x-a", "1")]);
        assert!(keep_valid(&mut good).is_some());
        assert_eq!(good.len(), 3);
        for mut bad in [
            h(&[("traceparent", "00-zz"), ("tracestate", "k=v"), ("x-a", "1")]),
            h(&[
                ("traceparent", GOOD),
                ("traceparent", GOOD),
                ("tracestate", "k=v"),
                ("x-a", "1"),
            ]),
            h(&[("tracestate", "k=v"), ("x-a", "1")]),
        ] {
            assert!(keep_valid(&mut bad).is_none());
            assert_eq!(bad, h(&[("x-a", "1")]));
        }
    }
}
