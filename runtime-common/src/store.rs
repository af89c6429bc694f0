//! The session transcripts on disk (SPEC A9): the file half of the core's session store. The
//! core decides what to write and when; this opens, locks, appends, truncates, reads and lists
//! files in the state directory, on one thread of its own (file IO blocks; the loop must not),
//! started with the first transcript action.
//!
//! - Files are opened directly inside the state directory only: a name with a `/` or a leading
//!   `.` is refused, symbolic links are not followed (`O_NOFOLLOW`), and the directory listing
//!   takes regular files only. Nothing is read or written elsewhere.
//! - A new transcript is created with `O_EXCL`, mode 0600; the state directory is created
//!   (mode 0700) with the first one.
//! - Every open transcript holds an exclusive `flock(2)` lock: a second agent opening the same
//!   session is refused ([`TranscriptError::Locked`]), and the lock dies with the process, so a
//!   `kill -9`'d agent never leaves a stale one.
//! - Appends are written whole lines at a time, then `fdatasync(2)`'d: once the core's round is
//!   final, a crash of the agent (or of the machine) does not lose it. Appends queue while the
//!   thread writes and syncs; it takes them all and writes each file's queued appends with one
//!   `writev(2)` and one `fdatasync(2)` (a group commit, [`group`]), in the order they came
//!   and never past a truncate, close or other command queued between them.
//! - A read streams the file in [`READ_CHUNK`] pieces through the loop's bounded input channel
//!   (the thread waits while it is full), on a thread of its own, and waits too while more
//!   than [`MAX_STDOUT_BACKLOG`] bytes wait for stdout (the replay a client has not read yet):
//!   a long transcript never sits in memory whole, whether in the input queue or in the
//!   stdout queue, and a client that stops reading holds up only its own load.
//!
//! At exit, [`Store::finish`] lets the thread write what is queued (bounded by a deadline).

use crate::runtime::InputSender;
use buzz_agent_core::config::StateDir;
use buzz_agent_core::{
    Action, Input, OpenMode, TRANSCRIPT_HEAD_BYTES, TranscriptEntry, TranscriptError,
    TranscriptEvent, TranscriptId,
};
use std::collections::BTreeMap;
use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{IoSlice, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileExt, OpenOptionsExt};
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

/// The transcript actions of the core, carried to the store thread.
#[derive(Debug)]
enum Cmd {
    Open {
        file: TranscriptId,
        name: String,
        mode: OpenMode,
    },
    Read(TranscriptId),
    Append(TranscriptId, Vec<u8>),
    Truncate(TranscriptId, u64),
    Close(TranscriptId),
    List(u64),
}

/// The driver's handle on the store thread.
pub struct Store {
    dir: Option<PathBuf>,
    tx: InputSender,
    backlog: Arc<Backlog>,
    worker: Option<(mpsc::Sender<Cmd>, mpsc::Receiver<()>)>,
}

impl Store {
    /// The store of `dir`; its thread starts with the first action. Its inputs go to `tx`;
    /// `backlog` counts the bytes waiting for stdout.
    #[must_use]
    pub fn new(dir: &StateDir, tx: InputSender, backlog: Arc<Backlog>) -> Store {
        Store {
            dir: match dir {
                StateDir::Off => None,
                StateDir::Dir(d) => Some(PathBuf::from(d)),
            },
            tx,
            backlog,
            worker: None,
        }
    }

    /// Starts one transcript action (others are not the store's and are ignored). When the
    /// thread cannot start, opens and lists fail at once (the returned input); other actions
    /// are dropped.
    pub fn start(&mut self, action: Action) -> Option<Input> {
        let cmd = match action {
            Action::OpenTranscript { file, name, mode } => Cmd::Open { file, name, mode },
            Action::ReadTranscript { file } => Cmd::Read(file),
            Action::AppendTranscript { file, bytes } => Cmd::Append(file, bytes),
            Action::TruncateTranscript { file, len } => Cmd::Truncate(file, len),
            Action::CloseTranscript { file } => Cmd::Close(file),
            Action::ListTranscripts { request } => Cmd::List(request),
            Action::WriteAcp(_)
            | Action::WriteMcp { .. }
            | Action::SpawnMcp { .. }
            | Action::CloseMcpStdin { .. }
            | Action::SignalProcessGroup { .. }
            | Action::CallLlm { .. }
            | Action::CancelLlm { .. }
            | Action::ReadProject { .. }
            | Action::Log(_)
            | Action::Exit { .. } => return None,
        };
        if self.worker.is_none() {
            match self.spawn() {
                Ok(w) => self.worker = Some(w),
                Err(e) => return failure(&cmd, &format!("cannot start the store thread: {e}")),
            }
        }
        let (cmds, _) = self.worker.as_ref()?;
        cmds.send(cmd)
            .err()
            .and_then(|e| failure(&e.0, "the store thread is gone"))
    }

    fn spawn(&self) -> std::io::Result<(mpsc::Sender<Cmd>, mpsc::Receiver<()>)> {
        let (cmd_tx, cmd_rx) = mpsc::channel::<Cmd>();
        let (done_tx, done_rx) = mpsc::channel::<()>();
        let mut worker = Worker {
            dir: self.dir.clone(),
            tx: self.tx.clone(),
            backlog: self.backlog.clone(),
            files: BTreeMap::new(),
            syncs: 0,
        };
        std::thread::Builder::new()
            .name("store".into())
            .spawn(move || {
                worker.serve(&cmd_rx);
                drop(worker.files);
                let _ = done_tx.send(());
            })?;
        Ok((cmd_tx, done_rx))
    }

    /// At exit: the thread writes what is queued and closes every file; waits for it until
    /// `timeout` passes.
    pub fn finish(self, timeout: Duration) {
        let Some((cmds, done)) = self.worker else {
            return;
        };
        drop(cmds);
        let _ = done.recv_timeout(timeout);
    }
}

/// The input that answers a command the thread could not take, if it expects one.
fn failure(cmd: &Cmd, why: &str) -> Option<Input> {
    match cmd {
        Cmd::Open { file, .. } | Cmd::Read(file) => Some(Input::Transcript {
            file: *file,
            event: TranscriptEvent::Failed(TranscriptError::Io(why.to_owned())),
        }),
        Cmd::List(request) => Some(Input::TranscriptList {
            request: *request,
            entries: Err(why.to_owned()),
        }),
        Cmd::Append(..) | Cmd::Truncate(..) | Cmd::Close(_) => None,
    }
}

/// What the store thread does next, after [`group`].
#[derive(Debug)]
enum Step {
    /// Append these pieces to the file, in order: one `writev(2)`, one `fdatasync(2)`.
    Write(TranscriptId, Vec<Vec<u8>>),
    /// Any command but an append, as it came.
    Other(Cmd),
}

/// Groups queued commands (in the order they came) into steps: every run of appends between
/// two other commands becomes one [`Step::Write`] per file (files in the order of their first
/// append; a file's pieces in the order they came), so a file is synced once per run however
/// many appends queued for it. Any other command (open, read, truncate, close, list) stays
/// where it was, after the writes of the appends queued before it: nothing is reordered
/// around it, and appends are reordered only across files, which share nothing.
fn group(cmds: impl IntoIterator<Item = Cmd>) -> Vec<Step> {
    let mut steps = Vec::new();
    let mut run: Vec<(TranscriptId, Vec<Vec<u8>>)> = Vec::new();
    for cmd in cmds {
        match cmd {
            Cmd::Append(file, bytes) => match run.iter_mut().find(|(f, _)| *f == file) {
                Some((_, pieces)) => pieces.push(bytes),
                None => run.push((file, vec![bytes])),
            },
            other => {
                steps.extend(run.drain(..).map(|(f, p)| Step::Write(f, p)));
                steps.push(Step::Other(other));
            }
        }
    }
    steps.extend(run.into_iter().map(|(f, p)| Step::Write(f, p)));
    steps
}

/// Writes all of `pieces` to `f` with as few `writev(2)` calls as it takes (one, unless the
/// kernel writes less than asked).
fn write_pieces(f: &mut File, pieces: &[Vec<u8>]) -> std::io::Result<()> {
    if let [one] = pieces {
        return f.write_all(one);
    }
    let mut slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
    let mut left = &mut slices[..];
    IoSlice::advance_slices(&mut left, 0); // skips empty pieces
    while !left.is_empty() {
        match f.write_vectored(left) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut left, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// An open transcript: the file (holding its lock) and the read in progress, or the failure
/// that ended its writes.
enum Held {
    Open(File, Option<Reading>),
    Failed,
}

/// A read in progress: its stop flag and its thread (whose copy of the file holds the lock
/// too).
struct Reading {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// The store thread's state.
struct Worker {
    dir: Option<PathBuf>,
    tx: InputSender,
    backlog: Arc<Backlog>,
    files: BTreeMap<TranscriptId, Held>,
    /// `fdatasync(2)` calls made.
    syncs: u64,
}

impl Worker {
    /// Serves commands until the channel closes (at exit, after the queued ones): every wake-up
    /// takes the command that woke it and all those queued behind it, and runs them grouped
    /// ([`group`]).
    fn serve(&mut self, cmds: &mpsc::Receiver<Cmd>) {
        while let Ok(cmd) = cmds.recv() {
            for step in group(std::iter::once(cmd).chain(cmds.try_iter())) {
                match step {
                    Step::Write(file, pieces) => self.append(file, &pieces),
                    Step::Other(cmd) => self.run(cmd),
                }
            }
        }
    }

    /// Appends `pieces` to `file` and syncs them; on a failure the file takes no more writes,
    /// and the core hears of it once. Ignored for a file that is not open (or failed).
    fn append(&mut self, file: TranscriptId, pieces: &[Vec<u8>]) {
        if let Some(Held::Open(f, _)) = self.files.get_mut(&file) {
            let written = write_pieces(f, pieces).and_then(|()| {
                self.syncs += 1;
                f.sync_data()
            });
            if let Err(e) = written {
                self.files.insert(file, Held::Failed);
                self.event(
                    file,
                    TranscriptEvent::Failed(TranscriptError::Io(e.to_string())),
                );
            }
        }
    }

    fn send(&self, input: Input) {
        // The loop may be gone at exit: the write itself is what matters then.
        let _ = self.tx.send_blocking(input);
    }

    fn event(&self, file: TranscriptId, event: TranscriptEvent) {
        self.send(Input::Transcript { file, event });
    }

    fn run(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Open { file, name, mode } => {
                let event = match self.open(&name, mode) {
                    Ok(f) => {
                        self.files.insert(file, Held::Open(f, None));
                        TranscriptEvent::Opened
                    }
                    Err(e) => TranscriptEvent::Failed(e),
                };
                self.event(file, event);
            }
            Cmd::Read(file) => {
                let started = match self.files.get_mut(&file) {
                    Some(Held::Open(f, reading)) => {
                        f.try_clone().map_err(|e| e.to_string()).and_then(|clone| {
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
                            *reading = Some(Reading { stop, thread });
                            Ok(())
                        })
                    }
                    Some(Held::Failed) | None => Err("the file is not open".to_owned()),
                };
                if let Err(e) = started {
                    self.event(file, TranscriptEvent::Failed(TranscriptError::Io(e)));
                }
            }
            Cmd::Append(file, bytes) => self.append(file, &[bytes]),
            Cmd::Truncate(file, len) => {
                if let Some(Held::Open(f, _)) = self.files.get(&file)
                    && let Err(e) = f.set_len(len).and_then(|()| {
                        self.syncs += 1;
                        f.sync_data()
                    })
                {
                    self.files.insert(file, Held::Failed);
                    self.event(
                        file,
                        TranscriptEvent::Failed(TranscriptError::Io(e.to_string())),
                    );
                }
            }
            Cmd::Close(file) => {
                // A read still going stops at its next chunk; its copy of the file holds the
                // lock until its thread ends, so the close waits for that (at most a chunk's
                // read or send, or one backlog wait): once closed, the session is free for
                // the next open, in this agent or another.
                if let Some(Held::Open(f, Some(reading))) = self.files.remove(&file) {
                    reading.stop.store(true, Ordering::Relaxed);
                    drop(f);
                    let _ = reading.thread.join();
                }
            }
            Cmd::List(request) => {
                let entries = self.list();
                self.send(Input::TranscriptList { request, entries });
            }
        }
    }

    /// The path of `name` in the state directory, if `name` is a plain file name.
    fn path(&self, name: &str) -> Result<PathBuf, TranscriptError> {
        let Some(dir) = &self.dir else {
            return Err(TranscriptError::Io("sessions are not saved (off)".into()));
        };
        if name.is_empty() || name.contains('/') || name.starts_with('.') || name.contains('\0') {
            return Err(TranscriptError::Io(format!(
                "{name:?} is not a file name in the state directory"
            )));
        }
        Ok(dir.join(name))
    }

    fn open(&self, name: &str, mode: OpenMode) -> Result<File, TranscriptError> {
        let path = self.path(name)?;
        let io = |e: std::io::Error| TranscriptError::Io(e.to_string());
        let mut options = OpenOptions::new();
        options
            .read(true)
            .append(true)
            .custom_flags(libc::O_NOFOLLOW);
        let file = match mode {
            OpenMode::Create => {
                if let Some(dir) = path.parent() {
                    DirBuilder::new()
                        .recursive(true)
                        .mode(0o700)
                        .create(dir)
                        .map_err(io)?;
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
        crate::sys::lock_exclusive(&file).map_err(|e| {
            if e.kind() == std::io::ErrorKind::WouldBlock {
                TranscriptError::Locked
            } else {
                io(e)
            }
        })?;
        Ok(file)
    }

    /// Every `sess_*.jsonl` regular file of the state directory with its modification time
    /// and first line; none when the directory does not exist yet.
    fn list(&self) -> Result<Vec<TranscriptEntry>, String> {
        let Some(dir) = &self.dir else {
            return Ok(Vec::new());
        };
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

    fn worker(dir: &Path) -> (Worker, async_channel::Receiver<Input>) {
        let (tx, rx) = async_channel::unbounded();
        (
            Worker {
                dir: Some(dir.to_path_buf()),
                tx,
                backlog: Arc::new(Backlog::default()),
                files: BTreeMap::new(),
                syncs: 0,
            },
            rx,
        )
    }

    /// The inputs sent so far, after a moment for reader threads to finish.
    fn events(rx: &async_channel::Receiver<Input>) -> Vec<Input> {
        std::thread::sleep(Duration::from_millis(50));
        std::iter::from_fn(|| rx.try_recv().ok()).collect()
    }

    #[test]
    fn a9_a_new_transcript_is_0600_in_a_0700_directory_locked_and_appended() {
        let dir = scratch("create").join("nested/sessions");
        let (mut w, rx) = worker(&dir);
        w.run(Cmd::Open {
            file: TranscriptId(1),
            name: "sess_1.jsonl".into(),
            mode: OpenMode::Create,
        });
        w.run(Cmd::Append(TranscriptId(1), b"{\"v\":1}\n".to_vec()));
        assert_eq!(
            events(&rx),
            vec![Input::Transcript {
                file: TranscriptId(1),
                event: TranscriptEvent::Opened
            }]
        );
        let mode = |p: &Path| std::fs::metadata(p).expect("exists").permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("sess_1.jsonl")), 0o600);
        assert_eq!(
            std::fs::read(dir.join("sess_1.jsonl")).expect("written"),
            b"{\"v\":1}\n"
        );
        // A second opener (another agent) is refused while the first holds the lock.
        let (mut other, orx) = worker(&dir);
        other.run(Cmd::Open {
            file: TranscriptId(9),
            name: "sess_1.jsonl".into(),
            mode: OpenMode::Existing,
        });
        assert!(matches!(
            &events(&orx)[..],
            [Input::Transcript {
                event: TranscriptEvent::Failed(TranscriptError::Locked),
                ..
            }]
        ));
        // Creating it again fails: O_EXCL.
        other.run(Cmd::Open {
            file: TranscriptId(10),
            name: "sess_1.jsonl".into(),
            mode: OpenMode::Create,
        });
        assert!(matches!(
            &events(&orx)[..],
            [Input::Transcript {
                event: TranscriptEvent::Failed(TranscriptError::Io(_)),
                ..
            }]
        ));
        // Closed: the lock is released.
        w.run(Cmd::Close(TranscriptId(1)));
        other.run(Cmd::Open {
            file: TranscriptId(11),
            name: "sess_1.jsonl".into(),
            mode: OpenMode::Existing,
        });
        other.run(Cmd::Read(TranscriptId(11)));
        let got = events(&orx);
        assert!(
            matches!(&got[..], [
                Input::Transcript { event: TranscriptEvent::Opened, .. },
                Input::Transcript { event: TranscriptEvent::Bytes(b), .. },
                Input::Transcript { event: TranscriptEvent::End, .. },
            ] if b == b"{\"v\":1}\n"),
            "{got:?}"
        );
        let _ = std::fs::remove_dir_all(dir.parent().and_then(Path::parent).unwrap_or(&dir));
    }

    #[test]
    fn a9_nothing_outside_the_state_directory_is_opened() {
        let root = scratch("escape");
        let dir = root.join("sessions");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(root.join("secret.jsonl"), "secret\n").expect("write");
        std::os::unix::fs::symlink(root.join("secret.jsonl"), dir.join("sess_2.jsonl"))
            .expect("symlink");
        let (mut w, rx) = worker(&dir);
        for (i, name) in ["../secret.jsonl", "sess_2.jsonl", ".hidden", "a/b"]
            .iter()
            .enumerate()
        {
            w.run(Cmd::Open {
                file: TranscriptId(i as u64),
                name: (*name).into(),
                mode: OpenMode::Existing,
            });
        }
        let got = events(&rx);
        assert_eq!(got.len(), 4);
        for e in &got {
            assert!(
                matches!(
                    e,
                    Input::Transcript {
                        event: TranscriptEvent::Failed(TranscriptError::Io(_)),
                        ..
                    }
                ),
                "{e:?}"
            );
        }
        // The listing skips the symbolic link too.
        w.run(Cmd::List(1));
        assert!(matches!(
            &events(&rx)[..],
            [Input::TranscriptList { request: 1, entries: Ok(e) }] if e.is_empty()
        ));
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn a9_a_missing_directory_lists_nothing_and_loads_nothing() {
        let dir = scratch("missing");
        let (mut w, rx) = worker(&dir);
        w.run(Cmd::List(3));
        w.run(Cmd::Open {
            file: TranscriptId(1),
            name: "sess_1.jsonl".into(),
            mode: OpenMode::Existing,
        });
        let got = events(&rx);
        assert!(
            matches!(
                &got[..],
                [
                    Input::TranscriptList { request: 3, entries: Ok(e) },
                    Input::Transcript { event: TranscriptEvent::Failed(TranscriptError::NotFound), .. },
                ] if e.is_empty()
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
        let (mut w, rx) = worker(&dir);
        w.run(Cmd::Open {
            file: TranscriptId(5),
            name: "sess_5.jsonl".into(),
            mode: OpenMode::Existing,
        });
        w.backlog.queued(MAX_STDOUT_BACKLOG + 1);
        w.run(Cmd::Read(TranscriptId(5)));
        assert_eq!(
            events(&rx).len(),
            1,
            "opened, then nothing while stdout is backed up"
        );
        w.backlog.written(MAX_STDOUT_BACKLOG + 1);
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
        // A read of a closed file stops.
        w.backlog.queued(MAX_STDOUT_BACKLOG + 1);
        w.run(Cmd::Read(TranscriptId(5)));
        w.run(Cmd::Close(TranscriptId(5)));
        // Closed means unlocked, at once: the parked reader's copy of the file is gone too.
        let (mut other, orx) = worker(&dir);
        other.run(Cmd::Open {
            file: TranscriptId(6),
            name: "sess_5.jsonl".into(),
            mode: OpenMode::Existing,
        });
        let Ok(Input::Transcript { event, .. }) = orx.try_recv() else {
            panic!("the open is answered at once");
        };
        assert_eq!(event, TranscriptEvent::Opened);
        w.backlog.written(MAX_STDOUT_BACKLOG + 1);
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
        let (mut w, rx) = worker(&dir);
        w.run(Cmd::List(7));
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

    fn open_cmd(id: u64, mode: OpenMode) -> Cmd {
        Cmd::Open {
            file: TranscriptId(id),
            name: format!("sess_{id}.jsonl"),
            mode,
        }
    }

    /// The steps of `cmds` in a short form: `W1:a+b` writes pieces `a` and `b` to file 1,
    /// anything else is the command's kind and file.
    fn plan(cmds: Vec<Cmd>) -> Vec<String> {
        group(cmds)
            .into_iter()
            .map(|s| match s {
                Step::Write(f, pieces) => format!(
                    "W{}:{}",
                    f.0,
                    pieces
                        .iter()
                        .map(|p| String::from_utf8_lossy(p).into_owned())
                        .collect::<Vec<_>>()
                        .join("+")
                ),
                Step::Other(Cmd::Open { file, .. }) => format!("open{}", file.0),
                Step::Other(Cmd::Truncate(f, len)) => format!("cut{}@{len}", f.0),
                Step::Other(Cmd::Close(f)) => format!("close{}", f.0),
                Step::Other(Cmd::Read(f)) => format!("read{}", f.0),
                Step::Other(Cmd::List(r)) => format!("list{r}"),
                Step::Other(Cmd::Append(..)) => unreachable!("appends are grouped"),
            })
            .collect()
    }

    #[test]
    fn a9_queued_appends_group_per_file_in_order_and_never_past_another_command() {
        let a = |f: u64, s: &str| Cmd::Append(TranscriptId(f), s.as_bytes().to_vec());
        assert_eq!(
            plan(vec![a(1, "a"), a(2, "x"), a(1, "b"), a(1, "c"), a(2, "y")]),
            ["W1:a+b+c", "W2:x+y"],
            "one write per file, pieces in order, files in the order of their first append"
        );
        assert_eq!(
            plan(vec![
                open_cmd(3, OpenMode::Create),
                a(3, "h"),
                a(3, "r"),
                a(1, "a"),
                Cmd::Truncate(TranscriptId(1), 0),
                a(1, "b"),
                a(3, "s"),
                Cmd::Close(TranscriptId(3)),
                a(1, "c"),
                Cmd::List(4),
            ]),
            [
                "open3", "W3:h+r", "W1:a", "cut1@0", "W1:b", "W3:s", "close3", "W1:c", "list4"
            ],
            "a truncate, close or other command is never crossed"
        );
        assert_eq!(plan(vec![a(1, "a")]), ["W1:a"]);
        assert!(plan(Vec::new()).is_empty());
    }

    #[test]
    fn a9_appends_queued_behind_a_sync_are_written_with_one_write_and_one_sync() {
        let dir = scratch("group");
        let (mut w, rx) = worker(&dir);
        let (cmds, queue) = mpsc::channel();
        // Everything below is queued before the thread takes any of it, as happens while it
        // sits in an fdatasync: a round's answer and its tool results, for two sessions.
        cmds.send(open_cmd(1, OpenMode::Create)).expect("queued");
        cmds.send(open_cmd(2, OpenMode::Create)).expect("queued");
        for i in 0..10 {
            cmds.send(Cmd::Append(
                TranscriptId(1),
                format!("{{\"n\":{i}}}\n").into_bytes(),
            ))
            .expect("queued");
            cmds.send(Cmd::Append(
                TranscriptId(2),
                format!("{{\"m\":{i}}}\n").into_bytes(),
            ))
            .expect("queued");
        }
        drop(cmds);
        w.serve(&queue);
        assert_eq!(w.syncs, 2, "one fdatasync per file for 20 queued appends");
        let want = |k: &str| {
            (0..10)
                .map(|i| format!("{{\"{k}\":{i}}}\n"))
                .collect::<String>()
        };
        let read = |n: &str| std::fs::read_to_string(dir.join(n)).expect("written");
        assert_eq!(read("sess_1.jsonl"), want("n"), "every append, in order");
        assert_eq!(read("sess_2.jsonl"), want("m"));
        assert_eq!(
            events(&rx).len(),
            2,
            "the two opens only: appends are not answered"
        );

        // One at a time (each sent once the one before is written, so never queued behind
        // it): written and synced at once, one sync each, nothing held back for company.
        let (cmds, queue) = mpsc::channel();
        let worker = std::thread::spawn(move || {
            w.serve(&queue);
            w
        });
        for i in 10..13 {
            let line = format!("{{\"n\":{i}}}\n");
            cmds.send(Cmd::Append(TranscriptId(1), line.clone().into_bytes()))
                .expect("queued");
            let deadline = std::time::Instant::now() + Duration::from_secs(30);
            while !read("sess_1.jsonl").ends_with(&line) {
                assert!(
                    std::time::Instant::now() < deadline,
                    "append {i} never written"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        drop(cmds);
        let w = worker.join().expect("the store thread");
        assert_eq!(w.syncs, 2 + 3);
        assert!(read("sess_1.jsonl").ends_with("{\"n\":12}\n"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a9_a_failed_group_write_is_reported_once_and_the_file_takes_no_more() {
        let dir = scratch("groupfail");
        std::fs::create_dir_all(&dir).expect("mkdir");
        let path = dir.join("sess_1.jsonl");
        std::fs::write(&path, "").expect("create");
        let (mut w, rx) = worker(&dir);
        // A handle that cannot write: every write fails (EBADF), like a full disk.
        let read_only = File::open(&path).expect("open");
        w.files.insert(TranscriptId(1), Held::Open(read_only, None));
        let (cmds, queue) = mpsc::channel();
        for _ in 0..3 {
            cmds.send(Cmd::Append(TranscriptId(1), b"{}\n".to_vec()))
                .expect("queued");
        }
        drop(cmds);
        w.serve(&queue);
        let got = events(&rx);
        assert!(
            matches!(
                &got[..],
                [Input::Transcript {
                    file: TranscriptId(1),
                    event: TranscriptEvent::Failed(TranscriptError::Io(_)),
                }]
            ),
            "{got:?}"
        );
        assert!(matches!(w.files.get(&TranscriptId(1)), Some(Held::Failed)));
        w.run(Cmd::Append(TranscriptId(1), b"{}\n".to_vec()));
        assert!(events(&rx).is_empty(), "nothing more for that file");
        assert_eq!(std::fs::read(&path).expect("read").len(), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
