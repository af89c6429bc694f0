//! A session's history with the serialized form of its unchanging prefix (issue #15): the
//! messages ([`Message`]) and the [`BodyCache`] the request builders extend and reuse.

use crate::llm::BodyCache;
use crate::llm::Message;

/// A session's history: its messages, and the serialized form of their unchanging prefix kept
/// for the next request ([`BodyCache`], issue #15).
///
/// Reading goes through `Deref<Target = [Message]>`. [`History::push`] keeps the cache (a
/// round's request then serializes only what is new); every other change goes through
/// [`History::rewrite`] or replaces the whole value, and both drop the cache, so a request
/// can never be built from bytes of messages that were changed or removed.
#[derive(Default)]
pub(crate) struct History {
    messages: Vec<Message>,
    cache: BodyCache,
    /// How many messages the last request built with prompt caching carried (SPEC L11): where
    /// its conversation breakpoint was, for the next request to read back. Like the cache, only
    /// appends keep it.
    cache_mark: Option<usize>,
}

impl History {
    /// Appends a message; the cache stays valid.
    pub(crate) fn push(&mut self, message: Message) {
        self.messages.push(message);
    }

    /// Appends messages in order; the cache stays valid.
    pub(crate) fn extend(&mut self, messages: impl IntoIterator<Item = Message>) {
        self.messages.extend(messages);
    }

    /// The messages for any change other than appending (compaction, truncation, hook
    /// injections, joining a message) that leaves `history[..at]` as it is: drops the cache,
    /// so the next request is built afresh; the cache mark stays only when it lies within that
    /// part (a hook call joining the answer after the last cached request, SPEC L11).
    pub(crate) fn rewrite(&mut self, at: usize) -> &mut Vec<Message> {
        self.cache = BodyCache::default();
        if self.cache_mark.is_some_and(|mark| mark > at) {
            self.cache_mark = None;
        }
        &mut self.messages
    }

    /// The messages, taking them out (the history is left empty, without a cache).
    #[must_use]
    pub(crate) fn take(&mut self) -> Vec<Message> {
        self.cache = BodyCache::default();
        self.cache_mark = None;
        std::mem::take(&mut self.messages)
    }

    /// The messages and the cache of their serialized prefix, for building a request.
    pub(crate) fn with_cache(&mut self) -> (&[Message], &mut BodyCache) {
        (&self.messages, &mut self.cache)
    }

    /// How many messages the last request built with prompt caching carried, if only appends
    /// came since (SPEC L11; [`PromptCache::previous_len`](crate::llm::PromptCache)).
    #[must_use]
    pub(crate) fn cache_mark(&self) -> Option<usize> {
        self.cache_mark.filter(|&n| n <= self.messages.len())
    }

    /// A request built with prompt caching carried the first `len` messages.
    pub(crate) fn set_cache_mark(&mut self, len: usize) {
        self.cache_mark = Some(len);
    }
}

impl Clone for History {
    /// The messages; the copy starts without a cache (its first request builds it).
    fn clone(&self) -> History {
        History::from(self.messages.clone())
    }
}

impl std::ops::Deref for History {
    type Target = [Message];

    fn deref(&self) -> &[Message] {
        &self.messages
    }
}

impl From<Vec<Message>> for History {
    fn from(messages: Vec<Message>) -> History {
        History {
            messages,
            cache: BodyCache::default(),
            cache_mark: None,
        }
    }
}

impl PartialEq for History {
    /// The same messages (the cache is derived from them).
    fn eq(&self, other: &History) -> bool {
        self.messages == other.messages
    }
}

impl std::fmt::Debug for History {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(&self.messages).finish()
    }
}

/// Builds a Chat request through `cache` (as a round does) and answers the bytes of the
/// serialized prefix the cache then keeps; for tests of the owners of a history.
#[cfg(test)]
pub(crate) fn cached_after_a_chat_request(messages: &[Message], cache: &mut BodyCache) -> usize {
    let req = crate::llm::LlmRequest {
        max_output_tokens: 64,
        ..crate::llm::LlmRequest::for_tests("m", messages)
    };
    let options = crate::llm::builders::ChatOptions::default();
    let _ = crate::llm::builders::chat("http://h", "", &req, &options, Some(cache));
    cache.cached_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cached_after_a_request(h: &mut History) -> usize {
        let (messages, cache) = h.with_cache();
        cached_after_a_chat_request(messages, cache)
    }

    fn user(text: &str) -> Message {
        Message::User { text: text.into() }
    }

    fn assistant(text: &str) -> Message {
        Message::Assistant {
            text: text.into(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: Vec::new(),
        }
    }

    #[test]
    fn issue15_appends_keep_the_cached_prefix_and_every_other_change_drops_it() {
        let mut h = History::default();
        h.push(user("a"));
        h.extend([assistant("b"), user("c")]);
        assert_eq!(&h[..], &[user("a"), assistant("b"), user("c")]);
        let first = cached_after_a_request(&mut h);
        assert!(first > 0, "the closed messages are kept");
        h.push(assistant("d"));
        h.extend([user("e")]);
        let (messages, cache) = h.with_cache();
        assert_eq!(messages.len(), 5);
        assert_eq!(cache.cached_bytes(), first, "appends keep the prefix");
        h.rewrite(0).remove(0);
        assert_eq!(h.len(), 4);
        assert_eq!(h.with_cache().1.cached_bytes(), 0, "a rewrite drops it");
        assert!(cached_after_a_request(&mut h) > 0);
        let taken = h.take();
        assert_eq!(taken.len(), 4);
        assert!(h.is_empty());
        assert_eq!(h.with_cache().1.cached_bytes(), 0, "taking drops it");
    }

    #[test]
    fn l11_appends_keep_the_cache_mark_and_every_other_change_drops_it() {
        let mut h = History::from(vec![user("a")]);
        assert_eq!(h.cache_mark(), None, "no cached request yet");
        h.set_cache_mark(1);
        h.push(assistant("b"));
        h.extend([user("c")]);
        assert_eq!(h.cache_mark(), Some(1), "appends keep it");
        h.rewrite(1).push(user("d"));
        assert_eq!(h.cache_mark(), Some(1), "a change after it keeps it");
        h.rewrite(0);
        assert_eq!(h.cache_mark(), None, "a change within it drops it");
        h.set_cache_mark(4);
        let _ = h.take();
        assert_eq!(h.cache_mark(), None, "taking drops it");
        h.set_cache_mark(3);
        assert_eq!(h.cache_mark(), None, "never past the messages held");
        assert_eq!(h.clone().cache_mark(), None);
    }

    #[test]
    fn issue15_a_copy_or_a_history_made_from_messages_has_them_and_no_cache() {
        let mut h = History::from(vec![user("a"), assistant("b"), user("c")]);
        assert_eq!(h.len(), 3);
        assert!(cached_after_a_request(&mut h) > 0);
        let mut copy = h.clone();
        assert_eq!(copy, h, "the same messages");
        assert_eq!(
            copy.with_cache().1.cached_bytes(),
            0,
            "the copy starts afresh"
        );
        copy.push(assistant("d"));
        assert_ne!(copy, h, "other messages");
        assert_eq!(
            format!("{h:?}"),
            format!("{:?}", &h[..]),
            "Debug is the messages"
        );
    }
}
