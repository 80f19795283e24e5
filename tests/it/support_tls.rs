//! TLS test support: certificates made with rcgen ([`Pki`]), and a real TLS receiver
//! ([`TlsFront`]): a tokio-rustls server that terminates TLS (optionally requiring a client
//! certificate chained to a CA it trusts) and pipes the plain bytes to a
//! [`crate::support::Receiver`], so the receiver's recording is reused as is.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, SupportedProtocolVersion};

use crate::support::{eventually, Receiver};

/// A CA, with the files it writes in a temporary folder.
pub struct Pki {
    pub dir: tempfile::TempDir,
    issuer: Issuer<'static, KeyPair>,
    ca_der: CertificateDer<'static>,
    /// The CA certificate, PEM.
    pub ca_file: PathBuf,
}

/// A certificate the CA issued, and its key, as DER and as PEM files.
pub struct Leaf {
    pub der: CertificateDer<'static>,
    key_der: Vec<u8>,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

impl Pki {
    /// A new CA named `name`; its certificate is written to `<name>-ca.pem`.
    pub fn new(name: &str) -> Pki {
        let dir = tempfile::tempdir().unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        let ca = params.self_signed(&key).unwrap();
        let ca_file = dir.path().join(format!("{name}-ca.pem"));
        std::fs::write(&ca_file, ca.pem()).unwrap();
        Pki {
            dir,
            issuer: Issuer::new(params, key),
            ca_der: ca.der().clone(),
            ca_file,
        }
    }

    /// A certificate for `names` (DNS names or IP addresses), written to `<file>.pem` and
    /// `<file>.key`.
    pub fn leaf(&self, file: &str, names: &[&str]) -> Leaf {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_file, key_file) = (
            self.dir.path().join(format!("{file}.pem")),
            self.dir.path().join(format!("{file}.key")),
        );
        std::fs::write(&cert_file, cert.pem()).unwrap();
        std::fs::write(&key_file, key.serialize_pem()).unwrap();
        Leaf {
            der: cert.der().clone(),
            key_der: key.serialize_der(),
            cert_file,
            key_file,
        }
    }

    /// A server config presenting a certificate for `localhost` and `127.0.0.1`, offering
    /// `versions` and HTTP/1.1, requiring a client certificate issued by `clients` if given.
    pub fn server(&self, versions: &[&'static SupportedProtocolVersion], clients: Option<&Pki>) -> Arc<ServerConfig> {
        self.server_with(&["localhost", "127.0.0.1"], versions, clients)
    }

    /// A server config presenting a certificate for `names` only (no client certificate).
    pub fn server_for(&self, names: &[&str], versions: &[&'static SupportedProtocolVersion]) -> Arc<ServerConfig> {
        self.server_with(names, versions, None)
    }

    fn server_with(
        &self,
        names: &[&str],
        versions: &[&'static SupportedProtocolVersion],
        clients: Option<&Pki>,
    ) -> Arc<ServerConfig> {
        let leaf = self.leaf("server", names);
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .unwrap();
        let builder = match clients {
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                roots.add(ca.ca_der.clone()).unwrap();
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .build()
                    .unwrap();
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let key = PrivateKeyDer::try_from(leaf.key_der.clone()).unwrap();
        let mut config = builder.with_single_cert(vec![leaf.der.clone()], key).unwrap();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Arc::new(config)
    }
}

/// One TLS handshake the front saw.
#[derive(Debug, Clone)]
pub struct Handshake {
    /// Why it failed (rustls's reason), or `None` when it succeeded.
    pub error: Option<String>,
    /// The client certificate presented (verified against the client CA), if any.
    pub client_cert: Option<CertificateDer<'static>>,
}

/// A TLS receiver on 127.0.0.1 in front of a plain [`Receiver`].
pub struct TlsFront {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Handshake>>>,
}

impl TlsFront {
    /// Serves `config` on 127.0.0.1:0, piping each connection to `rx`.
    pub async fn start(config: Arc<ServerConfig>, rx: &Receiver) -> TlsFront {
        Self::start_on(config, rx, "127.0.0.1:0".parse().unwrap()).await
    }

    /// Serves `config` on `addr` (e.g. a port held by `reserve_port`, to bring a receiver
    /// that was down up), piping each connection to `rx`.
    pub async fn start_on(config: Arc<ServerConfig>, rx: &Receiver, addr: SocketAddr) -> TlsFront {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<Handshake>>> = Arc::default();
        let (log, upstream) = (seen.clone(), rx.addr);
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, log) = (acceptor.clone(), log.clone());
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(tcp).await {
                        Ok(tls) => tls,
                        Err(e) => {
                            log.lock().unwrap().push(Handshake {
                                error: Some(e.to_string()),
                                client_cert: None,
                            });
                            return;
                        }
                    };
                    let client_cert = tls.get_ref().1.peer_certificates().and_then(|c| c.first().cloned());
                    log.lock().unwrap().push(Handshake {
                        error: None,
                        client_cert,
                    });
                    if let Ok(mut plain) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                    }
                });
            }
        });
        TlsFront { addr, seen }
    }

    /// `https://localhost:<port><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("https://localhost:{}{path}", self.addr.port())
    }

    /// `localhost:<port>`, as a `[[host]]` entry names it.
    pub fn host(&self) -> String {
        format!("localhost:{}", self.addr.port())
    }

    /// Every handshake so far.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.seen.lock().unwrap().clone()
    }

    /// Waits until a handshake failed; returns its reason.
    pub async fn failed_handshake(&self) -> String {
        eventually("a failed handshake", || async {
            self.handshakes().into_iter().find_map(|h| h.error)
        })
        .await
    }
}

/// A TOML string literal of a path.
pub fn toml_path(p: &std::path::Path) -> String {
    format!("{:?}", p.display().to_string())
}
