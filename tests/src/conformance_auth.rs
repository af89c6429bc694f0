//! What the official MCP conformance suite's authorization scenarios hand their client, turned
//! into the agent's configuration (SPEC M11, docs/configuration.md "The clients file"): the
//! suite passes `MCP_CONFORMANCE_SCENARIO` and, for the scenarios with client credentials,
//! `MCP_CONFORMANCE_CONTEXT` (JSON, `src/schemas/context.ts` of
//! `@modelcontextprotocol/conformance` 0.1.16). The conformance wrapper writes
//! [`clients_file`] to a file named by `BUZZ_AGENT_OAUTH_CLIENTS_FILE` and sets
//! [`browser_command`] as `$BROWSER`: the suite's authorization server approves at once and
//! redirects, so the fake browser completes each login like a user who clicks "allow".

use serde_json::{Value, json};

/// The client ID metadata document URL the suite's `auth/basic-cimd` scenario expects.
pub const CONFORMANCE_CLIENT_METADATA_URL: &str =
    "https://conformance-test.local/client-metadata.json";

/// The clients file for `scenario` with the suite's `context` (its parsed
/// `MCP_CONFORMANCE_CONTEXT`, if any) for the server the agent knows as `server_name`; `None`
/// when the scenario needs no configuration (discovery, DCR, scopes …).
///
/// # Panics
/// Never; a context without the fields its scenario defines gives a file the agent refuses at
/// start with the missing field named, which fails the scenario visibly.
pub fn clients_file(scenario: &str, context: Option<&Value>, server_name: &str) -> Option<Value> {
    let field = |name: &str| context.and_then(|c| c.get(name)).cloned();
    let client = match scenario {
        "auth/basic-cimd" => {
            return Some(json!({"client_metadata_url": CONFORMANCE_CLIENT_METADATA_URL}));
        }
        "auth/pre-registration" => json!({
            "client_id": field("client_id"),
            "client_secret": field("client_secret"),
        }),
        "auth/client-credentials-basic" => json!({
            "client_id": field("client_id"),
            "client_secret": field("client_secret"),
            "grant": "client_credentials",
            "token_endpoint_auth_method": "client_secret_basic",
        }),
        "auth/client-credentials-jwt" => {
            let mut c = json!({
                "client_id": field("client_id"),
                "private_key_pem": field("private_key_pem"),
                "grant": "client_credentials",
                "token_endpoint_auth_method": "private_key_jwt",
            });
            if let Some(alg) = field("signing_algorithm") {
                c["signing_algorithm"] = alg;
            }
            c
        }
        "auth/cross-app-access-complete-flow" => json!({
            "client_id": field("client_id"),
            "client_secret": field("client_secret"),
            "grant": "cross_app_access",
            "idp": {
                "token_endpoint": field("idp_token_endpoint"),
                "client_id": field("idp_client_id"),
                "id_token": field("idp_id_token"),
            },
        }),
        _ => return None,
    };
    Some(json!({"servers": {server_name: client}}))
}

/// `$BROWSER` for a conformance run: the test binary `exe` as the fake browser
/// ([`crate::fake_oauth::browse_main`]).
pub fn browser_command(exe: &str) -> String {
    format!("env BUZZ_E2E_ROLE=fake-browser {exe}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn m11_every_context_of_the_suite_becomes_a_client_of_the_server() {
        let jwt = json!({"name": "auth/client-credentials-jwt", "client_id": "c", "private_key_pem": "PEM", "signing_algorithm": "ES256"});
        assert_eq!(
            clients_file("auth/client-credentials-jwt", Some(&jwt), "srv"),
            Some(
                json!({"servers": {"srv": {"client_id": "c", "private_key_pem": "PEM", "signing_algorithm": "ES256", "grant": "client_credentials", "token_endpoint_auth_method": "private_key_jwt"}}})
            )
        );
        let xaa = json!({"client_id": "c", "client_secret": "s", "idp_client_id": "i", "idp_id_token": "t", "idp_issuer": "https://idp", "idp_token_endpoint": "http://127.0.0.1:9/token"});
        let file = clients_file("auth/cross-app-access-complete-flow", Some(&xaa), "srv").unwrap();
        assert_eq!(
            file["servers"]["srv"]["idp"],
            json!({"token_endpoint": "http://127.0.0.1:9/token", "client_id": "i", "id_token": "t"})
        );
        let pre = json!({"client_id": "c", "client_secret": "s"});
        assert_eq!(
            clients_file("auth/pre-registration", Some(&pre), "srv").unwrap()["servers"]["srv"],
            json!({"client_id": "c", "client_secret": "s"})
        );
        assert_eq!(
            clients_file("auth/basic-cimd", None, "srv"),
            Some(json!({"client_metadata_url": CONFORMANCE_CLIENT_METADATA_URL}))
        );
        assert_eq!(clients_file("auth/scope-step-up", None, "srv"), None);
        // The files are ones the agent's own parser takes.
        for (scenario, context) in [
            ("auth/pre-registration", Some(&pre)),
            ("auth/basic-cimd", None),
            ("auth/client-credentials-basic", Some(&pre)),
        ] {
            let file = clients_file(scenario, context, "srv").unwrap();
            let map: std::collections::BTreeMap<String, String> = [
                ("BUZZ_AGENT_PROVIDER".to_owned(), "openai".to_owned()),
                ("OPENAI_COMPAT_MODEL".to_owned(), "m".to_owned()),
                (
                    "BUZZ_AGENT_OAUTH_CLIENTS_FILE".to_owned(),
                    "/c.json".to_owned(),
                ),
            ]
            .into_iter()
            .collect();
            let text = file.to_string();
            let read = |p: &str| {
                if p == "/c.json" {
                    Ok(text.clone())
                } else {
                    Err(format!("{p}: none"))
                }
            };
            let config = buzz_agent_core::Config::from_env_map(&map, &read);
            assert!(config.is_ok(), "{scenario}: {:?}", config.err());
        }
    }
}
