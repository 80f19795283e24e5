//! The web view's files and answers: served with their headers, nothing inline the CSP
//! would have to allow, nothing fetched from elsewhere, and data only ever written as text.

use http_body_util::BodyExt;

use super::*;

fn body(r: Response<Body>) -> String {
    let bytes = block_on(r.into_body().collect()).unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// `Full` is ready at once: one poll collects it.
fn block_on<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap()
        .block_on(f)
}

#[test]
fn each_file_is_served_with_its_type_and_every_security_header() {
    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/", "text/html; charset=utf-8"),
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/dom.js", "text/javascript; charset=utf-8"),
        ("/ui/style.css", "text/css; charset=utf-8"),
    ] {
        for method in [Method::GET, Method::HEAD] {
            let r = respond(&method, path, true).unwrap_or_else(|| panic!("{path} is a UI path"));
            assert_eq!(r.status(), StatusCode::OK, "{path}");
            assert_eq!(r.headers()["content-type"], content_type, "{path}");
            for (name, value) in SECURITY_HEADERS {
                assert_eq!(r.headers()[name], value, "{path}: {name}");
            }
        }
    }
}

#[test]
fn other_paths_are_the_apis_and_other_methods_are_refused() {
    for path in ["/", "/uix", "/ui/other.js", "/ui/../metrics", "/deliveries", "/healthz"] {
        assert!(respond(&Method::GET, path, false).is_none(), "{path}");
    }
    for method in [Method::POST, Method::PUT, Method::DELETE] {
        let r = respond(&method, "/ui", false).unwrap();
        assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert!(body(r).contains("\"error\":\"method_not_allowed\""));
    }
}

#[test]
fn the_shell_says_only_whether_a_token_is_needed() {
    let with = body(respond(&Method::GET, "/ui", true).unwrap());
    let without = body(respond(&Method::GET, "/ui", false).unwrap());
    assert!(with.contains("data-auth=\"token\""), "{with}");
    assert!(without.contains("data-auth=\"none\""), "{without}");
    assert!(!with.contains(AUTH_MARK) && !without.contains(AUTH_MARK));
    // Otherwise the same bytes: the shell holds no data.
    assert_eq!(with.replace("data-auth=\"token\"", "data-auth=\"none\""), without);
}

#[test]
fn the_page_needs_nothing_inline_and_nothing_from_elsewhere() {
    // No inline script or style: the CSP allows neither.
    let html = INDEX_HTML.to_ascii_lowercase();
    assert_eq!(html.matches("<script").count(), 2, "the helpers and the app");
    assert!(
        html.contains("<script src=\"/ui/dom.js\" defer></script>\n<script src=\"/ui/app.js\" defer></script>"),
        "{html}"
    );
    assert!(
        html.contains("<link rel=\"stylesheet\" href=\"/ui/style.css\">"),
        "{html}"
    );
    for inline in [
        "<style",
        " style=",
        " onclick=",
        " onload=",
        " onsubmit=",
        "javascript:",
    ] {
        assert!(!html.contains(inline), "index.html has {inline}");
    }
    assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"), "{CONTENT_SECURITY_POLICY}");
    // No other host: the page works on a machine with no network.
    for file in [INDEX_HTML, APP_JS, DOM_JS, STYLE_CSS] {
        // (An SVG's namespace is a name, not a fetch.)
        let file = file.replace("xmlns='http://www.w3.org/2000/svg'", "");
        for far in ["http://", "https://", "//cdn", "@import"] {
            assert!(!file.contains(far), "{far} in a UI file");
        }
    }
}

#[test]
fn the_script_writes_data_only_as_text() {
    // Values from apps and receivers (targets, endpoint keys, error texts) go through
    // textContent and createElement; these would parse them as markup or code.
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "eval(",
        "new Function",
        "setTimeout(\"",
        "createContextualFragment",
        ".href =",
        "localStorage",
        "document.cookie",
    ] {
        assert!(!APP_JS.contains(sink) && !DOM_JS.contains(sink), "a script uses {sink}");
    }
    // The token is kept for this tab only, and sent as a bearer token.
    assert!(APP_JS.contains("sessionStorage"));
    assert!(APP_JS.contains("\"Bearer \""));
}
