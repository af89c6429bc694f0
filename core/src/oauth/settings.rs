//! The authorization settings (SPEC M11, docs/configuration.md "Authorization"): the
//! `BUZZ_AGENT_OAUTH_CLIENTS_FILE` JSON document (per-server clients, the client ID metadata
//! document URL, the redirect port) and `BUZZ_AGENT_OAUTH_TIMEOUT_SECS`.
//!
//! The file is read once at start, like every setting (C1); a mistake in it is a startup
//! error naming the field. Unknown fields are errors too, so that a typo is not a silently
//! ignored secret.

use super::client::{AuthMethod, ClientConfig, Grant, IdentityProvider};
use super::jwt::Es256Key;
use super::secrets::Secret;
use crate::url::HttpUrl;
use serde_json::{Map, Value};
use std::collections::BTreeMap;

/// How the agent authorizes to remote MCP servers (SPEC M11). `Debug` shows no secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthConfig {
    /// Per-server clients, keyed by the server's `session/new` name or by its URL in canonical
    /// form ([`HttpUrl::canonical`]), in the file's order.
    pub(crate) clients: Vec<(String, ClientConfig)>,
    /// `client_metadata_url`: the HTTPS URL of a client ID metadata document the operator
    /// hosts for this agent, used where a server supports it.
    pub(crate) client_metadata_url: Option<HttpUrl>,
    /// `redirect_port`: the loopback redirect port (0: any free port).
    pub(crate) redirect_port: u16,
    /// `BUZZ_AGENT_OAUTH_TIMEOUT_SECS` in ms: how long an authorization waits for the user.
    pub(crate) user_timeout_ms: u64,
    /// `$BROWSER` as set (the command that opens an authorization URL), if set.
    pub(crate) browser: Option<String>,
}

impl Default for OAuthConfig {
    fn default() -> Self {
        OAuthConfig {
            clients: Vec::new(),
            client_metadata_url: None,
            redirect_port: 0,
            user_timeout_ms: DEFAULT_USER_TIMEOUT_SECS * 1000,
            browser: None,
        }
    }
}

/// Default of `BUZZ_AGENT_OAUTH_TIMEOUT_SECS`: five minutes to log in.
pub(crate) const DEFAULT_USER_TIMEOUT_SECS: u64 = 300;

impl OAuthConfig {
    /// The client configured for the server named `name` at `url`: by name first, then by
    /// URL.
    pub(crate) fn client_for(&self, name: &str, url: &HttpUrl) -> Option<&ClientConfig> {
        let canonical = url.canonical();
        self.clients
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| self.clients.iter().find(|(k, _)| *k == canonical))
            .map(|(_, c)| c)
    }

    /// Whether any server has a configured client (for `--help`-style summaries and tests).
    #[must_use]
    pub fn configured_servers(&self) -> usize {
        self.clients.len()
    }
}

/// Reads the clients file's text. `env` resolves `*_env` fields; `read_file` reads
/// `*_file` fields (paths as written).
///
/// # Errors
/// One line naming the field (`servers."github".grant: …`) and what it must be.
pub(crate) fn parse_clients_file(
    text: &str,
    env: &BTreeMap<String, String>,
    read_file: &dyn Fn(&str) -> Result<String, String>,
) -> Result<OAuthConfig, String> {
    let doc: Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON ({e})"))?;
    let Value::Object(top) = doc else {
        return Err("the file must hold a JSON object".into());
    };
    let r = Reader { env, read_file };
    known_keys(
        &top,
        "",
        &["client_metadata_url", "redirect_port", "servers"],
    )?;
    let mut config = OAuthConfig::default();
    if let Some(v) = top.get("client_metadata_url") {
        config.client_metadata_url = Some(metadata_url(v, "client_metadata_url")?);
    }
    if let Some(v) = top.get("redirect_port") {
        config.redirect_port = port(v, "redirect_port")?;
    }
    match top.get("servers") {
        None => {}
        Some(Value::Object(servers)) => {
            for (key, entry) in servers {
                let at = format!("servers.{key:?}");
                let client = r.client(entry, &at)?;
                let key = match HttpUrl::parse(key) {
                    Ok(u) => u.canonical(),
                    Err(_) => key.clone(),
                };
                config.clients.push((key, client));
            }
        }
        Some(_) => {
            return Err("servers: must be an object of server name (or URL) to client".into());
        }
    }
    Ok(config)
}

/// Resolves secrets and files while reading.
struct Reader<'a> {
    env: &'a BTreeMap<String, String>,
    read_file: &'a dyn Fn(&str) -> Result<String, String>,
}

impl Reader<'_> {
    fn client(&self, entry: &Value, at: &str) -> Result<ClientConfig, String> {
        let Value::Object(m) = entry else {
            return Err(format!("{at}: must be an object"));
        };
        known_keys(
            m,
            at,
            &[
                "client_id",
                "client_secret",
                "client_secret_env",
                "token_endpoint_auth_method",
                "grant",
                "private_key_pem",
                "private_key_file",
                "signing_algorithm",
                "scope",
                "client_metadata_url",
                "redirect_port",
                "idp",
            ],
        )?;
        let client_id = opt_string(m, "client_id", at)?;
        let client_secret = self.secret(m, "client_secret", at)?;
        let auth_method = match opt_string(m, "token_endpoint_auth_method", at)? {
            None => None,
            Some(name) => Some(AuthMethod::parse(&name).ok_or_else(|| {
                format!("{at}.token_endpoint_auth_method: must be none, client_secret_basic, client_secret_post or private_key_jwt")
            })?),
        };
        if let Some(alg) = opt_string(m, "signing_algorithm", at)?
            && alg != "ES256"
        {
            return Err(format!("{at}.signing_algorithm: only ES256 is supported"));
        }
        let pem = match (
            opt_string(m, "private_key_pem", at)?,
            opt_string(m, "private_key_file", at)?,
        ) {
            (Some(_), Some(_)) => {
                return Err(format!(
                    "{at}: set private_key_pem or private_key_file, not both"
                ));
            }
            (Some(p), None) => Some(p),
            (None, Some(path)) => Some(
                (self.read_file)(&path)
                    .map_err(|e| format!("{at}.private_key_file: cannot read {path:?}: {e}"))?,
            ),
            (None, None) => None,
        };
        let key = match pem {
            None => None,
            Some(p) => {
                Some(Es256Key::from_pem(&p).map_err(|e| format!("{at}: the private key is {e}"))?)
            }
        };
        let grant = match opt_string(m, "grant", at)?.as_deref() {
            None | Some("authorization_code") => Grant::AuthorizationCode,
            Some("client_credentials") => Grant::ClientCredentials,
            Some("cross_app_access") => Grant::CrossAppAccess(self.idp(m.get("idp"), at)?),
            Some(_) => {
                return Err(format!(
                    "{at}.grant: must be authorization_code, client_credentials or cross_app_access"
                ));
            }
        };
        if !matches!(grant, Grant::CrossAppAccess(_)) && m.contains_key("idp") {
            return Err(format!("{at}.idp: only for grant cross_app_access"));
        }
        let headless = !matches!(grant, Grant::AuthorizationCode);
        if headless && client_id.is_none() {
            return Err(format!(
                "{at}: a {} client needs a client_id",
                grant_name(&grant)
            ));
        }
        if matches!(grant, Grant::ClientCredentials) && client_secret.is_none() && key.is_none() {
            return Err(format!(
                "{at}: a client_credentials client needs a client_secret or a private key"
            ));
        }
        if auth_method == Some(AuthMethod::PrivateKeyJwt) && key.is_none() {
            return Err(format!(
                "{at}: private_key_jwt needs private_key_pem or private_key_file"
            ));
        }
        if matches!(
            auth_method,
            Some(AuthMethod::ClientSecretBasic | AuthMethod::ClientSecretPost)
        ) && client_secret.is_none()
        {
            return Err(format!(
                "{at}: the token_endpoint_auth_method needs a client_secret"
            ));
        }
        if client_secret.is_some() && client_id.is_none() {
            return Err(format!("{at}: a client_secret needs its client_id"));
        }
        let scope = opt_string(m, "scope", at)?.filter(|s| !s.trim().is_empty());
        let client_metadata_url = match m.get("client_metadata_url") {
            None => None,
            Some(v) => Some(metadata_url(v, &format!("{at}.client_metadata_url"))?),
        };
        let redirect_port = match m.get("redirect_port") {
            None => None,
            Some(v) => Some(port(v, &format!("{at}.redirect_port"))?),
        };
        Ok(ClientConfig {
            client_id,
            client_secret,
            auth_method,
            key,
            grant,
            scope,
            client_metadata_url,
            redirect_port,
        })
    }

    fn idp(&self, v: Option<&Value>, at: &str) -> Result<IdentityProvider, String> {
        let at = format!("{at}.idp");
        let Some(Value::Object(m)) = v else {
            return Err(format!("{at}: cross_app_access needs an idp object"));
        };
        known_keys(
            m,
            &at,
            &[
                "token_endpoint",
                "client_id",
                "client_secret",
                "client_secret_env",
                "id_token",
                "id_token_env",
                "id_token_file",
            ],
        )?;
        let endpoint = opt_string(m, "token_endpoint", &at)?
            .ok_or_else(|| format!("{at}.token_endpoint: required"))?;
        let token_endpoint =
            HttpUrl::parse(endpoint.trim()).map_err(|e| format!("{at}.token_endpoint: {e}"))?;
        if !token_endpoint.is_https() && !token_endpoint.is_loopback() {
            return Err(format!(
                "{at}.token_endpoint: must be https (or a loopback address)"
            ));
        }
        let client_id =
            opt_string(m, "client_id", &at)?.ok_or_else(|| format!("{at}.client_id: required"))?;
        let client_secret = self.secret(m, "client_secret", &at)?;
        let id_token = match self.secret(m, "id_token", &at)? {
            Some(t) => Some(t),
            None => match opt_string(m, "id_token_file", &at)? {
                Some(path) => Some(Secret::new(
                    (self.read_file)(&path)
                        .map_err(|e| format!("{at}.id_token_file: cannot read {path:?}: {e}"))?
                        .trim(),
                )),
                None => None,
            },
        };
        let id_token = id_token
            .filter(|t| !t.expose().is_empty())
            .ok_or_else(|| format!("{at}: needs id_token, id_token_env or id_token_file"))?;
        Ok(IdentityProvider {
            token_endpoint,
            client_id,
            client_secret,
            id_token,
        })
    }

    /// `<name>` inline, or `<name>_env` naming a variable (which must be set).
    fn secret(
        &self,
        m: &Map<String, Value>,
        name: &str,
        at: &str,
    ) -> Result<Option<Secret>, String> {
        let env_name = format!("{name}_env");
        match (opt_string(m, name, at)?, opt_string(m, &env_name, at)?) {
            (Some(_), Some(_)) => Err(format!("{at}: set {name} or {env_name}, not both")),
            (Some(v), None) => Ok(Some(Secret::new(v))),
            (None, Some(var)) => match self.env.get(&var).map(|v| v.trim()) {
                Some(v) if !v.is_empty() => Ok(Some(Secret::new(v))),
                _ => Err(format!("{at}.{env_name}: the variable {var} is not set")),
            },
            (None, None) => Ok(None),
        }
    }
}

fn grant_name(g: &Grant) -> &'static str {
    match g {
        Grant::AuthorizationCode => "authorization_code",
        Grant::ClientCredentials => "client_credentials",
        Grant::CrossAppAccess(_) => "cross_app_access",
    }
}

fn known_keys(m: &Map<String, Value>, at: &str, known: &[&str]) -> Result<(), String> {
    match m.keys().find(|k| !known.contains(&k.as_str())) {
        None => Ok(()),
        Some(k) => {
            let prefix = if at.is_empty() {
                String::new()
            } else {
                format!("{at}.")
            };
            Err(format!(
                "{prefix}{k}: unknown field (known: {})",
                known.join(", ")
            ))
        }
    }
}

fn opt_string(m: &Map<String, Value>, name: &str, at: &str) -> Result<Option<String>, String> {
    match m.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(format!("{at}.{name}: must be a string")),
    }
}

fn port(v: &Value, at: &str) -> Result<u16, String> {
    v.as_u64()
        .and_then(|n| u16::try_from(n).ok())
        .ok_or_else(|| format!("{at}: must be a port number from 0 to 65535 (0: any free port)"))
}

/// A client ID metadata document URL: `https` with a path (the draft's requirement).
fn metadata_url(v: &Value, at: &str) -> Result<HttpUrl, String> {
    let text = v
        .as_str()
        .ok_or_else(|| format!("{at}: must be a string"))?;
    let url = HttpUrl::parse(text.trim()).map_err(|e| format!("{at}: {e}"))?;
    if !url.is_https() || url.path().trim_end_matches('/').is_empty() || url.has_fragment() {
        return Err(format!(
            "{at}: must be an https URL with a path and no fragment (the document's own address)"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(doc: &Value) -> Result<OAuthConfig, String> {
        let env: BTreeMap<String, String> =
            [("GH_SECRET".to_owned(), " s3cret ".to_owned())].into();
        let files = |p: &str| match p {
            "/keys/cc.pem" => Ok(super::super::jwt::tests::TEST_KEY_PKCS8.to_owned()),
            "/tokens/id" => Ok("id-token\n".to_owned()),
            other => Err(format!("{other}: No such file or directory (os error 2)")),
        };
        parse_clients_file(&doc.to_string(), &env, &files)
    }

    #[test]
    fn every_kind_of_client_is_read() {
        let c = parse(&json!({
            "client_metadata_url": "https://agent.example.com/buzz/client.json",
            "redirect_port": 8765,
            "servers": {
                "github": {"client_id": "Iv1.abc", "client_secret_env": "GH_SECRET", "scope": "repo"},
                "https://MCP.example.com/mcp/": {"client_id": "svc", "grant": "client_credentials", "private_key_file": "/keys/cc.pem", "signing_algorithm": "ES256"},
                "corp": {"client_id": "xaa", "client_secret": "x", "grant": "cross_app_access",
                         "idp": {"token_endpoint": "https://idp.example.com/token", "client_id": "idp-c", "id_token_file": "/tokens/id"}}
            }
        }))
        .unwrap();
        assert_eq!(c.redirect_port, 8765);
        assert_eq!(
            c.client_metadata_url.as_ref().unwrap().as_sent(),
            "https://agent.example.com/buzz/client.json"
        );
        let gh = c
            .client_for(
                "github",
                &HttpUrl::parse("https://api.githubcopilot.com/mcp").unwrap(),
            )
            .unwrap();
        assert_eq!(gh.client_secret.as_ref().unwrap().expose(), "s3cret");
        assert_eq!(gh.scope.as_deref(), Some("repo"));
        let by_url = c
            .client_for(
                "other-name",
                &HttpUrl::parse("https://mcp.example.com/mcp").unwrap(),
            )
            .unwrap();
        assert_eq!(by_url.grant, Grant::ClientCredentials);
        assert!(by_url.key.is_some());
        let Some(ClientConfig {
            grant: Grant::CrossAppAccess(idp),
            ..
        }) = c.client_for("corp", &HttpUrl::parse("https://x").unwrap())
        else {
            panic!()
        };
        assert_eq!(idp.id_token.expose(), "id-token");
        assert!(
            c.client_for("nobody", &HttpUrl::parse("https://x").unwrap())
                .is_none()
        );
        let shown = format!("{c:?}");
        assert!(
            !shown.contains("s3cret") && !shown.contains("id-token") && !shown.contains("PRIVATE"),
            "{shown}"
        );
    }

    #[test]
    fn mistakes_are_named_by_their_field() {
        for (doc, phrase) in [
            (json!([]), "JSON object"),
            (
                json!({"servers": {"a": {"client_idd": "x"}}}),
                "servers.\"a\".client_idd: unknown field",
            ),
            (json!({"serverz": {}}), "serverz: unknown field"),
            (
                json!({"servers": {"a": {"grant": "implicit"}}}),
                "servers.\"a\".grant: must be",
            ),
            (
                json!({"servers": {"a": {"grant": "client_credentials", "client_id": "c"}}}),
                "needs a client_secret or a private key",
            ),
            (
                json!({"servers": {"a": {"grant": "client_credentials", "client_secret": "s"}}}),
                "needs a client_id",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "client_secret_env": "UNSET_VAR"}}}),
                "UNSET_VAR is not set",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "client_secret": "s", "client_secret_env": "GH_SECRET"}}}),
                "not both",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "private_key_file": "/nope"}}}),
                "cannot read \"/nope\"",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "private_key_pem": "junk"}}}),
                "not a PEM",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "signing_algorithm": "RS256"}}}),
                "only ES256",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "token_endpoint_auth_method": "private_key_jwt"}}}),
                "private_key_jwt needs",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "token_endpoint_auth_method": "client_secret_post"}}}),
                "needs a client_secret",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "idp": {}}}}),
                "only for grant cross_app_access",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "grant": "cross_app_access"}}}),
                "needs an idp object",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "grant": "cross_app_access", "idp": {"token_endpoint": "http://idp.com/t", "client_id": "i", "id_token": "t"}}}}),
                "must be https",
            ),
            (
                json!({"servers": {"a": {"client_id": "c", "grant": "cross_app_access", "idp": {"token_endpoint": "https://idp.com/t", "client_id": "i"}}}}),
                "needs id_token",
            ),
            (
                json!({"redirect_port": 70000}),
                "redirect_port: must be a port",
            ),
            (
                json!({"client_metadata_url": "http://x.com/c.json"}),
                "must be an https URL with a path",
            ),
            (
                json!({"client_metadata_url": "https://x.com/"}),
                "must be an https URL with a path",
            ),
        ] {
            let e = parse(&doc).unwrap_err();
            assert!(e.contains(phrase), "{doc}: {e}");
        }
    }

    #[test]
    fn an_empty_file_object_is_the_default() {
        assert_eq!(parse(&json!({})).unwrap(), OAuthConfig::default());
    }
}
