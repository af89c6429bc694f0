//! Elicitations the agent asks of the ACP client (ACP `elicitation/create`, in the ACP v1
//! schema since `@agentclientprotocol/sdk` 2.4): URL mode, for the user to open an MCP
//! server's authorization page (SPEC M11). One [`Elicitations`] table holds the ones waiting
//! for the client's answer, by the JSON-RPC id we sent, with what each is for
//! ([`Purpose`]); forwarding a server's own elicitation (SPEC M12) adds its purpose here.
//!
//! Scope (ACP): while a session is being opened (`session/new`, `session/load`), there is no
//! session id the client knows yet, so the elicitation is tied to that request
//! (`{"requestId": …}`); afterwards to the session (`{"sessionId": …}`).
//!
//! An elicitation has no deadline of its own: the authorization it serves has one, and when
//! that ends (either way) [`Elicitations::complete`] sends `elicitation/complete` and forgets
//! it, so a late answer changes nothing (I6).

use crate::ids::{ServerSlot, SessionId};
use crate::jsonrpc::{self, RpcError, RpcId};
use serde_json::{Value, json};
use std::collections::BTreeMap;

/// What an elicitation is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The user opens the authorization URL of this MCP server (SPEC M11).
    Authorization(ServerSlot),
}

/// What the ACP ties an elicitation to.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Scope {
    /// The `session/new` or `session/load` request being answered (no session id yet).
    Request(RpcId),
    /// An open session.
    Session(SessionId),
}

/// The client's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answer {
    /// `accept`: for URL mode, the user agreed to open the URL (the client opens it).
    Accepted,
    /// `decline` or `cancel`.
    Declined,
    /// An error answer, or one that is none of the three: the client could not show it.
    Failed,
}

/// One elicitation waiting for the client.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pending {
    purpose: Purpose,
    elicitation_id: String,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Elicitations {
    /// By the JSON-RPC id of our `elicitation/create`.
    pending: BTreeMap<u64, Pending>,
    /// Elicitation ids still open (answered or not), by purpose: for `elicitation/complete`.
    open: BTreeMap<ServerSlot, String>,
}

impl Elicitations {
    /// The `elicitation/create` request line (id `id`, one of our outgoing ACP request ids)
    /// asking the user to open `url`, with `message` shown beside it; `elicitation_id` is
    /// unique (it comes from the OAuth secrets generator). Recorded as pending.
    pub(crate) fn ask_url(
        &mut self,
        id: u64,
        purpose: Purpose,
        scope: &Scope,
        elicitation_id: &str,
        url: &str,
        message: &str,
    ) -> String {
        let mut params = json!({
            "mode": "url",
            "elicitationId": elicitation_id,
            "url": url,
            "message": message,
        });
        match scope {
            Scope::Request(rid) => params["requestId"] = rid.to_value(),
            Scope::Session(sid) => params["sessionId"] = json!(sid.to_string()),
        }
        self.pending.insert(
            id,
            Pending {
                purpose,
                elicitation_id: elicitation_id.to_owned(),
            },
        );
        let Purpose::Authorization(slot) = purpose;
        self.open.insert(slot, elicitation_id.to_owned());
        jsonrpc::encode_request(id, "elicitation/create", &params)
    }

    /// Whether `id` is one of ours that waits.
    pub(crate) fn is_pending(&self, id: u64) -> bool {
        self.pending.contains_key(&id)
    }

    /// The client answered our request `id`: what it was for and what the user did; `None`
    /// for an id that is not (or no longer) ours.
    pub(crate) fn on_response(
        &mut self,
        id: u64,
        outcome: Result<Value, RpcError>,
    ) -> Option<(Purpose, Answer)> {
        let pending = self.pending.remove(&id)?;
        let answer = match outcome {
            Ok(v) => match v.get("action").and_then(Value::as_str) {
                Some("accept") => Answer::Accepted,
                Some("decline" | "cancel") => Answer::Declined,
                Some(_) | None => Answer::Failed,
            },
            Err(_) => Answer::Failed,
        };
        Some((pending.purpose, answer))
    }

    /// The authorization of `slot` ended: the `elicitation/complete` notification line for
    /// its elicitation, if one was sent; a pending request for it is forgotten.
    pub(crate) fn complete(&mut self, slot: ServerSlot) -> Option<String> {
        let elicitation_id = self.open.remove(&slot)?;
        self.pending
            .retain(|_, p| p.purpose != Purpose::Authorization(slot));
        Some(jsonrpc::encode_notification(
            "elicitation/complete",
            &json!({"elicitationId": elicitation_id}),
        ))
    }
}

/// Whether `initialize` params advertise URL-mode elicitation
/// (`clientCapabilities.elicitation.url`, an object).
pub(crate) fn client_offers_url_elicitation(params: &Value) -> bool {
    params
        .pointer("/clientCapabilities/elicitation/url")
        .is_some_and(Value::is_object)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: ServerSlot = ServerSlot(3);

    fn frame(line: &str) -> Value {
        assert!(line.ends_with('\n'));
        serde_json::from_str(line).unwrap()
    }

    #[test]
    fn a_url_elicitation_is_request_scoped_while_the_session_opens() {
        let mut e = Elicitations::default();
        let line = e.ask_url(
            7,
            Purpose::Authorization(S),
            &Scope::Request(RpcId::Num(2.into())),
            "el-1",
            "https://as/authorize?x",
            "Authorize …",
        );
        let v = frame(&line);
        assert_eq!(v["method"], "elicitation/create");
        assert_eq!(v["id"], 7);
        assert_eq!(
            v["params"],
            json!({"mode": "url", "elicitationId": "el-1", "url": "https://as/authorize?x", "message": "Authorize …", "requestId": 2})
        );
        let line = e.ask_url(
            8,
            Purpose::Authorization(ServerSlot(4)),
            &Scope::Session(SessionId(5)),
            "el-2",
            "https://u",
            "m",
        );
        assert_eq!(frame(&line)["params"]["sessionId"], "sess_5");
        assert!(e.is_pending(7) && e.is_pending(8));
    }

    #[test]
    fn answers_map_to_accept_decline_or_failure_and_only_once() {
        let mut e = Elicitations::default();
        let scope = Scope::Session(SessionId(1));
        for (id, outcome, want) in [
            (1, Ok(json!({"action": "accept"})), Answer::Accepted),
            (2, Ok(json!({"action": "decline"})), Answer::Declined),
            (3, Ok(json!({"action": "cancel"})), Answer::Declined),
            (4, Ok(json!({"action": "maybe"})), Answer::Failed),
            (
                5,
                Err(RpcError {
                    code: -32601,
                    message: "Method not found".into(),
                    data: None,
                }),
                Answer::Failed,
            ),
        ] {
            e.ask_url(id, Purpose::Authorization(S), &scope, "x", "https://u", "m");
            assert_eq!(
                e.on_response(id, outcome.clone()),
                Some((Purpose::Authorization(S), want))
            );
            assert_eq!(e.on_response(id, outcome), None, "answered once");
        }
    }

    #[test]
    fn completing_sends_the_notification_once_and_drops_a_late_answer() {
        let mut e = Elicitations::default();
        e.ask_url(
            9,
            Purpose::Authorization(S),
            &Scope::Session(SessionId(1)),
            "el-9",
            "https://u",
            "m",
        );
        let v = frame(&e.complete(S).unwrap());
        assert_eq!(v["method"], "elicitation/complete");
        assert_eq!(v["params"], json!({"elicitationId": "el-9"}));
        assert!(v.get("id").is_none());
        assert_eq!(e.complete(S), None);
        assert_eq!(e.on_response(9, Ok(json!({"action": "accept"}))), None);
    }

    #[test]
    fn url_elicitation_is_offered_only_as_an_object() {
        assert!(client_offers_url_elicitation(
            &json!({"clientCapabilities": {"elicitation": {"url": {}}}})
        ));
        for no in [
            json!({}),
            json!({"clientCapabilities": {"elicitation": {"form": {}}}}),
            json!({"clientCapabilities": {"elicitation": {"url": true}}}),
            json!({"clientCapabilities": {"elicitation": {"url": null}}}),
        ] {
            assert!(!client_offers_url_elicitation(&no), "{no}");
        }
    }
}
