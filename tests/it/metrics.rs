//! `/metrics` against a known traffic pattern, read with a small strict parser of the
//! Prometheus text format (0.0.4): HELP and TYPE before a family's samples, each once,
//! well-formed labels, no duplicate series, histograms cumulative and ending in `+Inf`
//! equal to `_count`.

use std::collections::{BTreeMap, HashMap};

use crate::support::*;

/// One sample: metric name, labels, value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name (for a histogram: `<family>_bucket`, `_sum` or `_count`).
    pub name: String,
    /// Labels, sorted by name.
    pub labels: BTreeMap<String, String>,
    /// The value.
    pub value: f64,
}

/// A metric family.
#[derive(Debug, Clone, Default)]
pub struct Family {
    /// HELP text.
    pub help: String,
    /// TYPE: counter, gauge, histogram, summary or untyped.
    pub kind: String,
    /// Its samples, in order.
    pub samples: Vec<Sample>,
}

/// A parsed exposition.
#[derive(Debug, Default)]
pub struct Exposition {
    /// Families by name.
    pub families: BTreeMap<String, Family>,
}

fn valid_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn valid_label_name(s: &str) -> bool {
    valid_name(s) && !s.contains(':') && !s.starts_with("__")
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s.parse::<f64>().map_err(|e| format!("bad value {s:?}: {e}")),
    }
}

/// Parses `{a="x",b="y"}` at the start of `s`; returns the labels and the rest.
fn parse_labels(s: &str) -> Result<(BTreeMap<String, String>, &str), String> {
    let mut labels = BTreeMap::new();
    let mut rest = s.strip_prefix('{').ok_or("labels must start with {")?;
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("label without =")?;
        let name = &rest[..eq];
        if !valid_label_name(name) {
            return Err(format!("bad label name {name:?}"));
        }
        rest = rest[eq + 1..].strip_prefix('"').ok_or("label value must be quoted")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    other => return Err(format!("bad escape {other:?}")),
                },
                Some((_, '\n')) => return Err("newline in a label value".into()),
                Some((_, c)) => value.push(c),
                None => return Err("unterminated label value".into()),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err("labels must be separated by commas".into());
        }
    }
}

/// The family a sample name belongs to, given the declared families.
fn family_of<'a>(name: &'a str, families: &BTreeMap<String, Family>) -> Option<&'a str> {
    if families.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if families
                .get(base)
                .is_some_and(|f| f.kind == "histogram" || f.kind == "summary")
            {
                return Some(base);
            }
        }
    }
    None
}

/// Parses strictly; any deviation from the format is an error naming the line.
pub fn parse(text: &str) -> Result<Exposition, String> {
    if !text.ends_with('\n') {
        return Err("the exposition must end with a newline".into());
    }
    let mut exp = Exposition::default();
    let mut series = std::collections::HashSet::new();
    let mut current: Option<String> = None;
    for (n, line) in text.lines().enumerate() {
        let err = |m: String| format!("line {}: {m}: {line:?}", n + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name, tail) = (parts.next().unwrap(), parts.next(), parts.next());
            let Some(name) = name else { continue };
            match kw {
                "HELP" => {
                    if !valid_name(name) {
                        return Err(err("bad metric name".into()));
                    }
                    let f = exp.families.entry(name.to_string()).or_default();
                    if !f.help.is_empty() {
                        return Err(err("HELP twice".into()));
                    }
                    if !f.samples.is_empty() {
                        return Err(err("HELP after samples".into()));
                    }
                    f.help = tail.unwrap_or("").to_string();
                    if f.help.is_empty() {
                        return Err(err("empty HELP".into()));
                    }
                    current = Some(name.to_string());
                }
                "TYPE" => {
                    let kind = tail.ok_or_else(|| err("TYPE without a type".into()))?;
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind) {
                        return Err(err(format!("unknown type {kind}")));
                    }
                    let f = exp.families.entry(name.to_string()).or_default();
                    if !f.kind.is_empty() {
                        return Err(err("TYPE twice".into()));
                    }
                    if !f.samples.is_empty() {
                        return Err(err("TYPE after samples".into()));
                    }
                    f.kind = kind.to_string();
                    current = Some(name.to_string());
                }
                _ => {}
            }
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| err("no value".into()))?;
        let name = &line[..name_end];
        if !valid_name(name) {
            return Err(err("bad sample name".into()));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(err)?
        } else {
            (BTreeMap::new(), &line[name_end..])
        };
        let rest = rest
            .strip_prefix(' ')
            .ok_or_else(|| err("no space before the value".into()))?;
        let mut fields = rest.split(' ');
        let value = parse_value(fields.next().unwrap_or("")).map_err(err)?;
        if let Some(ts) = fields.next() {
            ts.parse::<i64>().map_err(|e| err(format!("bad timestamp: {e}")))?;
        }
        if fields.next().is_some() {
            return Err(err("trailing fields".into()));
        }
        let family = family_of(name, &exp.families)
            .ok_or_else(|| err("sample without HELP/TYPE".into()))?
            .to_string();
        if current.as_deref() != Some(family.as_str()) {
            return Err(err(format!("sample of {family} outside its family's block")));
        }
        let f = exp.families.get_mut(&family).unwrap();
        if f.kind.is_empty() || f.help.is_empty() {
            return Err(err("sample before both HELP and TYPE".into()));
        }
        if f.kind == "counter" && (value.is_nan() || value < 0.0) {
            return Err(err("negative or NaN counter".into()));
        }
        if !series.insert(format!("{name}{labels:?}")) {
            return Err(err("duplicate series".into()));
        }
        f.samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for (name, f) in &exp.families {
        if f.kind.is_empty() || f.help.is_empty() {
            return Err(format!("{name}: HELP and TYPE are both required"));
        }
        if f.kind == "histogram" {
            check_histogram(name, f)?;
        }
    }
    Ok(exp)
}

/// Buckets sorted by `le`, cumulative, the last one `+Inf` and equal to `_count`; `_sum` present.
fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
    let mut by_labels: HashMap<BTreeMap<String, String>, Vec<(f64, f64)>> = HashMap::new();
    let mut counts = HashMap::new();
    let mut sums = HashMap::new();
    for s in &f.samples {
        let mut base = s.labels.clone();
        if s.name == format!("{name}_bucket") {
            let le = base
                .remove("le")
                .ok_or_else(|| format!("{name}: a bucket without le"))?;
            by_labels.entry(base).or_default().push((parse_value(&le)?, s.value));
        } else if s.name == format!("{name}_count") {
            counts.insert(base, s.value);
        } else if s.name == format!("{name}_sum") {
            sums.insert(base, s.value);
        } else {
            return Err(format!("{name}: unexpected sample {}", s.name));
        }
    }
    if by_labels.is_empty() {
        return Err(format!("{name}: no buckets"));
    }
    for (labels, buckets) in &by_labels {
        for w in buckets.windows(2) {
            if w[1].0 <= w[0].0 {
                return Err(format!("{name}: le not increasing: {} then {}", w[0].0, w[1].0));
            }
            if w[1].1 < w[0].1 {
                return Err(format!("{name}: buckets not cumulative at le={}", w[1].0));
            }
        }
        let last = buckets.last().unwrap();
        if last.0 != f64::INFINITY {
            return Err(format!("{name}: the last bucket is not +Inf"));
        }
        match counts.get(labels) {
            Some(c) if *c == last.1 => {}
            other => return Err(format!("{name}: +Inf bucket {} but _count {other:?}", last.1)),
        }
        if !sums.contains_key(labels) {
            return Err(format!("{name}: no _sum"));
        }
    }
    Ok(())
}

impl Exposition {
    /// The value of the sample `name` with exactly these labels.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let want: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.families
            .values()
            .flat_map(|f| &f.samples)
            .find(|s| s.name == name && s.labels == want)
            .map(|s| s.value)
    }

    /// Like [`Exposition::value`], panicking when absent.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(name, labels)
            .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
    }

    /// The TYPE of a family.
    pub fn kind(&self, family: &str) -> Option<&str> {
        self.families.get(family).map(|f| f.kind.as_str())
    }
}

#[test]
fn the_parser_rejects_what_prometheus_would() {
    let ok = "# HELP a_total A.\n# TYPE a_total counter\na_total{x=\"1\"} 2\n\
              # HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 3.5\nh_count 2\n";
    let e = parse(ok).unwrap();
    assert_eq!(e.get("a_total", &[("x", "1")]), 2.0);
    assert_eq!(e.get("h_count", &[]), 2.0);
    for bad in [
        "a 1\n",                                              // no HELP/TYPE
        "# HELP a A.\n# TYPE a gauge\na 1",                   // no final newline
        "# HELP a A.\n# TYPE a gauge\na{x=1} 1\n",            // unquoted label
        "# HELP a A.\n# TYPE a gauge\na 1\na 2\n",            // duplicate series
        "# HELP a A.\n# TYPE a gauge\na one\n",               // bad value
        "# HELP a A.\n# TYPE a gauge\n# TYPE a gauge\na 1\n", // TYPE twice
        "# HELP a A.\n# TYPE a wat\na 1\n",                   // unknown type
        "# HELP a A.\n# TYPE a counter\na -1\n",              // negative counter
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n", // not cumulative
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
        "# HELP h H.\n# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n", // +Inf != count
        "# HELP a A.\n# TYPE a gauge\n# HELP b B.\n# TYPE b gauge\na 1\n",             // interleaved
    ] {
        assert!(parse(bad).is_err(), "accepted: {bad:?}");
    }
}

const FAST: &str = "[retry]\nbase_delay = \"100ms\"\nmax_delay = \"400ms\"\njitter = \"none\"\n";

pub(crate) async fn scrape(c: &Courier) -> Exposition {
    let a = get(&c.admin_url("/metrics")).await;
    assert_eq!(a.status, 200);
    let ct = a.headers.get("content-type").cloned().unwrap_or_default();
    assert!(ct.starts_with("text/plain") && ct.contains("version=0.0.4"), "{ct}");
    parse(&a.text()).unwrap_or_else(|e| panic!("{e}\n{}", a.text()))
}

#[tokio::test]
async fn metrics_count_a_known_traffic_pattern() {
    // /ok answers 200; /gone 410; /flaky 503 once, then 200.
    let rx = Receiver::start().await;
    let flaky_seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let f = flaky_seen.clone();
    rx.set_script(move |_, s| match s.path.as_str() {
        "/gone" => Reply::status(410),
        "/flaky" if f.fetch_add(1, std::sync::atomic::Ordering::SeqCst) == 0 => Reply::status(503),
        _ => Reply::status(200),
    });
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), FAST);

    // Before any traffic every family is there, at zero.
    let e = scrape(&c).await;
    assert_eq!(e.get("courier_accepted_total", &[]), 0.0);
    assert_eq!(e.get("courier_delivery_latency_seconds_count", &[]), 0.0);

    for target in ["/ok", "/ok", "/ok", "/gone", "/flaky"] {
        let a = post(&c.prefixed(&rx.url(target)), &[], "m").await;
        assert_eq!(a.status, 202);
    }
    // Rejected at ingress: counted by code, never accepted.
    assert_eq!(post(&c.prefixed("ftp://127.0.0.1/x"), &[], "m").await.status, 400);

    let e = eventually("4 delivered and 1 dead in the metrics", || async {
        let e = scrape(&c).await;
        (e.get("courier_delivered_total", &[]) == 4.0
            && e.get("courier_dead_letters_total", &[("reason", "permanent_status")]) == 1.0)
            .then_some(e)
    })
    .await;
    let seen = rx.seen();
    assert_eq!(seen.len(), 6, "3 + 1 + 2 attempts at the receiver");

    for (family, kind) in [
        ("courier_accepted_total", "counter"),
        ("courier_attempts_total", "counter"),
        ("courier_delivered_total", "counter"),
        ("courier_dead_letters_total", "counter"),
        ("courier_pending", "gauge"),
        ("courier_in_flight", "gauge"),
        ("courier_oldest_pending_seconds", "gauge"),
        ("courier_endpoints_paused", "gauge"),
        ("courier_delivery_latency_seconds", "histogram"),
        ("courier_attempt_duration_seconds", "histogram"),
    ] {
        assert_eq!(e.kind(family), Some(kind), "{family}");
    }
    assert_eq!(e.get("courier_accepted_total", &[]), 5.0);
    assert_eq!(e.get("courier_attempts_total", &[("outcome", "delivered")]), 4.0);
    assert_eq!(e.get("courier_attempts_total", &[("outcome", "permanent")]), 1.0);
    assert_eq!(e.get("courier_attempts_total", &[("outcome", "retry")]), 1.0);
    assert_eq!(e.get("courier_attempts_total", &[("outcome", "egress_denied")]), 0.0);
    let attempts: f64 = e.families["courier_attempts_total"]
        .samples
        .iter()
        .map(|s| s.value)
        .sum();
    assert_eq!(attempts, seen.len() as f64, "every attempt the receiver saw, once");
    assert_eq!(e.get("courier_delivered_total", &[]), 4.0);
    for reason in ["max_attempts", "expired", "egress_denied"] {
        assert_eq!(
            e.get("courier_dead_letters_total", &[("reason", reason)]),
            0.0,
            "{reason}"
        );
    }
    assert_eq!(e.get("courier_pending", &[]), 0.0);
    assert_eq!(e.get("courier_in_flight", &[]), 0.0);
    assert_eq!(e.get("courier_oldest_pending_seconds", &[]), 0.0);
    assert_eq!(e.get("courier_endpoints_paused", &[]), 0.0);
    assert_eq!(e.get("courier_dead_letters", &[]), 1.0);
    assert_eq!(e.get("courier_duplicates_total", &[]), 0.0);
    assert_eq!(
        e.get("courier_ingress_rejected_total", &[("code", "unsupported_scheme")]),
        1.0
    );
    assert_eq!(e.get("courier_delivery_latency_seconds_count", &[]), 4.0);
    assert_eq!(e.get("courier_attempt_duration_seconds_count", &[]), 6.0);
    // The retried message waited at least its 100ms backoff.
    assert!(
        e.get("courier_delivery_latency_seconds_bucket", &[("le", "0.05")]) <= 3.0,
        "the retried delivery took longer than 50ms"
    );
    assert!(e.get("courier_delivery_latency_seconds_sum", &[]) >= 0.1);
}

#[tokio::test]
async fn pending_gauges_describe_a_backlog() {
    // A receiver that is down: messages wait, and the gauges say so.
    let down = dead_addr();
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "[retry]\nbase_delay = \"1h\"\n");
    // The first message 1s before the other two: the oldest is told apart from the newest.
    let first_sent = std::time::Instant::now();
    let mut ids = Vec::new();
    for n in 0..3 {
        let a = post(&c.prefixed(&format!("http://{down}/x")), &[], "m").await;
        assert_eq!(a.status, 202);
        ids.push(a.json()["id"].as_str().unwrap().to_string());
        if n == 0 {
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        }
    }
    // The attempt counter moves just before the in-flight gauge drops: wait for both.
    let e = eventually("3 failed attempts, none in flight", || async {
        let e = scrape(&c).await;
        let settled =
            e.get("courier_attempts_total", &[("outcome", "retry")]) == 3.0 && e.get("courier_in_flight", &[]) == 0.0;
        settled.then_some(e)
    })
    .await;
    assert_eq!(e.get("courier_pending", &[]), 3.0);
    assert_eq!(e.get("courier_delivered_total", &[]), 0.0);
    // The gauges agree with what the admin API says of each message and of the endpoint:
    // three pending with one failed attempt each, none in flight.
    for id in &ids {
        let v = delivery(&c, id).await;
        assert_eq!((&v["state"], &v["attempts"]), (&"pending".into(), &1.into()), "{v}");
    }
    let endpoint = crate::admin::endpoint(&c, &format!("http://{down}/x"))
        .await
        .expect("the endpoint is listed");
    assert_eq!(
        (&endpoint["pending"], &endpoint["in_flight"]),
        (&3.into(), &0.into()),
        "{endpoint}"
    );
    let oldest_then = e.get("courier_oldest_pending_seconds", &[]);
    // The age of the first message: at least the 1s it was sent before the others, at
    // most the time since it was sent.
    let age_bound = first_sent.elapsed().as_secs_f64();
    assert!(
        (0.95..=age_bound + 0.05).contains(&oldest_then),
        "oldest pending {oldest_then}s, want the first message's age (1s..{age_bound}s)"
    );
    let e = eventually("the oldest pending age to grow", || async {
        let e = scrape(&c).await;
        (e.get("courier_oldest_pending_seconds", &[]) > oldest_then + 0.5).then_some(e)
    })
    .await;
    assert!(e.get("courier_oldest_pending_seconds", &[]) < 60.0);
}

/// In flight, for real: attempts held open by a receiver that answers only when the test
/// lets it. The gauge, the per-endpoint field, the delivery's state, and `courier_pending`
/// counting the waiting messages but not the ones in flight.
#[tokio::test]
async fn in_flight_is_counted_while_attempts_are_held_open() {
    let gate = Gate::new();
    let g = gate.clone();
    let rx = Receiver::scripted(move |_, _| Reply::status(200).until(&g)).await;
    let down = dead_addr();
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "[retry]\nbase_delay = \"1h\"\n");
    // Two messages that wait (their receiver is down, next attempt in an hour)...
    for _ in 0..2 {
        assert_eq!(
            post(&c.prefixed(&format!("http://{down}/x")), &[], "w").await.status,
            202
        );
    }
    eventually("2 failed attempts", || async {
        let e = scrape(&c).await;
        (e.get("courier_attempts_total", &[("outcome", "retry")]) == 2.0 && e.get("courier_in_flight", &[]) == 0.0)
            .then_some(())
    })
    .await;
    // ...and three held open at the receiver.
    let held_url = rx.url("/held");
    let mut held = Vec::new();
    for _ in 0..3 {
        let a = post(&c.prefixed(&held_url), &[], "h").await;
        held.push(a.json()["id"].as_str().unwrap().to_string());
    }
    rx.wait_for(3).await;

    let e = scrape(&c).await;
    assert_eq!(e.get("courier_in_flight", &[]), 3.0);
    assert_eq!(e.get("courier_pending", &[]), 2.0, "pending excludes the 3 in flight");
    let ep = crate::admin::endpoint(&c, &held_url)
        .await
        .expect("the busy endpoint is listed");
    assert_eq!((&ep["in_flight"], &ep["pending"]), (&3.into(), &0.into()), "{ep}");
    for id in &held {
        assert_eq!(delivery(&c, id).await["state"], "in_flight");
    }

    gate.open();
    for id in &held {
        wait_state(&c, id, "delivered").await;
    }
    let e = eventually("nothing in flight", || async {
        let e = scrape(&c).await;
        (e.get("courier_in_flight", &[]) == 0.0).then_some(e)
    })
    .await;
    assert_eq!(e.get("courier_pending", &[]), 2.0);
    let ep = crate::admin::endpoint(&c, &held_url).await.unwrap();
    assert_eq!(ep["in_flight"], 0, "{ep}");
}
