//! The action queue of one [`Agent`](crate::Agent) (DESIGN "The core's contract": `Agent` owns
//! the queue; `poll_action` drains it). Sub-machines get `&mut Outbox` to ask for IO and to log;
//! they never see the `Agent`.

use crate::config::LogLevel;
use crate::io::{Action, LogRecord};
use crate::jsonrpc::{self, RpcError, RpcId};
use crate::time::MonoTime;
use serde_json::Value;
use std::collections::VecDeque;

/// Actions in the order they were asked for, plus the step's time and the log threshold.
#[derive(Debug)]
pub(crate) struct Outbox {
    actions: VecDeque<Action>,
    level: LogLevel,
    now: MonoTime,
}

impl Outbox {
    /// An empty queue at `now` that keeps log lines at or above `level` (`BUZZ_AGENT_LOG`).
    pub(crate) fn new(level: LogLevel, now: MonoTime) -> Outbox {
        Outbox {
            actions: VecDeque::new(),
            level,
            now,
        }
    }

    /// The time of the step being handled (already clamped monotonic by the agent).
    pub(crate) fn now(&self) -> MonoTime {
        self.now
    }

    /// Moves the step's time forward; earlier times are ignored (DESIGN: the core clamps time
    /// monotonic).
    pub(crate) fn advance(&mut self, now: MonoTime) {
        if now > self.now {
            self.now = now;
        }
    }

    /// Queues `action` after everything queued before.
    pub(crate) fn push(&mut self, action: Action) {
        self.actions.push_back(action);
    }

    /// The oldest queued action.
    pub(crate) fn pop(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Whether a line at `level` would be kept (to skip building costly messages).
    pub(crate) fn logs(&self, level: LogLevel) -> bool {
        level <= self.level
    }

    /// Queues a log line at the step's time if `level` passes the threshold (SPEC T2).
    pub(crate) fn log(&mut self, level: LogLevel, message: String) {
        if self.logs(level) {
            self.actions.push_back(Action::Log(LogRecord {
                level,
                at: self.now,
                message,
            }));
        }
    }

    /// Writes the JSON-RPC success response `result` to request `id` on stdout (ACP).
    pub(crate) fn reply_ok(&mut self, id: &RpcId, result: &Value) {
        self.push(Action::WriteAcp(jsonrpc::encode_result(id, result)));
    }

    /// Writes a JSON-RPC error response on stdout (ACP); `id` is `None` when the request's id
    /// could not be read (JSON-RPC: `"id": null`).
    pub(crate) fn reply_err(
        &mut self,
        id: Option<&RpcId>,
        code: i64,
        message: String,
        data: Option<Value>,
    ) {
        let err = RpcError {
            code,
            message,
            data,
        };
        self.push(Action::WriteAcp(jsonrpc::encode_error(id, &err)));
    }

    /// Writes a `session/update` notification for `session` (SPEC A6).
    pub(crate) fn send_update(&mut self, session: &str, update: &Value) {
        self.push(Action::WriteAcp(crate::acp::update_line(session, update)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_come_out_in_order_and_logs_below_the_threshold_are_dropped() {
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        out.push(Action::Exit { code: 1 });
        out.log(LogLevel::Debug, "hidden".into());
        out.advance(MonoTime::ZERO.plus_ms(5));
        out.advance(MonoTime::ZERO.plus_ms(2));
        out.log(LogLevel::Warn, "shown".into());
        assert_eq!(out.pop(), Some(Action::Exit { code: 1 }));
        match out.pop() {
            Some(Action::Log(r)) => {
                assert_eq!((r.level, r.message.as_str()), (LogLevel::Warn, "shown"));
                assert_eq!(r.at, MonoTime::ZERO.plus_ms(5), "time never goes back");
            }
            other => panic!("expected the warn line, got {other:?}"),
        }
        assert_eq!(out.pop(), None);
    }

    #[test]
    fn t1_replies_and_updates_are_queued_as_acp_lines_at_the_step_s_time() {
        let mut out = Outbox::new(LogLevel::Info, MonoTime::ZERO);
        out.advance(MonoTime::ZERO.plus_ms(7));
        assert_eq!(out.now(), MonoTime::ZERO.plus_ms(7));
        let id = RpcId::Num(3.into());
        out.reply_ok(&id, &serde_json::json!({"ok": true}));
        out.reply_err(Some(&id), -32602, "bad".into(), None);
        out.reply_err(None, -32700, "parse".into(), None);
        out.send_update("sess_1", &serde_json::json!({"sessionUpdate": "x"}));
        let lines: Vec<Action> = std::iter::from_fn(|| out.pop()).collect();
        assert_eq!(
            lines,
            vec![
                Action::WriteAcp(jsonrpc::encode_result(
                    &id,
                    &serde_json::json!({"ok": true})
                )),
                Action::WriteAcp(jsonrpc::encode_error(
                    Some(&id),
                    &RpcError {
                        code: -32602,
                        message: "bad".into(),
                        data: None
                    }
                )),
                Action::WriteAcp(jsonrpc::encode_error(
                    None,
                    &RpcError {
                        code: -32700,
                        message: "parse".into(),
                        data: None
                    }
                )),
                Action::WriteAcp(crate::acp::update_line(
                    "sess_1",
                    &serde_json::json!({"sessionUpdate": "x"})
                )),
            ]
        );
    }
}
