//! Shutdown (SPEC P1, M8): on stdin EOF, SIGTERM/SIGINT or a dead stdout — cancel every turn,
//! answer pending requests, close every server's stdin, wait up to 2 s, SIGTERM every process
//! group, wait up to 2 s (or until every leader exited, plus a short grace for grandchildren),
//! SIGKILL every group, then exit 0. Bounded by ~4.3 s whatever the children do.

use crate::agent::Agent;
use crate::config::LogLevel;
use crate::io::{Action, Signal};
use crate::jsonrpc;
use crate::time::MonoTime;

/// Grace after SIGTERM for grandchildren when every leader already exited, in ms.
const GROUP_GRACE_MS: u64 = 250;

/// Shutdown stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// stdin of every child closed; waiting for leaders to exit (≤ 2 s).
    Closing { since: MonoTime },
    /// SIGTERM sent to every group; waiting (≤ 2 s).
    Terminating { since: MonoTime },
    /// Done: `Exit` queued.
    Exited,
}

/// Shutdown progress.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shutdown {
    pub stage: Stage,
}

impl Shutdown {
    /// When the current stage times out.
    #[must_use]
    pub fn deadline(&self) -> Option<MonoTime> {
        match self.stage {
            Stage::Closing { since } | Stage::Terminating { since } => {
                Some(since.plus_ms(crate::mcp::KILL_GRACE_MS))
            }
            Stage::Exited => None,
        }
    }
}

impl Agent {
    /// Begin shutting down (idempotent).
    pub(crate) fn begin_shutdown(&mut self) {
        if self.shutdown.is_some() {
            return;
        }
        let now = self.now;
        self.shutdown = Some(Shutdown {
            stage: Stage::Closing { since: now },
        });
        // Cancel every turn and answer pending requests (P1).
        let sids: Vec<String> = self.sessions.keys().cloned().collect();
        for sid in &sids {
            let starting = self.sessions.get(sid).and_then(|s| s.starting.clone());
            if let Some(rpc) = starting {
                self.reply_err(
                    Some(&rpc),
                    jsonrpc::RpcError::SERVER_ERROR,
                    "agent is shutting down".into(),
                    None,
                );
                if let Some(s) = self.sessions.get_mut(sid) {
                    s.starting = None;
                }
            }
            if let Some(s) = self.sessions.get_mut(sid)
                && let Some((id, _)) = s.queued.take()
            {
                self.reply_ok(&id, &serde_json::json!({"stopReason": "cancelled"}));
            }
            self.cancel_turn(sid, "agent shutting down");
            // A turn still in a hook gate is answered now: shutdown does not wait for hooks.
            if self.sessions.get(sid).is_some_and(|s| s.turn.is_some()) {
                self.finish_turn(sid, "cancelled");
            }
        }
        for call in std::mem::take(&mut self.llm_calls).into_keys() {
            self.push(Action::CancelLlm { call });
        }
        self.out_requests.clear();
        let procs: Vec<(crate::io::ProcKey, bool)> = self
            .servers
            .values()
            .map(|s| (s.proc, s.was_started))
            .collect();
        for (proc, started) in procs {
            if started {
                self.push(Action::CloseMcpStdin { proc });
            }
        }
        for s in self.servers.values_mut() {
            s.pending.clear();
            if !matches!(s.state, crate::mcp::ServerState::Dead { .. }) {
                s.state = crate::mcp::ServerState::Dead {
                    reason: format!("MCP server '{}' stopped: agent shutting down", s.name),
                };
            }
        }
        self.log(
            LogLevel::Debug,
            "shutdown: closed every MCP server's stdin".into(),
        );
    }

    fn any_leader_alive(&self) -> bool {
        self.servers.values().any(|s| s.alive)
    }

    fn term_all_groups(&mut self) {
        let procs: Vec<_> = self
            .servers
            .values()
            .flat_map(crate::mcp::Server::procs_to_sweep)
            .collect();
        for proc in procs {
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Term,
            });
        }
    }

    fn kill_all_and_exit(&mut self) {
        let procs: Vec<_> = self
            .servers
            .values()
            .flat_map(crate::mcp::Server::procs_to_sweep)
            .collect();
        for proc in procs {
            self.push(Action::SignalProcessGroup {
                proc,
                signal: Signal::Kill,
            });
        }
        self.log(LogLevel::Info, "shutdown complete; exiting".into());
        self.push(Action::Exit { code: 0 });
        self.shutdown = Some(Shutdown {
            stage: Stage::Exited,
        });
        self.finished = true;
    }

    /// Advance shutdown when leaders exit early (called after every step).
    pub(crate) fn check_shutdown_progress(&mut self) {
        let Some(sh) = self.shutdown else { return };
        let now = self.now;
        match sh.stage {
            Stage::Closing { .. } if !self.any_leader_alive() => {
                self.term_all_groups();
                self.shutdown = Some(Shutdown {
                    stage: Stage::Terminating { since: now },
                });
                self.check_shutdown_progress();
            }
            Stage::Terminating { since }
                if !self.any_leader_alive()
                    && (now >= since.plus_ms(GROUP_GRACE_MS)
                        || !self.servers.values().any(|s| s.was_started)) =>
            {
                self.kill_all_and_exit();
            }
            Stage::Closing { .. } | Stage::Terminating { .. } | Stage::Exited => {}
        }
    }

    pub(crate) fn fire_shutdown_timers(&mut self) {
        let Some(sh) = self.shutdown else { return };
        let now = self.now;
        match sh.stage {
            Stage::Closing { since } if now >= since.plus_ms(crate::mcp::KILL_GRACE_MS) => {
                self.term_all_groups();
                self.shutdown = Some(Shutdown {
                    stage: Stage::Terminating { since: now },
                });
            }
            Stage::Terminating { since } if now >= since.plus_ms(crate::mcp::KILL_GRACE_MS) => {
                self.kill_all_and_exit()
            }
            Stage::Terminating { since }
                if !self.any_leader_alive() && now >= since.plus_ms(GROUP_GRACE_MS) =>
            {
                self.kill_all_and_exit();
            }
            Stage::Closing { .. } | Stage::Terminating { .. } | Stage::Exited => {}
        }
    }

    /// The shutdown deadline, including the short grandchild grace.
    pub(crate) fn shutdown_deadline(&self) -> Option<MonoTime> {
        let sh = self.shutdown?;
        match sh.stage {
            Stage::Terminating { since } if !self.any_leader_alive() => {
                Some(since.plus_ms(GROUP_GRACE_MS))
            }
            Stage::Closing { .. } | Stage::Terminating { .. } | Stage::Exited => sh.deadline(),
        }
    }
}
