//! HTTP exchanges for the LLM calls and for MCP over HTTP, as tasks on the loop's own executor
//! over the runtime's non-blocking sockets (DESIGN "Amended 2026-12-01": the runtime opens
//! sockets and moves bytes; the HTTP/1.1 codec is the core's `buzz_agent_core::http`). TLS is
//! rustls (the one TLS stack in the tree) with the webpki roots, driven here over the socket.
//!
//! **Connections.** Each connection is a task that serves one exchange at a time and then waits,
//! idle, for the next exchange to its origin, for its socket to show any sign of life (a peer
//! closing an idle connection: end of stream, a TLS alert, a reset), or for [`IDLE`] to pass;
//! the first two end it at once, so a connection taken for reuse is known to be open (no probe
//! before reuse). An exchange goes to the connection of its origin that went idle last, else
//! to a new one: one session's rounds run over one kept-alive connection.
//!
//! **One exchange** writes the core's request head and the body's pieces with one `writev`
//! (plain TCP; through TLS the pieces are encrypted into one buffer written together), then
//! reads the response in [`READ_CHUNK`] reads, each handed to the core's codec, whose events go
//! to the loop at once (the same thread: no hop). Redirects are the core's business: a `3xx`
//! goes to it like any response, so no credential ever follows a `Location`.
//!
//! **Cancellation** (SPEC A4; L5 idle timeouts cancel the attempt too). After
//! [`Exchange::cancel`] nothing more is reported; the rest of the response is read for at most
//! [`CANCEL_GRACE`] and [`DRAIN_CAP`] bytes, so a call the core dropped after the stream's own
//! terminator (case C24 b) still ends cleanly and keeps its connection; otherwise the
//! connection is closed.
//!
//! Memory: one [`READ_CHUNK`] buffer per connection, the response head at most the core's
//! `MAX_RESPONSE_HEAD_BYTES`, and the loop's bounded input channel between reads and the core:
//! an endless body costs a connection one chunk at a time.

use crate::runtime::{InputSender, Runtime, Socket};
use crate::util::{Either, race};
use buzz_agent_core::http::{Exchange as Codec, Origin, Request, Started};
use buzz_agent_core::{HttpEvent, Input};
use std::collections::BTreeMap;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Read buffer size per connection, in bytes.
const READ_CHUNK: usize = 16 * 1024;
/// How long an idle connection waits for its next exchange before it closes.
pub const IDLE: Duration = Duration::from_secs(60);
/// How long a TCP connection (and its TLS handshake) may take.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Body bytes still read after an exchange was cancelled, to end the response cleanly and keep
/// the connection (the rest of a finished stream is a few bytes); past this it is closed.
pub const DRAIN_CAP: usize = 16 * 1024;
/// How long after [`Exchange::cancel`] the rest of the response may take to arrive before the
/// connection is closed (SPEC A4).
pub const CANCEL_GRACE: Duration = Duration::from_millis(100);
/// Ciphertext buffered before it is written, in bytes, while a large body goes through TLS.
const TLS_WRITE_BATCH: usize = 256 * 1024;

/// The exchanges of the process: the idle connections by origin and the TLS configuration.
pub struct Http {
    shared: Arc<Shared>,
}

struct Shared {
    /// Idle connections by origin, the one that went idle last at the end.
    idle: Mutex<BTreeMap<Origin, Vec<IdleConn>>>,
    /// Sent as `user-agent` when a request has none.
    user_agent: String,
    next_conn: Mutex<u64>,
}

/// A connection waiting for its next exchange: hand it one through `jobs`.
struct IdleConn {
    id: u64,
    jobs: async_channel::Sender<Job>,
}

/// One exchange given to a connection.
struct Job {
    started: Started,
    request: Request,
    report: Box<dyn Fn(HttpEvent) -> Input + Send + Sync>,
    tx: InputSender,
    /// Closed by [`Exchange::cancel`] (or by dropping the handle).
    cancelled: async_channel::Receiver<()>,
}

/// A started exchange: cancel it when the core is done with it.
pub struct Exchange {
    cancel: async_channel::Sender<()>,
}

impl Exchange {
    /// The core dropped the exchange: nothing more is reported; the connection finishes the
    /// response within [`CANCEL_GRACE`] or is closed.
    pub fn cancel(&self) {
        self.cancel.close();
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.cancel.close();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Http {
    /// No connection yet; requests without a `user-agent` get `user_agent`.
    #[must_use]
    pub fn new(user_agent: String) -> Http {
        Http {
            shared: Arc::new(Shared {
                idle: Mutex::new(BTreeMap::new()),
                user_agent,
                next_conn: Mutex::new(0),
            }),
        }
    }

    /// Starts `request` on an idle connection to its origin, or on a new one; its events go to
    /// `tx` as `report(event)`.
    ///
    /// # Errors
    /// When the request cannot be written (a bad URL or header): the `Input` reporting the
    /// exchange as failed, for the loop to handle.
    pub fn start<R: Runtime>(
        &mut self,
        rt: &R,
        request: Request,
        report: impl Fn(HttpEvent) -> Input + Send + Sync + 'static,
        tx: &InputSender,
    ) -> Result<Exchange, Input> {
        let started = match Codec::start(&request, &self.shared.user_agent) {
            Ok(s) => s,
            Err(e) => return Err(report(HttpEvent::Failed(e.to_string()))),
        };
        let (cancel, cancelled) = async_channel::bounded(1);
        let mut job = Job {
            started,
            request,
            report: Box::new(report),
            tx: tx.clone(),
            cancelled,
        };
        loop {
            let idle = {
                let mut idle = lock(&self.shared.idle);
                let list = idle.get_mut(&job.started.origin);
                let conn = list.and_then(Vec::pop);
                idle.retain(|_, v| !v.is_empty());
                conn
            };
            let Some(conn) = idle else { break };
            match conn.jobs.try_send(job) {
                Ok(()) => return Ok(Exchange { cancel }),
                // The connection ended between going idle and now.
                Err(e) => job = e.into_inner(),
            }
        }
        let id = {
            let mut n = lock(&self.shared.next_conn);
            *n += 1;
            *n
        };
        rt.spawn(run_connection::<R>(self.shared.clone(), id, job));
        Ok(Exchange { cancel })
    }
}

/// A connection's socket, in the clear or through TLS.
enum Conn<S> {
    Plain(S),
    Tls(Box<Tls<S>>),
}

impl<S: Socket> Conn<S> {
    /// The socket itself (an idle connection watches it for the peer closing).
    fn socket(&mut self) -> &mut S {
        match self {
            Conn::Plain(s) => s,
            Conn::Tls(t) => &mut t.sock,
        }
    }

    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Plain(s) => s.read(buf).await,
            Conn::Tls(t) => t.read(buf).await,
        }
    }

    /// Writes `head` then every piece of `body`.
    async fn write_request(&mut self, head: &[u8], request: &Request) -> io::Result<()> {
        match self {
            Conn::Plain(s) => {
                let mut slices: Vec<IoSlice<'_>> = std::iter::once(head)
                    .chain(request.body.pieces())
                    .map(IoSlice::new)
                    .collect();
                write_all_vectored(s, &mut slices).await
            }
            Conn::Tls(t) => t.write_request(head, request).await,
        }
    }
}

/// Writes every byte of `slices` (as few `writev`s as the socket takes).
async fn write_all_vectored<S: Socket>(
    s: &mut S,
    mut slices: &mut [IoSlice<'_>],
) -> io::Result<()> {
    IoSlice::advance_slices(&mut slices, 0);
    while !slices.is_empty() {
        let n = s.write_vectored(slices).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        IoSlice::advance_slices(&mut slices, n);
    }
    Ok(())
}

async fn write_all<S: Socket>(s: &mut S, bytes: &[u8]) -> io::Result<()> {
    write_all_vectored(s, &mut [IoSlice::new(bytes)]).await
}

/// A rustls client session over a socket.
struct Tls<S> {
    sock: S,
    session: rustls::ClientConnection,
    /// Ciphertext read buffer.
    inbuf: Vec<u8>,
    /// The socket reached end of stream.
    eof: bool,
}

/// The process's TLS configuration: the webpki roots, TLS 1.2 and 1.3 (rustls with ring, as
/// before through ureq), ALPN `http/1.1`. Built on first use.
fn tls_config() -> Result<Arc<rustls::ClientConfig>, String> {
    static CONFIG: OnceLock<Result<Arc<rustls::ClientConfig>, String>> = OnceLock::new();
    CONFIG
        .get_or_init(|| {
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            let roots = rustls::RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            };
            let mut config = rustls::ClientConfig::builder_with_provider(provider)
                .with_protocol_versions(rustls::ALL_VERSIONS)
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(Arc::new(config))
        })
        .clone()
}

impl<S: Socket> Tls<S> {
    /// A TLS session with `host` over `sock`, handshake done.
    async fn connect(sock: S, host: &str) -> io::Result<Tls<S>> {
        let config = tls_config().map_err(io::Error::other)?;
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut session = rustls::ClientConnection::new(config, name).map_err(io::Error::other)?;
        session.set_buffer_limit(None);
        let mut tls = Tls {
            sock,
            session,
            inbuf: vec![0u8; READ_CHUNK],
            eof: false,
        };
        while tls.session.is_handshaking() {
            tls.flush().await?;
            if tls.session.wants_read() {
                if tls.eof {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the server closed the connection during the TLS handshake",
                    ));
                }
                tls.fill().await?;
            }
        }
        tls.flush().await?;
        Ok(tls)
    }

    /// Writes the ciphertext rustls has queued.
    async fn flush(&mut self) -> io::Result<()> {
        let mut out = Vec::new();
        while self.session.wants_write() {
            self.session.write_tls(&mut out)?;
        }
        if out.is_empty() {
            return Ok(());
        }
        write_all(&mut self.sock, &out).await
    }

    /// Reads ciphertext once and processes it.
    async fn fill(&mut self) -> io::Result<()> {
        let n = self.sock.read(&mut self.inbuf).await?;
        if n == 0 {
            self.eof = true;
        }
        let mut rd = self.inbuf.get(..n).unwrap_or(&[]);
        loop {
            // Called once at end of stream too, so the session learns of it.
            self.session.read_tls(&mut rd)?;
            self.session
                .process_new_packets()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
            if rd.is_empty() {
                return Ok(());
            }
        }
    }

    async fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match io::Read::read(&mut self.session.reader(), buf) {
                Ok(n) => return Ok(n),
                // End of stream without close_notify: the HTTP framing decides whether the
                // response was whole.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(0),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if self.eof {
                        return Ok(0);
                    }
                    self.fill().await?;
                    self.flush().await?;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn write_request(&mut self, head: &[u8], request: &Request) -> io::Result<()> {
        let mut out = Vec::new();
        for piece in std::iter::once(head).chain(request.body.pieces()) {
            io::Write::write_all(&mut self.session.writer(), piece)?;
            while self.session.wants_write() {
                self.session.write_tls(&mut out)?;
            }
            if out.len() >= TLS_WRITE_BATCH {
                write_all(&mut self.sock, &out).await?;
                out.clear();
            }
        }
        write_all(&mut self.sock, &out).await
    }
}

/// Opens a connection to `origin` within [`CONNECT_TIMEOUT`].
async fn open<R: Runtime>(origin: &Origin) -> io::Result<Conn<R::Tcp>> {
    let connect = async {
        let sock = R::connect(origin.host.clone(), origin.port).await?;
        if origin.tls {
            Ok(Conn::Tls(Box::new(Tls::connect(sock, &origin.host).await?)))
        } else {
            Ok(Conn::Plain(sock))
        }
    };
    match race(connect, R::sleep_until(Instant::now() + CONNECT_TIMEOUT)).await {
        Either::First(r) => r,
        Either::Second(()) => Err(io::Error::new(
            io::ErrorKind::TimedOut,
            format!("no connection within {} s", CONNECT_TIMEOUT.as_secs()),
        )),
    }
}

/// What became of an exchange, for its connection.
enum Served {
    /// The response ended and the connection may carry another.
    Reusable,
    /// The connection must close (failed, cancelled mid-response, or the server said so).
    Close,
    /// The loop is gone: stop.
    LoopGone,
}

/// A connection's life: serves `job` (connecting first), then every exchange handed to it
/// while idle, until one leaves it unusable or it has been idle for [`IDLE`].
async fn run_connection<R: Runtime>(shared: Arc<Shared>, id: u64, first: Job) {
    let origin = first.started.origin.clone();
    let (jobs_tx, jobs) = async_channel::bounded::<Job>(1);
    let mut conn: Option<Conn<R::Tcp>> = None;
    let mut next = Some(first);
    let mut idle = IdleTimer::<R>::default();
    loop {
        let Some(job) = next.take() else { return };
        if conn.is_none() {
            match open::<R>(&origin).await {
                Ok(c) => conn = Some(c),
                Err(e) => {
                    let _ = job
                        .tx
                        .send((job.report)(HttpEvent::Failed(format!(
                            "cannot connect to {origin}: {e}"
                        ))))
                        .await;
                    return;
                }
            }
        }
        let Some(c) = conn.as_mut() else { return };
        match serve::<R>(c, job).await {
            Served::Reusable => {}
            Served::Close | Served::LoopGone => return,
        }
        // Idle: go back to the pool, then wait for an exchange, the peer or the idle timeout.
        lock(&shared.idle)
            .entry(origin.clone())
            .or_default()
            .push(IdleConn {
                id,
                jobs: jobs_tx.clone(),
            });
        let Some(c) = conn.as_mut() else { return };
        let mut probe = [0u8; 1];
        let until = Instant::now() + IDLE;
        let watched = loop {
            let watched = race(jobs.recv(), async {
                race(c.socket().read(&mut probe), idle.fired(until)).await
            })
            .await;
            // The timer was armed for an earlier idle period: this one is not over yet.
            if !matches!(watched, Either::Second(Either::Second(()))) || Instant::now() >= until {
                break watched;
            }
        };
        match watched {
            Either::First(Ok(job)) => next = Some(job),
            Either::First(Err(_)) => return,
            Either::Second(_) => {
                // The peer closed (or spoke out of turn), or the idle time is over: this
                // connection is done. If the pool no longer lists it, an exchange took it
                // meanwhile and is on its way: serve it on a new connection.
                conn = None;
                let listed = {
                    let mut idle = lock(&shared.idle);
                    let list = idle.entry(origin.clone()).or_default();
                    let at = list.iter().position(|c| c.id == id);
                    if let Some(at) = at {
                        list.remove(at);
                    }
                    idle.retain(|_, v| !v.is_empty());
                    at.is_some()
                };
                if listed {
                    return;
                }
                match jobs.recv().await {
                    Ok(job) => next = Some(job),
                    Err(_) => return,
                }
            }
        }
    }
}

/// A connection's idle timeout: one timer for the connection's life, re-armed only when it
/// fired (or was never armed), as the driver loop's timer is. Going idle moves the deadline
/// with every exchange; re-arming for each (or a new timer per idle period) would register a
/// timer with the reactor every round, and smol's reactor is woken for every registration
/// (an eventfd write, then one more wait). A timer armed for an earlier idle period fires
/// early instead, once per [`IDLE`] at most, and the caller waits again.
struct IdleTimer<R: Runtime> {
    timer: Option<R::Timer>,
    /// The timer is armed and has not fired.
    armed: bool,
}

impl<R: Runtime> Default for IdleTimer<R> {
    fn default() -> Self {
        IdleTimer {
            timer: None,
            armed: false,
        }
    }
}

impl<R: Runtime> IdleTimer<R> {
    /// Completes when the timer fires: at `until`, or earlier when it was still armed for an
    /// earlier deadline (the caller checks the time).
    async fn fired(&mut self, until: Instant) {
        if !self.armed {
            match &mut self.timer {
                Some(t) => R::reset_timer(t, until),
                None => self.timer = Some(R::timer(until)),
            }
            self.armed = true;
        }
        if let Some(t) = &mut self.timer {
            t.await;
        }
        self.armed = false;
    }
}

/// One exchange on an open connection (see the module docs).
async fn serve<R: Runtime>(conn: &mut Conn<R::Tcp>, job: Job) -> Served {
    let Job {
        started,
        request,
        report,
        tx,
        cancelled,
    } = job;
    let Started {
        exchange: mut codec,
        head,
        ..
    } = started;
    let send = |event: HttpEvent| {
        let input = report(event);
        let tx = tx.clone();
        async move { tx.send(input).await.is_ok() }
    };
    let write = conn.write_request(&head, &request);
    match race(write, cancelled.recv()).await {
        Either::First(Ok(())) => {}
        Either::First(Err(e)) => {
            let alive = send(HttpEvent::Failed(format!(
                "sending the request failed: {e}"
            )))
            .await;
            return if alive {
                Served::Close
            } else {
                Served::LoopGone
            };
        }
        // Cancelled before the request was written: the connection is mid-request.
        Either::Second(_) => return Served::Close,
    }
    // The body is not needed any more: free it before the response streams (and let the
    // session's cache grow in place again).
    drop(request);
    drop(head);
    let mut buf = vec![0u8; READ_CHUNK];
    let mut events = Vec::new();
    let mut cancelled_at: Option<Instant> = None;
    let mut drained = 0usize;
    loop {
        let read = match cancelled_at {
            None => match race(conn.read(&mut buf), cancelled.recv()).await {
                Either::First(r) => r,
                Either::Second(_) => {
                    cancelled_at = Some(Instant::now());
                    continue;
                }
            },
            Some(at) => match race(conn.read(&mut buf), R::sleep_until(at + CANCEL_GRACE)).await {
                Either::First(r) => r,
                Either::Second(()) => return Served::Close,
            },
        };
        let eof = matches!(read, Ok(0));
        let result = match read {
            Ok(0) => codec.finish(&mut events),
            Ok(n) => {
                if cancelled_at.is_some() {
                    drained += n;
                    if drained > DRAIN_CAP {
                        return Served::Close;
                    }
                }
                codec.push(buf.get(..n).unwrap_or(&[]), &mut events)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                if cancelled_at.is_some() {
                    return Served::Close;
                }
                let alive = send(HttpEvent::Failed(format!(
                    "reading the response failed: {e}"
                )))
                .await;
                return if alive {
                    Served::Close
                } else {
                    Served::LoopGone
                };
            }
        };
        if cancelled_at.is_none() {
            for event in events.drain(..) {
                if !send(event).await {
                    return Served::LoopGone;
                }
            }
        } else {
            events.clear();
        }
        if let Err(e) = result {
            if cancelled_at.is_none() && !send(HttpEvent::Failed(e.to_string())).await {
                return Served::LoopGone;
            }
            return Served::Close;
        }
        if codec.is_done() {
            return if codec.reusable() {
                Served::Reusable
            } else {
                Served::Close
            };
        }
        if eof {
            return Served::Close;
        }
    }
}
