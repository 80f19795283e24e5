//! `[signing]` ([`SigningConfig`]) and its named keys ([`SigningKey`]), which the file may
//! write as a list of secrets or as a table with `secrets` and `targets`.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::de::{self, Name, Target};
use super::summary::patterns;
use crate::model::SignatureScheme;
use crate::signing::scope::TargetPattern;
use crate::signing::Secret;

section! {
    /// Signature settings (`[signing]`).
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct SigningConfig {
        /// The scheme used when neither a route nor the message chooses one.
        pub scheme: SignatureScheme ["de::one::<Name<SignatureScheme>, _>"] = SignatureScheme::default(),
        /// Default secrets; all of them sign (rotation). Empty: unsigned unless a message
        /// brings one.
        pub secrets: Vec<Secret> = Vec::new(),
        /// Named secret sets, referenced by routes and by `Courier-Signing-Key`.
        pub keys: BTreeMap<String, SigningKey> = BTreeMap::new(),
    }
}

section! {
    /// One `[signing.keys]` entry: `name = ["whsec_…"]`, or
    /// `name = { secrets = ["whsec_…"], targets = ["https://*.billing.example/*"] }`.
    /// `Debug` shows the secrets as `Secret(***)` and the targets as written.
    // `remote = "Self"`: the derive reads the table form; the `Deserialize` impl below adds
    // the list form in front of it.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(remote = "Self", deny_unknown_fields)]
    pub struct SigningKey {
        /// The secrets; all of them sign (rotation).
        pub secrets: Vec<Secret> = Vec::new(),
        /// Where this key may sign; empty: anywhere.
        #[serde(default, deserialize_with = "de::list::<Target, _>")]
        pub targets: Vec<TargetPattern> = Vec::new() => patterns,
    }
}

/// Either spelling, read by hand rather than `#[serde(untagged)]` so a mistake in either
/// form gets serde's precise message (unknown key, wrong type) with its path, instead of
/// "data did not match any variant".
impl<'de> Deserialize<'de> for SigningKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = SigningKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of secrets or a table with secrets and targets")
            }

            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<SigningKey, A::Error> {
                let secrets = Vec::deserialize(SeqAccessDeserializer::new(seq))?;
                Ok(SigningKey {
                    secrets,
                    targets: Vec::new(),
                })
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<SigningKey, A::Error> {
                SigningKey::deserialize(MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_any(KeyVisitor)
    }
}
