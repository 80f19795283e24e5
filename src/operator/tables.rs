//! How the operator commands print what the admin API answered: aligned tables, one
//! per listing, and the detail of one delivery.

use serde_json::Value;

use crate::redact::{escape, escape_json};

/// The API's JSON, with bidi and zero-width characters escaped so that a terminal shows them.
pub(super) fn pretty(v: &Value) -> String {
    escape_json(&serde_json::to_string_pretty(v).unwrap_or_default())
}

/// One table cell: text from receivers and callers has its control, bidi and zero-width
/// characters written as escapes, so a hostile `last_error` cannot rewrite the screen.
pub(super) fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => escape(s),
        other => other.to_string(),
    }
}

/// Renders rows as an aligned table with a header.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let parts: Vec<String> = cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        parts.join("  ").trim_end().to_string()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

/// The cells of `v`'s `fields`, in order.
fn cells(v: &Value, fields: &[&str]) -> Vec<String> {
    fields.iter().map(|f| cell(&v[*f])).collect()
}

/// One row per element of the array `v` (none when it is not one).
fn rows(v: &Value, row: impl FnMut(&Value) -> Vec<String>) -> Vec<Vec<String>> {
    v.as_array().into_iter().flatten().map(row).collect()
}

/// `courier deliveries list`: one row per delivery.
pub(super) fn deliveries_table(v: &Value) -> String {
    let rows = rows(&v["items"], |d| {
        let mut row = cells(d, &["id", "state", "attempts", "last_status"]);
        row.push(match d["state"].as_str() {
            Some("dead") => cell(&d["dead_reason"]),
            Some("pending") => cell(&d["next_attempt_at"]),
            _ => "-".into(),
        });
        row.push(cell(&d["endpoint"]));
        row
    });
    let mut out = table(&["ID", "STATE", "ATTEMPTS", "LAST", "NEXT/REASON", "ENDPOINT"], &rows);
    if let Some(c) = v["next_cursor"].as_str() {
        out.push_str(&format!("\n(more: --cursor {c})"));
    }
    out
}

/// `courier deliveries show`: the delivery, then its attempts.
pub(super) fn delivery_detail(d: &Value) -> String {
    let fields = [
        "id",
        "event_id",
        "state",
        "target",
        "endpoint",
        "route",
        "attempts",
        "max_attempts",
        "accepted_at",
        "next_attempt_at",
        "give_up_at",
        "finished_at",
        "dead_reason",
        "last_status",
        "last_error",
    ];
    let mut out: Vec<String> = fields.iter().map(|f| format!("{f:<16}{}", cell(&d[*f]))).collect();
    // An ordered message's line, shown only for those (unordered output stays as it was).
    if d["ordering"] == "fifo" {
        for f in ["ordering", "on_dead", "line_position", "line_head"] {
            out.push(format!("{f:<16}{}", cell(&d[f])));
        }
    }
    // The policy the next attempt is made under (the config's now), with its revision: an
    // attempt below made under another revision ran under settings since changed.
    out.push(format!("{:<16}{}", "policy", cell(&d["policy"]["summary"])));
    // A traced message's trace, and each attempt's span in the table; shown only for those
    // (an untraced message's output stays as it was).
    let traced = !d["trace_id"].is_null();
    if traced {
        out.push(format!("{:<16}{}", "trace_id", cell(&d["trace_id"])));
    }
    let mut attempt = 0;
    let rows = rows(&d["history"], |a| {
        attempt += 1;
        let mut row = vec![attempt.to_string()];
        row.extend(cells(a, &["at", "status", "duration_ms", "policy_revision"]));
        if traced {
            row.push(cell(&a["span_id"]));
        }
        row.push(cell(&a["error"]));
        row
    });
    out.push(String::new());
    let header: &[&str] = if traced {
        &["#", "AT", "STATUS", "MS", "POLICY", "SPAN", "ERROR"]
    } else {
        &["#", "AT", "STATUS", "MS", "POLICY", "ERROR"]
    };
    out.push(table(header, &rows));
    out.join("\n")
}

/// `courier endpoints list`: one row per endpoint.
pub(super) fn endpoints_table(v: &Value) -> String {
    let items = v["items"].as_array().map(Vec::as_slice).unwrap_or_default();
    // The line columns appear when some endpoint listed is ordered: the table of a courier
    // without ordered endpoints is as it always was.
    let ordered = items.iter().any(|e| e["ordering"] == "fifo");
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|e| {
            let mut row = cells(e, &["key", "state", "permanent_failure_streak", "in_flight", "pending"]);
            if ordered {
                let fifo = e["ordering"] == "fifo";
                row.push(if fifo { "fifo".into() } else { "none".into() });
                row.push(if fifo { cell(&e["line_waiting"]) } else { "-".into() });
                row.push(line_head(e));
            }
            row
        })
        .collect();
    let mut headers = vec!["ENDPOINT", "STATE", "STREAK", "IN_FLIGHT", "PENDING"];
    if ordered {
        headers.extend(["ORDERING", "WAITING", "HEAD"]);
    }
    table(&headers, &rows)
}

/// An ordered endpoint's head, `blocked:<id>` when its line is blocked behind it.
fn line_head(e: &Value) -> String {
    let head = cell(&e["line_head"]);
    if e["line_blocked"] == true {
        format!("blocked:{head}")
    } else {
        head
    }
}

/// `courier hosts list`: one row per host.
pub(super) fn hosts_table(v: &Value) -> String {
    let fields = [
        "host",
        "circuit",
        "in_flight",
        "cap",
        "consecutive_failures",
        "next_probe_at",
    ];
    let rows = rows(&v["items"], |h| cells(h, &fields));
    table(
        &["HOST", "CIRCUIT", "IN_FLIGHT", "CAP", "FAILURES", "NEXT_PROBE"],
        &rows,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["A", "LONG"],
            &[vec!["xxxx".into(), "1".into()], vec!["y".into(), "22".into()]],
        );
        assert_eq!(t, "A     LONG\nxxxx  1\ny     22");
    }
}
