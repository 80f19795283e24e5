//! How the typed tree reads its values: each kind of value the file writes as text
//! (durations, sizes, addresses, URLs, ...) is a [`Text`] marker that names the shared
//! parser of `parse`, so the file and the environment read a setting the same way. The
//! fields say which one with `["de::one::<Dur, _>"]` in `section!` (a `deserialize_with`:
//! [`one`], [`opt`], [`list`]); a bad value is a [`Problem`] raised as a serde error, so
//! serde's path names the key (`retry.base_delay`, `route[0].url`, `ingress.hosts[1]`).

use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::Deserializer;
use serde::Deserialize;
use url::Url;

use super::error::Problem;
use super::parse::{
    normalize_endpoint_key, normalize_host_key, parse_duration_text, parse_host_entry, parse_net, parse_origin,
    parse_target, parse_url,
};
use super::units::parse_size;
use crate::model::{Jitter, UnknownName};
use crate::signing::scope::TargetPattern;
use crate::signing::Secret;

/// A kind of value written as a string, and the parser that reads it.
pub(super) trait Text {
    /// What the text stands for.
    type Value;
    /// The shared parser (see `parse`).
    const PARSE: fn(&str) -> Result<Self::Value, String>;
    /// The machine-readable code of a bad value, where its rule has one.
    const CODE: Option<&'static str> = None;
    /// Reads `text`; the problem names no place (serde's path, or the variable, does).
    fn parse(text: &str) -> Result<Self::Value, Problem> {
        Self::PARSE(text).map_err(|e| match Self::CODE {
            Some(code) => Problem::coded(code, e),
            None => Problem::from(e),
        })
    }
}

/// Reads one string with `P` (a wrong type is serde's own message).
pub(super) fn one<'de, P: Text, D: Deserializer<'de>>(d: D) -> Result<P::Value, D::Error> {
    Parsed::<P>::deserialize(d).map(|p| p.0)
}

/// [`one`], for a setting that is unset unless the file writes it.
pub(super) fn opt<'de, P: Text, D: Deserializer<'de>>(d: D) -> Result<Option<P::Value>, D::Error> {
    one::<P, D>(d).map(Some)
}

/// A list of strings, each read with `P`; a bad item is named by its index.
pub(super) fn list<'de, P: Text, D: Deserializer<'de>>(d: D) -> Result<Vec<P::Value>, D::Error> {
    Vec::<Parsed<P>>::deserialize(d).map(|items| items.into_iter().map(|p| p.0).collect())
}

/// One value read with `P`: items of a list go through serde one by one, so its path
/// counts them.
struct Parsed<P: Text>(P::Value);

impl<'de, P: Text> Deserialize<'de> for Parsed<P> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        P::parse(&text).map(Parsed).map_err(Problem::into_serde)
    }
}

/// Tokens and signing secrets are [`Secret`]s from the moment they are read.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Secret::new)
    }
}

/// Declares a [`Text`] marker: its doc, name, value type, parser, and the code of a bad
/// value where its rule has one.
macro_rules! text {
    ($(#[$doc:meta])* $name:ident: $value:ty = $parse:expr $(, $code:literal)?) => {
        $(#[$doc])*
        pub(super) struct $name;
        impl $crate::config::de::Text for $name {
            type Value = $value;
            const PARSE: fn(&str) -> Result<$value, String> = $parse;
            $(const CODE: Option<&'static str> = Some($code);)?
        }
    };
}
pub(super) use text;

text!(/// A size (`64KiB`), in bytes.
    Size: u64 = |t| parse_size(t).map_err(|e| e.to_string()));
text!(/// A URL (its text is never repeated: it may carry a credential).
    Link: Url = parse_url);
text!(/// A CIDR network or a bare address.
    Net: IpNet = parse_net);
text!(/// A browser origin, as its ASCII serialization.
    Origin: String = parse_origin);
text!(/// An extra `Host` name, lowercased.
    HostEntry: String = parse_host_entry);
text!(/// A signing target pattern.
    Target: TargetPattern = parse_target);
text!(/// A `[[host]]` key, normalised as live targets' are (`validate` checks its form).
    HostKey: String = |t| Ok(normalize_host_key(t)));
text!(/// An `[[endpoint]]` key, normalised as live targets' are.
    EndpointKey: String = |t| Ok(normalize_endpoint_key(t)));
text!(/// A duration (`30s`); a bad one is `invalid_duration`, in whichever section.
    Dur: Duration = parse_duration_text, "invalid_duration");
text!(/// The jitter mode (`equal`, `full`, `none`, any case); a bad one is `invalid_value`.
    JitterMode: Jitter = |t| t.trim().to_ascii_lowercase().parse().map_err(|e: UnknownName| e.to_string()),
    "invalid_value");

/// One of the names of a model enum (`stripe`, `fifo`, `block`), read with its `FromStr`.
pub(super) struct Name<T>(PhantomData<T>);
impl<T: FromStr<Err = UnknownName>> Text for Name<T> {
    type Value = T;
    const PARSE: fn(&str) -> Result<T, String> = |t| t.trim().parse().map_err(|e: UnknownName| e.to_string());
}
