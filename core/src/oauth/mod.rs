//! MCP authorization (SPEC M11; MCP 2025-11-25 basic/authorization): OAuth 2.1 for remote MCP
//! servers as pure state machines. Nothing here does IO: requests leave as data
//! ([`flow::OAuthRequest`]), answers come back as data, time and randomness are inputs.
//!
//! - [`challenge`]: the `WWW-Authenticate` header of a `401`/`403`.
//! - [`metadata`]: protected resource and authorization server metadata, discovery order,
//!   the resource and issuer checks.
//! - [`client`]: client identity and token endpoint authentication.
//! - [`jwt`]: ES256 client assertions (`private_key_jwt`).
//! - [`tokens`]: token endpoint answers.
//! - [`secrets`]: PKCE, `state`, the generator they come from; [`secrets::Secret`].
//! - [`flow`]: one authorization, discovery to tokens.

pub(crate) mod authorizer;
pub(crate) mod challenge;
pub(crate) mod client;
pub(crate) mod flow;
pub(crate) mod jwt;
pub(crate) mod metadata;
pub(crate) mod redirect;
pub(crate) mod secrets;
pub(crate) mod settings;
pub(crate) mod store;
pub(crate) mod tokens;
