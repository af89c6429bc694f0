//! `block_on` over the [`crate::reactor`]: polls the future (the executor's `run`), and parks
//! in the reactor's `epoll_pwait` when it is pending.
//!
//! The future's waker is the reactor's [`Notifier`](crate::reactor::Notifier): woken on this
//! thread (an IO event, a timer, a task waking another) it only sets a flag; woken from
//! another thread (the stdin reader, the store, an `async-channel` sender) while this thread
//! is parked, it writes the eventfd once. A round without a cross-thread wake-up costs no
//! syscall for waking.

use crate::reactor::{self, Notifier};
use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};

/// Polls without waiting for events at most this many times in a row (the future keeps
/// waking itself: the executor yields after a batch of tasks), then looks for events without
/// waiting, so that busy tasks do not starve IO and timers.
const POLLS_WITHOUT_EVENTS: u32 = 64;

struct Wakeup(Arc<Notifier>);

impl Wake for Wakeup {
    fn wake(self: Arc<Self>) {
        self.0.notify();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.notify();
    }
}

/// Runs `fut` to completion on this thread, parking in the reactor between polls.
///
/// # Panics
/// When `epoll_pwait` fails (only with invalid arguments, never expected).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    let notifier = reactor::with(reactor::Reactor::notifier);
    let waker = Waker::from(Arc::new(Wakeup(notifier.clone())));
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let mut busy = 0;
    loop {
        // Wake-ups before this point are seen by the poll that follows.
        notifier.notified.store(false, Ordering::SeqCst);
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
        notifier.parked.store(true, Ordering::SeqCst);
        // A wake-up after the poll, from here or another thread: poll again at once. One
        // from another thread that already saw `parked` has also written the eventfd; the
        // next wait then returns at once, once.
        let woken = notifier.notified.load(Ordering::SeqCst);
        if woken && busy < POLLS_WITHOUT_EVENTS {
            busy += 1;
        } else {
            busy = 0;
            reactor::with(|r| r.park(woken)).expect("epoll_pwait failed");
        }
        notifier.parked.store(false, Ordering::SeqCst);
    }
}
