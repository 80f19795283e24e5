//! The Grafana dashboard (`deploy/grafana/courier.json`) and the Prometheus alerting rules
//! (`deploy/prometheus/alerts.yaml`) against the real `/metrics`: every metric name their
//! PromQL expressions select must be a family courier exports (a `# TYPE` line), so a
//! renamed or misspelled metric fails here instead of drawing an empty panel or an alert
//! that can never fire. `deploy/validate.sh` checks the same files' syntax (`promtool
//! check rules`, JSON with an `expr` on every panel target).

use std::collections::BTreeSet;
use std::path::PathBuf;

use crate::metrics::{parse, Exposition};
use crate::support::*;

/// Series that are not courier's but Prometheus's own: `up` (1 when the scrape worked).
const NOT_COURIER: &[&str] = &["up"];

/// PromQL keywords and aggregation operators: words that are neither metric names nor
/// called like functions (`sum by (x) (...)`, `a and b`, `x offset 5m`).
const KEYWORDS: &[&str] = &[
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesised list of label names.
const LABEL_LISTS: &[&str] = &["by", "without", "on", "ignoring", "group_left", "group_right"];

fn repo(path: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The index just past the bracket that closes the one at `open` (quotes respected).
fn skip_group(s: &[char], open: usize) -> Result<usize, String> {
    let close = match s[open] {
        '(' => ')',
        '{' => '}',
        '[' => ']',
        c => return Err(format!("not a bracket: {c}")),
    };
    let mut i = open + 1;
    while i < s.len() {
        match s[i] {
            '"' | '\'' | '`' => i = skip_string(s, i)?,
            c if c == close => return Ok(i + 1),
            '(' | '{' | '[' => i = skip_group(s, i)?,
            _ => i += 1,
        }
    }
    Err(format!("unbalanced {:?}", s[open]))
}

/// The index just past the string literal that starts at `open`.
fn skip_string(s: &[char], open: usize) -> Result<usize, String> {
    let quote = s[open];
    let mut i = open + 1;
    while i < s.len() {
        match s[i] {
            '\\' if quote != '`' => i += 2,
            c if c == quote => return Ok(i + 1),
            _ => i += 1,
        }
    }
    Err("unterminated string".into())
}

fn ident_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn ident_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_' || c == ':'
}

/// The metric names a PromQL expression selects: identifiers outside label matchers `{}`,
/// ranges `[]` and strings that are not functions (followed by `(`), keywords, aggregation
/// operators, the label lists of `by (...)`/`on (...)`/..., numbers, durations or Grafana
/// variables (`$x`, `${x}`). A Grafana `label_values(metric, label)` query yields `metric`.
pub fn metric_names(expr: &str) -> Result<BTreeSet<String>, String> {
    let expr = expr.trim();
    if let Some(inner) = expr.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')) {
        // label_values(label) names no metric; label_values(selector, label) selects one.
        return match inner.rsplit_once(',') {
            Some((selector, _label)) => metric_names(selector),
            None => Ok(BTreeSet::new()),
        };
    }
    let s: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < s.len() {
        let c = s[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&s, i)?;
        } else if c == '{' || c == '[' {
            i = skip_group(&s, i)?;
        } else if c == '}' || c == ']' {
            return Err(format!("unbalanced {c:?} in {expr}"));
        } else if c == '$' {
            // A Grafana variable: $name or ${name}.
            i += 1;
            if s.get(i) == Some(&'{') {
                i = skip_group(&s, i)?;
            } else {
                while i < s.len() && ident_char(s[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() || (c == '.' && s.get(i + 1).is_some_and(|d| d.is_ascii_digit())) {
            // A number or a duration (0.99, 1e3, 5m, 1h30m).
            while i < s.len() && (s[i].is_ascii_alphanumeric() || s[i] == '.' || s[i] == '_') {
                i += 1;
            }
        } else if ident_start(c) {
            let start = i;
            while i < s.len() && ident_char(s[i]) {
                i += 1;
            }
            let word: String = s[start..i].iter().collect();
            let mut next = i;
            while next < s.len() && s[next].is_whitespace() {
                next += 1;
            }
            let called = s.get(next) == Some(&'(');
            if LABEL_LISTS.contains(&word.as_str()) {
                if called {
                    i = skip_group(&s, next)?;
                }
            } else if KEYWORDS.contains(&word.to_ascii_lowercase().as_str()) || called {
                // An operator, or a function whose arguments are read in turn.
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    Ok(names)
}

/// Every `expr` of the dashboard (panel targets, at any depth) and the metric selector of
/// its query variables (`label_values(...)`).
fn dashboard_exprs() -> Vec<String> {
    let text = std::fs::read_to_string(repo("deploy/grafana/courier.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).expect("courier.json is JSON");
    fn walk(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    match (k.as_str(), v) {
                        ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                        ("query" | "definition", serde_json::Value::String(q)) if q.contains("label_values(") => {
                            out.push(q.clone())
                        }
                        _ => walk(v, out),
                    }
                }
            }
            serde_json::Value::Array(a) => a.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(&dash, &mut out);
    out
}

/// Every `expr:` of the rules file.
fn rule_exprs() -> Vec<String> {
    rule_exprs_in(&std::fs::read_to_string(repo("deploy/prometheus/alerts.yaml")).unwrap())
}

/// Every `expr:` of a rules file's text: single-line (plain or quoted) or a `|`/`>` block.
fn rule_exprs_in(text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some((indent, value)) = line.split_once("expr:") else {
            continue;
        };
        if !indent.trim().is_empty() && indent.trim() != "-" {
            continue;
        }
        let value = value.trim();
        if value.starts_with('|') || value.starts_with('>') {
            let depth = indent.len();
            let block: Vec<&str> = lines[n + 1..]
                .iter()
                .take_while(|l| l.trim().is_empty() || l.len() - l.trim_start().len() > depth)
                .map(|l| l.trim())
                .collect();
            out.push(block.join(" "));
        } else if let Some(q) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
            out.push(q.replace("\\\"", "\"").replace("\\\\", "\\"));
        } else if let Some(q) = value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
            out.push(q.replace("''", "'"));
        } else {
            out.push(value.to_string());
        }
    }
    out
}

/// The names among `exprs` that courier does not export (with the expression using each).
/// `_bucket`, `_sum` and `_count` of a histogram family count as that family.
fn unknown_names(exprs: &[String], exported: &Exposition, text: &str) -> Vec<String> {
    let mut unknown = Vec::new();
    for expr in exprs {
        let names = metric_names(expr).unwrap_or_else(|e| panic!("cannot read {expr:?}: {e}"));
        for name in names {
            if NOT_COURIER.contains(&name.as_str()) {
                continue;
            }
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|suffix| {
                    name.strip_suffix(suffix)
                        .filter(|base| matches!(exported.kind(base), Some("histogram" | "summary")))
                })
                .unwrap_or(&name);
            let typed = text.lines().any(|l| {
                l.strip_prefix("# TYPE ")
                    .and_then(|rest| rest.split_whitespace().next())
                    .is_some_and(|n| n == family)
            });
            if !typed || exported.kind(family).is_none() {
                unknown.push(format!("{name} (in {expr})"));
            }
        }
    }
    unknown
}

#[test]
fn metric_names_skips_functions_labels_and_variables() {
    let names = |e: &str| metric_names(e).unwrap().into_iter().collect::<Vec<_>>();
    assert_eq!(
        names(r#"histogram_quantile(0.99, sum by (le, host) (rate(a_bucket{x=~"$v", y!="b c"}[$__rate_interval])))"#),
        ["a_bucket"]
    );
    assert_eq!(
        names("sum(rate(a_total[5m])) by (code) / on (instance) group_left b > 0"),
        ["a_total", "b"]
    );
    assert_eq!(
        names("max without (host) (x offset 1h30m) > bool 1e3 and up == 0"),
        ["up", "x"]
    );
    assert_eq!(
        names("increase(a_total{code=\"}\"}[${__range}]) or vector(0)"),
        ["a_total"]
    );
    assert_eq!(names("label_values(courier_pending, instance)"), ["courier_pending"]);
    assert!(names("label_values(instance)").is_empty());
    assert!(metric_names("rate(x[5m]").is_ok() && metric_names("sum(x{a=\"b\")").is_err());
}

#[test]
fn rule_exprs_are_read_in_every_yaml_style() {
    let text = "groups:\n  - name: g\n    rules:\n      - alert: A\n        expr: up == 0\n        for: 5m\n\
                \x20     - alert: B\n        expr: |\n          sum(rate(a_total[5m]))\n            > 0\n        labels: {}\n\
                \x20     - record: c\n        expr: \"b{x=\\\"y\\\"}\"\n\
                \x20     - expr: 'd{x=''y''}'\n        record: e\n";
    assert_eq!(
        rule_exprs_in(text),
        ["up == 0", "sum(rate(a_total[5m])) > 0", "b{x=\"y\"}", "d{x='y'}"],
        "{text}"
    );
}

#[test]
fn every_alerting_rule_has_an_expr_the_test_reads() {
    // The reader in rule_exprs() against the real file: one expr per rule.
    let text = std::fs::read_to_string(repo("deploy/prometheus/alerts.yaml")).unwrap();
    let rules = text.lines().filter(|l| l.trim_start().starts_with("- alert:")).count();
    let exprs = rule_exprs();
    assert!(rules >= 5, "expected the alerting rules, found {rules}");
    assert_eq!(exprs.len(), rules, "{exprs:#?}");
    assert!(exprs.iter().all(|e| !e.is_empty() && !e.starts_with('|')), "{exprs:#?}");
}

#[tokio::test]
async fn dashboard_and_alerts_use_only_metrics_courier_exports() {
    let d = tempfile::tempdir().unwrap();
    let c = Courier::start(d.path(), "");
    let a = get(&c.admin_url("/metrics")).await;
    assert_eq!(a.status, 200);
    let text = a.text();
    let exported = parse(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));

    let dashboard = dashboard_exprs();
    let rules = rule_exprs();
    // Every panel target has a query, and every query selects at least one metric.
    assert!(dashboard.len() >= 10, "{dashboard:#?}");
    for expr in dashboard.iter().chain(&rules) {
        assert!(!metric_names(expr).unwrap().is_empty(), "no metric in {expr:?}");
    }
    let unknown = unknown_names(&dashboard, &exported, &text);
    assert!(
        unknown.is_empty(),
        "deploy/grafana/courier.json uses metrics courier does not export:\n{unknown:#?}"
    );
    let unknown = unknown_names(&rules, &exported, &text);
    assert!(
        unknown.is_empty(),
        "deploy/prometheus/alerts.yaml uses metrics courier does not export:\n{unknown:#?}"
    );

    // The check itself: a misspelled name, a suffix on a non-histogram and a histogram's
    // series under a wrong family are all caught; the histogram's own series are not.
    let bad = [
        "sum(rate(courier_delivered_totl[5m]))".to_string(),
        "courier_pending_count".to_string(),
        "rate(courier_attempt_seconds_bucket[5m])".to_string(),
    ];
    assert_eq!(
        unknown_names(&bad, &exported, &text).len(),
        3,
        "{:#?}",
        unknown_names(&bad, &exported, &text)
    );
    let good = ["rate(courier_attempt_duration_seconds_count[5m]) + courier_delivery_latency_seconds_sum".to_string()];
    assert!(unknown_names(&good, &exported, &text).is_empty());
}
