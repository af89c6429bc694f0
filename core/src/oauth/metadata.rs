//! Discovery documents: the protected resource metadata of an MCP server (RFC 9728) and the
//! metadata of its authorization server (RFC 8414, OpenID Connect Discovery 1.0), the URLs to
//! try for each in the order MCP 2025-11-25 basic/authorization gives, and the checks that
//! make a document usable: the `resource` must cover the server we talk to, the `issuer` must
//! be the one we asked for, endpoints must be `https` (or loopback).
//!
//! Every failure is a sentence for the user's notice, naming the URL it is about.

use crate::url::HttpUrl;
use serde_json::Value;

/// The protected resource metadata we use (RFC 9728 §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceMetadata {
    /// `resource`: the protected resource's identifier, sent as the RFC 8707 `resource`
    /// parameter (in canonical form, [`HttpUrl::canonical`]).
    pub(crate) resource: String,
    /// `authorization_servers[0]` that parses: the issuer to discover (RFC 9728 §7.6 leaves
    /// the choice to the client; we take the first usable one).
    pub(crate) issuer: HttpUrl,
    /// `scopes_supported`, when present.
    pub(crate) scopes_supported: Option<Vec<String>>,
}

/// The authorization server metadata we use (RFC 8414 §2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerMetadata {
    /// `issuer`, checked equal to the one discovered (RFC 8414 §3.3).
    pub(crate) issuer: HttpUrl,
    /// `authorization_endpoint` (absent: no authorization code grant).
    pub(crate) authorization_endpoint: Option<HttpUrl>,
    /// `token_endpoint`.
    pub(crate) token_endpoint: HttpUrl,
    /// `registration_endpoint` (RFC 7591), when offered.
    pub(crate) registration_endpoint: Option<HttpUrl>,
    /// `scopes_supported`, when present.
    pub(crate) scopes_supported: Option<Vec<String>>,
    /// `grant_types_supported`, when present (RFC 8414's default, `authorization_code` and
    /// `implicit`, is not assumed for other grants).
    pub(crate) grant_types_supported: Option<Vec<String>>,
    /// `token_endpoint_auth_methods_supported`, else RFC 8414's default
    /// `["client_secret_basic"]`.
    pub(crate) token_endpoint_auth_methods: Vec<String>,
    /// Whether `code_challenge_methods_supported` lists `S256`. MCP: when it does not, the
    /// client must refuse the authorization code flow.
    pub(crate) pkce_s256: bool,
    /// `client_id_metadata_document_supported` is `true`.
    pub(crate) client_id_metadata_documents: bool,
    /// The endpoints were not discovered but assumed (the 2025-03-26 fallback at the server's
    /// origin: `/authorize`, `/token`, `/register`).
    pub(crate) assumed: bool,
}

impl ServerMetadata {
    /// Whether the server says it accepts `grant` (an unlisted grant is tried when the server
    /// lists none).
    pub(crate) fn offers_grant(&self, grant: &str) -> bool {
        self.grant_types_supported
            .as_ref()
            .is_none_or(|g| g.iter().any(|x| x == grant))
    }

    /// Whether `scope` is among `scopes_supported`.
    pub(crate) fn offers_scope(&self, scope: &str) -> bool {
        self.scopes_supported
            .as_ref()
            .is_some_and(|s| s.iter().any(|x| x == scope))
    }
}

/// Where the protected resource metadata may be, in order (MCP 2025-11-25 "Protected
/// Resource Metadata Discovery Requirements"): the `resource_metadata` URL of the challenge
/// when it has a usable one, else the well-known URI with the server's path inserted (when it
/// has a path), then at the root.
pub(crate) fn resource_metadata_urls(server: &HttpUrl, from_header: Option<&str>) -> Vec<HttpUrl> {
    if let Some(url) = from_header.and_then(|h| HttpUrl::parse(h.trim()).ok()) {
        return vec![url];
    }
    let mut out = Vec::with_capacity(2);
    let path_based = server.well_known_inserted("oauth-protected-resource");
    let root = server
        .root()
        .well_known_inserted("oauth-protected-resource");
    if path_based != root {
        out.push(path_based);
    }
    out.push(root);
    out
}

/// Where the authorization server metadata of `issuer` may be, in order (MCP 2025-11-25
/// "Authorization Server Metadata Discovery"): with a path, OAuth with path insertion, OpenID
/// with path insertion, OpenID with the path appended; without one, OAuth then OpenID at the
/// root.
pub(crate) fn server_metadata_urls(issuer: &HttpUrl) -> Vec<HttpUrl> {
    let has_path = !issuer.path().trim_end_matches('/').is_empty();
    let mut out = vec![
        issuer.well_known_inserted("oauth-authorization-server"),
        issuer.well_known_inserted("openid-configuration"),
    ];
    if has_path {
        out.push(issuer.well_known_appended("openid-configuration"));
    }
    out
}

/// Whether protected resource `resource` covers `server`: same origin, and the resource's
/// path is the server's path or one of its ancestors, segment by segment (`https://x/mcp`
/// covers `https://x/mcp` and `https://x/mcp/a`, not `https://x/mcp2`; `https://x` covers
/// all of `https://x`). The check the official MCP SDKs make; a resource on another origin is
/// always refused (RFC 9728 §3.3, §7.3: a server may not obtain tokens for another).
pub(crate) fn resource_covers(resource: &HttpUrl, server: &HttpUrl) -> bool {
    if resource.origin() != server.origin() {
        return false;
    }
    let r = resource.path().trim_end_matches('/');
    let s = server.path().trim_end_matches('/');
    r.is_empty() || s == r || s.strip_prefix(r).is_some_and(|rest| rest.starts_with('/'))
}

/// Reads a protected resource metadata document fetched from `from` for `server`.
///
/// # Errors
/// A sentence for the user: not JSON, no `resource`, a `resource` that does not cover the
/// server (RFC 9728 §3.3), no usable `authorization_servers`.
pub(crate) fn parse_resource_metadata(
    body: &[u8],
    from: &HttpUrl,
    server: &HttpUrl,
) -> Result<ResourceMetadata, String> {
    let doc = json_object(body, "protected resource metadata", from)?;
    let resource_text = doc
        .get("resource")
        .and_then(Value::as_str)
        .ok_or_else(|| format!("the protected resource metadata at {from} has no \"resource\""))?;
    let resource = HttpUrl::parse(resource_text.trim())
        .ok()
        .filter(|r| !r.has_fragment())
        .ok_or_else(|| {
            format!("the protected resource metadata at {from} has an invalid \"resource\"")
        })?;
    if !resource_covers(&resource, server) {
        return Err(format!(
            "the protected resource metadata at {from} is for {}, not for {} (refused: a server may only ask for tokens for itself)",
            quote_for_message(resource_text),
            server
        ));
    }
    let issuer = doc
        .get("authorization_servers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find_map(|s| HttpUrl::parse(s.trim()).ok())
        .ok_or_else(|| {
            format!(
                "the protected resource metadata at {from} names no usable authorization server"
            )
        })?;
    secure_endpoint(&issuer, "authorization server", from)?;
    Ok(ResourceMetadata {
        resource: resource.canonical(),
        issuer,
        scopes_supported: string_list(doc.get("scopes_supported")),
    })
}

/// Reads authorization server metadata fetched from `from` for `issuer`.
///
/// # Errors
/// A sentence for the user: not JSON, no or another `issuer` (RFC 8414 §3.3: the document
/// must not be used), a missing `token_endpoint`, an endpoint that is not `https` (OAuth 2.1
/// §1.5; loopback hosts excepted).
pub(crate) fn parse_server_metadata(
    body: &[u8],
    from: &HttpUrl,
    issuer: &HttpUrl,
) -> Result<ServerMetadata, String> {
    let doc = json_object(body, "authorization server metadata", from)?;
    let named = doc.get("issuer").and_then(Value::as_str).unwrap_or("");
    let same = HttpUrl::parse(named.trim()).is_ok_and(|n| n.canonical() == issuer.canonical());
    if !same {
        return Err(format!(
            "the authorization server metadata at {from} names the issuer {}, not {issuer} (refused, RFC 8414 section 3.3)",
            quote_for_message(named)
        ));
    }
    let endpoint = |name: &str| -> Result<Option<HttpUrl>, String> {
        match doc.get(name).and_then(Value::as_str) {
            None => Ok(None),
            Some(text) => {
                let url = HttpUrl::parse(text.trim()).map_err(|e| {
                    format!(
                        "the authorization server metadata at {from} has an invalid \"{name}\": {e}"
                    )
                })?;
                secure_endpoint(&url, name, from)?;
                Ok(Some(url))
            }
        }
    };
    let token_endpoint = endpoint("token_endpoint")?.ok_or_else(|| {
        format!("the authorization server metadata at {from} has no \"token_endpoint\"")
    })?;
    Ok(ServerMetadata {
        issuer: issuer.clone(),
        authorization_endpoint: endpoint("authorization_endpoint")?,
        token_endpoint,
        registration_endpoint: endpoint("registration_endpoint")?,
        scopes_supported: string_list(doc.get("scopes_supported")),
        grant_types_supported: string_list(doc.get("grant_types_supported")),
        token_endpoint_auth_methods: string_list(doc.get("token_endpoint_auth_methods_supported"))
            .unwrap_or_else(|| vec!["client_secret_basic".to_owned()]),
        pkce_s256: string_list(doc.get("code_challenge_methods_supported"))
            .is_some_and(|m| m.iter().any(|x| x == "S256")),
        client_id_metadata_documents: doc
            .get("client_id_metadata_document_supported")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        assumed: false,
    })
}

/// The endpoints MCP 2025-03-26 told clients to assume when a server publishes no metadata:
/// `/authorize`, `/token` and `/register` at the server's origin (its "Fallbacks for Servers
/// without Metadata Discovery"). PKCE `S256` is assumed, since that revision required it of
/// every server.
pub(crate) fn assumed_server_metadata(origin: &HttpUrl) -> ServerMetadata {
    let root = origin.root();
    ServerMetadata {
        issuer: root.clone(),
        authorization_endpoint: Some(root.with_path("/authorize")),
        token_endpoint: root.with_path("/token"),
        registration_endpoint: Some(root.with_path("/register")),
        scopes_supported: None,
        grant_types_supported: None,
        token_endpoint_auth_methods: vec!["client_secret_basic".to_owned()],
        pkce_s256: true,
        client_id_metadata_documents: false,
        assumed: true,
    }
}

/// OAuth 2.1 §1.5 and MCP "Communication Security": authorization server endpoints are
/// `https`; plain `http` only on the loopback interface (local and test servers).
fn secure_endpoint(url: &HttpUrl, what: &str, from: &HttpUrl) -> Result<(), String> {
    if url.is_https() || url.is_loopback() {
        Ok(())
    } else {
        Err(format!(
            "the {what} {url} (named at {from}) is not https (refused: tokens and codes must not travel in clear text)"
        ))
    }
}

/// The body as a JSON object, or the sentence saying it is not one.
fn json_object(
    body: &[u8],
    what: &str,
    from: &HttpUrl,
) -> Result<serde_json::Map<String, Value>, String> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) | Err(_) => Err(format!("the {what} at {from} is not a JSON object")),
    }
}

/// A JSON array of strings (other entries skipped); `None` when absent or not an array.
pub(crate) fn string_list(v: Option<&Value>) -> Option<Vec<String>> {
    let items = v?.as_array()?;
    Some(
        items
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
    )
}

/// A value from a peer, quoted and cut to 200 bytes for a message.
pub(crate) fn quote_for_message(s: &str) -> String {
    let mut end = s.len().min(200);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let cut = if end < s.len() { "…" } else { "" };
    format!("{:?}{cut}", &s[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn url(s: &str) -> HttpUrl {
        HttpUrl::parse(s).unwrap()
    }

    fn sent(urls: &[HttpUrl]) -> Vec<String> {
        urls.iter().map(HttpUrl::as_sent).collect()
    }

    #[test]
    fn resource_metadata_is_looked_for_at_the_header_url_else_path_then_root() {
        let server = url("https://example.com/public/mcp");
        assert_eq!(
            sent(&resource_metadata_urls(
                &server,
                Some("https://example.com/custom.json")
            )),
            ["https://example.com/custom.json"]
        );
        assert_eq!(
            sent(&resource_metadata_urls(&server, None)),
            [
                "https://example.com/.well-known/oauth-protected-resource/public/mcp",
                "https://example.com/.well-known/oauth-protected-resource"
            ]
        );
        // An unusable header value falls back to the well-known URIs.
        assert_eq!(resource_metadata_urls(&server, Some("not a url")).len(), 2);
        // A server at the root has one well-known URI.
        assert_eq!(
            sent(&resource_metadata_urls(&url("https://example.com/"), None)),
            ["https://example.com/.well-known/oauth-protected-resource"]
        );
    }

    #[test]
    fn server_metadata_is_looked_for_in_the_spec_order() {
        assert_eq!(
            sent(&server_metadata_urls(&url(
                "https://auth.example.com/tenant1"
            ))),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server/tenant1",
                "https://auth.example.com/.well-known/openid-configuration/tenant1",
                "https://auth.example.com/tenant1/.well-known/openid-configuration"
            ]
        );
        assert_eq!(
            sent(&server_metadata_urls(&url("https://auth.example.com/"))),
            [
                "https://auth.example.com/.well-known/oauth-authorization-server",
                "https://auth.example.com/.well-known/openid-configuration"
            ]
        );
    }

    #[test]
    fn a_resource_covers_its_own_path_and_below_on_its_origin_only() {
        let server = url("https://x.com/mcp");
        for ok in [
            "https://x.com/mcp",
            "https://x.com/mcp/",
            "https://x.com",
            "https://X.COM:443/",
        ] {
            assert!(resource_covers(&url(ok), &server), "{ok}");
        }
        assert!(resource_covers(
            &url("https://x.com/mcp"),
            &url("https://x.com/mcp/sub")
        ));
        for bad in [
            "https://evil.example.com/mcp",
            "http://x.com/mcp",
            "https://x.com:8443/mcp",
            "https://x.com/mc",
            "https://x.com/mcp/sub",
            "https://x.com/mcp2",
        ] {
            assert!(!resource_covers(&url(bad), &server), "{bad}");
        }
    }

    #[test]
    fn protected_resource_metadata_is_checked_before_it_is_used() {
        let from = url("https://x.com/.well-known/oauth-protected-resource/mcp");
        let server = url("https://x.com/mcp");
        let good = json!({"resource": "https://x.com/mcp", "authorization_servers": [7, "https://as.com/t1"], "scopes_supported": ["a", 1, "b"]});
        let m = parse_resource_metadata(good.to_string().as_bytes(), &from, &server).unwrap();
        assert_eq!(m.resource, "https://x.com/mcp");
        assert_eq!(m.issuer, url("https://as.com/t1"));
        assert_eq!(
            m.scopes_supported,
            Some(vec!["a".to_owned(), "b".to_owned()])
        );

        let evil = json!({"resource": "https://evil.example.com/mcp", "authorization_servers": ["https://as.com"]});
        let e = parse_resource_metadata(evil.to_string().as_bytes(), &from, &server).unwrap_err();
        assert!(
            e.contains("evil.example.com") && e.contains("refused"),
            "{e}"
        );
        for (doc, phrase) in [
            (json!([1]), "not a JSON object"),
            (
                json!({"authorization_servers": ["https://as.com"]}),
                "no \"resource\"",
            ),
            (
                json!({"resource": "https://x.com/mcp#f", "authorization_servers": ["https://as.com"]}),
                "invalid \"resource\"",
            ),
            (
                json!({"resource": "https://x.com/mcp"}),
                "no usable authorization server",
            ),
            (
                json!({"resource": "https://x.com/mcp", "authorization_servers": ["http://as.com"]}),
                "not https",
            ),
        ] {
            let e =
                parse_resource_metadata(doc.to_string().as_bytes(), &from, &server).unwrap_err();
            assert!(e.contains(phrase), "{e}");
        }
        let e = parse_resource_metadata(b"<html>", &from, &server).unwrap_err();
        assert!(e.contains(&from.to_string()), "{e}");
    }

    #[test]
    fn server_metadata_must_name_the_issuer_we_asked_for() {
        let issuer = url("http://localhost:9000");
        let from = url("http://localhost:9000/.well-known/oauth-authorization-server");
        let doc = json!({
            "issuer": "http://localhost:9000/",
            "authorization_endpoint": "http://localhost:9000/authorize",
            "token_endpoint": "http://localhost:9000/token",
            "code_challenge_methods_supported": ["plain", "S256"],
            "client_id_metadata_document_supported": true
        });
        let m = parse_server_metadata(doc.to_string().as_bytes(), &from, &issuer).unwrap();
        assert!(m.pkce_s256 && m.client_id_metadata_documents && !m.assumed);
        assert_eq!(m.token_endpoint_auth_methods, ["client_secret_basic"]);
        assert!(m.offers_grant("client_credentials"));
        assert!(m.registration_endpoint.is_none());

        // The 2025-03-26 back-compat fixture: the root document names a sub-path issuer.
        let other = json!({"issuer": "http://localhost:9000/oauth", "token_endpoint": "http://localhost:9000/oauth/token"});
        let e = parse_server_metadata(other.to_string().as_bytes(), &from, &issuer).unwrap_err();
        assert!(
            e.contains("\"http://localhost:9000/oauth\"") && e.contains("8414"),
            "{e}"
        );
        let none = json!({"token_endpoint": "http://localhost:9000/token"});
        assert!(parse_server_metadata(none.to_string().as_bytes(), &from, &issuer).is_err());
    }

    #[test]
    fn server_metadata_needs_a_token_endpoint_and_https_off_loopback() {
        let issuer = url("https://as.com");
        let from = url("https://as.com/.well-known/oauth-authorization-server");
        let no_token = json!({"issuer": "https://as.com"});
        let e = parse_server_metadata(no_token.to_string().as_bytes(), &from, &issuer).unwrap_err();
        assert!(e.contains("token_endpoint"), "{e}");
        let clear = json!({"issuer": "https://as.com", "token_endpoint": "http://as.com/token"});
        let e = parse_server_metadata(clear.to_string().as_bytes(), &from, &issuer).unwrap_err();
        assert!(e.contains("not https"), "{e}");
        let ok = json!({"issuer": "https://as.com", "token_endpoint": "https://as.com/token",
            "grant_types_supported": ["client_credentials"], "scopes_supported": ["offline_access"],
            "code_challenge_methods_supported": "S256"});
        let m = parse_server_metadata(ok.to_string().as_bytes(), &from, &issuer).unwrap();
        assert!(!m.offers_grant("authorization_code") && m.offers_grant("client_credentials"));
        assert!(m.offers_scope("offline_access") && !m.offers_scope("x"));
        assert!(!m.pkce_s256, "a string is not the list of methods");
    }

    #[test]
    fn the_2025_03_26_fallback_assumes_endpoints_at_the_origin() {
        let m = assumed_server_metadata(&url("http://localhost:5/mcp"));
        assert_eq!(m.token_endpoint.as_sent(), "http://localhost:5/token");
        assert_eq!(
            m.authorization_endpoint.unwrap().as_sent(),
            "http://localhost:5/authorize"
        );
        assert_eq!(
            m.registration_endpoint.unwrap().as_sent(),
            "http://localhost:5/register"
        );
        assert!(m.assumed && m.pkce_s256);
    }
}
