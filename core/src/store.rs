//! The session store (SPEC A9): every session is written as an append-only JSONL transcript
//! (the records of `record.rs`), and `session/load`, `session/resume` and `session/list` read
//! the transcripts back. The [`SessionStore`] decides what to record and when; the runtime
//! only opens, appends, truncates, reads and lists files ([`Action::OpenTranscript`] and the
//! others) and reports back as [`Input::Transcript`](crate::Input::Transcript) /
//! [`Input::TranscriptList`](crate::Input::TranscriptList).
//!
//! **Recording.** Per session, a `Recorder` buffers records as things happen and hands them
//! to the runtime once per step (one append per session and step):
//!
//! - history: after every step the store compares the session's [`Transcript`] with what it
//!   recorded: appended items become `message` records; an item changed in place (a
//!   compaction, a hook call joining the model's answer) becomes a `rewind` to the unchanged
//!   prefix followed by the items after it;
//! - a tool call's result as soon as it is known (`tool_result`), so a crash in the middle of
//!   a round loses only what was still running;
//! - what the client saw, for the replay: the prompt, the streamed text and reasoning (merged
//!   into one `update` per run), the `tool_call` announcements;
//! - the usage mark (SPEC K1), `session/set_model`, remembered permission answers (SPEC A7),
//!   and each turn's end.
//!
//! The file is created with the first prompt (its header carries the title), so a session that
//! never got a prompt leaves no file.
//!
//! **Loading** (`Loader`) runs in three steps: open and lock the file (an unknown id or a
//! file another agent holds fails here, before any server starts), start the servers (the
//! agent), then stream the file through the core chunk by chunk: each record is applied to the
//! history being rebuilt and, for `session/load`, replayed to the client at once. Memory stays
//! proportional to the history kept: a `rewind` drops what came before it. At the end, a torn
//! last line is cut off (WARN), and tool calls left without a result by a crash are closed with
//! an error result (SPEC I9), recorded, and replayed as failed.

use crate::config::{Effort, LogLevel, StateDir};
use crate::ids::{SessionId, TranscriptId};
use crate::io::{Action, OpenMode, TranscriptEntry, TranscriptError, TranscriptEvent};
use crate::jsonrpc::{RpcError, RpcId};
use crate::llm::{Message, ToolCall};
use crate::outbox::Outbox;
use crate::record::{Record, iso8601_utc};
use crate::session::Session;
use crate::tools::ToolOutput;
use crate::transcript::Transcript;
use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// Sessions per `session/list` page.
pub(crate) const LIST_PAGE_SIZE: usize = 50;
/// Longest title, in characters (the first prompt's first line, cut).
pub(crate) const TITLE_CHARS: usize = 80;
/// Longest transcript line the loader accepts, bytes. The agent never writes one this long
/// (a response body is capped well below); a longer line means the file is not a transcript.
pub(crate) const MAX_RECORD_BYTES: usize = 256 * 1024 * 1024;
/// The result a tool call gets when the process died before it finished (SPEC I9).
pub(crate) const INTERRUPTED_TEXT: &str =
    "tool call interrupted: the agent stopped before it finished; its outcome is unknown";

/// What the store reports to the agent about a load.
#[derive(Debug)]
pub(crate) enum StoreEvent {
    /// The stored session's file is open and locked: start its servers.
    Opened(SessionId),
    /// The session is loaded: install it and answer the request.
    Loaded(SessionId, Box<Restored>),
    /// Answers held for the disk were sent (the file is synced up to them, or its writes
    /// failed): the session may start its next turn.
    Released(SessionId),
    /// The load failed: answer the request with this error and forget the session.
    LoadFailed {
        /// The session being loaded.
        session: SessionId,
        /// The JSON-RPC error code (`-32002` unknown session, `-32000` otherwise).
        code: i64,
        /// The message, naming the file (and the line for a parse error).
        message: String,
    },
}

/// A session as its transcript left it.
#[derive(Debug)]
pub(crate) struct Restored {
    /// The history (repaired: every tool call has its result), usage and call counter.
    pub(crate) transcript: Transcript,
    /// The model set with `session/set_model`.
    pub(crate) model: Option<String>,
    /// The reasoning effort set with `session/set_config_option` (SPEC L12), as
    /// `Session::thought_level` keeps it.
    pub(crate) thought_level: Option<Option<Effort>>,
    /// Remembered permission answers.
    pub(crate) remembered: BTreeMap<String, bool>,
    /// Whether the client asked for the replay (`session/load`) or not (`session/resume`).
    pub(crate) replayed: bool,
}

/// One model tool call as [`SessionStore::on_tool_calls`] records it.
pub(crate) struct AnnouncedCall<'a> {
    /// Position in the response.
    pub(crate) index: usize,
    /// The ACP `toolCallId`.
    pub(crate) acp_id: &'a str,
    /// The call.
    pub(crate) call: &'a ToolCall,
    /// The `tool_call` update as sent.
    pub(crate) update: &'a Value,
}

/// The `tool_call_update` that closes a call with `out` (SPEC A6): `failed` or `completed`,
/// the text as content and `rawOutput {isError}`. The live turn and the replay both build it
/// here, so they cannot drift apart.
pub(crate) fn result_update(acp_id: &str, failed: bool, out: &ToolOutput) -> Value {
    let status = if failed { "failed" } else { "completed" };
    json!({
        "sessionUpdate": "tool_call_update", "toolCallId": acp_id, "status": status,
        "content": out.client_content(),
        "rawOutput": {"isError": out.is_error}
    })
}

/// The title of a session: the first non-blank line of its first prompt, trimmed and cut to
/// [`TITLE_CHARS`] characters (with `…`).
pub(crate) fn title_of(prompt: &str) -> String {
    let line = prompt
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or("");
    if line.chars().count() <= TITLE_CHARS {
        return line.to_owned();
    }
    let mut t: String = line.chars().take(TITLE_CHARS - 1).collect();
    t.push('…');
    t
}

/// The open model tool calls of the last assistant message, as the recorder knows them.
#[derive(Debug)]
struct RecordedBatch {
    /// The history position of the assistant message.
    base: usize,
    /// Positions in the response whose results were recorded early (`tool_result`).
    recorded: BTreeSet<usize>,
}

/// The recording state of one live session.
#[derive(Debug)]
struct Recorder {
    /// The session's file once asked for.
    file: Option<TranscriptId>,
    /// Whether the header is written (or the file came from a load).
    header_written: bool,
    cwd: String,
    /// The title, known from the first prompt.
    title: Option<String>,
    /// Recording stopped after a write failed.
    broken: bool,
    /// Records not yet handed to the runtime (whole lines).
    pending: Vec<u8>,
    /// The run of streamed text not yet recorded: (update kind, text).
    chunk: Option<(&'static str, String)>,
    /// History items recorded.
    synced: usize,
    /// The usage recorded: (input tokens, mark).
    usage: (u64, usize),
    /// The model recorded.
    model: Option<String>,
    /// The reasoning effort recorded (SPEC L12).
    thought_level: Option<Option<Effort>>,
    /// The permission answers recorded.
    remembered: BTreeMap<String, bool>,
    batch: Option<RecordedBatch>,
    /// Bytes handed to the runtime to append since the file was opened by this process.
    appended: u64,
    /// The highest mark a sync was asked for ([`Action::SyncTranscript`]).
    sync_asked: u64,
    /// The highest mark the runtime reported synced.
    durable: u64,
    /// ACP lines (answers) waiting for the file to be synced up to their mark, in order.
    held: VecDeque<(u64, String)>,
    /// The session is gone: the file closes once the last sync is done.
    closing: bool,
}

impl Recorder {
    fn new(cwd: &str) -> Recorder {
        Recorder {
            file: None,
            header_written: false,
            cwd: cwd.to_owned(),
            title: None,
            broken: false,
            pending: Vec::new(),
            chunk: None,
            synced: 0,
            usage: (0, 0),
            model: None,
            thought_level: None,
            remembered: BTreeMap::new(),
            batch: None,
            appended: 0,
            sync_asked: 0,
            durable: 0,
            held: VecDeque::new(),
            closing: false,
        }
    }

    /// Whether bytes were appended that are not known to be on the disk.
    fn unsynced(&self) -> bool {
        !self.broken && self.file.is_some() && self.appended > self.durable
    }

    /// Asks for a sync of everything appended so far, unless one is already asked for.
    fn ask_sync(&mut self, out: &mut Outbox) {
        if let Some(file) = self.file
            && self.sync_asked < self.appended
        {
            self.sync_asked = self.appended;
            out.push(Action::SyncTranscript {
                file,
                mark: self.appended,
            });
        }
    }

    /// Sends the held lines the disk now covers (all of them once the file failed), in
    /// order; whether any was sent.
    fn release(&mut self, out: &mut Outbox) -> bool {
        let mut sent = false;
        while let Some((mark, _)) = self.held.front() {
            if !self.broken && *mark > self.durable {
                break;
            }
            if let Some((_, line)) = self.held.pop_front() {
                out.push(Action::WriteAcp(line));
                sent = true;
            }
        }
        sent
    }

    fn record(&mut self, r: &Record) {
        if !self.broken {
            r.write_line(&mut self.pending);
        }
    }

    /// Writes the run of streamed text as one `update`.
    fn flush_chunk(&mut self) {
        if let Some((kind, text)) = self.chunk.take() {
            self.record(&Record::Update(crate::acp::chunk_update(kind, &text)));
        }
    }

    /// Records what changed in `sess` since the last call (see the module docs).
    fn sync(&mut self, sess: &mut Session) {
        let changed = sess.transcript.take_changed();
        if self.broken {
            return;
        }
        let len = sess.transcript.len();
        let rewind = changed.filter(|&c| c < self.synced);
        if rewind.is_some() || len > self.synced {
            // The streamed text precedes the history item it became.
            self.flush_chunk();
        }
        if let Some(keep) = rewind {
            self.record(&Record::Rewind { keep });
            self.synced = keep;
            self.batch = None;
        }
        for j in self.synced..len {
            let Some(m) = sess.transcript.messages().get(j) else {
                break;
            };
            let early = match (m, &self.batch) {
                (Message::ToolResult { .. }, Some(b)) => j
                    .checked_sub(b.base + 1)
                    .is_some_and(|i| b.recorded.contains(&i)),
                _ => false,
            };
            if !matches!(m, Message::ToolResult { .. }) {
                self.batch = None;
            }
            if !early {
                crate::record::write_message(&mut self.pending, m);
            }
        }
        self.synced = len;
        let usage = (
            sess.transcript.last_input_tokens,
            sess.transcript.usage_mark,
        );
        if usage != self.usage {
            self.usage = usage;
            self.record(&Record::Usage {
                input_tokens: usage.0,
                mark: usage.1,
            });
        }
        if sess.model_override != self.model {
            self.model.clone_from(&sess.model_override);
            self.record(&Record::Model(self.model.clone()));
        }
        if let Some(level) = sess.thought_level
            && self.thought_level != Some(level)
        {
            self.thought_level = Some(level);
            self.record(&Record::ThoughtLevel(level));
        }
        for (tool, allow) in &sess.remembered {
            if self.remembered.get(tool) != Some(allow) {
                self.remembered.insert(tool.clone(), *allow);
                Record::Permission {
                    tool: tool.clone(),
                    allow: *allow,
                }
                .write_line(&mut self.pending);
            }
        }
    }
}

/// Where a load is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LoadPhase {
    /// Waiting for the file to be opened and locked.
    Opening,
    /// Open; the agent starts the servers.
    Opened,
    /// Streaming the file.
    Reading,
}

/// The model tool calls of the last assistant message while a transcript is read back.
#[derive(Debug)]
struct OpenBatch {
    calls: Vec<ToolCall>,
    /// Results recorded early, by position.
    results: BTreeMap<usize, Message>,
    /// The ACP ids of the calls the client saw, by position.
    announced: BTreeMap<usize, String>,
}

/// One `session/load` or `session/resume` in progress.
#[derive(Debug)]
struct Loader {
    file: TranscriptId,
    /// `session/load` replays; `session/resume` does not.
    replay: bool,
    phase: LoadPhase,
    cwd: String,
    /// The unfinished line.
    line: Vec<u8>,
    /// Lines read.
    line_no: u64,
    /// Bytes of the complete lines read.
    complete_bytes: u64,
    header: bool,
    history: Vec<Message>,
    batch: Option<OpenBatch>,
    usage: (u64, usize),
    calls: u64,
    model: Option<String>,
    thought_level: Option<Option<Effort>>,
    remembered: BTreeMap<String, bool>,
    /// Record types skipped (warned once each).
    unknown: BTreeSet<String>,
}

/// A `session/list` waiting for the directory listing.
#[derive(Debug)]
struct ListRequest {
    rpc: RpcId,
    cwd: Option<String>,
    after: Option<(u64, String)>,
}

/// The session store. See the module docs.
#[derive(Debug)]
pub(crate) struct SessionStore {
    /// The state directory, `None` when persistence is off.
    dir: Option<String>,
    next_file: u64,
    next_list: u64,
    recorders: BTreeMap<SessionId, Recorder>,
    loads: BTreeMap<SessionId, Loader>,
    /// Whose file each file handle is.
    files: BTreeMap<TranscriptId, SessionId>,
    lists: BTreeMap<u64, ListRequest>,
}

impl SessionStore {
    /// A store in `dir` (off: every recording call does nothing).
    pub(crate) fn new(dir: &StateDir) -> SessionStore {
        SessionStore {
            dir: match dir {
                StateDir::Off => None,
                StateDir::Dir(d) => Some(d.clone()),
            },
            next_file: 1,
            next_list: 1,
            recorders: BTreeMap::new(),
            loads: BTreeMap::new(),
            files: BTreeMap::new(),
            lists: BTreeMap::new(),
        }
    }

    /// Whether sessions are persisted.
    pub(crate) fn is_on(&self) -> bool {
        self.dir.is_some()
    }

    /// The path of `sid`'s transcript, for messages.
    pub(crate) fn path_of(&self, sid: SessionId) -> String {
        let dir = self.dir.as_deref().unwrap_or("");
        let sep = if dir.ends_with('/') { "" } else { "/" };
        format!("{dir}{sep}{}", sid.file_name())
    }

    fn new_file(&mut self, sid: SessionId) -> TranscriptId {
        let file = TranscriptId(self.next_file);
        self.next_file += 1;
        self.files.insert(file, sid);
        file
    }

    // ------------------------------------------------------------------ recording

    /// A new session in `cwd` will be recorded.
    pub(crate) fn on_new(&mut self, sid: SessionId, cwd: &str) {
        if self.is_on() {
            self.recorders.insert(sid, Recorder::new(cwd));
        }
    }

    /// The client's prompt `text` starts a turn of `sid` (after [`SessionStore::sync`]): the
    /// replay shows it, and the first one titles the session.
    pub(crate) fn on_prompt(&mut self, sid: SessionId, text: &str) {
        let Some(rec) = self.recorders.get_mut(&sid) else {
            return;
        };
        rec.flush_chunk();
        if rec.title.is_none() {
            rec.title = Some(title_of(text));
        }
        rec.record(&Record::Update(crate::acp::chunk_update(
            "user_message_chunk",
            text,
        )));
    }

    /// Streamed text of `kind` (`agent_message_chunk`, `agent_thought_chunk`) reached the
    /// client: it joins the current run of that kind.
    pub(crate) fn on_chunk(&mut self, sid: SessionId, kind: &'static str, text: &str) {
        let Some(rec) = self.recorders.get_mut(&sid) else {
            return;
        };
        if rec.broken {
            return;
        }
        match &mut rec.chunk {
            Some((k, run)) if *k == kind => run.push_str(text),
            _ => {
                rec.flush_chunk();
                rec.chunk = Some((kind, text.to_owned()));
            }
        }
    }

    /// The model's tool calls were announced to the client: the history is recorded up to
    /// their assistant message first, then each `tool_call`.
    pub(crate) fn on_tool_calls(&mut self, sess: &mut Session, calls: &[AnnouncedCall<'_>]) {
        let Some(rec) = self.recorders.get_mut(&sess.id) else {
            return;
        };
        rec.sync(sess);
        let base = sess
            .transcript
            .messages()
            .iter()
            .rposition(|m| matches!(m, Message::Assistant { .. }))
            .unwrap_or(0);
        rec.batch = Some(RecordedBatch {
            base,
            recorded: BTreeSet::new(),
        });
        if rec.broken {
            return;
        }
        for c in calls {
            crate::record::write_tool_call(
                &mut rec.pending,
                c.index,
                c.acp_id,
                &c.call.id,
                &c.call.name,
                c.update,
            );
        }
    }

    /// Tool call `index` (ACP id `acp_id`) of the open batch of `sid` ended with `out`.
    pub(crate) fn on_tool_result(
        &mut self,
        sid: SessionId,
        index: usize,
        acp_id: &str,
        call: &ToolCall,
        out: &ToolOutput,
        failed: bool,
    ) {
        let Some(rec) = self.recorders.get_mut(&sid) else {
            return;
        };
        rec.flush_chunk();
        if !rec.broken {
            crate::record::write_tool_result(
                &mut rec.pending,
                index,
                Some(acp_id),
                &call.id,
                &call.name,
                &out.text,
                out.is_error,
                failed,
            );
        }
        if let Some(b) = &mut rec.batch {
            b.recorded.insert(index);
        }
    }

    /// The turn of `sid` ended (after [`SessionStore::sync`]): its stop reason and `_meta`,
    /// or its error.
    pub(crate) fn on_turn_end(&mut self, sid: SessionId, stop_reason: Option<&str>, detail: Value) {
        let Some(rec) = self.recorders.get_mut(&sid) else {
            return;
        };
        rec.flush_chunk();
        rec.record(&Record::TurnEnd {
            stop_reason: stop_reason.map(str::to_owned),
            detail,
        });
    }

    /// Records what changed in `sess` (history, usage, model, permissions) since the last
    /// call.
    pub(crate) fn sync(&mut self, sess: &mut Session) {
        match self.recorders.get_mut(&sess.id) {
            Some(rec) => rec.sync(sess),
            None => {
                sess.transcript.take_changed();
            }
        }
    }

    /// Hands the records of `sid` buffered so far to the runtime: one append (the file is
    /// created with the first prompt's records, its header first).
    pub(crate) fn flush(&mut self, sid: SessionId, out: &mut Outbox) {
        let Some(rec) = self.recorders.get_mut(&sid) else {
            return;
        };
        if rec.broken || rec.pending.is_empty() {
            return;
        }
        if !rec.header_written {
            let Some(title) = rec.title.clone() else {
                return; // nothing to title the file with yet: no prompt
            };
            let mut header = Vec::with_capacity(128 + rec.pending.len());
            Record::Session {
                session_id: sid.to_string(),
                cwd: rec.cwd.clone(),
                title,
            }
            .write_line(&mut header);
            header.append(&mut rec.pending);
            rec.pending = header;
            rec.header_written = true;
        }
        let bytes = std::mem::take(&mut rec.pending);
        let file = match rec.file {
            Some(f) => f,
            None => {
                let file = self.new_file(sid);
                if let Some(rec) = self.recorders.get_mut(&sid) {
                    rec.file = Some(file);
                }
                out.push(Action::OpenTranscript {
                    file,
                    name: sid.file_name(),
                    mode: OpenMode::Create,
                });
                file
            }
        };
        if let Some(rec) = self.recorders.get_mut(&sid) {
            rec.appended += bytes.len() as u64;
        }
        out.push(Action::AppendTranscript { file, bytes });
    }

    /// Sends the ACP line `line` (a `session/prompt` answer) once every record of `sid` so
    /// far, the ones buffered now included, is on the disk (SPEC A9): the records are handed
    /// to the runtime, a sync is asked for, and the line waits for
    /// [`TranscriptEvent::Synced`]. A line waits behind the lines held before it. Sent at
    /// once when nothing unsynced was written (or the session is not saved, or its writes
    /// failed).
    pub(crate) fn send_when_synced(&mut self, sid: SessionId, line: String, out: &mut Outbox) {
        self.flush(sid, out);
        match self.recorders.get_mut(&sid) {
            Some(rec) if rec.unsynced() => {
                rec.ask_sync(out);
                rec.held.push_back((rec.appended, line));
            }
            Some(_) | None => out.push(Action::WriteAcp(line)),
        }
    }

    /// Whether an answer of `sid` waits for the disk ([`SessionStore::send_when_synced`]).
    pub(crate) fn is_holding(&self, sid: SessionId) -> bool {
        self.recorders.get(&sid).is_some_and(|r| !r.held.is_empty())
    }

    /// Whether `sid`'s file is still open in this agent (recording, or closing after its last
    /// sync).
    pub(crate) fn has_file(&self, sid: SessionId) -> bool {
        self.recorders.contains_key(&sid) || self.loads.contains_key(&sid)
    }

    /// At exit: every held line is sent now, its sync still queued in the runtime (which
    /// finishes its syncs before it writes the last lines, SPEC A9).
    pub(crate) fn release_all(&mut self, out: &mut Outbox) {
        for rec in self.recorders.values_mut() {
            while let Some((_, line)) = rec.held.pop_front() {
                out.push(Action::WriteAcp(line));
            }
        }
    }

    /// Syncs and flushes every live session of `sessions`: those whose opening request is
    /// answered (after each step; a starting one is not recorded yet).
    pub(crate) fn sync_all<'a>(
        &mut self,
        sessions: impl IntoIterator<Item = &'a mut Session>,
        out: &mut Outbox,
    ) {
        if self.recorders.is_empty() {
            return;
        }
        for sess in sessions {
            self.sync(sess);
            self.flush(sess.id, out);
        }
    }

    /// Stops recording `sid` and closes its file (releasing its lock), after a last sync of
    /// what it wrote (SPEC A9: at close); see [`SessionStore::close_then_send`].
    pub(crate) fn close(&mut self, sid: SessionId, out: &mut Outbox) {
        self.close_then_send(sid, None, out);
    }

    /// [`SessionStore::close`], then `line` (the `session/close` answer): when something
    /// written is not synced yet, the file is synced first, then closed, then the held lines
    /// and `line` are sent, so that the answer comes after the lock is released.
    pub(crate) fn close_then_send(
        &mut self,
        sid: SessionId,
        line: Option<String>,
        out: &mut Outbox,
    ) {
        if let Some(load) = self.loads.remove(&sid) {
            self.files.remove(&load.file);
            out.push(Action::CloseTranscript { file: load.file });
        }
        let Some(rec) = self.recorders.get_mut(&sid) else {
            if let Some(line) = line {
                out.push(Action::WriteAcp(line));
            }
            return;
        };
        rec.closing = true;
        rec.chunk = None;
        if rec.unsynced() {
            rec.ask_sync(out);
            if let Some(line) = line {
                rec.held.push_back((rec.appended, line));
            }
            return;
        }
        if let Some(line) = line {
            rec.held.push_back((0, line));
        }
        self.finish_close(sid, out);
    }

    /// Closes the file of a closing session, then sends what it held.
    fn finish_close(&mut self, sid: SessionId, out: &mut Outbox) {
        let Some(mut rec) = self.recorders.remove(&sid) else {
            return;
        };
        if let Some(file) = rec.file {
            self.files.remove(&file);
            out.push(Action::CloseTranscript { file });
        }
        rec.broken = true; // what is left goes out now
        rec.release(out);
    }

    // ------------------------------------------------------------------ loading

    /// Whether `sid` is being loaded.
    pub(crate) fn is_loading(&self, sid: SessionId) -> bool {
        self.loads.contains_key(&sid)
    }

    /// `session/load` (`replay`) or `session/resume` of `sid` in `cwd`: open and lock its
    /// file. The answer comes as [`StoreEvent::Opened`] or [`StoreEvent::LoadFailed`].
    pub(crate) fn begin_load(&mut self, sid: SessionId, cwd: &str, replay: bool, out: &mut Outbox) {
        let file = self.new_file(sid);
        self.loads.insert(
            sid,
            Loader {
                file,
                replay,
                phase: LoadPhase::Opening,
                cwd: cwd.to_owned(),
                line: Vec::new(),
                line_no: 0,
                complete_bytes: 0,
                header: false,
                history: Vec::new(),
                batch: None,
                usage: (0, 0),
                calls: 0,
                model: None,
                thought_level: None,
                remembered: BTreeMap::new(),
                unknown: BTreeSet::new(),
            },
        );
        out.push(Action::OpenTranscript {
            file,
            name: sid.file_name(),
            mode: OpenMode::Existing,
        });
    }

    /// The servers of the session being loaded are ready: read its file.
    pub(crate) fn read(&mut self, sid: SessionId, out: &mut Outbox) {
        if let Some(load) = self.loads.get_mut(&sid)
            && load.phase == LoadPhase::Opened
        {
            load.phase = LoadPhase::Reading;
            out.push(Action::ReadTranscript { file: load.file });
        }
    }

    /// What happened to a file: drives loads, and stops recording a session whose writes
    /// fail.
    pub(crate) fn on_file_event(
        &mut self,
        file: TranscriptId,
        event: TranscriptEvent,
        out: &mut Outbox,
    ) -> Vec<StoreEvent> {
        let Some(&sid) = self.files.get(&file) else {
            return Vec::new(); // a closed file's late news
        };
        if self.loads.get(&sid).is_some_and(|l| l.file == file) {
            return self.on_load_event(sid, event, out);
        }
        match event {
            TranscriptEvent::Synced(mark) => {
                let Some(rec) = self.recorders.get_mut(&sid) else {
                    return Vec::new();
                };
                rec.durable = rec.durable.max(mark);
                if rec.closing {
                    if !rec.unsynced() {
                        self.finish_close(sid, out);
                    }
                    return Vec::new();
                }
                if rec.release(out) {
                    return vec![StoreEvent::Released(sid)];
                }
            }
            TranscriptEvent::Failed(e) => {
                let path = self.path_of(sid);
                if let Some(rec) = self.recorders.get_mut(&sid)
                    && !rec.broken
                {
                    rec.broken = true;
                    rec.pending.clear();
                    rec.chunk = None;
                    let why = match e {
                        TranscriptError::NotFound => "not found".to_owned(),
                        TranscriptError::Locked => "it is locked by another process".to_owned(),
                        TranscriptError::Io(e) => e,
                    };
                    out.log(
                        LogLevel::Error,
                        format!(
                            "session {sid}: cannot write its transcript {path}: {why}; the session goes on without being saved"
                        ),
                    );
                    self.files.remove(&file);
                    out.push(Action::CloseTranscript { file });
                    rec.file = None;
                    // What waited for the disk goes out: the session goes on unsaved.
                    let closing = rec.closing;
                    let sent = rec.release(out);
                    if closing {
                        self.recorders.remove(&sid);
                    } else if sent {
                        return vec![StoreEvent::Released(sid)];
                    }
                }
            }
            TranscriptEvent::Opened | TranscriptEvent::Bytes(_) | TranscriptEvent::End => {}
        }
        Vec::new()
    }

    fn fail_load(
        &mut self,
        sid: SessionId,
        code: i64,
        message: String,
        out: &mut Outbox,
    ) -> Vec<StoreEvent> {
        if let Some(load) = self.loads.remove(&sid) {
            self.files.remove(&load.file);
            out.push(Action::CloseTranscript { file: load.file });
        }
        vec![StoreEvent::LoadFailed {
            session: sid,
            code,
            message,
        }]
    }

    fn on_load_event(
        &mut self,
        sid: SessionId,
        event: TranscriptEvent,
        out: &mut Outbox,
    ) -> Vec<StoreEvent> {
        let path = self.path_of(sid);
        let Some(load) = self.loads.get_mut(&sid) else {
            return Vec::new();
        };
        match (load.phase, event) {
            (LoadPhase::Opening, TranscriptEvent::Opened) => {
                load.phase = LoadPhase::Opened;
                vec![StoreEvent::Opened(sid)]
            }
            (LoadPhase::Opening, TranscriptEvent::Failed(e)) => {
                // Opening failed: the runtime holds nothing.
                let file = load.file;
                self.loads.remove(&sid);
                self.files.remove(&file);
                let (code, message) = match e {
                    TranscriptError::NotFound => (
                        RpcError::RESOURCE_NOT_FOUND,
                        format!("session not found: {sid} (no transcript at {path})"),
                    ),
                    TranscriptError::Locked => (
                        RpcError::SERVER_ERROR,
                        format!(
                            "session {sid} is open in another buzz-agent process (its transcript {path} is locked)"
                        ),
                    ),
                    TranscriptError::Io(e) => (
                        RpcError::SERVER_ERROR,
                        format!("cannot open the transcript of session {sid}: {path}: {e}"),
                    ),
                };
                vec![StoreEvent::LoadFailed {
                    session: sid,
                    code,
                    message,
                }]
            }
            (LoadPhase::Reading, TranscriptEvent::Bytes(bytes)) => {
                match load.feed(&bytes, &sid.to_string(), out) {
                    Ok(()) => Vec::new(),
                    Err(why) => {
                        let message = format!(
                            "cannot load session {sid}: {path} line {}: {why}",
                            load.line_no
                        );
                        self.fail_load(sid, RpcError::SERVER_ERROR, message, out)
                    }
                }
            }
            (LoadPhase::Reading, TranscriptEvent::End) => self.finish_load(sid, &path, out),
            (LoadPhase::Reading | LoadPhase::Opened, TranscriptEvent::Failed(e)) => {
                let why = match e {
                    TranscriptError::NotFound => "not found".to_owned(),
                    TranscriptError::Locked => "locked".to_owned(),
                    TranscriptError::Io(e) => e,
                };
                let message = format!("cannot read the transcript of session {sid}: {path}: {why}");
                self.fail_load(sid, RpcError::SERVER_ERROR, message, out)
            }
            (
                LoadPhase::Opening | LoadPhase::Opened | LoadPhase::Reading,
                TranscriptEvent::Opened
                | TranscriptEvent::Bytes(_)
                | TranscriptEvent::End
                | TranscriptEvent::Synced(_),
            ) => Vec::new(),
        }
    }

    fn finish_load(&mut self, sid: SessionId, path: &str, out: &mut Outbox) -> Vec<StoreEvent> {
        let Some(mut load) = self.loads.remove(&sid) else {
            return Vec::new();
        };
        let sid_text = sid.to_string();
        if !load.line.is_empty() {
            out.log(
                LogLevel::Warn,
                format!(
                    "session {sid}: {path} ends with a torn line ({} bytes after line {}, left by a crash); ignored and cut off",
                    load.line.len(),
                    load.line_no
                ),
            );
            out.push(Action::TruncateTranscript {
                file: load.file,
                len: load.complete_bytes,
            });
        }
        let repairs = load.close_batch(true, &sid_text, out);
        let mut rec = Recorder::new(&load.cwd);
        rec.file = Some(load.file);
        rec.header_written = load.header;
        rec.synced = load.history.len();
        rec.usage = load.usage;
        rec.model.clone_from(&load.model);
        rec.thought_level = load.thought_level;
        rec.remembered.clone_from(&load.remembered);
        for r in &repairs {
            rec.record(r);
        }
        if !repairs.is_empty() {
            out.log(
                LogLevel::Warn,
                format!(
                    "session {sid}: {} tool call(s) were still running when the agent stopped; closed with an error result",
                    repairs.len()
                ),
            );
        }
        if !load.header {
            out.log(
                LogLevel::Warn,
                format!("session {sid}: {path} holds no record; loaded as an empty session"),
            );
        }
        self.recorders.insert(sid, rec);
        out.log(
            LogLevel::Info,
            format!(
                "session {sid}: loaded {} history item(s) from {path} ({} line(s))",
                load.history.len(),
                load.line_no
            ),
        );
        let transcript = Transcript::restored(load.history, load.usage.0, load.usage.1, load.calls);
        vec![StoreEvent::Loaded(
            sid,
            Box::new(Restored {
                transcript,
                model: load.model,
                thought_level: load.thought_level,
                remembered: load.remembered,
                replayed: load.replay,
            }),
        )]
    }

    // ------------------------------------------------------------------ listing

    /// `session/list` (SPEC A9): asks the runtime for the directory; the answer is written
    /// when it comes ([`SessionStore::on_list`]). `cursor` is a previous page's `nextCursor`.
    ///
    /// # Errors
    /// A cursor this agent did not write (for a `-32602` reply).
    pub(crate) fn list(
        &mut self,
        rpc: RpcId,
        cwd: Option<String>,
        cursor: Option<&str>,
        out: &mut Outbox,
    ) -> Result<(), String> {
        let after = match cursor {
            None => None,
            Some(c) => Some(
                c.split_once('/')
                    .and_then(|(ms, name)| Some((ms.parse::<u64>().ok()?, name.to_owned())))
                    .ok_or_else(|| {
                        format!("session/list: cursor {c:?} is not one this agent gave")
                    })?,
            ),
        };
        let request = self.next_list;
        self.next_list += 1;
        self.lists.insert(request, ListRequest { rpc, cwd, after });
        out.push(Action::ListTranscripts { request });
        Ok(())
    }

    /// The directory listing for `session/list` request `request`: one page, newest first.
    pub(crate) fn on_list(
        &mut self,
        request: u64,
        entries: Result<Vec<TranscriptEntry>, String>,
        out: &mut Outbox,
    ) {
        let Some(req) = self.lists.remove(&request) else {
            return;
        };
        let dir = self.dir.clone().unwrap_or_default();
        let entries = match entries {
            Ok(e) => e,
            Err(e) => {
                out.reply_err(
                    Some(&req.rpc),
                    RpcError::SERVER_ERROR,
                    format!("session/list: cannot read the state directory {dir}: {e}"),
                    None,
                );
                return;
            }
        };
        let mut found: Vec<(u64, String, Value)> = Vec::new();
        for e in entries {
            let Some(sid) = e.name.strip_suffix(".jsonl").and_then(SessionId::parse) else {
                continue;
            };
            let head = e.head.strip_suffix(b"\n").unwrap_or(&e.head);
            match Record::parse(head) {
                Ok(Record::Session {
                    session_id,
                    cwd,
                    title,
                }) if session_id == sid.to_string() => {
                    if req.cwd.as_deref().is_none_or(|want| same_dir(want, &cwd)) {
                        found.push((
                            e.modified_ms,
                            e.name,
                            json!({"sessionId": session_id, "cwd": cwd, "title": title,
                                   "updatedAt": iso8601_utc(e.modified_ms)}),
                        ));
                    }
                }
                Ok(_) | Err(_) => out.log(
                    LogLevel::Warn,
                    format!(
                        "session/list: skipped {dir}/{}: its first line is not this session's header",
                        e.name
                    ),
                ),
            }
        }
        found.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        let start = match &req.after {
            None => 0,
            Some((ms, name)) => found
                .iter()
                .position(|(m, n, _)| m < ms || (m == ms && n > name))
                .unwrap_or(found.len()),
        };
        let page: Vec<&(u64, String, Value)> =
            found.iter().skip(start).take(LIST_PAGE_SIZE).collect();
        let mut result = json!({
            "sessions": page.iter().map(|(_, _, v)| v.clone()).collect::<Vec<Value>>()
        });
        if start + page.len() < found.len()
            && let Some((ms, name, _)) = page.last()
        {
            result["nextCursor"] = json!(format!("{ms}/{name}"));
        }
        out.reply_ok(&req.rpc, &result);
    }
}

/// Whether two absolute directory paths name the same directory as written (trailing `/`s
/// ignored).
fn same_dir(a: &str, b: &str) -> bool {
    let trim = |p: &str| {
        let t = p.trim_end_matches('/');
        if t.is_empty() {
            "/".to_owned()
        } else {
            t.to_owned()
        }
    };
    trim(a) == trim(b)
}

/// The number at the end of a tool-call id the agent hands out: `tc_N`, `buzz_hook_…_N`.
fn call_number(id: &str) -> Option<u64> {
    if let Some(n) = id.strip_prefix("tc_") {
        return n.parse().ok();
    }
    if id.starts_with("buzz_hook_") {
        return id.rsplit('_').next()?.parse().ok();
    }
    None
}

impl Loader {
    /// The next bytes of the file: every complete line is applied.
    fn feed(&mut self, bytes: &[u8], sid: &str, out: &mut Outbox) -> Result<(), String> {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = tail.get(1..).unwrap_or(&[]);
            self.line_no += 1;
            let line = if self.line.is_empty() {
                head
            } else {
                self.line.extend_from_slice(head);
                &self.line[..]
            };
            if line.len() > MAX_RECORD_BYTES {
                return Err(format!("longer than {} MiB", MAX_RECORD_BYTES >> 20));
            }
            let record = Record::parse(line);
            let consumed = line.len() as u64 + 1;
            self.line.clear();
            self.complete_bytes += consumed;
            self.apply(record?, sid, out)?;
        }
        if self.line.len() + rest.len() > MAX_RECORD_BYTES {
            self.line_no += 1;
            return Err(format!("longer than {} MiB", MAX_RECORD_BYTES >> 20));
        }
        self.line.extend_from_slice(rest);
        Ok(())
    }

    fn replay(&self, update: &Value, sid: &str, out: &mut Outbox) {
        if self.replay {
            out.push(Action::WriteAcp(crate::acp::update_line(sid, update)));
        }
    }

    fn note_calls(&mut self, calls: &[ToolCall]) {
        for c in calls {
            if let Some(n) = call_number(&c.id) {
                self.calls = self.calls.max(n);
            }
        }
    }

    fn apply(&mut self, record: Record, sid: &str, out: &mut Outbox) -> Result<(), String> {
        if !self.header {
            return match record {
                Record::Session { session_id, .. } if session_id == sid => {
                    self.header = true;
                    Ok(())
                }
                Record::Session { session_id, .. } => {
                    Err(format!("the header names another session ({session_id})"))
                }
                Record::Message(_)
                | Record::Rewind { .. }
                | Record::Usage { .. }
                | Record::Update(_)
                | Record::ToolCall { .. }
                | Record::ToolResult { .. }
                | Record::Model(_)
                | Record::ThoughtLevel(_)
                | Record::Permission { .. }
                | Record::TurnEnd { .. }
                | Record::Unknown(_) => Err("not a session header".into()),
            };
        }
        match record {
            Record::Session { .. } => return Err("a second session header".into()),
            Record::Message(m) => {
                // A result of the open batch (a hook call's, or one rewritten after a rewind)
                // waits for the batch to close, like the early ones.
                if let (Message::ToolResult { call_id, .. }, Some(b)) = (&m, &mut self.batch)
                    && let Some(i) = (0..b.calls.len()).find(|i| {
                        !b.results.contains_key(i)
                            && b.calls.get(*i).is_some_and(|c| c.id == *call_id)
                    })
                {
                    b.announced.remove(&i);
                    b.results.insert(i, m);
                    return Ok(());
                }
                self.close_batch(false, sid, out);
                if let Message::Assistant { tool_calls, .. } = &m {
                    self.note_calls(tool_calls);
                    if !tool_calls.is_empty() {
                        self.batch = Some(OpenBatch {
                            calls: tool_calls.clone(),
                            results: BTreeMap::new(),
                            announced: BTreeMap::new(),
                        });
                    }
                }
                self.history.push(m);
            }
            Record::Rewind { keep } => {
                self.close_batch(false, sid, out);
                if keep > self.history.len() {
                    return Err(format!(
                        "rewind to {keep} items of a history of {}",
                        self.history.len()
                    ));
                }
                self.history.truncate(keep);
            }
            Record::Usage { input_tokens, mark } => self.usage = (input_tokens, mark),
            Record::Update(u) => self.replay(&u, sid, out),
            Record::ToolCall {
                index,
                tool_call_id,
                update,
                ..
            } => {
                if let Some(n) = call_number(&tool_call_id) {
                    self.calls = self.calls.max(n);
                }
                if let Some(b) = &mut self.batch {
                    b.announced.insert(index, tool_call_id);
                }
                self.replay(&update, sid, out);
            }
            Record::ToolResult {
                index,
                tool_call_id,
                call_id,
                name,
                text,
                is_error,
                failed,
            } => {
                let output = ToolOutput::plain(text, is_error);
                if let Some(acp_id) = &tool_call_id {
                    self.replay(&result_update(acp_id, failed, &output), sid, out);
                }
                match &mut self.batch {
                    Some(b) if index < b.calls.len() => {
                        b.announced.remove(&index);
                        b.results.insert(
                            index,
                            Message::ToolResult {
                                call_id,
                                name,
                                text: output.text,
                                is_error: output.is_error,
                            },
                        );
                    }
                    Some(_) | None => {
                        return Err(format!("a tool result ({call_id}) without its tool call"));
                    }
                }
            }
            Record::Model(m) => self.model = m,
            Record::ThoughtLevel(e) => self.thought_level = Some(e),
            Record::Permission { tool, allow } => {
                self.remembered.insert(tool, allow);
            }
            Record::TurnEnd { .. } => {}
            Record::Unknown(kind) => {
                if self.unknown.insert(kind.clone()) {
                    out.log(
                        LogLevel::Warn,
                        format!(
                            "session {sid}: skipped records of type {kind:?} (written by a newer buzz-agent?)"
                        ),
                    );
                }
            }
        }
        Ok(())
    }

    /// The open batch's early results join the history in call order. At the end of the file
    /// (`repair`), a call without a result gets [`INTERRUPTED_TEXT`] (SPEC I9), shown failed
    /// to the client; the records of those repairs are returned.
    fn close_batch(&mut self, repair: bool, sid: &str, out: &mut Outbox) -> Vec<Record> {
        let Some(mut b) = self.batch.take() else {
            return Vec::new();
        };
        let mut repairs = Vec::new();
        for (i, call) in b.calls.iter().enumerate() {
            match b.results.remove(&i) {
                Some(m) => self.history.push(m),
                None if repair => {
                    let acp_id = b.announced.remove(&i);
                    let output = ToolOutput::plain(INTERRUPTED_TEXT.to_owned(), true);
                    if let Some(acp_id) = &acp_id {
                        self.replay(&result_update(acp_id, true, &output), sid, out);
                    }
                    repairs.push(Record::ToolResult {
                        index: i,
                        tool_call_id: acp_id,
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        text: output.text.clone(),
                        is_error: true,
                        failed: true,
                    });
                    self.history.push(Message::ToolResult {
                        call_id: call.id.clone(),
                        name: call.name.clone(),
                        text: output.text,
                        is_error: true,
                    });
                }
                None => {}
            }
        }
        repairs
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LogLevel;
    use crate::time::MonoTime;

    const SID: SessionId = SessionId(1);

    fn store() -> SessionStore {
        SessionStore::new(&StateDir::Dir("/state".into()))
    }

    fn out() -> Outbox {
        Outbox::new(LogLevel::Debug, MonoTime::ZERO)
    }

    fn session() -> Session {
        Session::new(SID, Vec::new())
    }

    fn drain(out: &mut Outbox) -> Vec<Action> {
        std::iter::from_fn(|| out.pop()).collect()
    }

    /// The records appended by `actions`, as `type` names (and the file actions as `open`).
    fn written(actions: &[Action]) -> Vec<String> {
        let mut kinds = Vec::new();
        for a in actions {
            if let Action::OpenTranscript { name, mode, .. } = a {
                kinds.push(format!("open {name} {mode:?}"));
            } else if let Action::AppendTranscript { bytes, .. } = a {
                for line in String::from_utf8_lossy(bytes).lines() {
                    let v: Value = serde_json::from_str(line).unwrap_or_default();
                    kinds.push(v["type"].as_str().unwrap_or("?").to_owned());
                }
            } else {
                kinds.push(format!("{a:?}"));
            }
        }
        kinds
    }

    fn user(t: &str) -> Message {
        Message::User { text: t.into() }
    }

    /// The `result` of the last response written.
    fn last_result(out: &mut Outbox) -> Value {
        drain(out)
            .iter()
            .rev()
            .find_map(|a| {
                if let Action::WriteAcp(l) = a {
                    serde_json::from_str::<Value>(l).ok()
                } else {
                    None
                }
            })
            .map(|v| v["result"].clone())
            .unwrap_or_default()
    }

    fn answer(t: &str, calls: &[&str]) -> Message {
        Message::Assistant {
            text: t.into(),
            thinking: String::new(),
            reasoning: Vec::new(),
            tool_calls: calls
                .iter()
                .map(|id| ToolCall {
                    id: (*id).into(),
                    name: "fs__read".into(),
                    arguments: "{}".into(),
                })
                .collect(),
        }
    }

    fn result(id: &str) -> Message {
        Message::ToolResult {
            call_id: id.into(),
            name: "fs__read".into(),
            text: "ok".into(),
            is_error: false,
        }
    }

    #[test]
    fn a9_nothing_is_written_before_the_first_prompt_whose_first_line_titles_the_file() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        s.model_override = Some("m2".into());
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(drain(&mut o).is_empty(), "no prompt, no file");
        st.on_prompt(SID, "\n  Fix the parser  \nthen test");
        s.transcript.push(user("Fix the parser"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let actions = drain(&mut o);
        assert_eq!(
            written(&actions),
            [
                "open sess_1.jsonl Create",
                "session",
                "model",
                "update",
                "message"
            ]
        );
        let Some(Action::AppendTranscript { bytes, .. }) = actions.get(1) else {
            panic!("an append");
        };
        let head: Value =
            serde_json::from_slice(bytes.split(|b| *b == b'\n').next().unwrap_or(&[]))
                .unwrap_or_default();
        assert_eq!(head["title"], "Fix the parser");
        assert_eq!(head["cwd"], "/w");
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(drain(&mut o).is_empty(), "nothing new, nothing written");
    }

    #[test]
    fn a9_streamed_text_is_one_record_per_run_written_with_its_message() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "hi");
        s.transcript.push(user("hi"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        drain(&mut o);
        for piece in ["Hel", "lo"] {
            st.on_chunk(SID, "agent_message_chunk", piece);
            st.sync(&mut s);
            st.flush(SID, &mut o);
            assert!(
                drain(&mut o).is_empty(),
                "a stream is not written piece by piece"
            );
        }
        st.on_chunk(SID, "agent_thought_chunk", "hmm");
        s.transcript.push(answer("Hello", &[]));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let actions = drain(&mut o);
        assert_eq!(written(&actions), ["update", "update", "message"]);
        let Some(Action::AppendTranscript { bytes, .. }) = actions.first() else {
            panic!("an append");
        };
        let text = String::from_utf8_lossy(bytes);
        assert!(
            text.contains(r#""text":"Hello","type":"text"},"sessionUpdate":"agent_message_chunk""#),
            "{text}"
        );
    }

    #[test]
    fn a9_a_change_in_place_is_a_rewind_to_the_unchanged_prefix() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "hi");
        s.transcript.extend([user("hi"), answer("Done.", &[])]);
        st.sync(&mut s);
        st.flush(SID, &mut o);
        drain(&mut o);
        // A `_Stop` objection joins the answer (SPEC L10): the answer is rewritten.
        crate::hooks::append_injections(
            &mut s.transcript,
            crate::hooks::HookPoint::Stop,
            &[("guard".into(), "no".into())],
        );
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let actions = drain(&mut o);
        assert_eq!(written(&actions), ["rewind", "message", "message"]);
        let Some(Action::AppendTranscript { bytes, .. }) = actions.first() else {
            panic!("an append");
        };
        assert!(String::from_utf8_lossy(bytes).starts_with(r#"{"v":1,"type":"rewind","keep":1}"#));
        // A compaction replaces everything: a rewind to nothing, and the usage it forgot.
        s.transcript.record_usage(900);
        let all = s.transcript.take_messages();
        s.transcript.replace(vec![user("summary"), all[0].clone()]);
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert_eq!(
            written(&drain(&mut o)),
            ["rewind", "message", "message"],
            "the usage went from 0 to 900 and back within the step: nothing to record"
        );
    }

    #[test]
    fn a9_results_recorded_as_they_come_are_not_written_again_with_the_batch() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.extend([user("go"), answer("", &["a", "b"])]);
        let calls = [
            ToolCall {
                id: "a".into(),
                name: "fs__read".into(),
                arguments: "{}".into(),
            },
            ToolCall {
                id: "b".into(),
                name: "fs__read".into(),
                arguments: "{}".into(),
            },
        ];
        let update = json!({"sessionUpdate": "tool_call"});
        let announced: Vec<AnnouncedCall<'_>> = calls
            .iter()
            .enumerate()
            .map(|(index, call)| AnnouncedCall {
                index,
                acp_id: if index == 0 { "tc_1" } else { "tc_2" },
                call,
                update: &update,
            })
            .collect();
        st.on_tool_calls(&mut s, &announced);
        let ok = ToolOutput::plain("ok".into(), false);
        st.on_tool_result(SID, 1, "tc_2", &calls[1], &ok, false);
        st.on_tool_result(SID, 0, "tc_1", &calls[0], &ok, false);
        s.transcript.extend([result("a"), result("b")]);
        s.transcript.push(answer("Both read.", &[]));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert_eq!(
            written(&drain(&mut o)),
            [
                "open sess_1.jsonl Create",
                "session",
                "update",
                "message",
                "message",
                "tool_call",
                "tool_call",
                "tool_result",
                "tool_result",
                "message"
            ],
            "the results are written once, as they came"
        );
    }

    #[test]
    fn a9_a_failed_write_stops_recording_with_one_error_and_the_session_goes_on() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.push(user("go"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let file = drain(&mut o)
            .iter()
            .find_map(|a| {
                if let Action::OpenTranscript { file, .. } = a {
                    Some(*file)
                } else {
                    None
                }
            })
            .unwrap_or(TranscriptId(0));
        let failed = TranscriptEvent::Failed(TranscriptError::Io("No space left on device".into()));
        assert!(st.on_file_event(file, failed.clone(), &mut o).is_empty());
        let actions = drain(&mut o);
        assert!(actions.contains(&Action::CloseTranscript { file }));
        let logs: Vec<&str> = actions
            .iter()
            .filter_map(|a| {
                if let Action::Log(r) = a {
                    Some(r.message.as_str())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            logs,
            [
                "session sess_1: cannot write its transcript /state/sess_1.jsonl: No space left on device; the session goes on without being saved"
            ]
        );
        st.on_file_event(file, failed, &mut o);
        s.transcript.push(answer("more", &[]));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(drain(&mut o).is_empty(), "no more writes, no second error");
    }

    /// The lines of a small transcript: a prompt, a tool round, an answer.
    fn sample_file() -> Vec<u8> {
        let recs = [
            Record::Session {
                session_id: "sess_1".into(),
                cwd: "/w".into(),
                title: "go".into(),
            },
            Record::Update(crate::acp::chunk_update("user_message_chunk", "go")),
            Record::Message(user("go")),
            Record::Message(answer("", &["a"])),
            call_record("tc_1", "a"),
            result_record(0, "tc_1", "a"),
            Record::Message(answer("Done.", &[])),
            Record::Usage {
                input_tokens: 42,
                mark: 3,
            },
            Record::Permission {
                tool: "fs__read".into(),
                allow: true,
            },
        ];
        recs.iter()
            .map(Record::to_line)
            .collect::<String>()
            .into_bytes()
    }

    /// Runs a load of `SID` through its phases with `bytes` fed in `chunk`-byte pieces.
    fn load(bytes: &[u8], chunk: usize) -> (Vec<StoreEvent>, Vec<Action>) {
        let (events, actions, _) = load_keeping(bytes, chunk);
        (events, actions)
    }

    /// [`load`], also giving the store.
    fn load_keeping(bytes: &[u8], chunk: usize) -> (Vec<StoreEvent>, Vec<Action>, SessionStore) {
        let (mut st, mut o) = (store(), out());
        st.begin_load(SID, "/w", true, &mut o);
        let file = TranscriptId(1);
        assert_eq!(
            drain(&mut o),
            [Action::OpenTranscript {
                file,
                name: "sess_1.jsonl".into(),
                mode: OpenMode::Existing
            }]
        );
        let ev = st.on_file_event(file, TranscriptEvent::Opened, &mut o);
        assert!(matches!(ev[..], [StoreEvent::Opened(SID)]));
        st.read(SID, &mut o);
        assert_eq!(drain(&mut o), [Action::ReadTranscript { file }]);
        let mut events = Vec::new();
        for piece in bytes.chunks(chunk.max(1)) {
            events.extend(st.on_file_event(file, TranscriptEvent::Bytes(piece.to_vec()), &mut o));
        }
        events.extend(st.on_file_event(file, TranscriptEvent::End, &mut o));
        (events, drain(&mut o), st)
    }

    #[test]
    fn a9_a_transcript_loads_the_same_whatever_its_chunks_and_replays_what_the_client_saw() {
        let bytes = sample_file();
        let (events, actions) = load(&bytes, bytes.len());
        let [StoreEvent::Loaded(SID, restored)] = &events[..] else {
            panic!("loaded: {events:?}");
        };
        let t = &restored.transcript;
        assert_eq!(
            t.messages(),
            [
                user("go"),
                answer("", &["a"]),
                result("a"),
                answer("Done.", &[])
            ]
        );
        assert_eq!(
            (t.last_input_tokens, t.usage_mark, t.calls_issued()),
            (42, 3, 1)
        );
        assert_eq!(restored.remembered.get("fs__read"), Some(&true));
        let replay: Vec<String> = actions
            .iter()
            .filter_map(|a| {
                if let Action::WriteAcp(l) = a {
                    Some(l.clone())
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            replay.len(),
            3,
            "the prompt, the tool call, its result: {replay:?}"
        );
        assert!(
            replay[2].contains(r#""status":"completed""#),
            "{}",
            replay[2]
        );
        for chunk in [1, 7, 100] {
            let (again, _) = load(&bytes, chunk);
            let [StoreEvent::Loaded(_, r)] = &again[..] else {
                panic!("loaded");
            };
            assert_eq!(r.transcript, restored.transcript, "chunks of {chunk}");
        }
    }

    #[test]
    fn a9_a_torn_tail_is_cut_and_calls_left_running_get_an_error_result_recorded() {
        let bytes = sample_file();
        // Up to the tool call, then half of the result line.
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let cut = text.find("{\"v\":1,\"type\":\"tool_result\"").unwrap_or(0) + 30;
        let (events, actions, mut st) = load_keeping(&bytes[..cut], 64);
        let [StoreEvent::Loaded(SID, restored)] = &events[..] else {
            panic!("loaded: {events:?}");
        };
        assert_eq!(
            restored.transcript.messages()[2],
            Message::ToolResult {
                call_id: "a".into(),
                name: "fs__read".into(),
                text: INTERRUPTED_TEXT.into(),
                is_error: true,
            }
        );
        let whole = text.find("{\"v\":1,\"type\":\"tool_result\"").unwrap_or(0) as u64;
        assert!(actions.contains(&Action::TruncateTranscript {
            file: TranscriptId(1),
            len: whole
        }));
        assert!(
            actions
                .iter()
                .any(|a| matches!(a, Action::WriteAcp(l) if l.contains(r#""status":"failed""#)))
        );
        assert!(actions.iter().any(
            |a| matches!(a, Action::Log(r) if r.level == LogLevel::Warn && r.message.contains("torn line"))
        ));
        // The repair is recorded with the next append (after the cut), so the next load sees
        // the call closed.
        let mut o = out();
        st.flush(SID, &mut o);
        assert_eq!(written(&drain(&mut o)), ["tool_result"]);
    }

    #[test]
    fn a9_load_failures_name_the_file_and_line_and_map_to_their_codes() {
        let mut bad = sample_file();
        bad.extend_from_slice(b"{\"v\":1,\"type\":\"rewind\",\"keep\":99}\nmore\n");
        let (events, actions) = load(&bad, 5);
        let [StoreEvent::LoadFailed { code, message, .. }] = &events[..] else {
            panic!("failed: {events:?}");
        };
        assert_eq!(*code, RpcError::SERVER_ERROR);
        assert_eq!(
            message,
            "cannot load session sess_1: /state/sess_1.jsonl line 10: rewind to 99 items of a history of 4"
        );
        assert!(actions.contains(&Action::CloseTranscript {
            file: TranscriptId(1)
        }));
        assert!(
            !actions.iter().any(|a| matches!(
                a,
                Action::AppendTranscript { .. } | Action::TruncateTranscript { .. }
            )),
            "never written"
        );
        for (e, want) in [
            (TranscriptError::NotFound, RpcError::RESOURCE_NOT_FOUND),
            (TranscriptError::Locked, RpcError::SERVER_ERROR),
        ] {
            let (mut st, mut o) = (store(), out());
            st.begin_load(SID, "/w", true, &mut o);
            let ev = st.on_file_event(TranscriptId(1), TranscriptEvent::Failed(e), &mut o);
            assert!(matches!(ev[..], [StoreEvent::LoadFailed { code, .. }] if code == want));
            assert!(!st.is_loading(SID));
        }
    }

    #[test]
    fn a9_a_listing_is_paged_newest_first_with_a_cursor() {
        let (mut st, mut o) = (store(), out());
        let entries: Vec<TranscriptEntry> = (1..=60u128)
            .map(|n| {
                let sid = SessionId(n);
                TranscriptEntry {
                    name: sid.file_name(),
                    modified_ms: 1_000 * n as u64,
                    head: Record::Session {
                        session_id: sid.to_string(),
                        cwd: if n % 2 == 0 { "/a" } else { "/b" }.into(),
                        title: format!("t{n}"),
                    }
                    .to_line()
                    .into_bytes(),
                }
            })
            .collect();
        st.list(RpcId::Num(1.into()), None, None, &mut o).ok();
        assert_eq!(drain(&mut o), [Action::ListTranscripts { request: 1 }]);
        st.on_list(1, Ok(entries.clone()), &mut o);
        let page = last_result(&mut o);
        assert_eq!(
            page["sessions"].as_array().map(Vec::len),
            Some(LIST_PAGE_SIZE)
        );
        assert_eq!(page["sessions"][0]["sessionId"], "sess_60");
        assert_eq!(page["sessions"][0]["updatedAt"], "1970-01-01T00:01:00.000Z");
        let cursor = page["nextCursor"].as_str().unwrap_or("").to_owned();
        st.list(
            RpcId::Num(2.into()),
            Some("/a".into()),
            Some(&cursor),
            &mut o,
        )
        .ok();
        drain(&mut o);
        st.on_list(2, Ok(entries), &mut o);
        let page = last_result(&mut o);
        let ids = crate::json::strs_of(&page["sessions"], "sessionId");
        assert_eq!(ids, ["sess_10", "sess_8", "sess_6", "sess_4", "sess_2"]);
        assert!(page.get("nextCursor").is_none());
        assert!(
            st.list(RpcId::Num(3.into()), None, Some("x"), &mut o)
                .is_err()
        );
    }

    // ---- more of the store's rules, one test each (issue 13: tests that can fail)

    /// The lines of `recs`, as the agent writes them.
    /// The record announcing tool call `tool_call_id` (the model's `call_id`, index 0,
    /// `fs__read`).
    fn call_record(tool_call_id: &str, call_id: &str) -> Record {
        Record::ToolCall {
            index: 0,
            tool_call_id: tool_call_id.into(),
            call_id: call_id.into(),
            name: "fs__read".into(),
            update: json!({"sessionUpdate": "tool_call", "toolCallId": tool_call_id}),
        }
    }

    /// The record of that call's result `ok` at batch position `index`.
    fn result_record(index: usize, tool_call_id: &str, call_id: &str) -> Record {
        Record::ToolResult {
            index,
            tool_call_id: Some(tool_call_id.into()),
            call_id: call_id.into(),
            name: "fs__read".into(),
            text: "ok".into(),
            is_error: false,
            failed: false,
        }
    }

    fn file_of(recs: &[Record]) -> Vec<u8> {
        recs.iter()
            .map(Record::to_line)
            .collect::<String>()
            .into_bytes()
    }

    /// The header of `SID`'s file.
    fn header() -> Record {
        Record::Session {
            session_id: "sess_1".into(),
            cwd: "/w".into(),
            title: "go".into(),
        }
    }

    /// The text of every log line of `actions` at `level`.
    fn logs_at(actions: &[Action], level: LogLevel) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::Log(r) = a
                    && r.level == level
                {
                    Some(r.message.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    /// The client lines of `actions` (the replay).
    fn acp_lines(actions: &[Action]) -> Vec<String> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::WriteAcp(l) = a {
                    Some(l.clone())
                } else {
                    None
                }
            })
            .collect()
    }

    /// The records appended by `actions`, as JSON.
    fn appended(actions: &[Action]) -> Vec<Value> {
        actions
            .iter()
            .filter_map(|a| {
                if let Action::AppendTranscript { bytes, .. } = a {
                    Some(bytes)
                } else {
                    None
                }
            })
            .flat_map(|bytes| {
                String::from_utf8_lossy(bytes)
                    .lines()
                    .map(|l| serde_json::from_str::<Value>(l).unwrap_or_default())
                    .collect::<Vec<Value>>()
            })
            .collect()
    }

    /// What a load of `bytes` restored; panics when it failed.
    fn restored(bytes: &[u8]) -> (Box<Restored>, Vec<Action>) {
        let (mut events, actions) = load(bytes, 64);
        match events.pop() {
            Some(StoreEvent::Loaded(SID, r)) if events.is_empty() => (r, actions),
            other => panic!("loaded: {other:?} after {events:?}"),
        }
    }

    /// Why a load of `bytes` failed; panics when it did not.
    fn load_error(bytes: &[u8]) -> String {
        let (events, _) = load(bytes, 64);
        match &events[..] {
            [StoreEvent::LoadFailed { code, message, .. }] => {
                assert_eq!(*code, RpcError::SERVER_ERROR);
                message.clone()
            }
            other => panic!("failed: {other:?}"),
        }
    }

    #[test]
    fn a9_a_title_is_the_first_non_blank_line_cut_to_80_characters() {
        assert_eq!(title_of("\n \t\n  Fix it  \nmore"), "Fix it");
        assert_eq!(title_of(""), "");
        let fits = "é".repeat(TITLE_CHARS);
        assert_eq!(title_of(&fits), fits, "80 characters (160 bytes) fit");
        let long = format!("{}xyz", "a".repeat(TITLE_CHARS));
        let title = title_of(&long);
        assert_eq!(title, format!("{}…", "a".repeat(TITLE_CHARS - 1)));
        assert_eq!(title.chars().count(), TITLE_CHARS);
    }

    #[test]
    fn a9_an_item_changed_in_the_step_it_was_appended_is_written_once_without_a_rewind() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "hi");
        s.transcript.push(user("hi"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        drain(&mut o);
        // The answer comes and a `_Stop` objection joins it before the step ends.
        s.transcript.push(answer("Done.", &[]));
        crate::hooks::append_injections(
            &mut s.transcript,
            crate::hooks::HookPoint::Stop,
            &[("guard".into(), "no".into())],
        );
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert_eq!(written(&drain(&mut o)), ["message", "message"]);
    }

    #[test]
    fn a7_a9_a_remembered_permission_answer_is_recorded_when_it_changes() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.push(user("go"));
        s.remembered.insert("fs__write".into(), true);
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let records = appended(&drain(&mut o));
        assert_eq!(
            records.last(),
            Some(&json!({"v": 1, "type": "permission", "tool": "fs__write", "allow": true}))
        );
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(
            drain(&mut o).is_empty(),
            "the same answer is not written again"
        );
        s.remembered.insert("fs__write".into(), false);
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert_eq!(
            appended(&drain(&mut o)),
            [json!({"v": 1, "type": "permission", "tool": "fs__write", "allow": false})]
        );
    }

    #[test]
    fn a9_with_persistence_off_nothing_is_recorded() {
        let (mut st, mut o, mut s) = (SessionStore::new(&StateDir::Off), out(), session());
        assert!(!st.is_on());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.push(user("go"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(drain(&mut o).is_empty());
        assert!(store().is_on());
    }

    #[test]
    fn a9_each_session_has_its_own_file_and_a_failed_write_stops_only_its_own() {
        let (mut st, mut o) = (store(), out());
        let two = SessionId(2);
        let mut sessions = [session(), Session::new(two, Vec::new())];
        for s in &mut sessions {
            st.on_new(s.id, "/w");
            st.on_prompt(s.id, "go");
            s.transcript.push(user("go"));
            st.sync(s);
            st.flush(s.id, &mut o);
        }
        let opened: Vec<(TranscriptId, String)> = drain(&mut o)
            .into_iter()
            .filter_map(|a| {
                if let Action::OpenTranscript { file, name, .. } = a {
                    Some((file, name))
                } else {
                    None
                }
            })
            .collect();
        assert_eq!(
            opened,
            [
                (TranscriptId(1), "sess_1.jsonl".into()),
                (TranscriptId(2), "sess_2.jsonl".into())
            ]
        );
        let failed = TranscriptEvent::Failed(TranscriptError::Locked);
        assert!(st.on_file_event(TranscriptId(2), failed, &mut o).is_empty());
        assert_eq!(
            logs_at(&drain(&mut o), LogLevel::Error),
            [
                "session sess_2: cannot write its transcript /state/sess_2.jsonl: it is locked by another process; the session goes on without being saved"
            ]
        );
        for s in &mut sessions {
            s.transcript.push(answer("Done.", &[]));
            st.sync(s);
            st.flush(s.id, &mut o);
        }
        assert!(matches!(
            &drain(&mut o)[..],
            [Action::AppendTranscript {
                file: TranscriptId(1),
                ..
            }]
        ));
    }

    #[test]
    fn a9_closing_a_session_closes_its_file_or_its_load_and_later_news_is_ignored() {
        let (mut st, mut o, mut s, before) = recording();
        s.transcript.push(answer("Half done.", &[]));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let appended = before + appended_bytes(&drain(&mut o));
        st.close(SID, &mut o);
        assert_eq!(
            drain(&mut o),
            [Action::SyncTranscript {
                file: TranscriptId(1),
                mark: appended
            }],
            "at close, what was written is synced first"
        );
        assert!(
            st.on_file_event(TranscriptId(1), TranscriptEvent::Synced(appended), &mut o)
                .is_empty()
        );
        assert_eq!(
            drain(&mut o),
            [Action::CloseTranscript {
                file: TranscriptId(1)
            }]
        );
        let failed = TranscriptEvent::Failed(TranscriptError::Io("gone".into()));
        assert!(st.on_file_event(TranscriptId(1), failed, &mut o).is_empty());
        s.transcript.push(answer("Done.", &[]));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        assert!(drain(&mut o).is_empty(), "no error, no write: {st:?}");
        // A session closed while its file is being opened for a load.
        let two = SessionId(2);
        st.begin_load(two, "/w", false, &mut o);
        assert!(st.is_loading(two));
        drain(&mut o);
        st.close(two, &mut o);
        assert!(!st.is_loading(two));
        assert_eq!(
            drain(&mut o),
            [Action::CloseTranscript {
                file: TranscriptId(2)
            }]
        );
        assert!(
            st.on_file_event(TranscriptId(2), TranscriptEvent::Opened, &mut o)
                .is_empty()
        );
    }

    /// The bytes the appends of `actions` hand to the runtime.
    fn appended_bytes(actions: &[Action]) -> u64 {
        actions
            .iter()
            .map(|a| {
                if let Action::AppendTranscript { bytes, .. } = a {
                    bytes.len() as u64
                } else {
                    0
                }
            })
            .sum()
    }

    /// A store recording `SID` with its first prompt written (and synced: nothing waits).
    fn recording() -> (SessionStore, Outbox, Session, u64) {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.push(user("go"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        let written = appended_bytes(&drain(&mut o));
        st.on_file_event(TranscriptId(1), TranscriptEvent::Synced(written), &mut o);
        assert!(drain(&mut o).is_empty());
        (st, o, s, written)
    }

    #[test]
    fn a9_an_answer_waits_until_the_turns_records_turn_end_included_are_synced() {
        let (mut st, mut o, mut s, before) = recording();
        s.transcript.push(answer("Done.", &[]));
        st.sync(&mut s);
        st.on_turn_end(SID, Some("end_turn"), json!({}));
        st.send_when_synced(SID, "answer\n".into(), &mut o);
        let actions = drain(&mut o);
        assert_eq!(written(&actions[..1]), ["message", "turn_end"]);
        let mark = before + appended_bytes(&actions);
        assert_eq!(
            actions[1..],
            [Action::SyncTranscript {
                file: TranscriptId(1),
                mark
            }],
            "the records, then one sync; no answer yet"
        );
        assert!(st.is_holding(SID));
        // A sync asked for earlier does not cover the turn.
        assert!(
            st.on_file_event(TranscriptId(1), TranscriptEvent::Synced(before), &mut o)
                .is_empty()
        );
        assert!(drain(&mut o).is_empty());
        let events = st.on_file_event(TranscriptId(1), TranscriptEvent::Synced(mark), &mut o);
        assert!(matches!(events[..], [StoreEvent::Released(SID)]));
        assert_eq!(acp_lines(&drain(&mut o)), ["answer\n"]);
        assert!(!st.is_holding(SID));
        // Nothing new written: the next line goes at once, without a sync.
        st.send_when_synced(SID, "again\n".into(), &mut o);
        assert_eq!(drain(&mut o), [Action::WriteAcp("again\n".into())]);
    }

    #[test]
    fn a9_unsaved_sessions_answer_at_once() {
        let mut off = SessionStore::new(&StateDir::Off);
        let mut o = out();
        off.on_new(SID, "/w");
        off.send_when_synced(SID, "answer\n".into(), &mut o);
        assert_eq!(drain(&mut o), [Action::WriteAcp("answer\n".into())]);
        assert!(!off.is_holding(SID));
    }

    #[test]
    fn a9_a_failed_sync_sends_what_waited_and_the_session_goes_on_unsaved() {
        let (mut st, mut o, mut s, _) = recording();
        s.transcript.push(answer("Done.", &[]));
        st.sync(&mut s);
        st.send_when_synced(SID, "answer\n".into(), &mut o);
        drain(&mut o);
        let failed = TranscriptEvent::Failed(TranscriptError::Io("Input/output error".into()));
        let events = st.on_file_event(TranscriptId(1), failed, &mut o);
        assert!(matches!(events[..], [StoreEvent::Released(SID)]));
        let actions = drain(&mut o);
        assert_eq!(acp_lines(&actions), ["answer\n"]);
        assert!(actions.contains(&Action::CloseTranscript {
            file: TranscriptId(1)
        }));
        assert!(actions.iter().any(
            |a| matches!(a, Action::Log(r) if r.message.contains("goes on without being saved"))
        ));
        s.transcript.push(user("next"));
        st.sync(&mut s);
        st.send_when_synced(SID, "next\n".into(), &mut o);
        assert_eq!(drain(&mut o), [Action::WriteAcp("next\n".into())]);
        st.close(SID, &mut o);
        assert!(drain(&mut o).is_empty(), "closed already");
    }

    #[test]
    fn a9_a_close_syncs_then_closes_then_sends_what_waited_and_its_own_answer() {
        let (mut st, mut o, mut s, _) = recording();
        s.transcript.push(answer("Done.", &[]));
        st.sync(&mut s);
        st.send_when_synced(SID, "prompt answer\n".into(), &mut o);
        let first = drain(&mut o);
        let Some(&Action::SyncTranscript { mark, .. }) = first.last() else {
            panic!("a sync: {first:?}");
        };
        st.close_then_send(SID, Some("close answer\n".into()), &mut o);
        assert!(
            drain(&mut o).is_empty(),
            "the sync asked for covers the close"
        );
        assert!(st.has_file(SID), "open until synced");
        assert!(
            st.on_file_event(TranscriptId(1), TranscriptEvent::Synced(mark), &mut o)
                .is_empty()
        );
        assert_eq!(
            drain(&mut o),
            [
                Action::CloseTranscript {
                    file: TranscriptId(1)
                },
                Action::WriteAcp("prompt answer\n".into()),
                Action::WriteAcp("close answer\n".into()),
            ],
            "the lock is released before the answers"
        );
        assert!(!st.has_file(SID));
        // With everything synced already, a close needs no sync.
        let (mut st, mut o, _, _) = recording();
        st.close_then_send(SID, Some("closed\n".into()), &mut o);
        assert_eq!(
            drain(&mut o),
            [
                Action::CloseTranscript {
                    file: TranscriptId(1)
                },
                Action::WriteAcp("closed\n".into())
            ]
        );
    }

    #[test]
    fn a9_at_exit_every_held_answer_is_sent() {
        let (mut st, mut o, mut s, _) = recording();
        s.transcript.push(answer("Done.", &[]));
        st.sync(&mut s);
        st.send_when_synced(SID, "answer\n".into(), &mut o);
        drain(&mut o);
        st.release_all(&mut o);
        assert_eq!(drain(&mut o), [Action::WriteAcp("answer\n".into())]);
        assert!(!st.is_holding(SID));
    }

    #[test]
    fn a8_a9_a_turn_end_is_recorded_after_the_text_the_client_saw() {
        let (mut st, mut o, mut s) = (store(), out(), session());
        st.on_new(SID, "/w");
        st.on_prompt(SID, "go");
        s.transcript.push(user("go"));
        st.sync(&mut s);
        st.flush(SID, &mut o);
        drain(&mut o);
        // A cancelled turn: the streamed text never became a history item.
        st.on_chunk(SID, "agent_message_chunk", "Work");
        st.sync(&mut s);
        st.on_turn_end(SID, Some("cancelled"), json!({"buzz": {"rounds": 1}}));
        st.on_turn_end(SID, None, json!("llm: HTTP 500"));
        st.flush(SID, &mut o);
        let records = appended(&drain(&mut o));
        assert_eq!(records.len(), 3, "{records:?}");
        assert_eq!(records[0]["update"]["content"]["text"], "Work");
        assert_eq!(
            records[1],
            json!({"v": 1, "type": "turn_end", "stopReason": "cancelled",
                "meta": {"buzz": {"rounds": 1}}})
        );
        assert_eq!(
            records[2],
            json!({"v": 1, "type": "turn_end", "error": "llm: HTTP 500"})
        );
    }

    #[test]
    fn a9_after_each_step_every_started_session_is_recorded() {
        let (mut st, mut o) = (store(), out());
        let mut sessions = [session()];
        st.on_new(SID, "/w");
        st.sync_all(&mut sessions, &mut o);
        assert!(drain(&mut o).is_empty(), "no prompt yet");
        st.on_prompt(SID, "go");
        sessions[0].transcript.push(user("go"));
        st.sync_all(&mut sessions, &mut o);
        assert_eq!(
            written(&drain(&mut o)),
            ["open sess_1.jsonl Create", "session", "update", "message"]
        );
    }

    #[test]
    fn a9_a_listing_pages_through_equal_times_in_name_order_once_each() {
        // Times with ties across the page boundaries (groups of 7), ending exactly at them
        // (groups of 10), and all different.
        for group in [7, 10, 1] {
            let entries: Vec<TranscriptEntry> = (1..=110u64)
                .map(|n| {
                    let sid = SessionId(u128::from(n));
                    TranscriptEntry {
                        name: sid.file_name(),
                        modified_ms: 1_000 * ((n - 1) / group),
                        head: Record::Session {
                            session_id: sid.to_string(),
                            cwd: "/w".into(),
                            title: String::new(),
                        }
                        .to_line()
                        .into_bytes(),
                    }
                })
                .collect();
            let mut want: Vec<(u64, String)> = entries
                .iter()
                .map(|e| (e.modified_ms, e.name.clone()))
                .collect();
            want.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
            let want: Vec<String> = want
                .into_iter()
                .map(|(_, name)| name.trim_end_matches(".jsonl").to_owned())
                .collect();
            let (mut st, mut o) = (store(), out());
            let (mut got, mut cursor, mut pages) = (Vec::new(), None::<String>, 0);
            loop {
                pages += 1;
                st.list(RpcId::Num(pages.into()), None, cursor.as_deref(), &mut o)
                    .ok();
                let Some(Action::ListTranscripts { request }) = drain(&mut o).pop() else {
                    panic!("a listing");
                };
                st.on_list(request, Ok(entries.clone()), &mut o);
                let page = last_result(&mut o);
                let ids = page["sessions"].as_array().cloned().unwrap_or_default();
                assert!(ids.len() <= LIST_PAGE_SIZE);
                got.extend(
                    ids.iter()
                        .map(|s| s["sessionId"].as_str().unwrap_or("?").to_owned()),
                );
                cursor = page["nextCursor"].as_str().map(str::to_owned);
                if cursor.is_none() || pages == 4 {
                    break;
                }
            }
            assert_eq!((got, pages), (want, 3), "groups of {group}");
        }
    }

    #[test]
    fn a9_a_listing_skips_a_file_whose_first_line_is_not_its_own_header() {
        let (mut st, mut o) = (store(), out());
        let head = |sid: &str| {
            Record::Session {
                session_id: sid.into(),
                cwd: "/w".into(),
                title: "t".into(),
            }
            .to_line()
            .into_bytes()
        };
        let entry = |name: &str, head: Vec<u8>| TranscriptEntry {
            name: name.into(),
            modified_ms: 5,
            head,
        };
        let entries = vec![
            entry("sess_1.jsonl", head("sess_1")),
            entry("sess_2.jsonl", head("sess_3")),
            entry(
                "sess_4.jsonl",
                Record::Rewind { keep: 0 }.to_line().into_bytes(),
            ),
            entry("notes.txt", head("sess_5")),
        ];
        st.list(RpcId::Num(1.into()), None, None, &mut o).ok();
        drain(&mut o);
        st.on_list(1, Ok(entries), &mut o);
        let actions = drain(&mut o);
        assert_eq!(
            logs_at(&actions, LogLevel::Warn),
            [
                "session/list: skipped /state/sess_2.jsonl: its first line is not this session's header",
                "session/list: skipped /state/sess_4.jsonl: its first line is not this session's header"
            ]
        );
        let Some(Action::WriteAcp(reply)) = actions.last() else {
            panic!("a reply");
        };
        let reply: Value = serde_json::from_str(reply).unwrap_or_default();
        assert_eq!(
            reply["result"]["sessions"],
            json!([{"sessionId": "sess_1", "cwd": "/w", "title": "t",
                "updatedAt": "1970-01-01T00:00:00.005Z"}])
        );
    }

    #[test]
    fn a9_the_call_counter_goes_on_after_the_highest_tc_or_hook_call_number() {
        let bytes = file_of(&[
            header(),
            Record::Message(user("go")),
            // A hook call joined the answer: its id is numbered, its result is a message.
            Record::Message(answer("", &["buzz_hook_stop_7"])),
            Record::Message(result("buzz_hook_stop_7")),
            Record::Message(answer("", &["call_x"])),
            call_record("tc_3", "call_x"),
            result_record(0, "tc_3", "call_x"),
            Record::Message(answer("Done.", &[])),
        ]);
        let (r, _) = restored(&bytes);
        assert_eq!(r.transcript.calls_issued(), 7);
        assert_eq!(r.transcript.len(), 6);
        let bytes = file_of(&[
            header(),
            Record::Message(user("go")),
            Record::Message(answer("", &["call_x"])),
            call_record("tc_12", "call_x"),
        ]);
        assert_eq!(restored(&bytes).0.transcript.calls_issued(), 12);
    }

    #[test]
    fn a9_i9_a_load_warns_about_repaired_calls_and_about_an_empty_file() {
        let (_, actions) = restored(&sample_file());
        assert_eq!(logs_at(&actions, LogLevel::Warn), Vec::<String>::new());
        let bytes = file_of(&[
            header(),
            Record::Message(user("go")),
            Record::Message(answer("", &["a", "b"])),
        ]);
        let (r, actions) = restored(&bytes);
        assert_eq!(r.transcript.len(), 4);
        assert_eq!(
            logs_at(&actions, LogLevel::Warn),
            [
                "session sess_1: 2 tool call(s) were still running when the agent stopped; closed with an error result"
            ]
        );
        let (r, actions) = restored(b"");
        assert!(r.transcript.messages().is_empty());
        assert_eq!(
            logs_at(&actions, LogLevel::Warn),
            ["session sess_1: /state/sess_1.jsonl holds no record; loaded as an empty session"]
        );
    }

    #[test]
    fn a9_a_header_naming_another_session_fails_the_load() {
        let bytes = file_of(&[Record::Session {
            session_id: "sess_2".into(),
            cwd: "/w".into(),
            title: "go".into(),
        }]);
        assert_eq!(
            load_error(&bytes),
            "cannot load session sess_1: /state/sess_1.jsonl line 1: the header names another session (sess_2)"
        );
    }

    #[test]
    fn a9_results_written_as_messages_join_the_history_in_call_order() {
        let bytes = file_of(&[
            header(),
            Record::Message(user("go")),
            Record::Message(answer("", &["a", "b"])),
            Record::Message(result("b")),
            Record::Message(result("a")),
            Record::Message(answer("Done.", &[])),
        ]);
        assert_eq!(
            restored(&bytes).0.transcript.messages(),
            [
                user("go"),
                answer("", &["a", "b"]),
                result("a"),
                result("b"),
                answer("Done.", &[])
            ]
        );
    }

    #[test]
    fn a9_a_rewind_may_keep_the_whole_history_but_not_more() {
        let mut recs = vec![
            header(),
            Record::Message(user("go")),
            Record::Message(answer("Hi.", &[])),
            Record::Rewind { keep: 2 },
            Record::Message(user("more")),
        ];
        assert_eq!(
            restored(&file_of(&recs)).0.transcript.messages(),
            [user("go"), answer("Hi.", &[]), user("more")]
        );
        recs.push(Record::Rewind { keep: 4 });
        assert_eq!(
            load_error(&file_of(&recs)),
            "cannot load session sess_1: /state/sess_1.jsonl line 6: rewind to 4 items of a history of 3"
        );
    }

    #[test]
    fn a9_a_tool_result_at_a_position_its_batch_does_not_have_fails_the_load() {
        for index in [1, 2] {
            let bytes = file_of(&[
                header(),
                Record::Message(user("go")),
                Record::Message(answer("", &["a"])),
                result_record(index, "tc_1", "a"),
            ]);
            assert_eq!(
                load_error(&bytes),
                "cannot load session sess_1: /state/sess_1.jsonl line 4: a tool result (a) without its tool call",
                "index {index}"
            );
        }
    }

    #[test]
    fn a9_i9_calls_a_rewind_dropped_are_not_closed_with_an_invented_result() {
        let bytes = file_of(&[
            header(),
            Record::Message(user("go")),
            Record::Message(answer("", &["a"])),
            call_record("tc_1", "a"),
            Record::Rewind { keep: 1 },
            Record::Message(answer("Plain.", &[])),
        ]);
        let (r, actions) = restored(&bytes);
        assert_eq!(r.transcript.messages(), [user("go"), answer("Plain.", &[])]);
        let replay = acp_lines(&actions);
        assert_eq!(
            replay.len(),
            1,
            "only the tool call as announced: {replay:?}"
        );
        assert!(replay[0].contains(r#""sessionUpdate":"tool_call""#));
        assert_eq!(logs_at(&actions, LogLevel::Warn), Vec::<String>::new());
    }

    /// Loads `SID` up to reading, with every byte of `bulk` fed `times` times.
    fn reading_after(bulk: &[u8], times: usize) -> (SessionStore, Outbox) {
        let (mut st, mut o) = (store(), out());
        st.begin_load(SID, "/w", false, &mut o);
        st.on_file_event(TranscriptId(1), TranscriptEvent::Opened, &mut o);
        st.read(SID, &mut o);
        for _ in 0..times {
            let ev = st.on_file_event(
                TranscriptId(1),
                TranscriptEvent::Bytes(bulk.to_vec()),
                &mut o,
            );
            assert!(ev.is_empty(), "{ev:?}");
        }
        drain(&mut o);
        (st, o)
    }

    #[test]
    fn a9_a_record_line_may_be_long_up_to_256_mib_and_no_longer() {
        // A 2 MiB prompt, its line fed in two pieces.
        let big = "x".repeat(2 << 20);
        let bytes = file_of(&[header(), Record::Message(user(&big))]);
        let (mut st, mut o) = reading_after(&bytes[..bytes.len() / 2], 1);
        st.on_file_event(
            TranscriptId(1),
            TranscriptEvent::Bytes(bytes[bytes.len() / 2..].to_vec()),
            &mut o,
        );
        let ev = st.on_file_event(TranscriptId(1), TranscriptEvent::End, &mut o);
        let [StoreEvent::Loaded(SID, r)] = &ev[..] else {
            panic!("loaded: {ev:?}");
        };
        assert_eq!(r.transcript.messages(), [user(&big)]);
        // Exactly the longest line: read (and found not to be JSON).
        let chunk = vec![b'x'; 16 << 20];
        assert_eq!(MAX_RECORD_BYTES, 16 * chunk.len());
        for (last, why) in [
            (
                &b"\n"[..],
                "line 1: not JSON: expected value at line 1 column 1",
            ),
            (b"x", "line 1: longer than 256 MiB"),
        ] {
            let (mut st, mut o) = reading_after(&chunk, 16);
            let ev = st.on_file_event(
                TranscriptId(1),
                TranscriptEvent::Bytes(last.to_vec()),
                &mut o,
            );
            let [StoreEvent::LoadFailed { message, .. }] = &ev[..] else {
                panic!("failed: {ev:?}");
            };
            assert_eq!(
                message,
                &format!("cannot load session sess_1: /state/sess_1.jsonl {why}")
            );
        }
    }
}
