//! Which secret or key signs an accepted message (CONTRACT §4): the message's own header
//! wins, then its route's, then the defaults. Pure: ingress refuses (`400`), before anything
//! is stored, what no attempt could sign and what may not be signed for its target.

use crate::config::{Config, RouteConfig};
use crate::headers::ControlHeaders;
use crate::inbound::serve::Refusal;
use crate::model::SignatureScheme;
use crate::signing::{self, scope};
use crate::store::SigningChoice;

/// The message's scheme (if it or its route names one) and what signs it, or why not.
pub(super) fn choose(
    config: &Config,
    control: &ControlHeaders,
    route: Option<&RouteConfig>,
    url: &url::Url,
) -> Result<(Option<SignatureScheme>, SigningChoice), Refusal> {
    // A route bound to targets delivers (and signs) only inside them, whatever extra path
    // the caller appended.
    if let Some(r) = route.filter(|r| !scope::allowed(&r.targets, url)) {
        return Err(not_allowed(format!(
            "route {:?} may not sign for {}: it is bound to other targets",
            r.name,
            crate::redact::url_for_log(url.as_str())
        )));
    }
    let scheme = control.scheme.or(route.and_then(|r| r.scheme));
    let effective = scheme.unwrap_or(config.signing.scheme);
    let signing = if let Some(secret) = &control.signing_secret {
        let secret = secret.expose();
        signing::validate_secret(effective, secret)
            .map_err(|e| Refusal::bad(e.code(), format!("Courier-Signing-Secret: {e}")))?;
        SigningChoice::Inline(secret.to_string())
    } else if let Some(name) = control
        .signing_key
        .clone()
        .or_else(|| route.and_then(|r| r.signing_key.clone()))
    {
        named_key(config, name, url)?
    } else {
        SigningChoice::Default
    };
    // A configured list holding an Ed25519 key cannot sign with an HMAC-only scheme the
    // message picked: refuse now rather than store a message no attempt could sign.
    let listed = match &signing {
        SigningChoice::Key(name) => config.signing_key(name).unwrap_or_default(),
        SigningChoice::Default => config.signing.secrets.as_slice(),
        SigningChoice::Inline(_) => &[],
    };
    signing::check_scheme(effective, listed).map_err(|e| {
        let source = match &signing {
            SigningChoice::Key(name) => format!("signing key {name:?}"),
            _ => "signing.secrets".to_string(),
        };
        Refusal::bad(e.code(), format!("{source}: {e}"))
    })?;
    Ok((scheme, signing))
}

/// A key of `[signing.keys]`, if it exists and may sign for `url`: otherwise whoever
/// reaches ingress could have any payload signed with a partner's key and replay it there.
fn named_key(config: &Config, name: String, url: &url::Url) -> Result<SigningChoice, Refusal> {
    if config.signing_key(&name).is_none() {
        return Err(Refusal::bad(
            "unknown_signing_key",
            format!("no signing key named {name:?} in [signing.keys]"),
        ));
    }
    if !scope::allowed(config.signing_key_targets(&name), url) {
        return Err(not_allowed(format!(
            "signing key {name:?} may not sign for {}: it is bound to other targets in [signing.keys]",
            crate::redact::url_for_log(url.as_str())
        )));
    }
    Ok(SigningChoice::Key(name))
}

fn not_allowed(message: String) -> Refusal {
    Refusal::bad("signing_key_not_allowed", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    const ED25519: &str = "whsk_Y291cmllciBlZDI1NTE5IGtub3duLWFuc3dlciBrZXk=";

    fn config() -> Config {
        let toml = format!(
            r#"
[signing]
secrets = ["{SECRET}"]
[signing.keys]
billing = ["{SECRET}"]
partner = {{ secrets = ["{SECRET}"], targets = ["https://*.partner.example/*"] }}
modern = ["{ED25519}"]
[[route]]
name = "billing"
url = "https://billing.example/hooks"
signing_key = "billing"
targets = ["https://billing.example/hooks*"]
"#
        );
        let c = Config::from_toml_str(&toml, "t").unwrap();
        c.validate().unwrap();
        c
    }

    fn choose_for(control: ControlHeaders, route: Option<&str>, url: &str) -> Result<SigningChoice, &'static str> {
        let c = config();
        let route = route.map(|name| c.routes.iter().find(|r| r.name == name).unwrap());
        choose(&c, &control, route, &url::Url::parse(url).unwrap())
            .map(|(_, choice)| choice)
            .map_err(|e| e.code())
    }

    #[test]
    fn the_message_s_header_wins_then_its_route_then_the_defaults() {
        let url = "https://billing.example/hooks/x";
        assert_eq!(
            choose_for(ControlHeaders::default(), None, url),
            Ok(SigningChoice::Default)
        );
        assert_eq!(
            choose_for(ControlHeaders::default(), Some("billing"), url),
            Ok(SigningChoice::Key("billing".into()))
        );
        let named = ControlHeaders {
            signing_key: Some("partner".into()),
            ..Default::default()
        };
        assert_eq!(
            choose_for(named, None, "https://a.partner.example/in"),
            Ok(SigningChoice::Key("partner".into()))
        );
        let inline = ControlHeaders {
            signing_secret: Some(signing::Secret::new(SECRET.into())),
            signing_key: Some("billing".into()),
            ..Default::default()
        };
        assert_eq!(
            choose_for(inline, Some("billing"), url),
            Ok(SigningChoice::Inline(SECRET.into()))
        );
    }

    #[test]
    fn what_may_not_or_cannot_sign_is_refused_with_its_code() {
        let key = |name: &str| ControlHeaders {
            signing_key: Some(name.into()),
            ..Default::default()
        };
        assert_eq!(
            choose_for(key("nobody"), None, "https://a.example/"),
            Err("unknown_signing_key")
        );
        assert_eq!(
            choose_for(key("partner"), None, "https://elsewhere.example/"),
            Err("signing_key_not_allowed"),
            "a key bound to targets signs for nothing else"
        );
        assert_eq!(
            choose_for(
                ControlHeaders::default(),
                Some("billing"),
                "https://billing.example/other"
            ),
            Err("signing_key_not_allowed"),
            "a route bound to targets signs for nothing else"
        );
        let hmac_only = ControlHeaders {
            signing_key: Some("modern".into()),
            scheme: Some(SignatureScheme::Stripe),
            ..Default::default()
        };
        assert!(
            choose_for(hmac_only, None, "https://a.example/").is_err(),
            "an Ed25519 key cannot sign a Stripe signature"
        );
        let bad_inline = ControlHeaders {
            signing_secret: Some(signing::Secret::new("not-a-secret".into())),
            ..Default::default()
        };
        assert!(choose_for(bad_inline, None, "https://a.example/").is_err());
    }
}
