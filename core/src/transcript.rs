//! The conversation of one session (SPEC L4, K1): the history the model sees, the usage the
//! provider last reported (for the K1 projection), and the counter of tool-call ids the agent
//! hands out. The session store of SPEC A9 will persist this.

use crate::history::History;
use crate::llm::Message;

/// One session's conversation.
#[derive(Debug, Clone, Default)]
pub(crate) struct Transcript {
    /// The history sent to the model, oldest first, with the serialized form of its prefix
    /// kept for the next request (issue #15). Invariant (SPEC L4, DESIGN I9): every tool call
    /// of an assistant message is followed by exactly one result.
    pub(crate) messages: History,
    /// Input tokens the last LLM response reported (SPEC K1 projection).
    pub(crate) last_input_tokens: u64,
    /// Length of `messages` when `last_input_tokens` was reported; bytes after it are
    /// projected (1 byte ≈ 1 token).
    pub(crate) usage_mark: usize,
    /// Tool-call numbers handed out in this session: ACP ids `tc_N` and hook injection ids
    /// `buzz_hook_…_N` share the counter (from 1).
    calls_issued: u64,
}

impl Transcript {
    /// The next tool-call number of this session (1, 2, …).
    pub(crate) fn next_call_no(&mut self) -> u64 {
        self.calls_issued += 1;
        self.calls_issued
    }

    /// The provider reported `input_tokens` for a request holding the whole current history.
    pub(crate) fn record_usage(&mut self, input_tokens: u64) {
        self.last_input_tokens = input_tokens;
        self.usage_mark = self.messages.len();
    }

    /// The history was replaced (compaction): nothing is known of its size until the next
    /// response reports it.
    pub(crate) fn replace(&mut self, messages: Vec<Message>) {
        self.messages = History::from(messages);
        self.last_input_tokens = 0;
        self.usage_mark = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_numbers_count_from_one_and_a_replaced_history_forgets_its_usage() {
        let mut t = Transcript::default();
        assert_eq!((t.next_call_no(), t.next_call_no()), (1, 2));
        t.messages.push(Message::User { text: "hi".into() });
        t.record_usage(500);
        assert_eq!((t.last_input_tokens, t.usage_mark), (500, 1));
        t.replace(Vec::new());
        assert_eq!((t.last_input_tokens, t.usage_mark), (0, 0));
        assert_eq!(t.next_call_no(), 3, "numbers are never reused");
    }
}
