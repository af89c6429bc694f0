//! The shutdown signals (SIGTERM, SIGINT, SIGHUP) as bytes on a socket pair: the handler
//! (installed by `signal-hook-registry`) writes one byte per signal, a task on the
//! [`crate::reactor`] reads them.

use crate::io::Async;
use buzz_agent_core::Input;
use buzz_agent_runtime::InputSender;
use futures_lite::io::AsyncReadExt;
use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;

/// Installs the handlers; the returned task sends [`Input::ShutdownSignal`] on `tx` for each
/// signal, until the loop is gone.
///
/// # Errors
/// The OS error of the socket pair, its registration or a handler's installation.
pub fn watch(tx: InputSender) -> io::Result<impl Future<Output = ()> + Send + 'static> {
    let (rx_end, tx_end) = UnixStream::pair()?;
    tx_end.set_nonblocking(true)?;
    rx_end.set_nonblocking(true)?;
    let mut rx_end = Async::nonblocking(rx_end)?;
    let tx_end = Arc::new(tx_end);
    for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        let w = tx_end.clone();
        // SAFETY: the action runs in a signal handler, where only async-signal-safe calls are
        // allowed: it makes one `write(2)` on a non-blocking socket (a full socket drops the
        // byte: signals are already pending then) and allocates or locks nothing.
        // `signal-hook-registry` keeps `errno` for the interrupted code.
        unsafe { signal_hook_registry::register(signal, move || drop((&*w).write(&[1]))) }?;
    }
    Ok(async move {
        let mut buf = [0u8; 16];
        loop {
            let n = match rx_end.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            for _ in 0..n {
                if tx.send(Input::ShutdownSignal).await.is_err() {
                    return;
                }
            }
        }
    })
}
