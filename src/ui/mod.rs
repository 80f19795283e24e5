//! The web view: `GET /ui` on the admin listener, one page over the admin JSON API (queue
//! depth and rates, endpoints with pause and resume, dead letters with replay, a delivery's
//! attempts) for a developer who would rather look than read JSON.
//!
//! How it is protected, and why this shape:
//!
//! - **The page is a static shell.** `/ui` and its script and style files are compiled
//!   into the binary (`include_str!`) and hold no data, so they are served without the
//!   token: a browser cannot send `Authorization` on a navigation. The one thing the shell
//!   says is whether `admin_token` is set (`data-auth`), so the page asks for the token
//!   before its first call instead of after a 401.
//! - **The data comes from the admin API**, fetched by the page with
//!   `Authorization: Bearer <token>`; the token is typed once and kept in `sessionStorage`
//!   (this tab only, gone when it closes). No cookie, so a page elsewhere cannot make the
//!   browser send the token for it (no CSRF surface), and the API stays exactly as guarded
//!   as it is for the CLI.
//! - **Only this origin may call.** Admin refuses browser requests from other origins as
//!   before; it accepts the page's own, same-origin ones (see [`crate::inbound::access`]).
//! - **Strict headers** on every UI answer ([`SECURITY_HEADERS`]): a CSP that allows only
//!   this origin's script, style and API (no inline script, no `eval`, no framing, no other
//!   host), `X-Frame-Options: DENY`, `Referrer-Policy: no-referrer`, `Cache-Control:
//!   no-store`, `nosniff`, and same-origin opener and resource policies.
//! - **Everything shown is text.** Targets, endpoint keys and error texts come from apps and
//!   receivers; the script builds the page with `textContent` and `createElement`, never
//!   `innerHTML` (a unit test below holds it to that).
//!
//! The handler is pure (path in, answer out): no store, no clock.

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Method, Response, StatusCode};

use crate::inbound::serve::{self, Body};

/// The page: markup only; script and style are separate files, so the CSP needs no
/// `'unsafe-inline'`.
const INDEX_HTML: &str = include_str!("index.html");
/// The page's script: plain JavaScript, no framework, no build step.
const APP_JS: &str = include_str!("app.js");
/// The script's helpers (elements and text nodes, formatting), loaded before it.
const DOM_JS: &str = include_str!("dom.js");
/// The page's style.
const STYLE_CSS: &str = include_str!("style.css");

/// In [`INDEX_HTML`], replaced by `token` or `none`.
const AUTH_MARK: &str = "__COURIER_AUTH__";

/// `Content-Security-Policy` of the UI: script, style and fetches from this origin only,
/// images only as `data:` URLs (the icon), nothing else, and never in a frame.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The headers every UI answer carries.
pub const SECURITY_HEADERS: [(&str, &str); 7] = [
    ("content-security-policy", CONTENT_SECURITY_POLICY),
    ("x-frame-options", "DENY"),
    ("referrer-policy", "no-referrer"),
    ("cache-control", "no-store"),
    ("x-content-type-options", "nosniff"),
    ("cross-origin-opener-policy", "same-origin"),
    ("cross-origin-resource-policy", "same-origin"),
];

/// The answer for a UI path (`/ui`, `/ui/`, `/ui/app.js`, `/ui/dom.js`, `/ui/style.css`),
/// or `None` for any other path (the admin API's). `token_required`: whether `admin_token`
/// is set.
pub fn respond(method: &Method, path: &str, token_required: bool) -> Option<Response<Body>> {
    let (content_type, body) = match path {
        "/ui" | "/ui/" => (
            "text/html; charset=utf-8",
            Bytes::from(INDEX_HTML.replace(AUTH_MARK, if token_required { "token" } else { "none" })),
        ),
        "/ui/app.js" => ("text/javascript; charset=utf-8", Bytes::from_static(APP_JS.as_bytes())),
        "/ui/dom.js" => ("text/javascript; charset=utf-8", Bytes::from_static(DOM_JS.as_bytes())),
        "/ui/style.css" => ("text/css; charset=utf-8", Bytes::from_static(STYLE_CSS.as_bytes())),
        _ => return None,
    };
    if method != Method::GET && method != Method::HEAD {
        return Some(serve::error(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}; the web view is read with GET"),
        ));
    }
    let mut answer = Response::builder()
        .status(StatusCode::OK)
        .header(http::header::CONTENT_TYPE, content_type);
    for (name, value) in SECURITY_HEADERS {
        answer = answer.header(name, value);
    }
    Some(answer.body(Full::new(body)).expect("static response parts are valid"))
}

#[cfg(test)]
mod tests;
