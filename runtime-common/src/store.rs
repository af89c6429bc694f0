//! The session transcripts on disk (SPEC A9): the file half of the core's session store. The
//! core decides what to write and when; this opens, locks, appends, truncates, syncs, reads
//! and lists files in the state directory.
//!
//! - Files are opened directly inside the state directory only: a name with a `/` or a leading
//!   `.` is refused, symbolic links are not followed (`O_NOFOLLOW`), and the directory listing
//!   takes regular files only. Nothing is read or written elsewhere.
//! - A new transcript is created with `O_EXCL`, mode 0600; the state directory is created
//!   (mode 0700) with the first one.
//! - Every open transcript holds an exclusive `flock(2)` lock: a second agent opening the same
//!   session is refused ([`TranscriptError::Locked`]), and the lock dies with the process, so a
//!   `kill -9`'d agent never leaves a stale one.
//! - **On the loop, at once**: open, append, truncate and close. An append is one `write(2)`
//!   of whole lines into the page cache, made while the core's actions are executed, so a
//!   step's records reach the kernel before that step's ACP lines reach stdout: a crash of the
//!   process after the client saw something never loses its record. None of these waits for
//!   the device (no sync).
//! - **Off the loop**, on the store thread (started with the first such action): the
//!   `fdatasync(2)` the core asks for once per answered prompt and at close
//!   ([`Action::SyncTranscript`], answered [`TranscriptEvent::Synced`]); for a file this
//!   process created, the first sync also `fsync`s the directories whose entries it created
//!   (the file's, and any directory made for it), so that the file itself survives a power
//!   loss. Syncs that queue while the thread is busy are taken together: one `fdatasync` per
//!   file answers all of that file's queued marks ([`group`]). The listing runs there too.
//! - A read streams the file in [`READ_CHUNK`] pieces through the loop's bounded input channel
//!   (the thread waits while it is full), on a thread of its own, and waits too while more
//!   than [`MAX_STDOUT_BACKLOG`] bytes wait for stdout (the replay a client has not read yet):
//!   a long transcript never sits in memory whole, whether in the input queue or in the
//!   stdout queue, and a client that stops reading holds up only its own load. Closing a file
//!   being read stops the read; the store thread waits for the reader to let go of the file.
//!
//! - **The directory must be the user's own** (SPEC S8): before every open and listing, the
//!   state directory must belong to the agent's user and be writable by no one else, and each
//!   of its parents must belong to that user or root and be writable by no one else unless it
//!   has the sticky bit (`/tmp`), as OpenSSH's `StrictModes` asks of `~/.ssh`
//!   ([`check_state_dir`]). A transcript must be the user's and writable by no one else. Else
//!   nothing there is opened, created or listed, so a session planted by another user (with
//!   its remembered `allow_always` answers) is never loaded; the driver says so once at start.
//!
//! At exit, [`Store::finish`] lets the thread run the syncs that are queued (bounded by a
//! deadline) before the last ACP lines are written.

use crate::runtime::InputSender;
use buzz_agent_core::config::StateDir;
use buzz_agent_core::{
    Action, Input, OpenMode, TRANSCRIPT_HEAD_BYTES, TranscriptEntry, TranscriptError,
    TranscriptEvent, TranscriptId,
};
use std::collections::BTreeMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, UNIX_EPOCH};

/// Bytes per read of a transcript being loaded (as the other readers: the input queue holds at
/// most [`crate::driver::INPUT_QUEUE`] of them).
pub const READ_CHUNK: usize = 16 * 1024;
/// Stdout bytes queued and not yet written above which a transcript read waits.
pub const MAX_STDOUT_BACKLOG: usize = 256 * 1024;

/// The bytes queued for stdout and not written yet, shared by the loop (which queues lines),
/// the stdout writer (which writes them) and transcript reads (which wait while the client has
/// more than [`MAX_STDOUT_BACKLOG`] bytes to read).
#[derive(Debug, Default)]
pub struct Backlog {
    bytes: AtomicUsize,
    lock: std::sync::Mutex<()>,
    drained: std::sync::Condvar,
}

impl Backlog {
    /// `n` bytes were queued.
    pub fn queued(&self, n: usize) {
        self.bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` queued bytes were written (or dropped); a read waiting for the client wakes when
    /// the backlog falls to the limit.
    pub fn written(&self, n: usize) {
        let before = self.bytes.fetch_sub(n, Ordering::Relaxed);
        if before > MAX_STDOUT_BACKLOG && before - n <= MAX_STDOUT_BACKLOG {
            let _guard = self
                .lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            self.drained.notify_all();
        }
    }

    /// Bytes waiting.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.bytes.load(Ordering::Relaxed)
    }

    /// Waits (at most `limit`) while more than [`MAX_STDOUT_BACKLOG`] bytes wait.
    fn wait_below_limit(&self, limit: Duration) {
        let guard = self
            .lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if self.bytes() > MAX_STDOUT_BACKLOG {
            let _ = self.drained.wait_timeout(guard, limit);
        }
    }
}

/// What the store thread does.
#[derive(Debug)]
enum Cmd {
    /// `fdatasync` the file (after `fsync`ing `dirs`), then answer `Synced(mark)`.
    Sync {
        file: TranscriptId,
        f: Arc<File>,
        dirs: Vec<PathBuf>,
        mark: u64,
    },
    /// Stop the read of a closed file and wait for its thread to let go of the file.
    StopRead(Reading),
    /// List the state directory for request `.0`.
    List(u64),
}

/// An open transcript.
struct Held {
    f: Arc<File>,
    /// The directories to `fsync` with the first sync: a file this process created is not
    /// durable before its directory entry is.
    dirs: Vec<PathBuf>,
    /// The read in progress.
    reading: Option<Reading>,
}

/// A read in progress: its stop flag and its thread (whose copy of the file holds the lock
/// too).
#[derive(Debug)]
struct Reading {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// The transcripts of the loop: the open files (used on the loop thread) and the handle on
/// the store thread.
pub struct Store {
    dir: Option<PathBuf>,
    tx: InputSender,
    backlog: Arc<Backlog>,
    files: BTreeMap<TranscriptId, Held>,
    worker: Option<(mpsc::Sender<Cmd>, mpsc::Receiver<()>)>,
}

impl Store {
    /// The store of `dir`; its thread starts with the first sync or listing. Its inputs go to
    /// `tx`; `backlog` counts the bytes waiting for stdout.
    #[must_use]
    pub fn new(dir: &StateDir, tx: InputSender, backlog: Arc<Backlog>) -> Store {
        Store {
            dir: match dir {
                StateDir::Off => None,
                StateDir::Dir(d) => Some(PathBuf::from(d)),
            },
            tx,
            backlog,
            files: BTreeMap::new(),
            worker: None,
        }
    }

    /// Whether the state directory may hold sessions ([`check_state_dir`]); `Ok` when
    /// sessions are not saved at all. The driver checks it once at start to say why sessions
    /// will not be saved; every open and listing checks it again.
    ///
    /// # Errors
    /// Why the directory is refused, naming it (or the parent at fault).
    pub fn check(&self) -> Result<(), String> {
        self.dir.as_deref().map_or(Ok(()), check_state_dir)
    }

    /// Runs one transcript action (others are not the store's and are ignored). The answer
    /// of an open, and the failure of a write, come back at once as the returned input; the
    /// answers of syncs, reads and listings come later through the channel.
    pub fn start(&mut self, action: Action) -> Option<Input> {
        match action {
            Action::OpenTranscript { file, name, mode } => {
                let event = match open(self.dir.as_deref(), &name, mode) {
                    Ok((f, dirs)) => {
                        self.files.insert(
                            file,
                            Held {
                                f: Arc::new(f),
                                dirs,
                                reading: None,
                            },
                        );
                        TranscriptEvent::Opened
                    }
                    Err(e) => TranscriptEvent::Failed(e),
                };
                Some(Input::Transcript { file, event })
            }
            Action::AppendTranscript { file, bytes } => {
                let held = self.files.get(&file)?;
                let written = (&*held.f).write_all(&bytes);
                self.failed(file, written.err())
            }
            Action::TruncateTranscript { file, len } => {
                let held = self.files.get(&file)?;
                let cut = held.f.set_len(len);
                self.failed(file, cut.err())
            }
            Action::SyncTranscript { file, mark } => {
                let held = self.files.get_mut(&file)?;
                let cmd = Cmd::Sync {
                    file,
                    f: held.f.clone(),
                    dirs: std::mem::take(&mut held.dirs),
                    mark,
                };
                self.send(cmd)
            }
            Action::ReadTranscript { file } => {
                let started = match self.files.get_mut(&file) {
                    Some(held) => held
                        .f
                        .try_clone()
                        .map_err(|e| e.to_string())
                        .and_then(|clone| {
                            let stop = Arc::new(AtomicBool::new(false));
                            let reader = Reader {
                                file,
                                f: clone,
                                tx: self.tx.clone(),
                                backlog: self.backlog.clone(),
                                stop: stop.clone(),
                            };
                            let thread = std::thread::Builder::new()
                                .name(format!("store-read-{}", file.0))
                                .spawn(move || reader.run())
                                .map_err(|e| format!("cannot start a reader thread: {e}"))?;
                            held.reading = Some(Reading { stop, thread });
                            Ok(())
                        }),
                    None => Err("the file is not open".to_owned()),
                };
                started.err().map(|e| Input::Transcript {
                    file,
                    event: TranscriptEvent::Failed(TranscriptError::Io(e)),
                })
            }
            Action::CloseTranscript { file } => {
                // Closed here, its lock released with it; a read still going stops at its next
                // chunk, and the store thread waits for it to let go of its copy of the file
                // (which holds the lock too) — the loop never waits for a reader that may be
                // waiting for the loop.
                let reading = self.files.remove(&file)?.reading?;
                reading.stop.store(true, Ordering::Relaxed);
                self.send(Cmd::StopRead(reading))
            }
            Action::ListTranscripts { request } => self.send(Cmd::List(request)),
            Action::WriteAcp(_)
            | Action::WriteMcp { .. }
            | Action::SpawnMcp { .. }
            | Action::CloseMcpStdin { .. }
            | Action::SignalProcessGroup { .. }
            | Action::CallLlm { .. }
            | Action::CancelLlm { .. }
            | Action::ReadProject { .. }
            | Action::OAuth(_)
            | Action::Http { .. }
            | Action::CancelHttp { .. }
            | Action::Log(_)
            | Action::Exit { .. } => None,
        }
    }

    /// After a failed write to `file`: it takes no more, and the core hears of it once.
    fn failed(&mut self, file: TranscriptId, error: Option<std::io::Error>) -> Option<Input> {
        let e = error?;
        self.files.remove(&file);
        Some(Input::Transcript {
            file,
            event: TranscriptEvent::Failed(TranscriptError::Io(e.to_string())),
        })
    }

    /// Hands `cmd` to the store thread, starting it if needed; the input answering it at once
    /// when the thread cannot take it.
    fn send(&mut self, cmd: Cmd) -> Option<Input> {
        if self.worker.is_none() {
            match self.spawn() {
                Ok(w) => self.worker = Some(w),
                Err(e) => return failure(cmd, &format!("cannot start the store thread: {e}")),
            }
        }
        let (cmds, _) = self.worker.as_ref()?;
        cmds.send(cmd)
            .err()
            .and_then(|e| failure(e.0, "the store thread is gone"))
    }

    fn spawn(&self) -> std::io::Result<(mpsc::Sender<Cmd>, mpsc::Receiver<()>)> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut worker = Worker {
            dir: self.dir.clone(),
            tx: self.tx.clone(),
            syncs: 0,
        };
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || {
                worker.serve(&cmd_rx);
                let _ = done_tx.send(());
            })?;
        Ok((cmd_tx, done_rx))
    }

    /// At exit: every file is closed, and the thread runs the syncs queued before (the last
    /// answers are written after them); waits for it until `timeout` passes.
    pub fn finish(mut self, timeout: Duration) {
        self.files.clear();
        let Some((cmds, done)) = self.worker.take() else {
            return;
        };
        drop(cmds);
        let _ = done.recv_timeout(timeout);
    }
}

/// The input that answers a command the thread could not take, if it expects one.
fn failure(cmd: Cmd, why: &str) -> Option<Input> {
    match cmd {
        Cmd::Sync { file, .. } => Some(Input::Transcript {
            file,
            event: TranscriptEvent::Failed(TranscriptError::Io(why.to_owned())),
        }),
        Cmd::List(request) => Some(Input::TranscriptList {
            request,
            entries: Err(why.to_owned()),
        }),
        Cmd::StopRead(_) => None,
    }
}

/// Groups queued commands (in the order they came): every run of syncs between two other
/// commands becomes one sync per file (files in the order of their first sync), carrying the
/// highest mark and every directory asked for. A sync covers what was appended before it
/// was asked for, so answering an earlier mark with a later sync is sound. Other commands
/// stay where they were.
fn group(cmds: impl IntoIterator<Item = Cmd>) -> Vec<Cmd> {
    let mut steps: Vec<Cmd> = Vec::new();
    let mut run: Vec<Cmd> = Vec::new();
    for cmd in cmds {
        match cmd {
            Cmd::Sync {
                file,
                f,
                dirs,
                mark,
            } => match run.iter_mut().find_map(|c| match c {
                Cmd::Sync {
                    file: g,
                    mark: m,
                    dirs: d,
                    ..
                } if *g == file => Some((m, d)),
                _ => None,
            }) {
                Some((m, d)) => {
                    *m = (*m).max(mark);
                    d.extend(dirs);
                }
                None => run.push(Cmd::Sync {
                    file,
                    f,
                    dirs,
                    mark,
                }),
            },
            other => {
                steps.append(&mut run);
                steps.push(other);
            }
        }
    }
    steps.append(&mut run);
    steps
}

/// Checks that `dir` can hold session transcripts (SPEC S8): the directory, when it exists,
/// belongs to the agent's effective user and is writable by neither its group nor others; and
/// each existing parent (after resolving symbolic links) belongs to that user or to root and is
/// writable by neither group nor others unless its sticky bit is set (then no one else can
/// rename or remove an entry they do not own). A missing directory is fine when its existing
/// parents are: the agent creates it 0700 and checks it again before using it.
///
/// # Errors
/// One sentence naming the directory at fault and what is wrong with it (owner, or mode in
/// octal), without the consequence (the caller words it).
pub fn check_state_dir(dir: &Path) -> Result<(), String> {
    let me = crate::sys::euid();
    let shown = dir.display();
    let io = |p: &Path, e: std::io::Error| format!("cannot check {}: {e}", p.display());
    let (resolved, exists) = match std::fs::canonicalize(dir) {
        Ok(p) => (p, true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // The nearest parent that exists is where the directory will be made.
            let Some(parent) = dir.ancestors().skip(1).find(|p| p.exists()) else {
                return Ok(());
            };
            (
                std::fs::canonicalize(parent).map_err(|e| io(parent, e))?,
                false,
            )
        }
        Err(e) => return Err(io(dir, e)),
    };
    let mut parents = resolved.ancestors();
    if exists {
        let meta = std::fs::metadata(&resolved).map_err(|e| io(&resolved, e))?;
        let mode = meta.mode() & 0o7777;
        if !meta.is_dir() {
            return Err(format!("the state directory {shown} is not a directory"));
        }
        if meta.uid() != me {
            return Err(format!(
                "the state directory {shown} belongs to uid {}, not to this user (uid {me})",
                meta.uid()
            ));
        }
        if mode & 0o002 != 0 {
            return Err(format!(
                "the state directory {shown} is writable by others (mode {mode:04o})"
            ));
        }
        if mode & 0o020 != 0 {
            return Err(format!(
                "the state directory {shown} is writable by its group (mode {mode:04o})"
            ));
        }
        parents.next();
    }
    for parent in parents {
        let meta = std::fs::metadata(parent).map_err(|e| io(parent, e))?;
        let mode = meta.mode() & 0o7777;
        if meta.uid() != me && meta.uid() != 0 {
            return Err(format!(
                "{}, a parent of the state directory {shown}, belongs to uid {} (neither this user nor root)",
                parent.display(),
                meta.uid()
            ));
        }
        if mode & 0o022 != 0 && mode & 0o1000 == 0 {
            return Err(format!(
                "{}, a parent of the state directory {shown}, is writable by group or others without the sticky bit (mode {mode:04o})",
                parent.display()
            ));
        }
    }
    Ok(())
}

/// Checks that an opened or listed transcript (`meta` of `path`) is the user's own and writable
/// by no one else (SPEC S8): the agent creates them 0600, so anything else was put there.
fn check_transcript(path: &Path, meta: &std::fs::Metadata) -> Result<(), String> {
    let me = crate::sys::euid();
    let mode = meta.mode() & 0o7777;
    if meta.uid() != me {
        return Err(format!(
            "{} belongs to uid {}, not to this user (uid {me}); not used",
            path.display(),
            meta.uid()
        ));
    }
    if mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others (mode {mode:04o}); not used",
            path.display()
        ));
    }
    Ok(())
}

/// The path of `name` in the state directory `dir`, if `name` is a plain file name.
fn path_in(dir: Option<&Path>, name: &str) -> Result<PathBuf, TranscriptError> {
    let Some(dir) = dir else {
        return Err(TranscriptError::Io("sessions are not saved (off)".into()));
    };
    if name.is_empty() || name.contains('/') || name.starts_with('.') || name.contains('\0') {
        return Err(TranscriptError::Io(format!(
            "{name:?} is not a file name in the state directory"
        )));
    }
    Ok(dir.join(name))
}

/// Opens (or creates) transcript `name` in `dir` and locks it; with the directories whose
/// entries this open created (the file's directory for a new file, and the parent of every
/// directory made on the way), to be synced with the file's first sync.
fn open(
    dir: Option<&Path>,
    name: &str,
    mode: OpenMode,
) -> Result<(File, Vec<PathBuf>), TranscriptError> {
    let path = path_in(dir, name)?;
    let io = |e: std::io::Error| TranscriptError::Io(e.to_string());
    let refused = |why: String| TranscriptError::Io(format!("{why}; sessions are not kept there"));
    if let Some(dir) = dir {
        check_state_dir(dir).map_err(refused)?;
    }
    let mut options = OpenOptions::new();
    options
        .read(true)
        .append(true)
        .custom_flags(libc::O_NOFOLLOW);
    let mut dirs = Vec::new();
    let file = match mode {
        OpenMode::Create => {
            if let Some(parent) = path.parent() {
                // The directories missing now: each one made is an entry in its parent.
                let missing: Vec<PathBuf> = parent
                    .ancestors()
                    .take_while(|d| !d.as_os_str().is_empty() && !d.exists())
                    .map(Path::to_path_buf)
                    .collect();
                DirBuilder::new()
                    .recursive(true)
                    .mode(0o700)
                    .create(parent)
                    .map_err(io)?;
                dirs.push(parent.to_path_buf());
                dirs.extend(
                    missing
                        .iter()
                        .filter_map(|d| d.parent().map(Path::to_path_buf)),
                );
                dirs.dedup();
                // Made by this open, or there before it: checked again now that it exists.
                check_state_dir(parent).map_err(refused)?;
            }
            options.create_new(true).mode(0o600).open(&path)
        }
        OpenMode::Existing => options.open(&path),
    };
    let file = file.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => TranscriptError::NotFound,
        _ if e.raw_os_error() == Some(libc::ELOOP) => TranscriptError::Io(format!(
            "{} is a symbolic link; not followed",
            path.display()
        )),
        _ => io(e),
    })?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(TranscriptError::Io(format!(
            "{} is not a regular file",
            path.display()
        )));
    }
    check_transcript(&path, &meta).map_err(TranscriptError::Io)?;
    crate::sys::lock_exclusive(&file).map_err(|e| {
        if e.kind() == std::io::ErrorKind::WouldBlock {
            TranscriptError::Locked
        } else {
            io(e)
        }
    })?;
    Ok((file, dirs))
}

/// The store thread's state.
struct Worker {
    dir: Option<PathBuf>,
    tx: InputSender,
    /// `fdatasync(2)` calls made.
    syncs: u64,
}

impl Worker {
    /// Serves commands until the channel closes (at exit, after the queued ones): every wake-up
    /// takes the command that woke it and all those queued behind it, and runs them grouped
    /// ([`group`]).
    fn serve(&mut self, cmds: &mpsc::Receiver<Cmd>) {
        while let Ok(cmd) = cmds.recv() {
            for cmd in group(std::iter::once(cmd).chain(cmds.try_iter())) {
                self.run(cmd);
            }
        }
    }

    fn send(&self, input: Input) {
        // The loop may be gone at exit: the sync itself is what matters then.
        let _ = self.tx.send_blocking(input);
    }

    fn run(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Sync {
                file,
                f,
                dirs,
                mark,
            } => {
                let synced = dirs
                    .iter()
                    .try_for_each(|d| File::open(d).and_then(|d| d.sync_all()))
                    .and_then(|()| {
                        self.syncs += 1;
                        f.sync_data()
                    });
                // The loop's copy of the file may be closed already: this one was the last.
                drop(f);
                let event = match synced {
                    Ok(()) => TranscriptEvent::Synced(mark),
                    Err(e) => TranscriptEvent::Failed(TranscriptError::Io(e.to_string())),
                };
                self.send(Input::Transcript { file, event });
            }
            Cmd::StopRead(reading) => {
                let _ = reading.thread.join();
            }
            Cmd::List(request) => {
                let entries = self.list();
                self.send(Input::TranscriptList { request, entries });
            }
        }
    }

    /// Every `sess_*.jsonl` regular file of the state directory with its modification time
    /// and first line; none when the directory does not exist yet.
    fn list(&self) -> Result<Vec<TranscriptEntry>, String> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
        check_state_dir(dir).map_err(|why| format!("{why}; sessions are not kept there"))?;
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e.to_string()),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.starts_with("sess_") || !name.ends_with(".jsonl") {
                continue;
            }
            if !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            if let Some(e) = entry_of(&entry.path(), name) {
                out.push(e);
            }
        }
        Ok(out)
    }
}

/// A read of one transcript, on a thread of its own.
struct Reader {
    file: TranscriptId,
    f: File,
    tx: InputSender,
    backlog: Arc<Backlog>,
    stop: Arc<AtomicBool>,
}

impl Reader {
    /// Streams the file from its first byte as `Bytes` events, then `End` (or `Failed`),
    /// waiting while the client has more than [`MAX_STDOUT_BACKLOG`] bytes of stdout to read.
    fn run(self) {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut at = 0u64;
        let event = loop {
            while self.backlog.bytes() > MAX_STDOUT_BACKLOG {
                if self.stop.load(Ordering::Relaxed) || self.tx.is_closed() {
                    return;
                }
                self.backlog.wait_below_limit(Duration::from_millis(50));
            }
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            match self.f.read_at(&mut buf, at) {
                Ok(0) => break TranscriptEvent::End,
                Ok(n) => {
                    at += n as u64;
                    let input = Input::Transcript {
                        file: self.file,
                        event: TranscriptEvent::Bytes(buf[..n].to_vec()),
                    };
                    if self.tx.send_blocking(input).is_err() {
                        return;
                    }
                }
                Err(e) => break TranscriptEvent::Failed(TranscriptError::Io(e.to_string())),
            }
        };
        let _ = self.tx.send_blocking(Input::Transcript {
            file: self.file,
            event,
        });
    }
}

/// A listed file: its modification time and first line (at most [`TRANSCRIPT_HEAD_BYTES`]).
fn entry_of(path: &Path, name: String) -> Option<TranscriptEntry> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .ok()?;
    let meta = file.metadata().ok()?;
    // A file the agent would refuse to load is not listed either.
    check_transcript(path, &meta).ok()?;
    let modified_ms = meta
        .modified()
        .ok()?
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    let mut reader = file;
    while head.len() < TRANSCRIPT_HEAD_BYTES {
        let n = reader.read(&mut chunk).ok()?;
        if n == 0 {
            break;
        }
        let piece = &chunk[..n];
        if let Some(nl) = piece.iter().position(|&b| b == b'\n') {
            head.extend_from_slice(&piece[..nl]);
            break;
        }
        head.extend_from_slice(piece);
    }
    head.truncate(TRANSCRIPT_HEAD_BYTES);
    Some(TranscriptEntry {
        name,
        modified_ms,
        head,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fresh directory under the system's temporary directory.
    fn scratch(tag: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("buzz-store-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn store(dir: &Path) -> (Store, async_channel::Receiver<Input>) {
        let (tx, rx) = async_channel::unbounded();
        let st = Store::new(
            &StateDir::Dir(dir.to_string_lossy().into_owned()),
            tx,
            Arc::new(Backlog::default()),
        );
        (st, rx)
    }

    /// The inputs sent so far, after a moment for the store and reader threads.
    fn events(rx: &async_channel::Receiver<Input>) -> Vec<Input> {
        std::thread::sleep(Duration::from_millis(50));
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    fn open_action(id: u64, mode: OpenMode) -> Action {
        Action::OpenTranscript {
            file: TranscriptId(id),
            name: format!("sess_{id}.jsonl"),
            mode,
        }
    }

    fn event(file: u64, event: TranscriptEvent) -> Option<Input> {
        Some(Input::Transcript {
            file: TranscriptId(file),
            event,
        })
    }

    fn append(file: u64, bytes: &str) -> Action {
        Action::AppendTranscript {
            file: TranscriptId(file),
            bytes: bytes.as_bytes().to_vec(),
        }
    }

    #[test]
    fn a9_a_new_transcript_is_0600_in_a_0700_directory_locked_and_appended_at_once() {
        let dir = scratch("create").join("nested/sessions");
        let (mut st, rx) = store(&dir);
        assert_eq!(
            st.start(open_action(1, OpenMode::Create)),
            event(1, TranscriptEvent::Opened),
            "an open is answered at once"
        );
        assert_eq!(st.start(append(1, "{\"v\":1}\n")), None);
        // Written before `start` returned: in the file, with no thread and no sync.
        assert_eq!(
            std::fs::read(dir.join("sess_1.jsonl")).expect("written"),
            b"{\"v\":1}\n"
        );
        assert!(st.worker.is_none(), "appends need no thread");
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("sess_1.jsonl")), 0o600);
        // A second opener (another agent) is refused while the first holds the lock.
        let (mut other, _orx) = store(&dir);
        assert_eq!(
            other.start(Action::OpenTranscript {
                file: TranscriptId(9),
                name: "sess_1.jsonl".into(),
                mode: OpenMode::Existing,
            }),
            event(9, TranscriptEvent::Failed(TranscriptError::Locked))
        );
        // Creating it again fails: O_EXCL.
        assert!(matches!(
            other.start(open_action(1, OpenMode::Create)),
            Some(Input::Transcript {
                event: TranscriptEvent::Failed(TranscriptError::Io(_)),
                ..
            })
        ));
        // Closed: the lock is released at once.
        assert_eq!(
            st.start(Action::CloseTranscript {
                file: TranscriptId(1)
            }),
            None
        );
        assert_eq!(
            other.start(Action::OpenTranscript {
                file: TranscriptId(11),
                name: "sess_1.jsonl".into(),
                mode: OpenMode::Existing,
            }),
            event(11, TranscriptEvent::Opened)
        );
        assert_eq!(
            other.start(Action::ReadTranscript {
                file: TranscriptId(11)
            }),
            None
        );
        let got = events(&_orx);
        assert!(
            matches!(&got[..], [
                Input::Transcript { event: TranscriptEvent::Bytes(b), .. },
                Input::Transcript { event: TranscriptEvent::End, .. },
            ] if b == b"{\"v\":1}\n"),
            "{got:?}"
        );
        assert!(events(&rx).is_empty());
        let _ = std::fs::remove_dir_all(dir.parent().and_then(Path::parent).unwrap_or(&dir));
    }

    #[test]
    fn a9_a_sync_is_answered_with_its_mark_and_a_new_file_syncs_the_directories_it_made() {
        let root = scratch("dirs");
        let dir = root.join("state/sessions");
        std::fs::create_dir_all(&root).expect("mkdir");
        // The directories a create made: their entries live in their parents.
        let (_, dirs) = open(Some(&dir), "sess_1.jsonl", OpenMode::Create).expect("created");
        assert_eq!(dirs, [dir.clone(), root.join("state"), root.clone()]);
        let (_, dirs) = open(Some(&dir), "sess_2.jsonl", OpenMode::Create).expect("created");
        assert_eq!(
            dirs,
            std::slice::from_ref(&dir),
            "only the file's own entry is new"
        );
        let (_, dirs) = open(Some(&dir), "sess_1.jsonl", OpenMode::Existing).expect("opened");
        assert!(
            dirs.is_empty(),
            "an existing file's entry is on the disk already"
        );

        let (mut st, rx) = store(&dir);
        st.start(open_action(3, OpenMode::Create));
        assert_eq!(st.files[&TranscriptId(3)].dirs, std::slice::from_ref(&dir));
        st.start(append(3, "a\n"));
        let sync = |mark| Action::SyncTranscript {
            file: TranscriptId(3),
            mark,
        };
        assert_eq!(st.start(sync(2)), None);
        assert!(
            st.files[&TranscriptId(3)].dirs.is_empty(),
            "the directory goes with the first sync only"
        );
        assert_eq!(
            events(&rx),
            [event(3, TranscriptEvent::Synced(2)).expect("an input")]
        );
        // A sync of a file that is not open is ignored.
        assert_eq!(
            st.start(Action::SyncTranscript {
                file: TranscriptId(8),
                mark: 1
            }),
            None
        );
        st.finish(Duration::from_secs(5));
        assert!(events(&rx).is_empty());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a9_nothing_outside_the_state_directory_is_opened() {
        let root = scratch("escape");
        let dir = root.join("sessions");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(root.join("secret.jsonl"), "secret\n").expect("write");
        std::os::unix::fs::symlink(root.join("secret.jsonl"), dir.join("sess_2.jsonl"))
            .expect("symlink");
        let (mut st, rx) = store(&dir);
        for (i, name) in ["../secret.jsonl", "sess_2.jsonl", ".hidden", "a/b"]
            .iter()
            .enumerate()
        {
            let got = st.start(Action::OpenTranscript {
                file: TranscriptId(i as u64),
                name: (*name).into(),
                mode: OpenMode::Existing,
            });
            assert!(
                matches!(
                    got,
                    Some(Input::Transcript {
                        event: TranscriptEvent::Failed(TranscriptError::Io(_)),
                        ..
                    })
                ),
                "{name}: {got:?}"
            );
        }
        // The listing skips the symbolic link too.
        st.start(Action::ListTranscripts { request: 1 });
        assert!(matches!(
            &events(&rx)[..],
            [Input::TranscriptList { request: 1, entries: Ok(e) }] if e.is_empty()
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a9_a_missing_directory_lists_nothing_and_loads_nothing() {
        let dir = scratch("missing");
        let (mut st, rx) = store(&dir);
        st.start(Action::ListTranscripts { request: 3 });
        assert_eq!(
            st.start(open_action(1, OpenMode::Existing)),
            event(1, TranscriptEvent::Failed(TranscriptError::NotFound))
        );
        let got = events(&rx);
        assert!(
            matches!(
                &got[..],
                [Input::TranscriptList { request: 3, entries: Ok(e) }] if e.is_empty()
            ),
            "{got:?}"
        );
        assert!(!dir.exists(), "a load or a listing creates nothing");
    }

    #[test]
    fn a9_a_read_waits_while_the_client_has_not_read_the_replay_and_stops_when_closed() {
        let dir = scratch("backlog");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("sess_5.jsonl"), "x\n".repeat(20_000)).expect("write");
        let (mut st, rx) = store(&dir);
        assert_eq!(
            st.start(open_action(5, OpenMode::Existing)),
            event(5, TranscriptEvent::Opened)
        );
        st.backlog.queued(MAX_STDOUT_BACKLOG + 1);
        st.start(Action::ReadTranscript {
            file: TranscriptId(5),
        });
        assert!(events(&rx).is_empty(), "nothing while stdout is backed up");
        st.backlog.written(MAX_STDOUT_BACKLOG + 1);
        let got = events(&rx);
        let bytes: usize = got
            .iter()
            .map(|e| match e {
                Input::Transcript {
                    event: TranscriptEvent::Bytes(b),
                    ..
                } => b.len(),
                _ => 0,
            })
            .sum();
        assert_eq!(bytes, 40_000, "then the whole file");
        assert!(matches!(
            got.last(),
            Some(Input::Transcript {
                event: TranscriptEvent::End,
                ..
            })
        ));
        // A read of a closed file stops, and lets go of the file: the lock is free once the
        // store thread has seen the reader end (the next command it runs).
        st.backlog.queued(MAX_STDOUT_BACKLOG + 1);
        st.start(Action::ReadTranscript {
            file: TranscriptId(5),
        });
        st.start(Action::CloseTranscript {
            file: TranscriptId(5),
        });
        st.start(Action::ListTranscripts { request: 1 });
        let listed = rx.recv_blocking();
        assert!(matches!(
            listed,
            Ok(Input::TranscriptList { request: 1, .. })
        ));
        let (mut other, _orx) = store(&dir);
        assert_eq!(
            other.start(open_action(5, OpenMode::Existing)),
            event(5, TranscriptEvent::Opened)
        );
        st.backlog.written(MAX_STDOUT_BACKLOG + 1);
        assert!(events(&rx).is_empty(), "nothing after the close");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a9_the_listing_gives_each_transcripts_first_line_and_time() {
        let dir = scratch("list");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("sess_1.jsonl"), "{\"head\":1}\n{\"next\":2}\n").expect("w");
        std::fs::write(dir.join("notes.txt"), "x").expect("w");
        std::fs::write(dir.join("sess_2.jsonl"), "x".repeat(20_000)).expect("w");
        let (mut st, rx) = store(&dir);
        st.start(Action::ListTranscripts { request: 7 });
        let got = events(&rx);
        let [
            Input::TranscriptList {
                entries: Ok(mut e), ..
            },
        ] = <[Input; 1]>::try_from(got).expect("one")
        else {
            panic!("a listing");
        };
        e.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(e.len(), 2);
        assert_eq!(e[0].head, b"{\"head\":1}");
        assert_eq!(e[1].head.len(), TRANSCRIPT_HEAD_BYTES, "capped");
        assert!(e[0].modified_ms > 1_600_000_000_000);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn sync_cmd(file: u64, f: &Arc<File>, mark: u64) -> Cmd {
        Cmd::Sync {
            file: TranscriptId(file),
            f: f.clone(),
            dirs: Vec::new(),
            mark,
        }
    }

    /// The commands of `cmds` grouped, in a short form: `S1@5` syncs file 1 answering mark 5.
    fn plan(cmds: Vec<Cmd>) -> Vec<String> {
        group(cmds)
            .into_iter()
            .map(|c| match c {
                Cmd::Sync { file, mark, .. } => format!("S{}@{mark}", file.0),
                Cmd::List(r) => format!("list{r}"),
                Cmd::StopRead(_) => "stop".into(),
            })
            .collect()
    }

    #[test]
    fn a9_queued_syncs_are_one_per_file_answering_the_highest_mark_never_past_another_command() {
        let dir = scratch("group");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let f = Arc::new(File::create(dir.join("f")).expect("create"));
        assert_eq!(
            plan(vec![
                sync_cmd(1, &f, 10),
                sync_cmd(2, &f, 3),
                sync_cmd(1, &f, 25),
                sync_cmd(2, &f, 4),
            ]),
            ["S1@25", "S2@4"]
        );
        assert_eq!(
            plan(vec![sync_cmd(1, &f, 10), Cmd::List(4), sync_cmd(1, &f, 12)]),
            ["S1@10", "list4", "S1@12"]
        );
        assert!(plan(Vec::new()).is_empty());

        // Served as the store thread serves them: 20 syncs queued for two files while it was
        // busy are two fdatasyncs, answered with each file's last mark.
        let (tx, rx) = async_channel::unbounded();
        let mut w = Worker {
            dir: Some(dir.clone()),
            tx,
            syncs: 0,
        };
        let (cmds, queue) = mpsc::channel();
        for i in 1..=10 {
            cmds.send(sync_cmd(1, &f, i)).expect("queued");
            cmds.send(sync_cmd(2, &f, 100 + i)).expect("queued");
        }
        drop(cmds);
        w.serve(&queue);
        assert_eq!(w.syncs, 2);
        assert_eq!(
            std::iter::from_fn(|| rx.try_recv().ok()).collect::<Vec<_>>(),
            [
                event(1, TranscriptEvent::Synced(10)).expect("an input"),
                event(2, TranscriptEvent::Synced(110)).expect("an input"),
            ]
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a9_a_failed_write_is_reported_once_and_the_file_takes_no_more() {
        let dir = scratch("writefail");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("sess_1.jsonl");
        std::fs::write(&path, "").expect("create");
        let (mut st, rx) = store(&dir);
        // A handle that cannot write: every write fails (EBADF), like a full disk.
        let read_only = File::open(&path).expect("open");
        st.files.insert(
            TranscriptId(1),
            Held {
                f: Arc::new(read_only),
                dirs: Vec::new(),
                reading: None,
            },
        );
        assert!(matches!(
            st.start(append(1, "{}\n")),
            Some(Input::Transcript {
                file: TranscriptId(1),
                event: TranscriptEvent::Failed(TranscriptError::Io(_)),
            })
        ));
        assert_eq!(
            st.start(append(1, "{}\n")),
            None,
            "nothing more for that file"
        );
        assert_eq!(
            st.start(Action::SyncTranscript {
                file: TranscriptId(1),
                mark: 3
            }),
            None
        );
        assert!(events(&rx).is_empty());
        assert_eq!(std::fs::read(&path).expect("read").len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn failed_with(got: Option<Input>) -> String {
        match got {
            Some(Input::Transcript {
                event: TranscriptEvent::Failed(TranscriptError::Io(why)),
                ..
            }) => why,
            other => panic!("not refused: {other:?}"),
        }
    }

    fn listed(st: &mut Store, rx: &async_channel::Receiver<Input>) -> Result<usize, String> {
        st.start(Action::ListTranscripts { request: 1 });
        match <[Input; 1]>::try_from(events(rx)) {
            Ok([Input::TranscriptList { entries, .. }]) => entries.map(|e| e.len()),
            other => panic!("one listing: {other:?}"),
        }
    }

    #[test]
    fn s8_a_state_directory_others_can_write_to_or_another_user_owns_is_never_used() {
        let root = scratch("s8-dir");
        let dir = root.join("sessions");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("sess_1.jsonl"), "{}\n").expect("write");
        let chmod = |p: &Path, m: u32| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).expect("chmod");
        };
        let (mut st, rx) = store(&dir);
        for (mode, why) in [
            (0o770, "is writable by its group (mode 0770)"),
            (0o703, "is writable by others (mode 0703)"),
            (0o777, "is writable by others (mode 0777)"),
        ] {
            chmod(&dir, mode);
            let refusal = st.check().expect_err("refused");
            assert!(refusal.contains(why), "{refusal}");
            assert!(refusal.contains(&dir.display().to_string()), "{refusal}");
            let open = failed_with(st.start(open_action(1, OpenMode::Existing)));
            assert!(
                open.contains(why) && open.contains("not kept there"),
                "{open}"
            );
            let create = failed_with(st.start(open_action(2, OpenMode::Create)));
            assert!(create.contains(why), "{create}");
            assert!(!dir.join("sess_2.jsonl").exists(), "nothing created");
            let list = listed(&mut st, &rx).expect_err("the listing is refused");
            assert!(list.contains(why), "{list}");
        }
        chmod(&dir, 0o700);
        assert_eq!(st.check(), Ok(()));
        assert_eq!(listed(&mut st, &rx), Ok(1));
        assert_eq!(
            st.start(open_action(1, OpenMode::Existing)),
            event(1, TranscriptEvent::Opened)
        );
        st.start(Action::CloseTranscript {
            file: TranscriptId(1),
        });
        // A parent others can write to lets them swap the directory: refused, unless its
        // sticky bit keeps them from renaming what is not theirs (as /tmp).
        chmod(&root, 0o777);
        let refusal = st.check().expect_err("refused");
        assert!(
            refusal.contains(&format!(
                "{}, a parent of the state directory",
                root.display()
            )) && refusal.contains("without the sticky bit (mode 0777)"),
            "{refusal}"
        );
        failed_with(st.start(open_action(1, OpenMode::Existing)));
        chmod(&root, 0o1777);
        assert_eq!(st.check(), Ok(()));
        chmod(&root, 0o700);
        // Another user's directory, or another user's file in ours (only root can make them).
        if crate::sys::euid() == 0 {
            std::os::unix::fs::chown(&dir, Some(65534), None).expect("chown");
            let refusal = failed_with(st.start(open_action(1, OpenMode::Existing)));
            assert!(
                refusal.contains("belongs to uid 65534, not to this user (uid 0)"),
                "{refusal}"
            );
            std::os::unix::fs::chown(&dir, Some(0), None).expect("chown");
            std::os::unix::fs::chown(dir.join("sess_1.jsonl"), Some(65534), None).expect("chown");
            let refusal = failed_with(st.start(open_action(1, OpenMode::Existing)));
            assert!(refusal.contains("belongs to uid 65534"), "{refusal}");
            assert_eq!(listed(&mut st, &rx), Ok(0), "nor listed");
            std::os::unix::fs::chown(dir.join("sess_1.jsonl"), Some(0), None).expect("chown");
        }
        // A transcript others can write to was not written by the agent alone.
        chmod(&dir.join("sess_1.jsonl"), 0o666);
        let refusal = failed_with(st.start(open_action(1, OpenMode::Existing)));
        assert!(
            refusal.contains("is writable by group or others (mode 0666)"),
            "{refusal}"
        );
        assert_eq!(listed(&mut st, &rx), Ok(0), "nor listed");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn s8_a_missing_directory_is_made_only_under_safe_parents() {
        let root = scratch("s8-missing");
        std::fs::create_dir_all(&root).expect("mkdir");
        let dir = root.join("a/b/sessions");
        let (mut st, _rx) = store(&dir);
        assert_eq!(st.check(), Ok(()), "missing, under safe parents");
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o757)).expect("chmod");
        assert!(st.check().is_err());
        let refusal = failed_with(st.start(open_action(1, OpenMode::Create)));
        assert!(
            refusal.contains("a parent of the state directory"),
            "{refusal}"
        );
        assert!(
            !root.join("a").exists(),
            "nothing made under an unsafe parent"
        );
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        assert_eq!(
            st.start(open_action(1, OpenMode::Create)),
            event(1, TranscriptEvent::Opened)
        );
        // A parent made by someone else, writable by all: nothing is made in it.
        let other = root.join("c");
        std::fs::create_dir(&other).expect("mkdir");
        std::fs::set_permissions(&other, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let (mut st2, _rx2) = store(&other.join("sessions"));
        failed_with(st2.start(open_action(3, OpenMode::Create)));
        assert!(!other.join("sessions").exists());
        let _ = std::fs::remove_dir_all(&root);
    }
}
