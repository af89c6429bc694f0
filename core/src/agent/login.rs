//! The user's login for a remote MCP server (SPEC M11), as the router carries it out: the
//! authorization URL goes to the ACP client as a URL-mode `elicitation/create` when it presents
//! URL mode (scoped to the server's session, or to the request that opens it), else as a
//! notice with the URL and `$BROWSER` when set; the client's decline (or cancel, or an error
//! answer) declines the server's authorization; when the login is over, a client that was
//! asked gets `elicitation/complete`. What to ask is decided in `elicitation.rs`
//! ([`login_ask`]); the flow itself runs in the server's transport.

use super::Agent;
use crate::authorization::browser_argv;
use crate::config::LogLevel;
use crate::elicitation::{LoginAnswer, LoginAsk, LoginScope, login_ask};
use crate::ids::{PermissionRequestId, ServerSlot};
use crate::io::{Action, OAuthAction};
use crate::jsonrpc::{self, RpcError};
use serde_json::Value;

impl Agent {
    /// `server` needs the user to open `url` to authorize it.
    pub(super) fn on_login(&mut self, server: ServerSlot, url: &str) {
        let name = self.parts.servers.name(server);
        let Some((sid, entry)) = self
            .parts
            .servers
            .session_of(server)
            .and_then(|sid| Some((sid, self.sessions.get(&sid)?)))
        else {
            return;
        };
        let scope = match entry.opening_request() {
            Some(request) => LoginScope::Request(request.clone()),
            None => LoginScope::Session(sid.to_string()),
        };
        let starting = entry.is_starting();
        let elicitation_id = self.logins.next_id(server);
        match login_ask(self.elicitation_modes, &name, url, &scope, &elicitation_id) {
            LoginAsk::Elicit(params) => {
                let id = self.parts.ids.next_permission();
                self.log(
                    LogLevel::Info,
                    format!(
                        "MCP server '{name}' needs authorization; asking the client to open its URL (request {id})"
                    ),
                );
                self.logins.insert(id, server, elicitation_id);
                self.parts
                    .out
                    .push(Action::WriteAcp(jsonrpc::encode_request(
                        id.0,
                        "elicitation/create",
                        &params,
                    )));
            }
            LoginAsk::Notice(text) => {
                if let Some(argv) = self
                    .parts
                    .cfg
                    .oauth
                    .browser
                    .as_deref()
                    .and_then(|b| browser_argv(b, url))
                {
                    self.parts
                        .out
                        .push(Action::OAuth(OAuthAction::OpenBrowser { server, argv }));
                }
                // A session not answered yet has nowhere to show it (the URL is logged); an
                // open one shows it at once, also while its turn waits for the server.
                if starting {
                    return;
                }
                if let Some(entry) = self.sessions.get_mut(&sid) {
                    entry.session.notify("mcp_server_login", text);
                }
                if self.has_turn(sid) {
                    self.step_turn(sid, |turn, sess, cx| {
                        turn.show_notices(sess, cx);
                        None
                    });
                }
            }
        }
    }

    /// The login of `server` is over (or the server stops with its session): a client that
    /// was asked to show it is told.
    pub(super) fn on_login_done(&mut self, server: ServerSlot) {
        if let Some(params) = self.logins.done(server) {
            self.parts
                .out
                .push(Action::WriteAcp(jsonrpc::encode_notification(
                    "elicitation/complete",
                    &params,
                )));
        }
    }

    /// The client answered ACP request `id`: `true` when it was a login's (a decline goes to
    /// the server's authorization).
    pub(super) fn on_login_answer(
        &mut self,
        id: PermissionRequestId,
        outcome: &Result<Value, RpcError>,
    ) -> bool {
        let Some(answer) = self.logins.answered(id, outcome.as_ref().ok()) else {
            return false;
        };
        if let LoginAnswer::Declined(server) = answer {
            self.log(
                LogLevel::Warn,
                format!(
                    "MCP server '{}': the client declined its login",
                    self.parts.servers.name(server)
                ),
            );
            let events = self.parts.servers.login_declined(
                server,
                &mut self.parts.out,
                &mut self.parts.timers,
            );
            self.route_mcp(events);
        }
        true
    }
}
