//! ES256 JSON Web Tokens (RFC 7515, RFC 7518 §3.4) for `private_key_jwt` client
//! authentication (RFC 7523 §2.2, OpenID Connect Core §9): the assertion a headless client
//! signs with its P-256 key at a token endpoint.
//!
//! Signing is deterministic (RFC 6979, the `p256` crate): it needs no randomness, so the core
//! can sign. The key is parsed once, when the configuration is read.

use super::secrets::b64url;
use p256::ecdsa::signature::Signer;
use p256::ecdsa::{Signature, SigningKey};
use p256::pkcs8::DecodePrivateKey;
use serde_json::{Value, json};

/// `client_assertion_type` of a JWT client assertion (RFC 7523 §2.2).
pub(crate) const JWT_BEARER_ASSERTION: &str =
    "urn:ietf:params:oauth:client-assertion-type:jwt-bearer";

/// How long a client assertion is valid, in seconds (RFC 7523 §3: short-lived).
pub(crate) const ASSERTION_LIFETIME_SECS: u64 = 300;

/// A P-256 private key for ES256. `Debug` never shows it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Es256Key(SigningKey);

impl std::fmt::Debug for Es256Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Es256Key(<private>)")
    }
}

impl Es256Key {
    /// Reads a PEM P-256 private key: PKCS#8 (`-----BEGIN PRIVATE KEY-----`, what `jose` and
    /// `openssl pkcs8` write) or SEC1 (`-----BEGIN EC PRIVATE KEY-----`, what
    /// `openssl ecparam -genkey` writes).
    ///
    /// # Errors
    /// A sentence naming what is wrong (never the key's bytes).
    pub(crate) fn from_pem(pem: &str) -> Result<Es256Key, String> {
        let pem = pem.trim();
        if let Ok(k) = SigningKey::from_pkcs8_pem(pem) {
            return Ok(Es256Key(k));
        }
        if let Ok(k) = p256::SecretKey::from_sec1_pem(pem) {
            return Ok(Es256Key(SigningKey::from(k)));
        }
        Err(if pem.starts_with("-----BEGIN") {
            "not a P-256 (ES256) private key in PKCS#8 or SEC1 PEM form".to_owned()
        } else {
            "not a PEM private key (it must start with -----BEGIN PRIVATE KEY-----)".to_owned()
        })
    }

    /// A compact JWS `header.claims.signature` with `{"alg":"ES256","typ":"JWT"}` over
    /// `claims`; the signature is the 64-byte `R ‖ S` form (RFC 7518 §3.4).
    pub(crate) fn sign(&self, claims: &Value) -> String {
        let header = json!({"alg": "ES256", "typ": "JWT"});
        let mut input = b64url(header.to_string().as_bytes());
        input.push('.');
        input.push_str(&b64url(claims.to_string().as_bytes()));
        let signature: Signature = self.0.sign(input.as_bytes());
        input.push('.');
        input.push_str(&b64url(&signature.to_bytes()));
        input
    }
}

/// The claims of a client assertion (RFC 7523 §3): `iss` and `sub` are the client id, `aud`
/// the authorization server's issuer identifier (draft-ietf-oauth-rfc7523bis: the issuer, not
/// the token endpoint URL), `iat` now, `exp` [`ASSERTION_LIFETIME_SECS`] later, `jti` unique.
pub(crate) fn client_assertion_claims(
    client_id: &str,
    audience: &str,
    now_unix_secs: u64,
    jti: &str,
) -> Value {
    json!({
        "iss": client_id,
        "sub": client_id,
        "aud": audience,
        "iat": now_unix_secs,
        "exp": now_unix_secs + ASSERTION_LIFETIME_SECS,
        "jti": jti,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;
    use p256::ecdsa::VerifyingKey;
    use p256::ecdsa::signature::Verifier;

    /// A P-256 key in PKCS#8 PEM, generated for these tests (openssl genpkey -algorithm EC
    /// -pkeyopt ec_paramgen_curve:P-256).
    pub(crate) const TEST_KEY_PKCS8: &str = "-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgoTUCEPwPJ4eyIaG0
A/N/mOH4COAdT3zeLlAEjWhubwuhRANCAAS6peEAJ2dfH4AY9SzmXsDImgiG4jQB
la0YRuiceClJMM4Drd7aSV7z0XINuQT1xfU3RqvE8b3vTkX8gbRc5ZE9
-----END PRIVATE KEY-----";

    /// The same key in SEC1 PEM (openssl ec).
    const TEST_KEY_SEC1: &str = "-----BEGIN EC PRIVATE KEY-----
MHcCAQEEIKE1AhD8DyeHsiGhtAPzf5jh+AjgHU983i5QBI1obm8LoAoGCCqGSM49
AwEHoUQDQgAEuqXhACdnXx+AGPUs5l7AyJoIhuI0AZWtGEbonHgpSTDOA63e2kle
89FyDbkE9cX1N0arxPG9705F/IG0XOWRPQ==
-----END EC PRIVATE KEY-----";

    #[test]
    fn a_signed_assertion_verifies_with_the_public_key_and_carries_the_claims() {
        let key = Es256Key::from_pem(TEST_KEY_PKCS8).unwrap();
        let claims =
            client_assertion_claims("client-1", "https://as.example.com", 1_700_000_000, "j1");
        let jwt = key.sign(&claims);
        let parts: Vec<&str> = jwt.split('.').collect();
        assert_eq!(parts.len(), 3);
        let header: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[0]).unwrap()).unwrap();
        assert_eq!(header, json!({"alg": "ES256", "typ": "JWT"}));
        let body: Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(parts[1]).unwrap()).unwrap();
        assert_eq!(body["iss"], "client-1");
        assert_eq!(body["sub"], "client-1");
        assert_eq!(body["aud"], "https://as.example.com");
        assert_eq!(body["exp"], 1_700_000_000 + ASSERTION_LIFETIME_SECS);
        let sig = Signature::from_slice(&URL_SAFE_NO_PAD.decode(parts[2]).unwrap()).unwrap();
        let public = VerifyingKey::from(&key.0);
        let signed = format!("{}.{}", parts[0], parts[1]);
        assert!(public.verify(signed.as_bytes(), &sig).is_ok());
        assert!(public.verify(b"other", &sig).is_err());
        // RFC 6979: the same input gives the same signature, without randomness.
        assert_eq!(key.sign(&claims), jwt);
    }

    #[test]
    fn sec1_and_pkcs8_forms_of_one_key_are_the_same_key() {
        assert_eq!(
            Es256Key::from_pem(TEST_KEY_SEC1).unwrap(),
            Es256Key::from_pem(TEST_KEY_PKCS8).unwrap()
        );
    }

    #[test]
    fn a_bad_key_is_refused_without_echoing_it() {
        let e = Es256Key::from_pem("hunter2").unwrap_err();
        assert!(e.contains("not a PEM") && !e.contains("hunter2"), "{e}");
        let e = Es256Key::from_pem("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----")
            .unwrap_err();
        assert!(e.contains("P-256"), "{e}");
        assert_eq!(
            format!("{:?}", Es256Key::from_pem(TEST_KEY_PKCS8).unwrap()),
            "Es256Key(<private>)"
        );
    }
}
