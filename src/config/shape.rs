//! What the file's keys mean together, settled on the parsed document before serde reads
//! it into the typed tree (whose structs take one key per field):
//! - CONTRACT §6's top-level `allow_private_targets` and `egress_allow` move into
//!   `[egress]`, where §7 puts them (both spellings of one setting at once is an error);
//! - in `[retry]`, each `[[route]]` and each `[[endpoint]]`, a `schedule` excludes
//!   `base_delay`/`max_delay`, and stands for `max_attempts` (its length + 1) unless that
//!   is written beside it;
//! - in each `[[route]]` and `[[endpoint]]`, the retry-policy keys are gathered into a
//!   `(policy)` table and `ordering`/`on_dead` into an `(ordering)` table, which the
//!   section's `policy` and `fifo` fields read; in each `[[host]]`, the TLS keys into a
//!   `(tls)` table for its `tls` field. serde cannot give one struct's keys to
//!   another inside the same table without `flatten`, and `flatten` loses the key and the
//!   line of an error; a moved value keeps its place in the text, so it does not.
//!
//! A group's name is in parentheses, which no bare key has: error paths leave such
//! segments out ([`is_group`]), so an error reads `route[0].base_delay`.

use toml_edit::{InlineTable, Item, Table, TableLike, Value};

use super::error::Problem;
use super::retry::implied_attempts;
use super::sections::Sequence;
use super::{HostTls, PolicyOverrides};

/// The key of the group of retry-policy keys in a route or an endpoint.
pub(super) const POLICY_GROUP: &str = "(policy)";
/// The key of the group of `ordering` and `on_dead` in a route or an endpoint.
pub(super) const ORDERING_GROUP: &str = "(ordering)";
/// The key of the group of TLS keys in a host.
pub(super) const TLS_GROUP: &str = "(tls)";

/// The top-level spellings of `[egress]`'s settings (CONTRACT §6), and their key there.
const EGRESS_ALIASES: [(&str, &str); 2] = [
    ("allow_private_targets", "allow_private_targets"),
    ("egress_allow", "allow"),
];

/// Settles the document `root` (see the module doc). A value of the wrong type is left as
/// it is, for serde to report with its key and line.
pub(super) fn shape(root: &mut Table) -> Result<(), Problem> {
    egress_aliases(root)?;
    if let Some(retry) = root.get_mut("retry").and_then(Item::as_table_like_mut) {
        backoff_keys("retry", retry)?;
    }
    for array in ["route", "endpoint"] {
        for (i, section) in sections(root, array) {
            backoff_keys(&format!("{array}[{i}]"), section)?;
            group(section, POLICY_GROUP, PolicyOverrides::KEYS);
            group(section, ORDERING_GROUP, Sequence::KEYS);
        }
    }
    for (_, host) in sections(root, "host") {
        group(host, TLS_GROUP, HostTls::KEYS);
    }
    Ok(())
}

/// Whether a segment of an error's path is a group made by [`shape`], not a key of the file.
pub(super) fn is_group(segment: &str) -> bool {
    segment.starts_with('(')
}

fn egress_aliases(root: &mut Table) -> Result<(), Problem> {
    for (alias, key) in EGRESS_ALIASES {
        let Some(value) = root.remove(alias) else {
            continue;
        };
        // An `egress` that is no table is serde's error to report; the alias goes with it.
        let Some(egress) = root
            .entry("egress")
            .or_insert(Item::Table(Table::new()))
            .as_table_like_mut()
        else {
            continue;
        };
        if egress.contains_key(key) {
            let problem = format!("egress.{key} and the top-level {alias} are the same setting: set only one");
            return Err(problem.into());
        }
        egress.insert(key, value);
    }
    Ok(())
}

/// A section's backoff is one setting: an explicit schedule, or the exponential
/// `base_delay`/`max_delay` (an unset one of the two taken from `[retry]`).
fn backoff_keys(section: &str, table: &mut dyn TableLike) -> Result<(), Problem> {
    let Some(schedule) = table.get("schedule") else {
        return Ok(());
    };
    if table.contains_key("base_delay") || table.contains_key("max_delay") {
        let problem = format!(
            "{section}: schedule and base_delay/max_delay are both set; a section's backoff is either \
             an explicit schedule or exponential"
        );
        return Err(Problem::coded("conflicting_backoff", problem));
    }
    if let Some(len) = schedule.as_array().map(|a| a.len()) {
        if !table.contains_key("max_attempts") {
            table.insert("max_attempts", toml_edit::value(i64::from(implied_attempts(len))));
        }
    }
    Ok(())
}

/// The tables of the array `key` (`[[route]]` or `route = [{ ... }]`), with their index.
fn sections<'a>(root: &'a mut Table, key: &str) -> Vec<(usize, &'a mut dyn TableLike)> {
    match root.get_mut(key) {
        Some(Item::ArrayOfTables(tables)) => tables.iter_mut().map(|t| t as &mut dyn TableLike).enumerate().collect(),
        Some(Item::Value(Value::Array(items))) => items
            .iter_mut()
            .enumerate()
            .filter_map(|(i, v)| v.as_inline_table_mut().map(|t| (i, t as &mut dyn TableLike)))
            .collect(),
        _ => Vec::new(),
    }
}

/// Moves the `keys` that `table` has into a table `name` in it.
fn group(table: &mut dyn TableLike, name: &str, keys: &[&str]) {
    let mut group = InlineTable::new();
    for key in keys {
        if let Some(value) = table.remove(key).and_then(|item| item.into_value().ok()) {
            group.insert(*key, value);
        }
    }
    if !group.is_empty() {
        table.insert(name, Item::Value(Value::InlineTable(group)));
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;

    use serde::de::{Deserializer, Error as _, Visitor};
    use serde::Deserialize;

    use super::*;
    use crate::config::{EndpointConfig, RouteConfig};

    /// The keys a derived struct reads, as serde's derive hands them to `deserialize_struct`
    /// (after its renames): what the groups must be named for the fields that read them.
    fn fields_of<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
        struct Probe;
        #[derive(Debug)]
        struct Fields(&'static [&'static str]);
        impl fmt::Display for Fields {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a struct's fields")
            }
        }
        impl std::error::Error for Fields {}
        impl serde::de::Error for Fields {
            fn custom<M: fmt::Display>(_: M) -> Self {
                Fields(&[])
            }
        }
        impl<'de> Deserializer<'de> for Probe {
            type Error = Fields;
            fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Fields> {
                Err(Fields::custom("not a struct"))
            }
            fn deserialize_struct<V: Visitor<'de>>(
                self,
                _: &'static str,
                fields: &'static [&'static str],
                _: V,
            ) -> Result<V::Value, Fields> {
                Err(Fields(fields))
            }
            serde::forward_to_deserialize_any! {
                bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
                option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
                ignored_any
            }
        }
        match T::deserialize(Probe) {
            Err(Fields(fields)) => fields,
            Ok(_) => &[],
        }
    }

    #[test]
    fn the_groups_are_the_fields_that_read_them() {
        for fields in [fields_of::<RouteConfig>(), fields_of::<EndpointConfig>()] {
            assert!(
                fields.contains(&POLICY_GROUP) && fields.contains(&ORDERING_GROUP),
                "{fields:?}"
            );
            assert!(fields.iter().filter(|f| is_group(f)).count() == 2, "{fields:?}");
        }
        let host = fields_of::<crate::config::HostConfig>();
        assert!(host.contains(&TLS_GROUP) && host.iter().filter(|f| is_group(f)).count() == 1);
        // A group's keys are its struct's fields: none is renamed.
        assert_eq!(fields_of::<HostTls>(), HostTls::KEYS);
        assert_eq!(fields_of::<PolicyOverrides>(), PolicyOverrides::KEYS);
        assert_eq!(fields_of::<Sequence>(), Sequence::KEYS);
        assert_eq!(Sequence::KEYS, ["ordering", "on_dead"]);
    }

    #[test]
    fn keys_move_into_their_groups_and_sections_keep_the_rest() {
        let mut root = toml_edit::ImDocument::parse(concat!(
            "egress_allow = [\"::1\"]\n",
            "[[route]]\nname = \"a\"\nschedule = [\"1s\"]\nordering = \"fifo\"\n",
            "[[endpoint]]\nkey = \"k\"\nmax_attempts = 2\n",
        ))
        .unwrap()
        .into_table();
        shape(&mut root).unwrap();
        let route = root["route"][0].as_table_like().unwrap();
        let keys: Vec<&str> = route.iter().map(|(k, _)| k).collect();
        assert_eq!(keys, ["name", POLICY_GROUP, ORDERING_GROUP]);
        let policy = route.get(POLICY_GROUP).and_then(Item::as_table_like).unwrap();
        assert_eq!(
            policy.get("max_attempts").and_then(Item::as_integer),
            Some(2),
            "implied"
        );
        assert!(root["endpoint"][0].get(ORDERING_GROUP).is_none(), "nothing to move");
        assert!(root.get("egress_allow").is_none() && root["egress"].get("allow").is_some());
    }
}
