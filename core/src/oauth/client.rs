//! Who the agent is at an authorization server: the configured client of a server, the client
//! ID metadata document, or a dynamically registered client (MCP 2025-11-25 "Client
//! Registration Approaches", in that order), and how it authenticates at the token endpoint
//! (`none`, `client_secret_basic`, `client_secret_post`, `private_key_jwt`; RFC 7591 §2,
//! RFC 6749 §2.3.1, RFC 7523 §2.2).

use super::jwt::{self, Es256Key};
use super::secrets::Secret;
use crate::url::{HttpUrl, form_component};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// A token endpoint authentication method (RFC 7591 §2 `token_endpoint_auth_method`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AuthMethod {
    /// A public client: `client_id` in the body, no secret.
    None,
    /// HTTP Basic with the form-encoded id and secret (RFC 6749 §2.3.1).
    ClientSecretBasic,
    /// `client_id` and `client_secret` in the body.
    ClientSecretPost,
    /// A signed JWT assertion (RFC 7523 §2.2), ES256 here.
    PrivateKeyJwt,
}

impl AuthMethod {
    /// The registered name (`client_secret_basic` …).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            AuthMethod::None => "none",
            AuthMethod::ClientSecretBasic => "client_secret_basic",
            AuthMethod::ClientSecretPost => "client_secret_post",
            AuthMethod::PrivateKeyJwt => "private_key_jwt",
        }
    }

    /// The method a registered name stands for, if it is one we use.
    pub(crate) fn parse(name: &str) -> Option<AuthMethod> {
        match name {
            "none" => Some(AuthMethod::None),
            "client_secret_basic" => Some(AuthMethod::ClientSecretBasic),
            "client_secret_post" => Some(AuthMethod::ClientSecretPost),
            "private_key_jwt" => Some(AuthMethod::PrivateKeyJwt),
            _ => None,
        }
    }
}

/// The enterprise identity provider of a cross-app access client (SEP-990, the Identity
/// Assertion JWT Authorization Grant draft): where the user's ID token is exchanged for an
/// authorization grant (RFC 8693).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IdentityProvider {
    /// The IdP's token endpoint.
    pub(crate) token_endpoint: HttpUrl,
    /// The agent's client id at the IdP.
    pub(crate) client_id: String,
    /// Its secret there, if it has one (sent with `client_secret_basic`).
    pub(crate) client_secret: Option<Secret>,
    /// The user's OpenID Connect ID token issued by the IdP.
    pub(crate) id_token: Secret,
}

/// How a server's tokens are obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Grant {
    /// The user authorizes in a browser (authorization code with PKCE, the default).
    AuthorizationCode,
    /// The client acts on its own behalf (OAuth 2.1 §4.2, SEP-1046): no user, no browser.
    ClientCredentials,
    /// Enterprise-managed: the user's ID token from `idp` is exchanged for an ID-JAG, which
    /// the authorization server exchanges for an access token (RFC 8693, then RFC 7523 §2.1).
    CrossAppAccess(IdentityProvider),
}

/// One server's client, from the configuration (docs/configuration.md "Authorization").
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientConfig {
    /// A pre-registered client id (required for `client_credentials` and cross-app access).
    pub(crate) client_id: Option<String>,
    /// Its secret, if confidential.
    pub(crate) client_secret: Option<Secret>,
    /// The token endpoint authentication to use; chosen from the server's list when unset.
    pub(crate) auth_method: Option<AuthMethod>,
    /// The P-256 key for `private_key_jwt`.
    pub(crate) key: Option<Es256Key>,
    /// How tokens are obtained.
    pub(crate) grant: Grant,
    /// Scopes to request instead of the ones discovery suggests (space-separated).
    pub(crate) scope: Option<String>,
    /// This server's client ID metadata document URL (overrides the global one).
    pub(crate) client_metadata_url: Option<HttpUrl>,
    /// A fixed port for the loopback redirect URI (a pre-registered client whose redirect URI
    /// names a port); 0 or unset: any free port.
    pub(crate) redirect_port: Option<u16>,
}

impl ClientConfig {
    /// A configuration that only picks the grant (tests and defaults).
    pub(crate) fn with_grant(grant: Grant) -> ClientConfig {
        ClientConfig {
            client_id: None,
            client_secret: None,
            auth_method: None,
            key: None,
            grant,
            scope: None,
            client_metadata_url: None,
            redirect_port: None,
        }
    }
}

/// Where the client identity of an authorization came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IdentitySource {
    /// The configuration (pre-registered).
    Configured,
    /// A client ID metadata document URL used as the client id.
    MetadataDocument,
    /// Dynamic client registration (RFC 7591), now or in an earlier run (kept in the token
    /// file).
    Registered,
}

/// The client identity used with one authorization server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientIdentity {
    /// `client_id`.
    pub(crate) client_id: String,
    /// `client_secret`, for the secret methods.
    pub(crate) secret: Option<Secret>,
    /// The token endpoint authentication.
    pub(crate) method: AuthMethod,
    /// Where it came from.
    pub(crate) source: IdentitySource,
}

/// The method to use when neither the configuration nor a registration response names one:
/// with a secret, `client_secret_basic` if the server lists it, else `client_secret_post` if
/// it lists that, else `client_secret_basic` (RFC 8414's default); with a key and no secret,
/// `private_key_jwt`; otherwise `none`.
pub(crate) fn choose_method(has_secret: bool, has_key: bool, supported: &[String]) -> AuthMethod {
    let lists = |m: AuthMethod| supported.iter().any(|s| s == m.as_str());
    if has_secret {
        if lists(AuthMethod::ClientSecretBasic) || !lists(AuthMethod::ClientSecretPost) {
            AuthMethod::ClientSecretBasic
        } else {
            AuthMethod::ClientSecretPost
        }
    } else if has_key {
        AuthMethod::PrivateKeyJwt
    } else {
        AuthMethod::None
    }
}

/// The method to ask for in a dynamic registration: `none` (a public native client, RFC 8252
/// §8.4) when the server lists it, else the first secret method it lists, else `none`.
pub(crate) fn registration_method(supported: &[String]) -> AuthMethod {
    [
        AuthMethod::None,
        AuthMethod::ClientSecretBasic,
        AuthMethod::ClientSecretPost,
    ]
    .into_iter()
    .find(|m| supported.iter().any(|s| s == m.as_str()))
    .unwrap_or(AuthMethod::None)
}

/// What client authentication adds to a token request.
#[derive(Debug, Default)]
pub(crate) struct TokenAuth {
    /// Form fields (`client_id`, `client_secret`, `client_assertion` …).
    pub(crate) form: Vec<(String, String)>,
    /// Headers (`authorization: Basic …`).
    pub(crate) headers: Vec<(String, String)>,
}

/// The inputs of a `private_key_jwt` assertion.
pub(crate) struct AssertionInputs<'a> {
    /// The signing key.
    pub(crate) key: Option<&'a Es256Key>,
    /// `aud`: the authorization server's issuer.
    pub(crate) audience: &'a str,
    /// `iat`, seconds since the Unix epoch.
    pub(crate) now_unix_secs: u64,
    /// `jti`: a fresh unique value.
    pub(crate) jti: &'a str,
}

/// Client authentication for a token request by `identity` (RFC 6749 §2.3.1, RFC 7523 §2.2).
///
/// # Errors
/// `private_key_jwt` without a key, or a secret method without a secret.
pub(crate) fn authenticate(
    identity: &ClientIdentity,
    assertion: &AssertionInputs<'_>,
) -> Result<TokenAuth, String> {
    let mut auth = TokenAuth::default();
    let id = identity.client_id.clone();
    let secret = || {
        identity.secret.as_ref().ok_or_else(|| {
            format!(
                "the client {} has no secret for {}",
                id,
                identity.method.as_str()
            )
        })
    };
    match identity.method {
        AuthMethod::None => auth.form.push(("client_id".into(), id.clone())),
        AuthMethod::ClientSecretBasic => {
            let pair = format!(
                "{}:{}",
                form_component(&id),
                form_component(secret()?.expose())
            );
            auth.headers.push((
                "authorization".into(),
                format!("Basic {}", STANDARD.encode(pair)),
            ));
        }
        AuthMethod::ClientSecretPost => {
            auth.form.push(("client_id".into(), id.clone()));
            auth.form
                .push(("client_secret".into(), secret()?.expose().to_owned()));
        }
        AuthMethod::PrivateKeyJwt => {
            let key = assertion.key.ok_or_else(|| {
                format!("the client {id} uses private_key_jwt but no private key is configured")
            })?;
            let claims = jwt::client_assertion_claims(
                &id,
                assertion.audience,
                assertion.now_unix_secs,
                assertion.jti,
            );
            auth.form.push(("client_id".into(), id.clone()));
            auth.form.push((
                "client_assertion_type".into(),
                jwt::JWT_BEARER_ASSERTION.into(),
            ));
            auth.form
                .push(("client_assertion".into(), key.sign(&claims)));
        }
    }
    Ok(auth)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| (*x).to_owned()).collect()
    }

    fn identity(method: AuthMethod, secret: Option<&str>) -> ClientIdentity {
        ClientIdentity {
            client_id: "my client".into(),
            secret: secret.map(Secret::new),
            method,
            source: IdentitySource::Configured,
        }
    }

    fn inputs<'a>(key: Option<&'a Es256Key>) -> AssertionInputs<'a> {
        AssertionInputs {
            key,
            audience: "https://as",
            now_unix_secs: 10,
            jti: "j",
        }
    }

    #[test]
    fn the_method_follows_what_the_server_lists() {
        assert_eq!(
            choose_method(true, false, &s(&["client_secret_post"])),
            AuthMethod::ClientSecretPost
        );
        assert_eq!(
            choose_method(
                true,
                false,
                &s(&["client_secret_basic", "client_secret_post"])
            ),
            AuthMethod::ClientSecretBasic
        );
        assert_eq!(
            choose_method(true, false, &s(&["none"])),
            AuthMethod::ClientSecretBasic
        );
        assert_eq!(
            choose_method(false, true, &s(&["private_key_jwt"])),
            AuthMethod::PrivateKeyJwt
        );
        assert_eq!(
            choose_method(false, false, &s(&["client_secret_basic"])),
            AuthMethod::None
        );
        assert_eq!(
            registration_method(&s(&["client_secret_post", "none"])),
            AuthMethod::None
        );
        assert_eq!(
            registration_method(&s(&["client_secret_post"])),
            AuthMethod::ClientSecretPost
        );
        assert_eq!(
            registration_method(&s(&["private_key_jwt"])),
            AuthMethod::None
        );
        for m in [
            AuthMethod::None,
            AuthMethod::ClientSecretBasic,
            AuthMethod::ClientSecretPost,
            AuthMethod::PrivateKeyJwt,
        ] {
            assert_eq!(AuthMethod::parse(m.as_str()), Some(m));
        }
        assert_eq!(AuthMethod::parse("tls_client_auth"), None);
    }

    #[test]
    fn basic_auth_form_encodes_then_base64s_the_pair() {
        let auth = authenticate(
            &identity(AuthMethod::ClientSecretBasic, Some("p:w+d")),
            &inputs(None),
        )
        .unwrap();
        assert!(auth.form.is_empty());
        let (name, value) = &auth.headers[0];
        assert_eq!(name, "authorization");
        let decoded = STANDARD
            .decode(value.strip_prefix("Basic ").unwrap())
            .unwrap();
        assert_eq!(String::from_utf8(decoded).unwrap(), "my+client:p%3Aw%2Bd");
    }

    #[test]
    fn post_and_none_put_the_client_in_the_body() {
        let auth = authenticate(
            &identity(AuthMethod::ClientSecretPost, Some("sec")),
            &inputs(None),
        )
        .unwrap();
        assert_eq!(
            auth.form,
            [
                ("client_id".to_owned(), "my client".to_owned()),
                ("client_secret".to_owned(), "sec".to_owned())
            ]
        );
        assert!(auth.headers.is_empty());
        let auth = authenticate(&identity(AuthMethod::None, None), &inputs(None)).unwrap();
        assert_eq!(
            auth.form,
            [("client_id".to_owned(), "my client".to_owned())]
        );
    }

    #[test]
    fn a_secret_method_without_a_secret_and_jwt_without_a_key_are_errors() {
        let e =
            authenticate(&identity(AuthMethod::ClientSecretPost, None), &inputs(None)).unwrap_err();
        assert!(e.contains("no secret"), "{e}");
        let e =
            authenticate(&identity(AuthMethod::PrivateKeyJwt, None), &inputs(None)).unwrap_err();
        assert!(e.contains("no private key"), "{e}");
    }

    #[test]
    fn private_key_jwt_sends_a_signed_assertion() {
        let key = Es256Key::from_pem(super::super::jwt::tests::TEST_KEY_PKCS8).unwrap();
        let auth = authenticate(
            &identity(AuthMethod::PrivateKeyJwt, None),
            &inputs(Some(&key)),
        )
        .unwrap();
        let field = |n: &str| {
            auth.form
                .iter()
                .find(|(k, _)| k == n)
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            field("client_assertion_type").as_deref(),
            Some(jwt::JWT_BEARER_ASSERTION)
        );
        assert_eq!(field("client_assertion").unwrap().split('.').count(), 3);
        assert!(auth.headers.is_empty());
    }
}
