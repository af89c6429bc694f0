//! The runtime's part of MCP authorization (SPEC M11; the core decides everything else): the
//! loopback listener the authorization redirect lands on, the token files in
//! `<state dir>/oauth/`, and `$BROWSER`. Each [`OAuthAction`] is started without waiting for
//! it; what comes of it returns as an [`OAuthInput`] through the loop's channel.
//!
//! - **Listener**: `127.0.0.1:<port>` bound at once (the result is the immediate input), then
//!   a thread accepts connections; each connection gets a thread that reads the request head
//!   (at most [`MAX_CALLBACK_HEAD_BYTES`], for at most [`CALLBACK_READ_TIMEOUT`]), hands it to
//!   the core and writes the core's answer ([`OAuthAction::Answer`], waited for at most
//!   [`CALLBACK_ANSWER_TIMEOUT`]), then closes. At most [`MAX_OPEN_CONNECTIONS`] are served at
//!   once; more are closed at once. Stopping wakes the accepting thread with a connection of
//!   its own.
//! - **Token files**: one thread, started with the first file action, does them in order (a
//!   later save never loses to an earlier one). Reads refuse symbolic links and files over
//!   [`MAX_TOKEN_FILE_BYTES`]; writes go to a temporary file (mode 0600, in a directory
//!   created 0700), are synced and renamed over the old file, and the directory is synced.
//! - **Browser**: `argv` is started detached in a process group of its own, with the standard
//!   streams on `/dev/null` and without the agent's own secrets in its environment (the
//!   variables withheld from MCP servers, SPEC M1); a thread reaps it.

use crate::runtime::InputSender;
use buzz_agent_core::config::StateDir;
use buzz_agent_core::io::MAX_CALLBACK_HEAD_BYTES;
use buzz_agent_core::{Input, ListenerId, OAuthAction, OAuthInput, ServerSlot};
use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How long a loopback connection may take to send its request head.
pub const CALLBACK_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a loopback connection waits for the core's answer.
pub const CALLBACK_ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Loopback connections served at once per listener; more are closed unanswered.
pub const MAX_OPEN_CONNECTIONS: usize = 8;
/// The largest token file read (a real one is well under 16 KiB).
pub const MAX_TOKEN_FILE_BYTES: u64 = 1024 * 1024;

/// The driver's handle on the authorization IO.
pub struct OAuthIo {
    dir: Option<PathBuf>,
    tx: InputSender,
    listeners: BTreeMap<(ServerSlot, ListenerId), Listener>,
    files: Option<mpsc::Sender<FileJob>>,
    /// The process groups of the browsers started (each its own group): the user's, left
    /// running when the agent stops its descendants at exit (SPEC S7).
    browsers: Vec<i32>,
}

/// One open listener.
struct Listener {
    port: u16,
    stop: Arc<AtomicBool>,
    answers: Answers,
}

/// Connections waiting for the core's answer, by connection number.
type Answers = Arc<Mutex<BTreeMap<u64, mpsc::Sender<Vec<u8>>>>>;

/// A token file operation, for a server.
enum FileJob {
    Read(ServerSlot, String),
    Write(ServerSlot, String, Vec<u8>),
}

impl OAuthIo {
    /// The IO of an agent whose state directory is `state_dir` (token files in its `oauth/`;
    /// none when it is off). Inputs go to `tx`.
    #[must_use]
    pub fn new(state_dir: &StateDir, tx: InputSender) -> OAuthIo {
        OAuthIo {
            dir: match state_dir {
                StateDir::Off => None,
                StateDir::Dir(d) => Some(Path::new(d).join("oauth")),
            },
            tx,
            listeners: BTreeMap::new(),
            files: None,
            browsers: Vec::new(),
        }
    }

    /// Starts `action`; an input that answers it at once (a bound listener, a failure) is
    /// returned for the loop to handle before anything else.
    pub fn start(&mut self, action: OAuthAction) -> Option<Input> {
        match action {
            OAuthAction::Listen {
                server,
                listener,
                port,
            } => Some(self.listen(server, listener, port)),
            OAuthAction::Answer {
                server,
                listener,
                connection,
                response,
            } => {
                if let Some(l) = self.listeners.get(&(server, listener))
                    && let Some(answer) = lock(&l.answers).remove(&connection)
                {
                    let _ = answer.send(response);
                }
                None
            }
            OAuthAction::StopListening { server, listener } => {
                if let Some(l) = self.listeners.remove(&(server, listener)) {
                    l.stop();
                }
                None
            }
            OAuthAction::ReadTokenFile { server, file } => {
                self.file_job(FileJob::Read(server, file))
            }
            OAuthAction::WriteTokenFile {
                server,
                file,
                bytes,
            } => self.file_job(FileJob::Write(server, file, bytes)),
            OAuthAction::OpenBrowser { server, argv } => {
                let result = open_browser(&argv).map(|pgid| self.browsers.push(pgid));
                Some(Input::OAuth(OAuthInput::Browser { server, result }))
            }
        }
    }

    /// The process groups of the browsers this agent started.
    #[must_use]
    pub fn browser_groups(&self) -> &[i32] {
        &self.browsers
    }

    /// At exit: every listener is closed.
    pub fn finish(&mut self) {
        for (_, l) in std::mem::take(&mut self.listeners) {
            l.stop();
        }
    }

    fn listen(&mut self, server: ServerSlot, listener: ListenerId, port: u16) -> Input {
        let result = TcpListener::bind(("127.0.0.1", port)).and_then(|socket| {
            let bound = socket.local_addr()?.port();
            let stop = Arc::new(AtomicBool::new(false));
            let answers: Answers = Arc::default();
            let (tx, s, a) = (self.tx.clone(), stop.clone(), answers.clone());
            std::thread::Builder::new()
                .name(format!("oauth-{server}"))
                .spawn(move || accept_loop(&socket, (server, listener), &s, &a, &tx))?;
            self.listeners.insert(
                (server, listener),
                Listener {
                    port: bound,
                    stop,
                    answers,
                },
            );
            Ok(bound)
        });
        Input::OAuth(OAuthInput::Listening {
            server,
            listener,
            result: result.map_err(|e| e.to_string()),
        })
    }

    fn file_job(&mut self, job: FileJob) -> Option<Input> {
        let Some(dir) = self.dir.clone() else {
            return Some(file_failure(&job, "the state directory is off"));
        };
        if self.files.is_none() {
            let (jobs, rx) = mpsc::channel::<FileJob>();
            let tx = self.tx.clone();
            let spawned = std::thread::Builder::new()
                .name("oauth-files".into())
                .spawn(move || {
                    for job in rx {
                        let input = run_file_job(&dir, job);
                        if tx.send_blocking(input).is_err() {
                            return;
                        }
                    }
                });
            match spawned {
                Ok(_) => self.files = Some(jobs),
                Err(e) => return Some(file_failure(&job, &format!("cannot start a thread: {e}"))),
            }
        }
        let jobs = self.files.as_ref()?;
        jobs.send(job)
            .err()
            .map(|e| file_failure(&e.0, "the file thread is gone"))
    }
}

impl Listener {
    /// Stops accepting (the accepting thread is woken by a connection of our own) and drops
    /// the connections waiting for an answer (they close unanswered).
    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        lock(&self.answers).clear();
        let _ = TcpStream::connect_timeout(
            &std::net::SocketAddr::from(([127, 0, 0, 1], self.port)),
            Duration::from_secs(1),
        );
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Accepts until stopped; one thread per connection, at most [`MAX_OPEN_CONNECTIONS`].
fn accept_loop(
    socket: &TcpListener,
    listener: (ServerSlot, ListenerId),
    stop: &Arc<AtomicBool>,
    answers: &Answers,
    tx: &InputSender,
) {
    let next = AtomicU64::new(0);
    let open = Arc::new(AtomicUsize::new(0));
    for conn in socket.incoming() {
        if stop.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = conn else { continue };
        if open.load(Ordering::Acquire) >= MAX_OPEN_CONNECTIONS {
            let _ = stream.shutdown(Shutdown::Both);
            continue;
        }
        let connection = next.fetch_add(1, Ordering::Relaxed) + 1;
        open.fetch_add(1, Ordering::AcqRel);
        let (answers, tx, open, stop) = (answers.clone(), tx.clone(), open.clone(), stop.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("oauth-{}-{connection}", listener.0))
            .spawn(move || {
                serve(stream, listener, connection, &answers, &tx, &stop);
                open.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            // The connection went with the closure; nothing more to do.
        }
    }
}

/// One connection: read the head, hand it over, write the answer, close.
fn serve(
    mut stream: TcpStream,
    (server, listener): (ServerSlot, ListenerId),
    connection: u64,
    answers: &Answers,
    tx: &InputSender,
    stop: &AtomicBool,
) {
    let _ = stream.set_read_timeout(Some(CALLBACK_READ_TIMEOUT));
    let _ = stream.set_write_timeout(Some(CALLBACK_ANSWER_TIMEOUT));
    let head = read_head(&mut stream);
    if stop.load(Ordering::Acquire) || head.is_empty() {
        let _ = stream.shutdown(Shutdown::Both);
        return;
    }
    let (answer_tx, answer_rx) = mpsc::channel();
    lock(answers).insert(connection, answer_tx);
    let sent = tx.send_blocking(Input::OAuth(OAuthInput::Callback {
        server,
        listener,
        connection,
        head,
    }));
    if sent.is_ok()
        && let Ok(response) = answer_rx.recv_timeout(CALLBACK_ANSWER_TIMEOUT)
    {
        let _ = stream.write_all(&response);
        let _ = stream.flush();
    }
    lock(answers).remove(&connection);
    let _ = stream.shutdown(Shutdown::Both);
}

/// The request head: bytes up to and including the first blank line, or all that arrived
/// before the size limit, the timeout or the end.
fn read_head(stream: &mut TcpStream) -> Vec<u8> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 2048];
    while head.len() < MAX_CALLBACK_HEAD_BYTES {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let room = MAX_CALLBACK_HEAD_BYTES - head.len();
                head.extend_from_slice(&buf[..n.min(room)]);
                if let Some(end) = find_blank_line(&head) {
                    head.truncate(end);
                    break;
                }
            }
        }
    }
    head
}

/// The end of the first `\r\n\r\n` (or `\n\n`), if any.
fn find_blank_line(b: &[u8]) -> Option<usize> {
    b.windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .or_else(|| b.windows(2).position(|w| w == b"\n\n").map(|i| i + 2))
}

/// Whether `name` is a plain file name (no directory part, not hidden).
fn plain_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.starts_with('.') && !name.contains('\0')
}

fn file_failure(job: &FileJob, why: &str) -> Input {
    match job {
        FileJob::Read(server, file) => Input::OAuth(OAuthInput::TokenFile {
            server: *server,
            file: file.clone(),
            result: Err(why.to_owned()),
        }),
        FileJob::Write(server, file, _) => Input::OAuth(OAuthInput::TokenFileWritten {
            server: *server,
            file: file.clone(),
            result: Err(why.to_owned()),
        }),
    }
}

fn run_file_job(dir: &Path, job: FileJob) -> Input {
    // SPEC S8: no token is read from, or written to, a directory another user can write to.
    if let Err(why) = crate::store::check_state_dir(dir) {
        return file_failure(&job, &format!("{why}; tokens are not kept there"));
    }
    match job {
        FileJob::Read(server, file) => {
            let result = read_token_file(dir, &file);
            Input::OAuth(OAuthInput::TokenFile {
                server,
                file,
                result,
            })
        }
        FileJob::Write(server, file, bytes) => {
            let result = write_token_file(dir, &file, &bytes);
            Input::OAuth(OAuthInput::TokenFileWritten {
                server,
                file,
                result,
            })
        }
    }
}

/// `dir/name`: `Ok(None)` when it does not exist; refuses links, non-files and big files.
fn read_token_file(dir: &Path, name: &str) -> Result<Option<Vec<u8>>, String> {
    if !plain_name(name) {
        return Err(format!("{name:?} is not a file name"));
    }
    let path = dir.join(name);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path);
    let mut file = match file {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(format!(
                "{} is a symbolic link; not followed",
                path.display()
            ));
        }
        Err(e) => return Err(e.to_string()),
    };
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.len() > MAX_TOKEN_FILE_BYTES {
        return Err(format!("{} is over 1 MiB", path.display()));
    }
    let mut bytes = Vec::with_capacity(usize::try_from(meta.len()).unwrap_or(0));
    Read::by_ref(&mut file)
        .take(MAX_TOKEN_FILE_BYTES)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    Ok(Some(bytes))
}

/// Replaces `dir/name` with `bytes`: directory 0700, a temporary file 0600 written, synced
/// and renamed over the old one, the directory synced.
fn write_token_file(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), String> {
    if !plain_name(name) {
        return Err(format!("{name:?} is not a file name"));
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, dir.join(name))?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(|e| e.to_string())
}

/// Starts the browser detached, in a process group of its own (returned); a thread reaps it.
fn open_browser(argv: &[String]) -> Result<i32, String> {
    use std::os::unix::process::CommandExt;
    let Some((program, args)) = argv.split_first() else {
        return Err("no browser command".into());
    };
    let mut cmd = std::process::Command::new(program);
    cmd.args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .process_group(0);
    for (k, _) in std::env::vars_os() {
        if let Some(k) = k.to_str()
            && buzz_agent_core::config::is_agent_secret_or_own_variable(k)
        {
            cmd.env_remove(k);
        }
    }
    let mut child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
    let pgid = i32::try_from(child.id()).unwrap_or(0);
    let _ = std::thread::Builder::new()
        .name("browser".into())
        .spawn(move || {
            let _ = child.wait();
        });
    Ok(pgid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    const S: ServerSlot = ServerSlot(7);

    fn io(dir: &Path) -> (OAuthIo, async_channel::Receiver<Input>) {
        let (tx, rx) = async_channel::bounded(16);
        (
            OAuthIo::new(&StateDir::Dir(dir.display().to_string()), tx),
            rx,
        )
    }

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("buzz-oauth-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn recv(rx: &async_channel::Receiver<Input>) -> Input {
        for _ in 0..200 {
            if let Ok(i) = rx.try_recv() {
                return i;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        panic!("no input within 5 s");
    }

    fn read(file: &str) -> OAuthAction {
        OAuthAction::ReadTokenFile {
            server: S,
            file: file.into(),
        }
    }

    #[test]
    fn a_callback_reaches_the_core_and_its_answer_reaches_the_browser() {
        let dir = scratch("listen");
        let (mut io, rx) = io(&dir);
        let listen = OAuthAction::Listen {
            server: S,
            listener: ListenerId(1),
            port: 0,
        };
        let Some(Input::OAuth(OAuthInput::Listening {
            server,
            listener,
            result: Ok(port),
        })) = io.start(listen)
        else {
            panic!("not listening")
        };
        assert_eq!((server, listener), (S, ListenerId(1)));
        let browser = std::thread::spawn(move || {
            let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.write_all(b"GET /callback?code=x&state=y HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                .unwrap();
            let mut answer = String::new();
            s.read_to_string(&mut answer).unwrap();
            answer
        });
        let Input::OAuth(OAuthInput::Callback {
            server,
            listener,
            connection,
            head,
        }) = recv(&rx)
        else {
            panic!()
        };
        assert_eq!(server, S);
        assert!(head.starts_with(b"GET /callback?code=x&state=y HTTP/1.1\r\n"));
        assert!(head.ends_with(b"\r\n\r\n"));
        io.start(OAuthAction::Answer {
            server,
            listener,
            connection,
            response: b"HTTP/1.1 200 OK\r\n\r\nok".to_vec(),
        });
        assert_eq!(browser.join().unwrap(), "HTTP/1.1 200 OK\r\n\r\nok");
        io.start(OAuthAction::StopListening { server, listener });
        // Closed: the port no longer answers (after the accepting thread saw the stop).
        std::thread::sleep(Duration::from_millis(100));
        assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn a_port_in_use_is_reported() {
        let dir = scratch("busy");
        let (mut io, _rx) = io(&dir);
        let taken = TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let port = taken.local_addr().unwrap().port();
        let r = io.start(OAuthAction::Listen {
            server: S,
            listener: ListenerId(2),
            port,
        });
        assert!(
            matches!(
                r,
                Some(Input::OAuth(OAuthInput::Listening { result: Err(_), .. }))
            ),
            "{r:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn token_files_are_written_0600_in_a_0700_directory_and_read_back() {
        let dir = scratch("files");
        let (mut io, rx) = io(&dir);
        assert!(io.start(read("a.json")).is_none());
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFile {
                result: Ok(None),
                server: S,
                ..
            })
        ));
        for bytes in [b"one", b"two"] {
            io.start(OAuthAction::WriteTokenFile {
                server: S,
                file: "a.json".into(),
                bytes: bytes.to_vec(),
            });
        }
        for _ in 0..2 {
            assert!(matches!(
                recv(&rx),
                Input::OAuth(OAuthInput::TokenFileWritten { result: Ok(()), .. })
            ));
        }
        io.start(read("a.json"));
        let Input::OAuth(OAuthInput::TokenFile {
            result: Ok(Some(bytes)),
            ..
        }) = recv(&rx)
        else {
            panic!()
        };
        assert_eq!(bytes, b"two", "the later save wins");
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir.join("oauth")), 0o700);
        assert_eq!(mode(&dir.join("oauth/a.json")), 0o600);
        let left = std::fs::read_dir(dir.join("oauth")).unwrap().count();
        assert_eq!(left, 1, "no temporary file left");
        // Links and path names are refused.
        std::os::unix::fs::symlink("/etc/passwd", dir.join("oauth/link.json")).unwrap();
        io.start(read("link.json"));
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFile { result: Err(e), .. }) if e.contains("symbolic link")
        ));
        io.start(read("../x"));
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFile { result: Err(_), .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn s8_no_token_is_read_or_written_where_another_user_can_write() {
        let dir = scratch("s8");
        let (mut io, rx) = io(&dir);
        std::fs::create_dir_all(dir.join("oauth")).unwrap();
        std::fs::write(dir.join("oauth/a.json"), b"planted").unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        io.start(read("a.json"));
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFile { result: Err(e), .. })
                if e.contains("without the sticky bit") && e.contains("tokens are not kept there")
        ));
        io.start(OAuthAction::WriteTokenFile {
            server: S,
            file: "b.json".into(),
            bytes: b"secret".to_vec(),
        });
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFileWritten { result: Err(_), .. })
        ));
        assert!(!dir.join("oauth/b.json").exists());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        io.start(read("a.json"));
        assert!(matches!(
            recv(&rx),
            Input::OAuth(OAuthInput::TokenFile { result: Ok(Some(b)), .. }) if b == b"planted"
        ));
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn without_a_state_directory_file_actions_fail_at_once() {
        let (tx, _rx) = async_channel::bounded(4);
        let mut io = OAuthIo::new(&StateDir::Off, tx);
        let r = io.start(read("a.json"));
        assert!(matches!(
            r,
            Some(Input::OAuth(OAuthInput::TokenFile { result: Err(_), .. }))
        ));
    }

    #[test]
    fn a_browser_that_cannot_be_started_is_reported_and_one_that_can_is_reaped() {
        let dir = scratch("browser");
        let (mut io, _rx) = io(&dir);
        let open = |argv: &[&str]| OAuthAction::OpenBrowser {
            server: S,
            argv: argv.iter().map(|a| (*a).to_owned()).collect(),
        };
        let r = io.start(open(&["/nonexistent/browser", "https://x"]));
        assert!(
            matches!(
                r,
                Some(Input::OAuth(OAuthInput::Browser { result: Err(_), .. }))
            ),
            "{r:?}"
        );
        let r = io.start(open(&["true", "https://x"]));
        assert!(
            matches!(
                r,
                Some(Input::OAuth(OAuthInput::Browser { result: Ok(()), .. }))
            ),
            "{r:?}"
        );
        let _ = std::fs::remove_dir_all(dir);
    }
}
