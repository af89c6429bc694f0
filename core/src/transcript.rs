//! The conversation of one session (SPEC L4, K1): the history the model sees, the usage the
//! provider last reported (for the K1 projection), and the counter of tool-call ids the agent
//! hands out. Every change of the history goes through a method here, so the session store
//! (`store.rs`, SPEC A9) knows what to record: appends, and the lowest position changed in
//! place since it last looked (a compaction, a hook call joining the model's answer).

use crate::history::History;
use crate::llm::BodyCache;
use crate::llm::Message;

/// One session's conversation.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Transcript {
    /// The history sent to the model, oldest first, with the serialized form of its prefix
    /// kept for the next request (issue #15). Invariant (SPEC L4, DESIGN I9): every tool call
    /// of an assistant message is followed by exactly one result.
    messages: History,
    /// Input tokens the last LLM response reported (SPEC K1 projection).
    pub(crate) last_input_tokens: u64,
    /// Length of `messages` when `last_input_tokens` was reported; bytes after it are
    /// projected (1 byte ≈ 1 token).
    pub(crate) usage_mark: usize,
    /// Tool-call numbers handed out in this session: ACP ids `tc_N` and hook injection ids
    /// `buzz_hook_…_N` share the counter (from 1).
    calls_issued: u64,
    /// The lowest position changed other than by appending since [`Transcript::take_changed`]
    /// (`None`: only appends).
    changed_from: Option<usize>,
}

impl Transcript {
    /// A transcript rebuilt from a stored session (SPEC A9): its history, its usage mark and
    /// the highest tool-call number it used. Nothing is marked changed.
    pub(crate) fn restored(
        messages: Vec<Message>,
        last_input_tokens: u64,
        usage_mark: usize,
        calls_issued: u64,
    ) -> Transcript {
        Transcript {
            usage_mark: usage_mark.min(messages.len()),
            messages: History::from(messages),
            last_input_tokens,
            calls_issued,
            changed_from: None,
        }
    }

    /// The history, oldest first.
    pub(crate) fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Messages in the history.
    pub(crate) fn len(&self) -> usize {
        self.messages.len()
    }

    /// The history and the cache of its serialized prefix, for building a round's request
    /// (issue #15).
    pub(crate) fn with_cache(&mut self) -> (&[Message], &mut BodyCache) {
        self.messages.with_cache()
    }

    /// How many messages the last request built with prompt caching carried, if only appends
    /// came since (SPEC L11).
    pub(crate) fn cache_mark(&self) -> Option<usize> {
        self.messages.cache_mark()
    }

    /// A request built with prompt caching carried the whole current history.
    pub(crate) fn set_cache_mark(&mut self) {
        let len = self.messages.len();
        self.messages.set_cache_mark(len);
    }

    /// Appends one message (the cache of the serialized prefix stays).
    pub(crate) fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    /// Appends messages in order (the cache of the serialized prefix stays).
    pub(crate) fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        self.messages.extend(messages);
    }

    /// The last message, to change in place (a hook call joining the model's answer, SPEC L10).
    /// The cache of the serialized prefix goes.
    pub(crate) fn last_mut(&mut self) -> Option<&mut Message> {
        let last = self.messages.len().checked_sub(1)?;
        self.mark_changed(last);
        self.messages.rewrite(last).last_mut()
    }

    /// Inserts `messages` before position `at` (at most the length). The cache of the
    /// serialized prefix goes.
    pub(crate) fn insert_at(&mut self, at: usize, messages: Vec<Message>) {
        let at = at.min(self.messages.len());
        if messages.is_empty() {
            return;
        }
        self.mark_changed(at);
        self.messages.rewrite(at).splice(at..at, messages);
    }

    /// Drops the messages from position `len` on (nothing when the history is not longer). The
    /// cache of the serialized prefix goes.
    pub(crate) fn truncate(&mut self, len: usize) {
        if len >= self.messages.len() {
            return;
        }
        self.mark_changed(len);
        self.messages.rewrite(len).truncate(len);
        self.usage_mark = self.usage_mark.min(len);
    }

    /// The whole history, taken out (it is put back with [`Transcript::replace`]).
    pub(crate) fn take_messages(&mut self) -> Vec<Message> {
        self.mark_changed(0);
        self.messages.take()
    }

    /// The next tool-call number of this session (1, 2, …).
    pub(crate) fn next_call_no(&mut self) -> u64 {
        self.calls_issued += 1;
        self.calls_issued
    }

    /// The highest tool-call number handed out (0: none).
    #[cfg(any(test, feature = "testing"))]
    pub(crate) fn calls_issued(&self) -> u64 {
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
        self.mark_changed(0);
        self.messages = History::from(messages);
        self.last_input_tokens = 0;
        self.usage_mark = 0;
    }

    /// The lowest position changed in place since the last call (`None`: only appends), and
    /// forget it (the session store recorded it).
    pub(crate) fn take_changed(&mut self) -> Option<usize> {
        self.changed_from.take()
    }

    fn mark_changed(&mut self, at: usize) {
        self.changed_from = Some(self.changed_from.map_or(at, |c| c.min(at)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(t: &str) -> Message {
        Message::User { text: t.into() }
    }

    #[test]
    fn call_numbers_count_from_one_and_a_replaced_history_forgets_its_usage() {
        let mut t = Transcript::default();
        assert_eq!((t.next_call_no(), t.next_call_no()), (1, 2));
        t.push(user("hi"));
        t.record_usage(500);
        assert_eq!((t.last_input_tokens, t.usage_mark), (500, 1));
        t.replace(Vec::new());
        assert_eq!((t.last_input_tokens, t.usage_mark), (0, 0));
        assert_eq!(t.next_call_no(), 3, "numbers are never reused");
    }

    #[test]
    fn a9_appends_mark_nothing_and_changes_in_place_mark_their_lowest_position() {
        let mut t = Transcript::default();
        t.extend([user("a"), user("b"), user("c")]);
        assert_eq!(t.take_changed(), None, "appends only");
        t.last_mut();
        t.insert_at(1, vec![user("x")]);
        assert_eq!(t.take_changed(), Some(1), "the lowest of the two");
        assert_eq!(t.take_changed(), None, "taken");
        t.insert_at(2, Vec::new());
        assert_eq!(t.take_changed(), None, "inserting nothing changes nothing");
        let all = t.take_messages();
        t.replace(all);
        assert_eq!(t.take_changed(), Some(0));
        assert_eq!(t.len(), 4);
        let r = Transcript::restored(vec![user("a")], 7, 9, 4);
        assert_eq!((r.usage_mark, r.calls_issued, r.len()), (1, 4, 1));
    }

    /// Bytes of the serialized prefix `t` keeps after a Chat request is built through it.
    fn cached_after_a_request(t: &mut Transcript) -> usize {
        let (messages, cache) = t.with_cache();
        crate::history::cached_after_a_chat_request(messages, cache)
    }

    #[test]
    fn appends_keep_the_cached_request_prefix_and_changes_in_place_drop_it() {
        let mut t = Transcript::default();
        t.extend([
            user("a"),
            Message::Assistant {
                text: "b".into(),
                thinking: String::new(),
                reasoning: Vec::new(),
                tool_calls: Vec::new(),
            },
            user("c"),
        ]);
        let first = cached_after_a_request(&mut t);
        assert!(first > 0, "the closed messages are kept");
        t.push(Message::Assistant {
            text: "d".into(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
        });
        assert_eq!(
            t.with_cache().1.cached_bytes(),
            first,
            "an append keeps the prefix"
        );
        assert!(
            cached_after_a_request(&mut t) > first,
            "and the next request extends it"
        );
        t.last_mut();
        assert_eq!(t.with_cache().1.cached_bytes(), 0, "a join drops it");
        assert!(cached_after_a_request(&mut t) > 0);
        t.insert_at(1, vec![user("x")]);
        assert_eq!(t.with_cache().1.cached_bytes(), 0, "an insertion drops it");
        assert!(cached_after_a_request(&mut t) > 0);
        let all = t.take_messages();
        t.replace(all);
        assert_eq!(
            t.with_cache().1.cached_bytes(),
            0,
            "a replaced history starts afresh"
        );
    }

    #[test]
    fn a9_the_highest_call_number_handed_out_is_kept_and_restored() {
        let mut t = Transcript::default();
        assert_eq!(t.calls_issued(), 0, "none yet");
        t.next_call_no();
        t.next_call_no();
        assert_eq!(t.calls_issued(), 2);
        let mut r = Transcript::restored(vec![user("a")], 0, 0, 7);
        assert_eq!(r.calls_issued(), 7);
        assert_eq!(r.next_call_no(), 8, "a restored session goes on numbering");
    }
}
