//! The unguessable values of an authorization (PKCE verifiers, `state`, JWT ids), drawn from
//! the runtime's randomness (DESIGN: randomness is an input): [`SecretRng`] is a SHA-256
//! counter generator keyed by 32 bytes the runtime read from the OS at start
//! ([`Config::oauth_seed`](crate::Config::oauth_seed)). The same seed gives the same values
//! (reproducible runs with `BUZZ_AGENT_SEED`, SPEC I12); an OS seed makes them unguessable.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};

/// `BASE64URL` without padding (RFC 7636 §A, RFC 7515 §2).
pub(crate) fn b64url(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// A deterministic generator of 32-byte blocks: block n = SHA-256(domain ‖ seed ‖ n). With a
/// secret seed its output cannot be predicted without the seed (SHA-256's preimage
/// resistance), which is what PKCE (RFC 7636 §7.1: at least 256 bits of entropy) and `state`
/// need.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SecretRng {
    seed: [u8; 32],
    counter: u64,
}

impl std::fmt::Debug for SecretRng {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretRng(<seed>, {})", self.counter)
    }
}

/// Domain separation of the generator's blocks from any other use of the seed.
const DOMAIN: &[u8] = b"buzz-agent oauth secrets v1";

impl SecretRng {
    /// A generator keyed by `seed`.
    pub(crate) fn new(seed: [u8; 32]) -> SecretRng {
        SecretRng { seed, counter: 0 }
    }

    /// A generator for a sub-machine (one per server): keyed by a block of this one, so the
    /// two streams never share a value.
    pub(crate) fn fork(&mut self) -> SecretRng {
        SecretRng::new(self.block())
    }

    /// The next 32 bytes.
    pub(crate) fn block(&mut self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(DOMAIN);
        h.update(self.seed);
        h.update(self.counter.to_le_bytes());
        self.counter = self.counter.wrapping_add(1);
        h.finalize().into()
    }

    /// A fresh value of 128 bits as 22 base64url characters (`state`, `jti`, elicitation ids).
    pub(crate) fn token(&mut self) -> String {
        b64url(&self.block()[..16])
    }

    /// A fresh PKCE pair (RFC 7636 §4.1–4.2): a 43-character verifier from 256 random bits and
    /// its `S256` challenge.
    pub(crate) fn pkce(&mut self) -> Pkce {
        let verifier = b64url(&self.block());
        let challenge = b64url(&sha256(verifier.as_bytes()));
        Pkce {
            verifier,
            challenge,
        }
    }
}

/// A PKCE verifier and its `S256` challenge. `Debug` shows neither.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Pkce {
    /// `code_verifier` for the token request.
    pub(crate) verifier: String,
    /// `code_challenge` for the authorization request (method `S256`).
    pub(crate) challenge: String,
}

impl std::fmt::Debug for Pkce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pkce(<secret>)")
    }
}

/// A credential (client secret, token, ID token) as text. `Debug` shows `<secret>`, never the
/// value (DESIGN: logs never carry secrets); [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub(crate) fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one place it is sent or stored.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<secret>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_s256_challenge_is_rfc_7636_appendix_b() {
        // RFC 7636 Appendix B's verifier and challenge.
        let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
        assert_eq!(
            b64url(&sha256(verifier.as_bytes())),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn verifiers_are_43_unreserved_characters_and_never_repeat() {
        let mut rng = SecretRng::new([7; 32]);
        let a = rng.pkce();
        let b = rng.pkce();
        assert_eq!(a.verifier.len(), 43);
        assert!(
            a.verifier
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        );
        assert_ne!(a.verifier, b.verifier);
        assert_eq!(a.challenge, b64url(&sha256(a.verifier.as_bytes())));
        assert_eq!(rng.token().len(), 22);
        assert!(!format!("{a:?}{rng:?}").contains(&a.verifier));
        assert_eq!(format!("{:?}", Secret::new("hunter2")), "<secret>");
        assert_eq!(Secret::new("hunter2").expose(), "hunter2");
    }

    #[test]
    fn the_same_seed_gives_the_same_values_and_forks_differ() {
        let mut x = SecretRng::new([1; 32]);
        let mut y = SecretRng::new([1; 32]);
        assert_eq!(x.token(), y.token());
        let mut fx = x.fork();
        assert_ne!(fx.token(), x.token());
        assert_ne!(
            SecretRng::new([2; 32]).token(),
            SecretRng::new([1; 32]).token()
        );
    }
}
