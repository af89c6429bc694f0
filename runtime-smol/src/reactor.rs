//! The main thread's reactor: one epoll instance, the readiness of every registered file
//! descriptor and the timers' deadlines (docs/performance.md, "smol's reactor").
//!
//! Built for a steady tool round costing no syscall of its own beyond the one `epoll_pwait`
//! the thread parks in:
//! - each file descriptor is registered once (`epoll_ctl ADD`), edge-triggered, for both
//!   directions, and removed once when its [`crate::io::Async`] is dropped: no re-arming per
//!   wait (async-io registers one-shot and re-arms with `epoll_ctl MOD` every time);
//! - a direction's readiness is remembered until an operation meets `EAGAIN` (or reads short,
//!   [`crate::io`]), so an operation on a ready descriptor makes no wait at all;
//! - timers are deadlines in a map, the wait's timeout is the earliest (rounded up to the
//!   millisecond by `epoll_pwait`, so a wait never ends before its deadline and the loop never
//!   spins); no timerfd to set and re-register per wait as polling does;
//! - wake-ups from other threads come through one eventfd, registered once and written only
//!   while this thread is parked ([`crate::exec`]).
//!
//! Everything here is for the thread that runs the executor: the state is thread-local, and
//! the futures that use it ([`crate::io::Async`], [`crate::timer::Timer`]) are only ever
//! polled on that thread (the driver runs every task on it).

use rustix::event::epoll;
use slab::Slab;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;
use std::time::{Duration, Instant};

/// The epoll data of the eventfd (sources are keyed by their slab index).
const NOTIFY_KEY: u64 = u64::MAX;

/// Events taken per `epoll_pwait`; more stay queued for the next one.
const EVENTS: usize = 64;

/// The longest wait: a deadline further off is waited for in several waits.
const MAX_WAIT: Duration = Duration::from_secs(3600);

/// A direction of a descriptor: reading or writing.
#[derive(Clone, Copy)]
pub enum Dir {
    /// Readable (also on end of file, hang-up or error).
    Read,
    /// Writable (also on hang-up or error).
    Write,
}

/// What the reactor knows of one direction of a descriptor.
#[derive(Default)]
struct Side {
    /// An event said so and no operation has met `EAGAIN` since.
    ready: bool,
    /// The peer hung up (or the descriptor has an error): ready for good. A short read then
    /// does not mean the buffer is empty (the end of file is still to be read), and no event
    /// would follow.
    closed: bool,
    /// The task waiting for it.
    waker: Option<Waker>,
}

/// A registered descriptor's two directions.
#[derive(Default)]
struct Source {
    read: Side,
    write: Side,
}

impl Source {
    fn side(&mut self, dir: Dir) -> &mut Side {
        match dir {
            Dir::Read => &mut self.read,
            Dir::Write => &mut self.write,
        }
    }
}

/// Cross-thread wake-ups of the thread parked in [`Reactor::park`]: the eventfd and the two
/// flags [`crate::exec::block_on`] keeps so that it is written only while that thread is
/// parked, and at most once per park.
pub struct Notifier {
    eventfd: OwnedFd,
    /// The executor's thread is in (or about to enter) `epoll_pwait`.
    pub parked: AtomicBool,
    /// A wake-up came since the thread last polled its future.
    pub notified: AtomicBool,
}

impl Notifier {
    /// Marks the thread notified; writes the eventfd if it is parked and nobody did yet.
    pub fn notify(&self) {
        if !self.notified.swap(true, Ordering::SeqCst) && self.parked.load(Ordering::SeqCst) {
            // The eventfd is never read: registered edge-triggered, every write is an event
            // (the kernel calls epoll back on each one). Only a full counter (2^64 - 2
            // writes) refuses a write; it is then reset by a read and written again.
            let one = 1u64.to_ne_bytes();
            if rustix::io::write(&self.eventfd, &one) == Err(rustix::io::Errno::AGAIN) {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&self.eventfd, &mut buf);
                let _ = rustix::io::write(&self.eventfd, &one);
            }
        }
    }
}

/// The thread's reactor (see the module documentation).
pub struct Reactor {
    epoll: OwnedFd,
    sources: RefCell<Slab<Source>>,
    /// Deadline and a sequence number (two timers may share a deadline) → the waiting task.
    timers: RefCell<BTreeMap<(Instant, u64), Waker>>,
    next_timer: Cell<u64>,
    events: RefCell<Vec<epoll::Event>>,
    /// The wakers a wait makes due, kept between waits so that a round allocates nothing.
    due: RefCell<Vec<Waker>>,
    notifier: Arc<Notifier>,
}

thread_local! {
    static REACTOR: Reactor = Reactor::new().expect("cannot create the epoll reactor");
}

/// Runs `f` with this thread's reactor.
pub fn with<T>(f: impl FnOnce(&Reactor) -> T) -> T {
    REACTOR.with(f)
}

/// [`with`], unless the thread's reactor is already destroyed (a drop during thread exit).
pub fn try_with<T>(f: impl FnOnce(&Reactor) -> T) -> Option<T> {
    REACTOR.try_with(f).ok()
}

impl Reactor {
    fn new() -> io::Result<Self> {
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC)?;
        let eventfd = rustix::event::eventfd(
            0,
            rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK,
        )?;
        epoll::add(
            &epoll,
            &eventfd,
            epoll::EventData::new_u64(NOTIFY_KEY),
            epoll::EventFlags::IN | epoll::EventFlags::ET,
        )?;
        Ok(Self {
            epoll,
            sources: RefCell::new(Slab::new()),
            timers: RefCell::new(BTreeMap::new()),
            next_timer: Cell::new(0),
            events: RefCell::new(Vec::with_capacity(EVENTS)),
            due: RefCell::new(Vec::new()),
            notifier: Arc::new(Notifier {
                eventfd,
                parked: AtomicBool::new(false),
                notified: AtomicBool::new(false),
            }),
        })
    }

    /// The cross-thread wake-ups of this reactor's thread.
    pub fn notifier(&self) -> Arc<Notifier> {
        self.notifier.clone()
    }

    /// Registers `fd` (already non-blocking) once, edge-triggered for both directions; its
    /// key. Neither direction is ready until an event says so (the kernel reports the
    /// current readiness at the first wait).
    pub fn register(&self, fd: BorrowedFd<'_>) -> io::Result<usize> {
        let key = self.sources.borrow_mut().insert(Source::default());
        let flags = epoll::EventFlags::IN
            | epoll::EventFlags::OUT
            | epoll::EventFlags::RDHUP
            | epoll::EventFlags::ET;
        if let Err(e) = epoll::add(
            &self.epoll,
            fd,
            epoll::EventData::new_u64(key as u64),
            flags,
        ) {
            self.sources.borrow_mut().remove(key);
            return Err(e.into());
        }
        Ok(key)
    }

    /// Removes `fd` (registered as `key`) before it is closed: its file description may live
    /// on in a duplicate (a child's stdin is also the driver's `stdin_fd`), which would keep
    /// the registration and deliver events for a key that may be reused.
    pub fn deregister(&self, key: usize, fd: BorrowedFd<'_>) {
        let _ = epoll::delete(&self.epoll, fd);
        self.sources.borrow_mut().try_remove(key);
    }

    /// Whether `key` is ready in `dir`; if not, `waker` is woken when it becomes so.
    pub fn poll_ready(&self, key: usize, dir: Dir, waker: &Waker) -> bool {
        let mut sources = self.sources.borrow_mut();
        let Some(source) = sources.get_mut(key) else {
            return true;
        };
        let side = source.side(dir);
        if side.ready {
            return true;
        }
        match &mut side.waker {
            Some(w) if w.will_wake(waker) => {}
            w => *w = Some(waker.clone()),
        }
        false
    }

    /// Forgets that `key` is ready in `dir` (an operation met `EAGAIN`): the next operation
    /// waits for an event.
    pub fn clear(&self, key: usize, dir: Dir) {
        if let Some(source) = self.sources.borrow_mut().get_mut(key) {
            let side = source.side(dir);
            side.ready = side.closed;
        }
    }

    /// Arms a timer for `deadline` waking `waker`: `entry` is the timer's place in the map,
    /// moved when the deadline changed and kept (with the waker updated) when not.
    pub fn set_timer(&self, entry: &mut Option<(Instant, u64)>, deadline: Instant, waker: &Waker) {
        let mut timers = self.timers.borrow_mut();
        if let Some(key) = *entry {
            if key.0 == deadline
                && let Some(w) = timers.get_mut(&key)
            {
                if !w.will_wake(waker) {
                    *w = waker.clone();
                }
                return;
            }
            timers.remove(&key);
        }
        let seq = self.next_timer.get();
        self.next_timer.set(seq.wrapping_add(1));
        timers.insert((deadline, seq), waker.clone());
        *entry = Some((deadline, seq));
    }

    /// Disarms the timer at `entry`, if it is still armed.
    pub fn cancel_timer(&self, entry: &mut Option<(Instant, u64)>) {
        if let Some(key) = entry.take() {
            self.timers.borrow_mut().remove(&key);
        }
    }

    /// Waits for events (without a timeout beyond the earliest timer's, none when
    /// `no_wait`), records the readiness they report and wakes the tasks waiting for it and
    /// for the timers due.
    pub fn park(&self, no_wait: bool) -> io::Result<()> {
        let timeout = if no_wait {
            Some(Duration::ZERO)
        } else {
            self.timers.borrow().keys().next().map(|&(deadline, _)| {
                deadline
                    .saturating_duration_since(Instant::now())
                    .min(MAX_WAIT)
            })
        };
        let timeout = timeout.map(|d| rustix::event::Timespec {
            tv_sec: d.as_secs().try_into().unwrap_or(i64::MAX),
            tv_nsec: d.subsec_nanos().into(),
        });
        // Taken out while the wakers run: waking a task only queues it, but the buffer is not
        // borrowed across foreign code.
        let mut wake = std::mem::take(&mut *self.due.borrow_mut());
        {
            let mut events = self.events.borrow_mut();
            events.clear();
            let buf = rustix::buffer::spare_capacity(&mut *events);
            match epoll::wait(&self.epoll, buf, timeout.as_ref()) {
                Ok(_) => {}
                // A signal handler ran (the shutdown signals' write their pipe).
                Err(rustix::io::Errno::INTR) => events.clear(),
                Err(e) => return Err(e.into()),
            }
            // Awake: the wake-ups below (and any from this thread until it parks again) must
            // not write the eventfd, which would only end the next wait at once.
            self.notifier.parked.store(false, Ordering::SeqCst);
            let mut sources = self.sources.borrow_mut();
            for ev in events.iter() {
                let key = ev.data.u64();
                if key == NOTIFY_KEY {
                    continue;
                }
                let Some(source) = usize::try_from(key).ok().and_then(|k| sources.get_mut(k))
                else {
                    continue;
                };
                let f = ev.flags;
                let gone = epoll::EventFlags::HUP | epoll::EventFlags::ERR;
                let read_closed = epoll::EventFlags::RDHUP | gone;
                if f.intersects(epoll::EventFlags::IN | epoll::EventFlags::PRI | read_closed) {
                    source.read.ready = true;
                    source.read.closed |= f.intersects(read_closed);
                    wake.extend(source.read.waker.take());
                }
                if f.intersects(epoll::EventFlags::OUT | gone) {
                    source.write.ready = true;
                    source.write.closed |= f.intersects(gone);
                    wake.extend(source.write.waker.take());
                }
            }
        }
        {
            let now = Instant::now();
            let mut timers = self.timers.borrow_mut();
            while let Some(entry) = timers.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                wake.push(entry.remove());
            }
        }
        for w in wake.drain(..) {
            w.wake();
        }
        *self.due.borrow_mut() = wake;
        Ok(())
    }
}
