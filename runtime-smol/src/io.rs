//! A non-blocking file descriptor on the [`crate::reactor`]: pipes, sockets, the pidfd of a
//! child and the signal pipe. Registered once when made, removed once when dropped.
//!
//! An operation is tried only while its direction is ready; `EAGAIN` clears it and the task
//! waits for the next edge. A read that returns less than it asked for (and more than
//! nothing) clears it too: for a pipe or a stream socket that means the kernel's buffer was
//! emptied, and data arriving after it is an event of its own (the descriptor is
//! edge-triggered, and a pipe or socket calls epoll back on every write into an empty
//! buffer), so the `read` that would only return `EAGAIN` is not made. Unless the peer hung
//! up: its end of file follows the data without an event of its own, so the reactor keeps
//! such a direction ready for good.

use crate::reactor::{self, Dir};
use futures_lite::io::{AsyncRead, AsyncWrite};
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::pin::Pin;
use std::task::{Context, Poll};

/// `T`'s descriptor registered with this thread's reactor.
pub struct Async<T: AsFd> {
    io: T,
    key: usize,
}

impl<T: AsFd> Async<T> {
    /// Sets `io` non-blocking and registers it.
    ///
    /// # Errors
    /// The OS error of `ioctl(FIONBIO)` or `epoll_ctl`.
    pub fn new(io: T) -> io::Result<Self> {
        rustix::io::ioctl_fionbio(&io, true)?;
        Self::nonblocking(io)
    }

    /// Registers `io`, already non-blocking.
    ///
    /// # Errors
    /// The OS error of `epoll_ctl`.
    pub fn nonblocking(io: T) -> io::Result<Self> {
        let key = reactor::with(|r| r.register(io.as_fd()))?;
        Ok(Self { io, key })
    }

    /// The wrapped descriptor.
    pub fn get_ref(&self) -> &T {
        &self.io
    }

    /// Ready when `dir` is (an event said so since the last `EAGAIN`).
    pub fn poll_ready(&self, cx: &Context<'_>, dir: Dir) -> Poll<()> {
        if reactor::with(|r| r.poll_ready(self.key, dir, cx.waker())) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// Waits until `dir` is ready.
    pub async fn ready(&self, dir: Dir) {
        std::future::poll_fn(|cx| self.poll_ready(cx, dir)).await;
    }

    /// Runs `op` while `dir` is ready: its result, or pending after `EAGAIN` (the direction
    /// is then cleared). `drained` says of a result that the buffer is now empty.
    fn poll_op<R>(
        &mut self,
        cx: &Context<'_>,
        dir: Dir,
        mut op: impl FnMut(&mut T) -> io::Result<R>,
        drained: impl Fn(&R) -> bool,
    ) -> Poll<io::Result<R>> {
        loop {
            if self.poll_ready(cx, dir).is_pending() {
                return Poll::Pending;
            }
            match op(&mut self.io) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    reactor::with(|r| r.clear(self.key, dir));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                r => {
                    if r.as_ref().is_ok_and(&drained) {
                        reactor::with(|r| r.clear(self.key, dir));
                    }
                    return Poll::Ready(r);
                }
            }
        }
    }
}

impl<T: AsFd> Drop for Async<T> {
    fn drop(&mut self) {
        // At exit the thread-local reactor may be gone already (and its epoll with it).
        let _ = reactor::try_with(|r| r.deregister(self.key, self.io.as_fd()));
    }
}

impl<T: AsFd + Read + Unpin> AsyncRead for Async<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        let len = buf.len();
        self.get_mut()
            .poll_op(cx, Dir::Read, |io| io.read(buf), |&n| n > 0 && n < len)
    }
}

impl<T: AsFd + Write + Unpin> AsyncWrite for Async<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_op(cx, Dir::Write, |io| io.write(buf), |_| false)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .poll_op(cx, Dir::Write, |io| io.write_vectored(bufs), |_| false)
    }

    /// Nothing is buffered: every write is a system call.
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_close(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
