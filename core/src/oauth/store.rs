//! The token file of one MCP server (SPEC M11: tokens kept in the state directory, mode 0600,
//! never in logs or transcripts): its name, and its JSON both ways. The runtime reads and
//! writes the bytes (`<state dir>/oauth/<name>`, written whole and renamed into place); what
//! is in them is decided here.
//!
//! Kept: the tokens (access, refresh, granted scope, expiry as wall-clock time), which client
//! obtained them (so a refresh authenticates the same way), and a dynamic registration (so the
//! next run does not register again). Not kept: configured secrets (they stay in the
//! configuration) and discovery (redone each run; it is cheap and may change).

use super::client::{AuthMethod, ClientIdentity, IdentitySource};
use super::flow::Registration;
use super::secrets::{Secret, sha256};
use super::tokens::{Clocks, TokenSet};
use crate::url::HttpUrl;
use serde::{Deserialize, Serialize};

/// The file format's version; a file with another is ignored (and replaced on the next save).
const VERSION: u32 = 1;

/// The name of `server`'s token file: 32 hex digits of the SHA-256 of its canonical URL, and
/// `.json` (safe as a file name whatever the URL).
pub(crate) fn file_name(server: &HttpUrl) -> String {
    let digest = sha256(server.canonical().as_bytes());
    let mut name = String::with_capacity(37);
    for b in &digest[..16] {
        name.push_str(&format!("{b:02x}"));
    }
    name.push_str(".json");
    name
}

/// Tokens from a file, with the client they belong to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StoredTokens {
    /// The tokens (expiry converted to the runtime's clock).
    pub(crate) tokens: TokenSet,
    /// The issuer that issued them (canonical form).
    pub(crate) issuer: String,
    /// The client that obtained them; a configured client's secret is not in the file (the
    /// caller takes it from the configuration).
    pub(crate) identity: ClientIdentity,
}

/// What a token file holds.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Stored {
    /// A dynamic registration.
    pub(crate) registration: Option<Registration>,
    /// The tokens.
    pub(crate) tokens: Option<StoredTokens>,
}

#[derive(Serialize, Deserialize)]
struct FileV1 {
    version: u32,
    server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    registration: Option<RegistrationV1>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens: Option<TokensV1>,
}

#[derive(Serialize, Deserialize)]
struct RegistrationV1 {
    issuer: String,
    redirect_uri: String,
    client_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    client_secret: Option<String>,
    token_endpoint_auth_method: String,
}

#[derive(Serialize, Deserialize)]
struct TokensV1 {
    issuer: String,
    access_token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    refresh_token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scope: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    expires_at_unix_ms: Option<u64>,
    client_id: String,
    token_endpoint_auth_method: String,
    /// `configured`, `metadata_document` or `registered`.
    client_source: String,
}

fn source_name(s: IdentitySource) -> &'static str {
    match s {
        IdentitySource::Configured => "configured",
        IdentitySource::MetadataDocument => "metadata_document",
        IdentitySource::Registered => "registered",
    }
}

fn source_of(name: &str) -> Option<IdentitySource> {
    match name {
        "configured" => Some(IdentitySource::Configured),
        "metadata_document" => Some(IdentitySource::MetadataDocument),
        "registered" => Some(IdentitySource::Registered),
        _ => None,
    }
}

/// The file's bytes for `stored` of `server` (compact JSON, one line).
pub(crate) fn encode(stored: &Stored, server: &HttpUrl) -> Vec<u8> {
    let file = FileV1 {
        version: VERSION,
        server: server.canonical(),
        registration: stored.registration.as_ref().map(|r| RegistrationV1 {
            issuer: r.issuer.clone(),
            redirect_uri: r.redirect_uri.clone(),
            client_id: r.identity.client_id.clone(),
            client_secret: r.identity.secret.as_ref().map(|s| s.expose().to_owned()),
            token_endpoint_auth_method: r.identity.method.as_str().to_owned(),
        }),
        tokens: stored.tokens.as_ref().map(|t| TokensV1 {
            issuer: t.issuer.clone(),
            access_token: t.tokens.access_token.expose().to_owned(),
            refresh_token: t
                .tokens
                .refresh_token
                .as_ref()
                .map(|s| s.expose().to_owned()),
            scope: t.tokens.scope.clone(),
            expires_at_unix_ms: t.tokens.expires_at_unix_ms,
            client_id: t.identity.client_id.clone(),
            token_endpoint_auth_method: t.identity.method.as_str().to_owned(),
            client_source: source_name(t.identity.source).to_owned(),
        }),
    };
    let mut bytes = serde_json::to_vec(&file).unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// Reads a token file of `server`.
///
/// # Errors
/// A sentence for a WARN (the file is then ignored, never fatal): not this format, another
/// version, another server's file.
pub(crate) fn decode(bytes: &[u8], server: &HttpUrl, clocks: Clocks) -> Result<Stored, String> {
    let file: FileV1 = serde_json::from_slice(bytes)
        .map_err(|_| "the token file is not in the expected format".to_owned())?;
    if file.version != VERSION {
        return Err(format!(
            "the token file has version {}, not {VERSION}",
            file.version
        ));
    }
    if file.server != server.canonical() {
        return Err("the token file belongs to another server".to_owned());
    }
    let registration = match file.registration {
        Some(r) => Some(Registration {
            issuer: r.issuer,
            redirect_uri: r.redirect_uri,
            identity: ClientIdentity {
                client_id: r.client_id,
                secret: r.client_secret.map(Secret::new),
                method: AuthMethod::parse(&r.token_endpoint_auth_method)
                    .ok_or("the token file names an unknown authentication method")?,
                source: IdentitySource::Registered,
            },
        }),
        None => None,
    };
    let tokens = match file.tokens {
        Some(t) => {
            let method = AuthMethod::parse(&t.token_endpoint_auth_method)
                .ok_or("the token file names an unknown authentication method")?;
            let source = source_of(&t.client_source)
                .ok_or("the token file names an unknown client source")?;
            let secret = match source {
                IdentitySource::Registered => registration
                    .as_ref()
                    .filter(|r| r.identity.client_id == t.client_id)
                    .and_then(|r| r.identity.secret.clone()),
                IdentitySource::Configured | IdentitySource::MetadataDocument => None,
            };
            let expires_at = t
                .expires_at_unix_ms
                .map(|at| clocks.now.plus_ms(at.saturating_sub(clocks.unix_ms)));
            Some(StoredTokens {
                tokens: TokenSet {
                    access_token: Secret::new(t.access_token),
                    refresh_token: t.refresh_token.map(Secret::new),
                    scope: t.scope,
                    expires_at,
                    expires_at_unix_ms: t.expires_at_unix_ms,
                },
                issuer: t.issuer,
                identity: ClientIdentity {
                    client_id: t.client_id,
                    secret,
                    method,
                    source,
                },
            })
        }
        None => None,
    };
    Ok(Stored {
        registration,
        tokens,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::MonoTime;

    fn url(s: &str) -> HttpUrl {
        HttpUrl::parse(s).unwrap()
    }

    const CLOCKS: Clocks = Clocks {
        now: MonoTime(std::time::Duration::from_secs(10)),
        unix_ms: 1_000_000,
    };

    fn sample() -> Stored {
        let registered = ClientIdentity {
            client_id: "dcr-1".into(),
            secret: Some(Secret::new("dcr-secret")),
            method: AuthMethod::ClientSecretBasic,
            source: IdentitySource::Registered,
        };
        Stored {
            registration: Some(Registration {
                issuer: "https://as.example.com".into(),
                redirect_uri: "http://127.0.0.1:41000/callback".into(),
                identity: registered.clone(),
            }),
            tokens: Some(StoredTokens {
                tokens: TokenSet {
                    access_token: Secret::new("at-1"),
                    refresh_token: Some(Secret::new("rt-1")),
                    scope: Some("a b".into()),
                    expires_at: Some(CLOCKS.now.plus_ms(60_000)),
                    expires_at_unix_ms: Some(1_060_000),
                },
                issuer: "https://as.example.com".into(),
                identity: registered,
            }),
        }
    }

    #[test]
    fn a_file_round_trips_with_its_expiry_on_the_new_clock() {
        let server = url("https://mcp.example.com/mcp");
        let bytes = encode(&sample(), &server);
        assert!(bytes.ends_with(b"\n") && !bytes[..bytes.len() - 1].contains(&b'\n'));
        assert_eq!(decode(&bytes, &server, CLOCKS).unwrap(), sample());
        // Read again 30 s of wall clock later, on a runtime whose clock started anew.
        let later = Clocks {
            now: MonoTime::ZERO,
            unix_ms: 1_030_000,
        };
        let t = decode(&bytes, &server, later).unwrap().tokens.unwrap();
        assert_eq!(t.tokens.expires_at, Some(MonoTime::ZERO.plus_ms(30_000)));
        let expired = Clocks {
            now: MonoTime::ZERO,
            unix_ms: 2_000_000,
        };
        let t = decode(&bytes, &server, expired).unwrap().tokens.unwrap();
        assert_eq!(t.tokens.expires_at, Some(MonoTime::ZERO));
    }

    #[test]
    fn a_configured_client_s_secret_is_never_written() {
        let server = url("https://mcp.example.com/mcp");
        let mut s = sample();
        s.registration = None;
        if let Some(t) = s.tokens.as_mut() {
            t.identity = ClientIdentity {
                client_id: "cfg".into(),
                secret: Some(Secret::new("from-config")),
                method: AuthMethod::ClientSecretPost,
                source: IdentitySource::Configured,
            };
        }
        let bytes = encode(&s, &server);
        assert!(!String::from_utf8_lossy(&bytes).contains("from-config"));
        let back = decode(&bytes, &server, CLOCKS).unwrap();
        assert_eq!(back.tokens.unwrap().identity.secret, None);
    }

    #[test]
    fn foreign_old_and_broken_files_are_refused_with_a_reason() {
        let server = url("https://mcp.example.com/mcp");
        let bytes = encode(&sample(), &server);
        assert!(
            decode(&bytes, &url("https://other.example.com/mcp"), CLOCKS)
                .unwrap_err()
                .contains("another server")
        );
        let old = String::from_utf8(bytes)
            .unwrap()
            .replace("\"version\":1", "\"version\":0");
        assert!(
            decode(old.as_bytes(), &server, CLOCKS)
                .unwrap_err()
                .contains("version 0")
        );
        assert!(decode(b"{not json", &server, CLOCKS).is_err());
        assert!(decode(b"", &server, CLOCKS).is_err());
    }

    #[test]
    fn file_names_are_hex_per_canonical_url() {
        let a = file_name(&url("https://MCP.example.com:443/mcp/"));
        assert_eq!(a, file_name(&url("https://mcp.example.com/mcp")));
        assert_ne!(a, file_name(&url("https://mcp.example.com/other")));
        assert_eq!(a.len(), 37);
        assert!(
            a.strip_suffix(".json")
                .unwrap()
                .bytes()
                .all(|b| b.is_ascii_hexdigit())
        );
    }
}
