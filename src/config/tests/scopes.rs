//! Signing key scopes: the table form of `[signing.keys]`, `targets` on keys and routes,
//! and the rule that a route's URL lies inside both.

use super::*;

fn scoped_toml() -> String {
    format!(
        r#"
[signing.keys]
billing = {{ secrets = ["sk-BILLING-5ecret"], targets = ["https://*.billing.example/*", "https://billing.example/hooks"] }}
partner = ["{STD_SECRET}"]

[signing.keys.legacy]
secrets = ["{STD_SECRET_2}", "{STD_SECRET}"]

[[route]]
name = "billing"
url = "https://billing.example/hooks"
signing_key = "billing"
scheme = "stripe"
targets = ["https://billing.example/hooks*"]

[[route]]
name = "partner"
url = "https://partner.example/in"
signing_key = "partner"
"#
    )
}

fn patterns(targets: &[TargetPattern]) -> Vec<&str> {
    targets.iter().map(TargetPattern::as_str).collect()
}

#[test]
fn keys_parse_in_both_forms_with_their_targets() {
    let c = parse(&scoped_toml());
    c.validate().unwrap();
    let billing = &c.signing.keys["billing"];
    assert_eq!(billing.secrets, [Secret::new("sk-BILLING-5ecret".into())]);
    assert_eq!(
        patterns(&billing.targets),
        ["https://*.billing.example/*", "https://billing.example/hooks"]
    );
    assert_eq!(c.signing_key("billing").map(<[Secret]>::len), Some(1));
    assert_eq!(patterns(c.signing_key_targets("billing")).len(), 2);
    // The list form and a table without targets are unscoped; an unknown key has no targets.
    assert_eq!(c.signing_key("partner").map(|s| s[0].expose()), Some(STD_SECRET));
    assert!(c.signing_key_targets("partner").is_empty());
    assert_eq!(c.signing_key("legacy").map(<[Secret]>::len), Some(2));
    assert!(c.signing_key_targets("legacy").is_empty());
    assert!(c.signing_key("nope").is_none() && c.signing_key_targets("nope").is_empty());
    assert_eq!(patterns(&c.routes[0].targets), ["https://billing.example/hooks*"]);
    assert!(c.routes[1].targets.is_empty());
    let target = Url::parse("https://eu.billing.example/x").unwrap();
    assert!(crate::signing::scope::allowed(
        c.signing_key_targets("billing"),
        &target
    ));
}

#[test]
fn bad_key_tables_and_patterns_name_the_key() {
    let cases: &[(&str, &str)] = &[
        (
            "[signing.keys]\nbilling = { secrets = [\"x\"], targets = [\"billing.example\"] }\n",
            "signing.keys.billing.targets[0]: \"billing.example\" is not a target pattern (no scheme)",
        ),
        (
            "[signing.keys]\nbilling = { secrets = [\"x\"], targets = [\"https://a.example/*\", \"https://a.*.example/*\"] }\n",
            "signing.keys.billing.targets[1]: \"https://a.*.example/*\" is not a target pattern",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\ntargets = [\"https://a.example/*\", \"ftp://a.example\"]\n",
            "route[0].targets[1]: \"ftp://a.example\" is not a target pattern (the scheme must be http or https)",
        ),
        (
            "[signing.keys]\nb = { targets = [\"https://a.example\"] }\n",
            "signing.keys.b: missing key \"secrets\"",
        ),
        (
            "[signing.keys]\nb = { secrets = [\"x\"], target = [] }\n",
            "unknown key \"signing.keys.b.target\" (line 2)",
        ),
        (
            "[signing.keys.b]\nsecrets = [\"x\"]\nscheme = \"stripe\"\n",
            "unknown key \"signing.keys.b.scheme\" (line 3)",
        ),
        (
            "[signing.keys]\nb = { secrets = [\"x\"], targets = \"https://a.example\" }\n",
            "signing.keys.b.targets: invalid type: a string, expected a sequence",
        ),
        (
            "[signing.keys]\nb = { secrets = \"sk-BILLING-5ecret\" }\n",
            "signing.keys.b.secrets: invalid type: a string, expected a sequence",
        ),
        (
            "[signing.keys]\nb = 3\n",
            "signing.keys.b: invalid type: integer `3`, expected a list of secrets or a table with secrets and targets",
        ),
        (
            "[[route]]\nname = \"a\"\nurl = \"https://a.example\"\ntarget = []\n",
            "unknown key \"route[0].target\" (line 4)",
        ),
    ];
    assert_file_errors(cases);
}

#[test]
fn a_route_must_lie_inside_its_targets_and_its_keys() {
    let key = "[signing.keys]\nbilling = { secrets = [\"sk-BILLING-5ecret\"], targets = [\"https://*.billing.example/*\"] }\n";
    let cases: &[(String, &str)] = &[
        (
            format!("{key}[[route]]\nname = \"r\"\nurl = \"https://evil.example/h\"\nsigning_key = \"billing\"\nscheme = \"stripe\""),
            "invalid config: route[0].url \"https://evil.example/h\" is outside the targets of signing key \"billing\"",
        ),
        (
            format!("{key}[[route]]\nname = \"r\"\nurl = \"https://billing.example/h\"\nsigning_key = \"billing\"\nscheme = \"stripe\""),
            "invalid config: route[0].url \"https://billing.example/h\" is outside the targets of signing key \"billing\"",
        ),
        (
            "[[route]]\nname = \"r\"\nurl = \"https://a.example/x\"\ntargets = [\"https://a.example/hooks/*\"]".to_string(),
            "invalid config: route[0].url \"https://a.example/x\" is outside route[0].targets",
        ),
        (
            "[[route]]\nname = \"ok\"\nurl = \"https://a.example/\"\n[[route]]\nname = \"r\"\nurl = \"https://user:s3kr1t@b.example/x\"\ntargets = [\"https://a.example/*\"]".to_string(),
            "invalid config: route[1].url \"https://user:***@b.example/x\" is outside route[1].targets",
        ),
    ];
    for (text, want) in cases {
        let msg = parse(text).validate().unwrap_err().to_string();
        assert_eq!(msg, *want, "{text:?}");
        assert_no_secret(&msg);
    }
    for text in [
        format!("{key}[[route]]\nname = \"r\"\nurl = \"https://eu.billing.example/h?a=1\"\nsigning_key = \"billing\"\nscheme = \"stripe\"\ntargets = [\"https://eu.billing.example/h\"]"),
        // Unscoped keys and routes without a key are not constrained.
        format!("{key}[[route]]\nname = \"r\"\nurl = \"https://anywhere.example/\"\nscheme = \"stripe\""),
        "[signing.keys]\nk = [\"sk\"]\n[[route]]\nname = \"r\"\nurl = \"https://anywhere.example/\"\nsigning_key = \"k\"\nscheme = \"stripe\"".to_string(),
    ] {
        if let Err(e) = parse(&text).validate() {
            panic!("{text:?}: {e}");
        }
    }
}

#[test]
fn table_form_secrets_are_validated_like_the_list_form() {
    let cases: &[(&str, &str)] = &[
        (
            "[signing.keys]\nk = { secrets = [\"hunter2!\"], targets = [\"https://a.example\"] }\n[[route]]\nname = \"r\"\nurl = \"https://a.example\"\nsigning_key = \"k\"",
            "signing.keys.k[0] is used with the standard scheme",
        ),
        ("[signing.keys]\nk = { secrets = [] }", "signing.keys.k must list at least one secret"),
        ("[signing.keys]\nk = { secrets = [\"\"] }", "signing.keys.k[0] must not be empty"),
    ];
    for (text, want) in cases {
        let msg = parse(text).validate().unwrap_err().to_string();
        assert!(msg.contains(want), "{text:?}: got {msg:?}, want {want:?}");
        assert_no_secret(&msg);
    }
}

#[test]
fn debug_and_summary_show_targets_but_no_secret() {
    let c = parse(&scoped_toml());
    let debug = format!("{c:?}");
    assert_no_secret(&debug);
    assert!(debug.contains("\"https://*.billing.example/*\""), "{debug}");
    assert!(debug.contains("Secret(***)"), "{debug}");
    let key_debug = format!("{:?}", c.signing.keys["billing"]);
    assert_no_secret(&key_debug);
    assert_eq!(
        key_debug,
        "SigningKey { secrets: [Secret(***)], targets: [\"https://*.billing.example/*\", \"https://billing.example/hooks\"] }"
    );
    let summary = c.summary();
    assert_no_secret(&summary);
    for want in [
        concat!(
            "keys: billing (1 secret, targets [https://*.billing.example/*, https://billing.example/hooks]), ",
            "legacy (2 secrets), partner (1 secret)"
        ),
        "route billing -> https://billing.example/hooks (signing key billing, scheme stripe, targets [https://billing.example/hooks*])",
        "route partner -> https://partner.example/in (signing key partner, scheme standard)",
    ] {
        assert!(summary.contains(want), "missing {want:?} in:\n{summary}");
    }
}
