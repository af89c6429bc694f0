//! The reactor's own rules, each on a real pipe, timer or thread (the e2e suite runs the whole
//! binary on it): a kept readiness never hangs a read, a hang-up's end of file is read without
//! an event of its own, a timer never ends early, and a wake-up from another thread ends a wait
//! that has no timer. Every test is bounded by a guard timer, so a lost wake-up fails it
//! instead of hanging it.

use crate::exec::block_on;
use crate::io::Async;
use crate::timer::Timer;
use futures_lite::io::{AsyncReadExt, AsyncWriteExt};
use std::future::Future;
use std::io::Write;
use std::time::{Duration, Instant};

/// Far beyond any wait a test makes: reaching it means a wake-up was lost.
const GUARD: Duration = Duration::from_secs(10);

/// Runs `fut` on this thread's reactor; panics if it is not done before [`GUARD`] (a future
/// made ready by a lost wake-up is found ready only when the guard's timer ends the wait).
fn within<T>(fut: impl Future<Output = T>) -> T {
    let start = Instant::now();
    let guard = async {
        Timer::at(start + GUARD).await;
        None
    };
    let out = block_on(futures_lite::future::or(async { Some(fut.await) }, guard));
    assert!(
        start.elapsed() < GUARD,
        "a wake-up was lost: the guard timer ended the wait"
    );
    out.expect("a wake-up was lost: the guard timer ended the test")
}

#[test]
fn a_short_read_leaves_the_next_read_to_the_next_write() {
    let (reader, mut writer) = std::io::pipe().unwrap();
    let mut reader = Async::new(reader).unwrap();
    writer.write_all(b"abc").unwrap();
    let later = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        writer.write_all(b"defg").unwrap();
        writer
    });
    let mut buf = [0u8; 64];
    let first = within(reader.read(&mut buf)).unwrap();
    assert_eq!(&buf[..first], b"abc");
    // The short read took the pipe as emptied; the later write is an edge of its own.
    let second = within(reader.read(&mut buf)).unwrap();
    assert_eq!(&buf[..second], b"defg");
    drop(later.join().unwrap());
}

#[test]
fn after_a_hang_up_the_data_and_the_end_of_file_are_read_without_another_event() {
    let (reader, mut writer) = std::io::pipe().unwrap();
    writer.write_all(b"last words").unwrap();
    drop(writer);
    let mut reader = Async::new(reader).unwrap();
    let mut buf = [0u8; 64];
    let n = within(reader.read(&mut buf)).unwrap();
    assert_eq!(&buf[..n], b"last words");
    // Short, but the peer is gone: the end of file follows with no event, so the direction
    // must still be ready.
    assert_eq!(within(reader.read(&mut buf)).unwrap(), 0);
}

#[test]
fn a_full_pipe_waits_for_room_and_then_takes_the_rest() {
    let (reader, writer) = std::io::pipe().unwrap();
    let mut writer = Async::new(writer).unwrap();
    let total = 1 << 20; // far more than a pipe's buffer
    let drain = std::thread::spawn(move || {
        let mut reader = reader;
        let mut got = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut got).unwrap();
        got.len()
    });
    within(writer.write_all(&vec![7u8; total])).unwrap();
    drop(writer);
    assert_eq!(drain.join().unwrap(), total);
}

#[test]
fn a_timer_never_ends_before_its_deadline_and_follows_an_earlier_one() {
    let start = Instant::now();
    within(Timer::at(start + Duration::from_millis(30)));
    assert!(start.elapsed() >= Duration::from_millis(30));

    // Armed for an hour and polled once, then moved to 20 ms from now: it ends then.
    let mut timer = Timer::at(Instant::now() + Duration::from_secs(3600));
    let polled = within(futures_lite::future::poll_once(&mut timer));
    assert!(polled.is_none(), "an hour-long timer is not due");
    let moved = Instant::now();
    timer.set_at(moved + Duration::from_millis(20));
    within(timer);
    let took = moved.elapsed();
    assert!(took >= Duration::from_millis(20), "ended early: {took:?}");
    assert!(
        took < GUARD / 2,
        "the moved deadline was not followed: {took:?}"
    );
}

#[test]
fn a_wake_up_from_another_thread_ends_a_wait_without_timers() {
    let (tx, rx) = async_channel::bounded(1);
    let sender = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(50));
        tx.send_blocking(42u32).unwrap();
    });
    // The only timer is the guard's: the wait ends by the eventfd or not at all.
    assert_eq!(within(rx.recv()).unwrap(), 42);
    sender.join().unwrap();
}
