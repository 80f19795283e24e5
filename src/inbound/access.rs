//! Who may talk to ingress and admin: server-side clients, never a web page.
//!
//! courier signs what reaches ingress with the operator's secrets, and the admin API
//! replays, deletes and pauses. Both listen on loopback, which a browser on the same machine
//! can reach too. Two browser-only paths are closed here:
//!
//! - **Cross-site requests.** A page can POST to `http://127.0.0.1:8787/…` (a "simple"
//!   request needs no preflight). Browsers mark every such request with `Origin` and
//!   `Sec-Fetch-Site`; server-side HTTP clients send neither. So a request with an `Origin`
//!   not listed in `allowed_origins`, or with `Sec-Fetch-Site` other than `none` (a request
//!   the user typed), is refused: 403 `cross_site_refused`. Ingress is stricter: it has no
//!   browser use at all, and `none` is also what a link clicked in a mail or chat app sends,
//!   so there any `Sec-Fetch-Site` is refused unless the origin is listed. (Not the other
//!   `Sec-Fetch-*` headers: Node's built-in fetch sends `Sec-Fetch-Mode: cors`.)
//!   One browser page is admin's own: the web view (`GET /ui`, see [`crate::ui`]) calls the
//!   API from the admin listener's origin. So admin also takes `Sec-Fetch-Site: same-origin`
//!   and an `Origin` that is its own (`http://` + the request's `Host`). Browsers set both
//!   headers themselves; a page elsewhere cannot claim them, and a page on a rebound name has
//!   that name in `Host`, which the check below refuses. Same-site is still refused: another
//!   local server (`http://127.0.0.1:3000`) is same-site with courier, not same-origin.
//! - **DNS rebinding.** A page on `evil.example` can re-point its own name at 127.0.0.1 and
//!   then make same-origin requests (no `Origin` check helps there), but the `Host` header
//!   still names `evil.example`. An origin-form request must therefore name an IP literal
//!   (rebinding needs a name; a literal also covers the listener's own address, behind NAT
//!   or dual-stack too), a loopback name (`localhost`, `*.localhost`), or a name listed in
//!   `hosts`: otherwise 421 `misdirected_request`. Absolute-form
//!   requests (`POST http://receiver/… HTTP/1.1`, as an app with `HTTP_PROXY` sends) carry
//!   the target as their authority and cannot come from a browser, so they are not checked.
//!   Nor is a Unix-socket listener: no browser can reach a socket file, and clients name its
//!   host arbitrarily (`http://docker/`, `http://unix/`).
//! - **Unmarked browser requests.** Older browsers send no Fetch Metadata, and an `<img>`
//!   or a link makes a `GET` with no `Origin`. Such a request cannot carry a custom header,
//!   so on ingress an origin-form `GET`/`HEAD` with no `Courier-*` header and no
//!   `Proxy-Authorization` is refused (403 `cross_site_refused`) unless `ingress.allow_get`
//!   is set. Any other method of a page without Fetch Metadata (a form's POST) is not
//!   signed either unless it names a target, which it can only do in the path; those are
//!   what `allowed_origins` and the token are for.
//!
//! Pure: the caller passes the request's parts.

use std::borrow::Cow;
use std::net::IpAddr;

use http::{HeaderMap, Method, Uri};

use crate::inbound::serve::Refusal;
use crate::outbound::egress::is_loopback_name;

/// The browser rules of one listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    /// Config section named in error messages (`ingress` or `admin`).
    section: &'static str,
    /// Refuse every request with Fetch Metadata, even `Sec-Fetch-Site: none` (ingress).
    strict: bool,
    /// Origins allowed to send cross-site (ASCII serialisation, e.g. `https://app.example`).
    allowed_origins: Vec<String>,
    /// Extra `Host` names (lowercase, optionally `:port`).
    hosts: Vec<String>,
    /// Skip the `Host` check (a Unix-socket listener).
    any_host: bool,
    /// Refuse unmarked origin-form `GET`/`HEAD` (ingress without `allow_get`).
    refuse_plain_get: bool,
}

/// A browser's cross-site request: 403 `cross_site_refused`.
fn cross_site(message: String) -> Refusal {
    Refusal::new(http::StatusCode::FORBIDDEN, "cross_site_refused", message)
}

impl AccessPolicy {
    /// The rules of the listener configured in `section` (`ingress` or `admin`); ingress is
    /// strict about Fetch Metadata.
    pub fn new(section: &'static str, allowed_origins: Vec<String>, hosts: Vec<String>) -> Self {
        AccessPolicy {
            section,
            strict: section == "ingress",
            allowed_origins: allowed_origins.into_iter().map(|o| o.to_ascii_lowercase()).collect(),
            hosts: hosts.into_iter().map(|h| h.to_ascii_lowercase()).collect(),
            any_host: false,
            refuse_plain_get: false,
        }
    }

    /// Ingress's rules: strict about Fetch Metadata; `unix_socket` serves any `Host`;
    /// unless `allow_get`, unmarked `GET`/`HEAD` requests are refused.
    pub fn ingress(config: &crate::config::IngressConfig, unix_socket: bool) -> Self {
        AccessPolicy {
            any_host: unix_socket,
            refuse_plain_get: !config.allow_get,
            ..AccessPolicy::new("ingress", config.allowed_origins.clone(), config.hosts.clone())
        }
    }

    /// Checks one request.
    pub fn check(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), Refusal> {
        self.check_cross_site(headers)?;
        if uri.authority().is_none() {
            if !self.any_host {
                self.check_host(headers)?;
            }
            if self.refuse_plain_get && is_unmarked_get(method, headers) {
                return Err(cross_site(
                    "a GET or HEAD with no Courier-* header may come from a web page (an image or a link); \
                     send the webhook with its own method and a Courier-* header, or set ingress.allow_get = true"
                        .into(),
                ));
            }
        }
        Ok(())
    }

    fn check_cross_site(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        let section = self.section;
        if let Some(origin) = lowercase(headers, http::header::ORIGIN) {
            if self.allowed_origins.iter().any(|o| *o == *origin) {
                return Ok(());
            }
            // The web view's own requests carry admin's own origin (a POST always has
            // Origin); their Sec-Fetch-Site is checked below.
            if self.strict || !is_own_origin(&origin, headers) {
                return Err(cross_site(format!(
                    "requests from web pages are refused (Origin {}); courier serves server-side \
                     clients, and an operator can list an origin in {section}.allowed_origins",
                    crate::redact::escape(&origin)
                )));
            }
        }
        match headers.get("sec-fetch-site").map(|v| v.as_bytes()) {
            None => Ok(()),
            // On ingress even `none` is a browser navigation.
            Some(v) if self.strict => Err(cross_site(format!(
                "requests from browsers are refused (Sec-Fetch-Site {}); ingress serves server-side clients",
                crate::redact::escape(&String::from_utf8_lossy(v))
            ))),
            // `same-origin`: the web view's fetches.
            Some(v) if v.eq_ignore_ascii_case(b"none") || v.eq_ignore_ascii_case(b"same-origin") => Ok(()),
            Some(v) => Err(cross_site(format!(
                "requests from web pages are refused (Sec-Fetch-Site {}); courier serves \
                 server-side clients",
                crate::redact::escape(&String::from_utf8_lossy(v))
            ))),
        }
    }

    fn check_host(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        // HTTP/1.0 clients may send no Host; browsers always send one.
        let Some(raw) = lowercase(headers, http::header::HOST) else {
            return Ok(());
        };
        let (name, port) = split_host_port(&raw);
        let name = name.strip_suffix('.').unwrap_or(name);
        // Any IP literal: DNS rebinding needs a name, and the listener may be reached at
        // addresses it cannot know (NAT, a dual-stack socket's mapped form).
        let ok = name.parse::<IpAddr>().is_ok() || is_loopback_name(name) || self.host_listed(name, port);
        if ok {
            return Ok(());
        }
        Err(Refusal::new(
            http::StatusCode::MISDIRECTED_REQUEST,
            "misdirected_request",
            format!(
                "Host {} is not a name of this listener (an IP address, localhost, or one listed \
             in {}.hosts); a DNS name pointed at courier is refused",
                crate::redact::escape(&raw),
                self.section
            ),
        ))
    }

    fn host_listed(&self, name: &str, port: Option<&str>) -> bool {
        self.hosts.iter().any(|h| {
            let (n, p) = split_host_port(h);
            n.strip_suffix('.').unwrap_or(n) == name && p.is_none_or(|p| Some(p) == port)
        })
    }
}

/// A `GET`/`HEAD` carrying nothing a web page could not send without a preflight: no
/// `Courier-*` header and no `Proxy-Authorization`.
fn is_unmarked_get(method: &Method, headers: &HeaderMap) -> bool {
    (method == Method::GET || method == Method::HEAD)
        && !headers.contains_key(http::header::PROXY_AUTHORIZATION)
        && !headers.keys().any(|name| name.as_str().starts_with("courier-"))
}

/// Whether `origin` (lowercase) is the origin the request was sent to: `http://` and its
/// `Host`. (The `Host` itself is checked separately against rebinding.)
fn is_own_origin(origin: &str, headers: &HeaderMap) -> bool {
    let host = lowercase(headers, http::header::HOST);
    host.is_some_and(|host| origin.strip_prefix("http://") == Some(&*host))
}

/// The header `name`, trimmed and lowercased: borrowed when it already is (a `Host` on
/// every accept), copied only when it must change.
fn lowercase(headers: &HeaderMap, name: http::HeaderName) -> Option<Cow<'_, str>> {
    let v = headers.get(name)?;
    Some(match String::from_utf8_lossy(v.as_bytes()) {
        Cow::Borrowed(text) => crate::headers::lowercased(text.trim()),
        Cow::Owned(text) => Cow::Owned(text.trim().to_ascii_lowercase()),
    })
}

/// `name:port`, `[v6]:port`, `name` or `[v6]` → (name without brackets, port).
fn split_host_port(text: &str) -> (&str, Option<&str>) {
    if let Some(rest) = text.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':')),
            None => (text, None),
        };
    }
    match text.rsplit_once(':') {
        // More than one colon without brackets: a bare IPv6 address, no port.
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (text, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(http::HeaderName::from_bytes(k.as_bytes()).unwrap(), v.parse().unwrap());
        }
        h
    }

    fn check(p: &AccessPolicy, uri: &str, pairs: &[(&str, &str)]) -> Result<(), &'static str> {
        p.check(&Method::POST, &uri.parse().unwrap(), &headers(pairs))
            .map_err(|e| e.code())
    }

    #[test]
    fn server_side_clients_pass() {
        let p = AccessPolicy::new("ingress", vec![], vec![]);
        for host in [
            "127.0.0.1:8787",
            "127.0.0.1",
            "127.9.9.9:1",
            "[::1]:8787",
            "[::ffff:127.0.0.1]:8787",
            "localhost:8787",
            "LOCALHOST.",
            "app.localhost:8787",
            "10.1.2.3:8787",
            "[2001:db8::1]:1",
            "192.0.2.7",
        ] {
            assert_eq!(check(&p, "/https://r.example/x", &[("host", host)]), Ok(()), "{host}");
        }
        assert_eq!(check(&p, "/x", &[]), Ok(()), "HTTP/1.0 without Host");
        assert_eq!(
            check(&p, "/x", &[("host", "127.0.0.1"), ("sec-fetch-site", "none")]),
            Err("cross_site_refused"),
            "ingress: even a navigation the user started (a link clicked in another app)"
        );
        let admin = AccessPolicy::new("admin", vec![], vec![]);
        assert_eq!(
            check(
                &admin,
                "/deliveries",
                &[("host", "127.0.0.1"), ("sec-fetch-site", "none")]
            ),
            Ok(()),
            "admin: a URL the operator typed"
        );
        // Node's fetch (undici) sends Sec-Fetch-Mode on every request: a server-side client.
        assert_eq!(
            check(&p, "/x", &[("host", "127.0.0.1"), ("sec-fetch-mode", "cors")]),
            Ok(())
        );
    }

    #[test]
    fn browsers_cross_site_are_refused() {
        let p = AccessPolicy::new("ingress", vec![], vec![]);
        let h = ("host", "127.0.0.1:8787");
        for extra in [
            ("origin", "https://evil.example"),
            ("origin", "null"),
            ("origin", "http://127.0.0.1:8787"),
            ("sec-fetch-site", "cross-site"),
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-site", "same-origin"),
        ] {
            assert_eq!(
                check(&p, "/https://evil.example/c", &[h, extra]),
                Err("cross_site_refused"),
                "{extra:?}"
            );
        }
        // Absolute form does not skip the browser check.
        assert_eq!(
            check(&p, "http://r.example/x", &[("origin", "https://evil.example")]),
            Err("cross_site_refused")
        );
    }

    #[test]
    fn the_web_view_calls_admin_from_its_own_origin_only() {
        let admin = AccessPolicy::new("admin", vec![], vec![]);
        let same = ("sec-fetch-site", "same-origin");
        for host in ["127.0.0.1:8788", "localhost:8788", "[::1]:8788", "127.0.0.1"] {
            let origin = format!("http://{host}");
            let h = ("host", host);
            assert_eq!(check(&admin, "/deliveries", &[h, same]), Ok(()), "GET from /ui: {host}");
            assert_eq!(
                check(&admin, "/deliveries/x/retry", &[h, ("origin", &origin), same]),
                Ok(()),
                "POST from /ui: {host}"
            );
            // A browser without Fetch Metadata still sends Origin on a POST.
            assert_eq!(check(&admin, "/x", &[h, ("origin", &origin.to_uppercase())]), Ok(()));
        }
        let h = ("host", "127.0.0.1:8788");
        for refused in [
            // Another local server is same-site with courier, not same-origin.
            &[h, ("origin", "http://127.0.0.1:3000"), ("sec-fetch-site", "same-site")][..],
            &[h, ("sec-fetch-site", "same-site")],
            &[h, ("origin", "http://127.0.0.1:3000"), same],
            &[h, ("origin", "https://127.0.0.1:8788"), same],
            &[h, ("origin", "http://127.0.0.1:8788.evil.example"), same],
            &[h, ("origin", "null"), same],
            &[h, ("origin", "http://127.0.0.1:8788"), ("sec-fetch-site", "cross-site")],
            // No Host to compare with: not its own origin.
            &[("origin", "http://127.0.0.1:8788"), same],
        ] {
            assert_eq!(
                check(&admin, "/deliveries", refused),
                Err("cross_site_refused"),
                "{refused:?}"
            );
        }
        // A rebound name is same-origin with itself, and still misdirected.
        let rebound = [
            ("host", "evil.example:8788"),
            ("origin", "http://evil.example:8788"),
            same,
        ];
        assert_eq!(check(&admin, "/deliveries", &rebound), Err("misdirected_request"));
        // Ingress has no page of its own.
        let ingress = AccessPolicy::new("ingress", vec![], vec![]);
        let own = [("host", "127.0.0.1:8787"), ("origin", "http://127.0.0.1:8787"), same];
        assert_eq!(check(&ingress, "/x", &own), Err("cross_site_refused"));
        assert_eq!(check(&ingress, "/x", &own[..2]), Err("cross_site_refused"));
    }

    #[test]
    fn listed_origins_may_send() {
        let p = AccessPolicy::new("admin", vec!["https://Ops.example".into()], vec![]);
        let h = ("host", "127.0.0.1");
        assert_eq!(
            check(
                &p,
                "/deliveries",
                &[h, ("origin", "https://ops.example"), ("sec-fetch-site", "cross-site")]
            ),
            Ok(())
        );
        assert_eq!(
            check(&p, "/deliveries", &[h, ("origin", "https://ops.example:8443")]),
            Err("cross_site_refused")
        );
    }

    #[test]
    fn rebound_names_are_misdirected_but_proxy_requests_pass() {
        let p = AccessPolicy::new("admin", vec![], vec!["courier".into(), "sidecar.internal:8788".into()]);
        for host in [
            "evil.example:8788",
            "evil.example",
            "localhost.evil.example",
            "a\u{e9}localhost",
        ] {
            assert_eq!(
                check(&p, "/deliveries", &[("host", host)]),
                Err("misdirected_request"),
                "{host}"
            );
        }
        for host in ["courier", "courier:8788", "COURIER.", "sidecar.internal:8788"] {
            assert_eq!(check(&p, "/deliveries", &[("host", host)]), Ok(()), "{host}");
        }
        assert_eq!(
            check(&p, "/x", &[("host", "sidecar.internal:9999")]),
            Err("misdirected_request")
        );
        // Absolute form: the authority is the target, Host follows it.
        assert_eq!(
            check(&p, "http://receiver.example/hook", &[("host", "receiver.example")]),
            Ok(())
        );
    }

    #[test]
    fn refusals_have_status_code_and_name_the_setting() {
        let p = AccessPolicy::new("ingress", vec![], vec![]);
        let e = p
            .check(
                &Method::POST,
                &"/x".parse().unwrap(),
                &headers(&[("host", "evil.example")]),
            )
            .unwrap_err();
        assert_eq!(e.response().status(), http::StatusCode::MISDIRECTED_REQUEST);
        assert!(e.to_string().contains("ingress.hosts"), "{e}");
        let e = p
            .check(
                &Method::POST,
                &"/x".parse().unwrap(),
                &headers(&[("origin", "https://e.example")]),
            )
            .unwrap_err();
        assert_eq!(e.response().status(), http::StatusCode::FORBIDDEN);
        assert!(e.to_string().contains("ingress.allowed_origins"), "{e}");
    }

    #[test]
    fn a_unix_socket_serves_any_host_and_plain_gets_are_refused_unless_allowed() {
        let mut config = crate::config::IngressConfig::default();
        let tcp = AccessPolicy::ingress(&config, false);
        let unix = AccessPolicy::ingress(&config, true);
        for host in ["courier", "docker", "unix", "evil.example:8787"] {
            let h = [("host", host)];
            assert_eq!(
                check(&tcp, "/https://r.example/x", &h),
                Err("misdirected_request"),
                "{host}"
            );
            assert_eq!(check(&unix, "/https://r.example/x", &h), Ok(()), "{host}");
        }
        // Fetch Metadata is still refused on the socket (nothing but a browser sends it).
        let marked = [("host", "courier"), ("sec-fetch-site", "cross-site")];
        assert_eq!(check(&unix, "/x", &marked), Err("cross_site_refused"));

        let get = |p: &AccessPolicy, method: Method, uri: &str, pairs: &[(&str, &str)]| {
            p.check(&method, &uri.parse().unwrap(), &headers(pairs))
                .map_err(|e| e.code())
        };
        let host = ("host", "127.0.0.1:8787");
        for method in [Method::GET, Method::HEAD] {
            let m = || method.clone();
            assert_eq!(
                get(&tcp, m(), "/https://r.example/x", &[host]),
                Err("cross_site_refused")
            );
            assert_eq!(
                get(&unix, m(), "/https://r.example/x", &[host]),
                Err("cross_site_refused")
            );
            for mark in [
                ("courier-endpoint", "e"),
                ("courier-token", "t"),
                ("proxy-authorization", "Bearer t"),
            ] {
                assert_eq!(
                    get(&tcp, m(), "/https://r.example/x", &[host, mark]),
                    Ok(()),
                    "{mark:?}"
                );
            }
            // Absolute form cannot come from a page.
            let proxied = [("host", "r.example")];
            assert_eq!(get(&tcp, m(), "http://r.example/x", &proxied), Ok(()));
        }
        assert_eq!(get(&tcp, Method::POST, "/https://r.example/x", &[host]), Ok(()));
        assert_eq!(get(&tcp, Method::DELETE, "/https://r.example/x", &[host]), Ok(()));
        config.allow_get = true;
        let open = AccessPolicy::ingress(&config, false);
        assert_eq!(get(&open, Method::GET, "/https://r.example/x", &[host]), Ok(()));
        let admin = AccessPolicy::new("admin", vec![], vec![]);
        assert_eq!(
            get(&admin, Method::GET, "/deliveries", &[host]),
            Ok(()),
            "admin reads with GET"
        );
    }

    #[test]
    fn host_port_splitting() {
        assert_eq!(split_host_port("a.example:80"), ("a.example", Some("80")));
        assert_eq!(split_host_port("a.example"), ("a.example", None));
        assert_eq!(split_host_port("[::1]:8787"), ("::1", Some("8787")));
        assert_eq!(split_host_port("[::1]"), ("::1", None));
        assert_eq!(split_host_port("::1"), ("::1", None));
    }
}
