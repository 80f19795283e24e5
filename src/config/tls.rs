//! `[tls]` and the TLS keys of `[[host]]`: which roots courier trusts toward receivers,
//! extra CA bundles, client certificates (mTLS) per host, and the lowest TLS version.
//!
//! Values only (config is below the I/O layer). The PEM files are read, parsed and matched
//! (a key against its certificate) by `crate::outbound::tls::TlsMaterial::from_config`, which
//! `courier serve` and `courier check-config` run right after loading the configuration
//! (`crate::cli::load_checked`), so a bad file is refused at start, not at the first
//! delivery.

use std::path::PathBuf;

use serde::{Deserialize, Deserializer};

use super::validate::rule;
use super::ConfigError;

section! {
    /// `[tls]`.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct TlsConfig {
        /// The root certificates trusted for every receiver.
        pub roots: TlsRoots = TlsRoots::Webpki,
        /// Extra CA bundles (PEM) trusted for every receiver, besides `roots`: `"ca.pem"` or
        /// `["a.pem", "b.pem"]`.
        pub ca_file: Vec<PathBuf> ["one_or_many"] = Vec::new(),
        /// The lowest TLS version offered.
        pub min_version: TlsVersion = TlsVersion::Tls12,
    }
}

spelled! {
    /// `tls.roots`: where the trusted roots come from.
    pub enum TlsRoots {
        /// The Mozilla set compiled in (`webpki-roots`): the same on every machine.
        #[default]
        Webpki = "webpki",
        /// The system's store (`rustls-native-certs`: `/etc/ssl/certs` and friends, or
        /// `SSL_CERT_FILE`/`SSL_CERT_DIR`), where corporate roots are usually installed.
        Native = "native",
        /// Both of them.
        Both = "both",
    }
}

spelled! {
    /// `tls.min_version`.
    pub enum TlsVersion {
        /// TLS 1.2 and 1.3.
        #[default]
        Tls12 = "1.2",
        /// TLS 1.3 only.
        Tls13 = "1.3",
    }
}

section! {
    /// The TLS keys of one `[[host]]` entry (written beside its other keys: `shape` gathers
    /// them for this struct). Per host, because connections are pooled per `host:port`: a
    /// pooled connection carries exactly one client identity.
    #[derive(Clone, PartialEq, Eq, Deserialize)]
    #[serde(default, deny_unknown_fields)]
    pub struct HostTls {
        /// CA bundles trusted for this host only, besides the global roots and `tls.ca_file`.
        pub ca_file: Vec<PathBuf> ["one_or_many"] = Vec::new(),
        /// The client certificate chain (PEM) presented to this host.
        pub client_cert: Option<PathBuf> = None,
        /// The client certificate's private key (PEM: PKCS#8, PKCS#1 or SEC1).
        pub client_key: Option<PathBuf> = None,
    }
}

impl HostTls {
    /// Whether the entry sets any TLS key (else the host uses the global TLS settings).
    pub fn is_set(&self) -> bool {
        !self.ca_file.is_empty() || self.client_cert.is_some() || self.client_key.is_some()
    }

    /// `host[i]`'s rules the types cannot express: a certificate needs its key and back.
    pub(super) fn validate(&self, i: usize) -> Result<(), ConfigError> {
        let (cert, key) = (format!("host[{i}].client_cert"), format!("host[{i}].client_key"));
        let (has_cert, has_key) = (self.client_cert.is_some(), self.client_key.is_some());
        rule(has_cert && !has_key, &cert, format_args!("needs {key}"))?;
        rule(has_key && !has_cert, &key, format_args!("needs {cert}"))?;
        check_paths(&format!("host[{i}].ca_file"), &self.ca_file)
    }
}

impl TlsConfig {
    /// The rules the types cannot express; the files themselves are checked by
    /// [`crate::outbound::tls::TlsMaterial::from_config`].
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        check_paths("tls.ca_file", &self.ca_file)
    }
}

fn check_paths(key: &str, paths: &[PathBuf]) -> Result<(), ConfigError> {
    let empty = paths.iter().position(|p| p.as_os_str().is_empty());
    empty.map_or(Ok(()), |i| rule(true, &format!("{key}[{i}]"), "must not be empty"))
}

/// A path or a list of paths.
pub(super) fn one_or_many<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged, expecting = "a path or a list of paths")]
    enum OneOrMany {
        One(PathBuf),
        Many(Vec<PathBuf>),
    }
    Ok(match OneOrMany::deserialize(d)? {
        OneOrMany::One(p) => vec![p],
        OneOrMany::Many(ps) => ps,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    #[test]
    fn the_section_overlays_the_defaults() {
        let c = Config::from_toml_str("", "t").unwrap();
        assert_eq!(c.tls, TlsConfig::default());
        assert_eq!(
            (c.tls.roots, c.tls.min_version, c.tls.ca_file.len()),
            (TlsRoots::Webpki, TlsVersion::Tls12, 0)
        );
        let c = Config::from_toml_str("[tls]\nroots = \"both\"\nca_file = \"/etc/ca.pem\"\n", "t").unwrap();
        assert_eq!(
            c.tls,
            TlsConfig {
                roots: TlsRoots::Both,
                ca_file: vec![PathBuf::from("/etc/ca.pem")],
                min_version: TlsVersion::Tls12,
            }
        );
        let c = Config::from_toml_str(
            "[tls]\nroots = \"native\"\nca_file = [\"a.pem\", \"b.pem\"]\nmin_version = \"1.3\"\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.tls.ca_file, [PathBuf::from("a.pem"), PathBuf::from("b.pem")]);
        assert_eq!((c.tls.roots, c.tls.min_version), (TlsRoots::Native, TlsVersion::Tls13));
    }

    #[test]
    fn host_entries_carry_their_tls_keys() {
        let c = Config::from_toml_str(
            "[[host]]\nhost = \"API.example:443\"\nca_file = \"ca.pem\"\nclient_cert = \"c.pem\"\nclient_key = \"k.pem\"\n\
             [[host]]\nhost = \"b.example:443\"\nmax_in_flight = 3\n",
            "t",
        )
        .unwrap();
        let h = &c.hosts[0];
        assert_eq!((h.host.as_str(), h.max_in_flight), ("api.example:443", None));
        assert_eq!(
            h.tls,
            HostTls {
                ca_file: vec![PathBuf::from("ca.pem")],
                client_cert: Some(PathBuf::from("c.pem")),
                client_key: Some(PathBuf::from("k.pem")),
            }
        );
        assert!(h.tls.is_set() && !c.hosts[1].tls.is_set());
        assert_eq!(c.hosts[1].max_in_flight, Some(3));
    }

    #[test]
    fn mistakes_name_their_key() {
        for (toml, problem) in [
            ("[tls]\nroots = \"system\"\n", "tls.roots"),
            ("[tls]\nmin_version = \"1.1\"\n", "tls.min_version"),
            ("[tls]\nca_file = 3\n", "tls.ca_file"),
            ("[tls]\nca = \"x.pem\"\n", "unknown key \"tls.ca\""),
            ("[[host]]\nhost = \"a:1\"\nclient_crt = \"x\"\n", "client_crt"),
        ] {
            let e = Config::from_toml_str(toml, "t").unwrap_err().to_string();
            assert!(e.contains(problem), "{toml}: {e}");
        }
        for (toml, problem) in [
            (
                "[[host]]\nhost = \"a:1\"\nclient_cert = \"c.pem\"\n",
                "host[0].client_cert needs host[0].client_key",
            ),
            (
                "[[host]]\nhost = \"a:1\"\nclient_key = \"k.pem\"\n",
                "host[0].client_key needs host[0].client_cert",
            ),
            ("[tls]\nca_file = [\"\"]\n", "tls.ca_file[0] must not be empty"),
            ("[[host]]\nhost = \"a:1\"\nmax_in_flight = 0\n", "host[0].max_in_flight"),
        ] {
            let c = Config::from_toml_str(toml, "t").unwrap();
            let e = c.validate().unwrap_err().to_string();
            assert!(e.contains(problem), "{toml}: {e}");
        }
    }
}
