//! The printed table and the JSON results.

use serde_json::Value;

/// A comparison: the baseline's name, its figure, and the ratio of courier's to it.
pub type Vs = (String, String, f64);

/// A comparison with a same-run baseline.
pub fn vs(name: impl Into<String>, value: impl Into<String>, ratio: f64) -> Vs {
    (name.into(), value.into(), ratio)
}

/// One line of the table: a figure, its comparisons with same-run baselines, and the
/// target it is judged against, if any.
pub struct Row {
    metric: String,
    value: String,
    vs: Vec<Vs>,
    target: Option<String>,
}

/// The rows printed so far and the JSON object written at the end.
#[derive(Default)]
pub struct Report {
    pub rows: Vec<Row>,
    pub json: serde_json::Map<String, Value>,
}

impl Report {
    /// Adds a row (and prints it at once, so a long run shows progress).
    pub fn row(&mut self, metric: impl Into<String>, value: impl Into<String>, vs: Vec<Vs>) {
        self.push(Row {
            metric: metric.into(),
            value: value.into(),
            vs,
            target: None,
        });
    }

    /// Adds a row with its target and verdict (`">= 0.75x: pass"`), shown in a column of
    /// its own.
    pub fn judged(&mut self, metric: impl Into<String>, value: impl Into<String>, vs: Vec<Vs>, target: String) {
        self.push(Row {
            metric: metric.into(),
            value: value.into(),
            vs,
            target: Some(target),
        });
    }

    /// Prints a row and keeps it for the table.
    fn push(&mut self, row: Row) {
        eprintln!(
            "  {:<52} {:>14} {}{}",
            row.metric,
            row.value,
            row.vs
                .iter()
                .map(|(n, v, r)| format!("| {n} {v} ({r:.2}x)"))
                .collect::<Vec<_>>()
                .join(" "),
            row.target.as_ref().map_or(String::new(), |t| format!(" | target {t}"))
        );
        self.rows.push(row);
    }

    /// Sets one top-level key of the JSON results.
    pub fn set(&mut self, key: &str, v: Value) {
        self.json.insert(key.to_string(), v);
    }

    /// The rows as a Markdown table (one line per baseline compared with); a target column
    /// only when some row has a target, so the other scenarios' tables stay as they were.
    pub fn table(&self) -> String {
        let judged = self.rows.iter().any(|r| r.target.is_some());
        let line = |m: &str, v: &str, b: &str, r: &str, t: &str| {
            let mut l = format!("| {m:<54} | {v:>16} | {b:<44} | {r:>7} |");
            if judged {
                l.push_str(&format!(" {t:<22} |"));
            }
            l.push('\n');
            l
        };
        let mut out = line("metric", "courier", "baseline (same run)", "ratio", "target");
        out.push_str(&format!("|{:-<56}|{:->18}|{:-<46}|{:->9}|", "", ":", "", ":"));
        if judged {
            out.push_str(&format!("{:-<24}|", ""));
        }
        out.push('\n');
        for r in &self.rows {
            let target = r.target.as_deref().unwrap_or("");
            if r.vs.is_empty() {
                out.push_str(&line(&r.metric, &r.value, "", "", target));
            }
            for (i, (name, v, ratio)) in r.vs.iter().enumerate() {
                let (m, val, t) = if i == 0 {
                    (r.metric.as_str(), r.value.as_str(), target)
                } else {
                    ("", "", "")
                };
                out.push_str(&line(m, val, &format!("{name}: {v}"), &format!("{ratio:.2}x"), t));
            }
        }
        out
    }
}

/// A rate with thousands separators: `12,345/s`.
pub fn per_s(x: f64) -> String {
    let n = x.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    format!("{out}/s")
}

/// Milliseconds with two decimals.
pub fn ms(x: f64) -> String {
    format!("{x:.2} ms")
}

/// Bytes in MiB.
pub fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

/// `a / b`, or 0 when `b` is 0 (a baseline that measured nothing).
pub fn ratio(a: f64, b: f64) -> f64 {
    if b == 0.0 {
        0.0
    } else {
        a / b
    }
}
