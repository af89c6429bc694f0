//! A session's history with the serialized form of its unchanging prefix (issue #15): the
//! messages ([`Message`]) and the [`BodyCache`] the request builders extend and reuse.

use crate::llm::Message;
use crate::request::BodyCache;

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
    /// injections, joining a message): drops the cache, so the next request is built afresh.
    pub(crate) fn rewrite(&mut self) -> &mut Vec<Message> {
        self.cache = BodyCache::default();
        &mut self.messages
    }

    /// The messages, taking them out (the history is left empty, without a cache).
    #[must_use]
    pub(crate) fn take(&mut self) -> Vec<Message> {
        self.cache = BodyCache::default();
        std::mem::take(&mut self.messages)
    }

    /// The messages and the cache of their serialized prefix, for building a request.
    pub(crate) fn with_cache(&mut self) -> (&[Message], &mut BodyCache) {
        (&self.messages, &mut self.cache)
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
