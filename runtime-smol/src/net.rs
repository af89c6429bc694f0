//! TCP connections on the [`crate::reactor`]: a non-blocking `connect`, then a wait until the
//! socket is writable and its `SO_ERROR`. A host name is resolved on a thread of its own
//! (`getaddrinfo` blocks); an address literal is used as it is.

use crate::io::Async;
use crate::reactor::Dir;
use rustix::net::{AddressFamily, SocketFlags, SocketType, sockopt};
use std::io;
use std::net::{IpAddr, SocketAddr, TcpStream, ToSocketAddrs};

/// Connects to `host` and `port`, trying each address in turn, with `TCP_NODELAY` set.
///
/// # Errors
/// The OS error of the resolution or of the last attempt.
pub async fn connect(host: String, port: u16) -> io::Result<Async<TcpStream>> {
    let addrs = match host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, port)],
        Err(_) => resolve(host, port).await?,
    };
    let mut last = None;
    for addr in addrs {
        match connect_to(addr).await {
            Ok(stream) => return Ok(stream),
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::NotFound, "the host name has no address")))
}

async fn resolve(host: String, port: u16) -> io::Result<Vec<SocketAddr>> {
    let (tx, rx) = async_channel::bounded(1);
    std::thread::Builder::new()
        .name("resolve".into())
        .spawn(move || {
            let addrs = (host.as_str(), port)
                .to_socket_addrs()
                .map(Iterator::collect::<Vec<_>>);
            let _ = tx.send_blocking(addrs);
        })?;
    rx.recv()
        .await
        .unwrap_or_else(|_| Err(io::Error::other("the resolving thread is gone")))
}

async fn connect_to(addr: SocketAddr) -> io::Result<Async<TcpStream>> {
    let family = if addr.is_ipv4() {
        AddressFamily::INET
    } else {
        AddressFamily::INET6
    };
    let fd = rustix::net::socket_with(
        family,
        SocketType::STREAM,
        SocketFlags::NONBLOCK | SocketFlags::CLOEXEC,
        None,
    )?;
    sockopt::set_tcp_nodelay(&fd, true)?;
    let stream = Async::nonblocking(TcpStream::from(fd))?;
    match rustix::net::connect(stream.get_ref(), &addr) {
        Ok(()) => return Ok(stream),
        Err(rustix::io::Errno::INPROGRESS | rustix::io::Errno::INTR) => {}
        Err(e) => return Err(e.into()),
    }
    stream.ready(Dir::Write).await;
    sockopt::socket_error(stream.get_ref())??;
    Ok(stream)
}
