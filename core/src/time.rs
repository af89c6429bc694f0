//! Time as an input (DESIGN: "Time is `MonoTime(Duration)` since the runtime's start").

use std::time::Duration;

/// Monotonic time since the runtime started (DESIGN "Time"): the runtime samples its own
/// monotonic clock and passes `now - start` with every input. The core never reads a clock; it
/// clamps the times it is given so they never go back. Displayed as `+S.mmms` (`+2.500s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default, Hash)]
pub struct MonoTime(pub Duration);

impl MonoTime {
    /// The runtime's start.
    pub const ZERO: MonoTime = MonoTime(Duration::ZERO);

    /// `self + ms` milliseconds, saturating.
    #[must_use]
    pub fn plus_ms(self, ms: u64) -> MonoTime {
        MonoTime(self.0.saturating_add(Duration::from_millis(ms)))
    }

    /// Milliseconds since [`MonoTime::ZERO`].
    #[must_use]
    pub fn as_ms(self) -> u64 {
        u64::try_from(self.0.as_millis()).unwrap_or(u64::MAX)
    }

    /// Milliseconds from `earlier` to `self` (0 if `earlier` is later).
    #[must_use]
    pub fn ms_since(self, earlier: MonoTime) -> u64 {
        u64::try_from(self.0.saturating_sub(earlier.0).as_millis()).unwrap_or(u64::MAX)
    }
}

impl std::fmt::Display for MonoTime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "+{}.{:03}s", self.0.as_secs(), self.0.subsec_millis())
    }
}
