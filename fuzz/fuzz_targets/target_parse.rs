//! Fuzzes target resolution (all four forms): arbitrary text as the `Courier-Target` header,
//! as an absolute-form or origin-form request target, and as a route path. Never panics, and
//! whatever it accepts is an http(s) URL with a host, no credentials and no fragment.
#![no_main]

use libfuzzer_sys::fuzz_target;

fn check(url: &url::Url) {
    assert!(url.scheme() == "http" || url.scheme() == "https", "{url}");
    assert!(url.host_str().is_some_and(|h| !h.is_empty()), "{url}");
    assert!(url.username().is_empty() && url.password().is_none(), "{url}");
    assert!(url.fragment().is_none(), "{url}");
    assert!(url.as_str().len() <= courier::target::MAX_TARGET_LEN, "{url}");
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let route = url::Url::parse("https://route.example/base?k=v").unwrap();
    let routes = |name: &str| (name == "billing").then(|| route.clone());
    let origin: http::Uri = "/".parse().unwrap();
    // Form 1: the header.
    if let Ok(t) = courier::target::resolve_target(Some(text), &origin, &routes) {
        check(&t.url);
    }
    // Forms 2-4: whatever request target hyper would accept.
    for candidate in [
        text.to_string(),
        format!("/{text}"),
        format!("/r/{text}"),
        format!("/r/billing/{text}"),
    ] {
        if let Ok(uri) = candidate.parse::<http::Uri>() {
            if let Ok(t) = courier::target::resolve_target(None, &uri, &routes) {
                check(&t.url);
                let _ = courier::target::default_endpoint_key(&t.url);
                let _ = courier::target::host_key(&t.url);
            }
        }
    }
});
