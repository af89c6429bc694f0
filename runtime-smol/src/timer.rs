//! A timer of the [`crate::reactor`]: a deadline in its map while a task waits for it, no
//! file descriptor and no system call (the reactor's wait ends by the earliest deadline).

use crate::reactor;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

/// Completes at its deadline (at once when it has passed); re-armed with [`Timer::set_at`].
pub struct Timer {
    deadline: Instant,
    /// Its place in the reactor's map while armed and polled.
    entry: Option<(Instant, u64)>,
}

impl Timer {
    /// A timer for `deadline`.
    pub fn at(deadline: Instant) -> Self {
        Self {
            deadline,
            entry: None,
        }
    }

    /// Re-arms the timer for `deadline`, whether or not it fired (the map entry moves at the
    /// next poll).
    pub fn set_at(&mut self, deadline: Instant) {
        self.deadline = deadline;
    }
}

impl Future for Timer {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            if this.entry.is_some() {
                reactor::with(|r| r.cancel_timer(&mut this.entry));
            }
            return Poll::Ready(());
        }
        reactor::with(|r| r.set_timer(&mut this.entry, this.deadline, cx.waker()));
        Poll::Pending
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if self.entry.is_some() {
            // At exit the thread-local reactor may be gone already.
            let _ = reactor::try_with(|r| r.cancel_timer(&mut self.entry));
        }
    }
}
