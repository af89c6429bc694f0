//! What a session's project gives the agent besides its prompt (SPEC A10, docs/context.md):
//! project instructions (`AGENTS.md` files) and Agent Skills (`SKILL.md` folders). Reading
//! files is IO, so the core only says what to read ([`ReadSpec`], in
//! [`Action::ReadProject`](crate::Action::ReadProject)) and is given what was read
//! ([`ProjectFiles`], in [`Input::ProjectRead`](crate::Input::ProjectRead)); every decision
//! about the bytes (caps, what is broken, the system prompt, `load_skill`) is the core's.
//!
//! The runtime's reader must stay bounded whatever the disk holds: it reads at most
//! [`ReadSpec::max_instruction_bytes`] of each `AGENTS.md` and [`ReadSpec::max_skill_bytes`]
//! of each `SKILL.md` (reporting the whole size beside the bytes), reads at most
//! [`ReadSpec::max_skills`] skill folders, lists at most [`ReadSpec::max_skill_files`] other
//! files of each, and never follows a symbolic link into a directory it already walks.

use std::fmt;

/// The name of a project instructions file (the `AGENTS.md` convention).
pub const INSTRUCTIONS_FILE: &str = "AGENTS.md";
/// The file that makes a folder a skill (the Agent Skills format).
pub const SKILL_FILE: &str = "SKILL.md";
/// Where skills live below the git root, the session's cwd and the home directory.
pub const SKILLS_DIR: &str = ".agents/skills";
/// Bytes of one `SKILL.md` read at most; a bigger one is skipped (its body would not fit a
/// tool result either).
pub const MAX_SKILL_BYTES: usize = 64 * 1024;
/// Skill folders read per session at most, across every skills directory; more are left out
/// with a warning.
pub const MAX_SKILLS: usize = 64;
/// Other files of one skill listed at most (their paths only).
pub const MAX_SKILL_FILES: usize = 50;
/// Entries of one skills directory looked at at most (a directory of a million entries costs
/// no more than this).
pub const MAX_DIR_ENTRIES: usize = 10_000;

/// What to read for a session (built by the core from the configuration and the session's
/// `cwd`). Paths are absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadSpec {
    /// The session's working directory.
    pub cwd: String,
    /// The user-wide instructions file, `$XDG_CONFIG_HOME/buzz-agent/AGENTS.md` (or
    /// `$HOME/.config/buzz-agent/AGENTS.md`); `None` when neither variable is set.
    pub user_instructions: Option<String>,
    /// The user's skills directory, `$HOME/.agents/skills`; `None` without `HOME`.
    pub user_skills: Option<String>,
    /// Bytes read of each `AGENTS.md` at most (the instructions budget,
    /// `BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES`).
    pub max_instruction_bytes: usize,
    /// Bytes read of each `SKILL.md` at most ([`MAX_SKILL_BYTES`]).
    pub max_skill_bytes: usize,
    /// Skill folders read at most ([`MAX_SKILLS`]).
    pub max_skills: usize,
    /// Other files listed per skill at most ([`MAX_SKILL_FILES`]).
    pub max_skill_files: usize,
}

/// What the runtime read for a [`ReadSpec`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProjectFiles {
    /// The git root above (or at) the cwd: the nearest directory holding a `.git` entry.
    pub git_root: Option<String>,
    /// Every `AGENTS.md` that exists, in order: the user-wide file, then the git root's, then
    /// each directory's down to the cwd (only the cwd's without a git root). A file that could
    /// not be read is listed with its error.
    pub instructions: Vec<FileRead>,
    /// Every skill folder (a directory holding `SKILL.md`) of the skills directories, in
    /// order: the cwd's `.agents/skills`, the git root's, then the user's; inside each, by
    /// name.
    pub skills: Vec<SkillFolder>,
    /// What could not be looked at, one sentence each naming the path: a skills directory or
    /// folder that cannot be read (a symbolic link loop, no permission), skill folders left out
    /// over [`ReadSpec::max_skills`].
    pub problems: Vec<String>,
}

/// One file, read up to a cap.
#[derive(Clone, PartialEq, Eq)]
pub struct FileRead {
    /// Its absolute path.
    pub path: String,
    /// Its first bytes, or why it could not be read (the OS error, or "not a regular file").
    pub content: Result<FileContent, String>,
}

/// The first bytes of a file and its whole size.
#[derive(Clone, PartialEq, Eq)]
pub struct FileContent {
    /// At most the cap's bytes from the start of the file.
    pub bytes: Vec<u8>,
    /// The file's size in bytes (more than `bytes.len()` when it was cut).
    pub size: u64,
}

/// One skill folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkillFolder {
    /// The folder's absolute path (its last component is the skill's expected name).
    pub dir: String,
    /// Its `SKILL.md`, up to [`ReadSpec::max_skill_bytes`].
    pub skill_md: FileRead,
    /// The folder's other files, relative to it (such as scripts/run.sh), sorted, at most
    /// [`ReadSpec::max_skill_files`] (a folder's own files are taken before its subfolders');
    /// directories are walked without following symbolic links.
    pub files: Vec<String>,
    /// The folder holds more files than listed (over [`ReadSpec::max_skill_files`]; the walk
    /// stops there).
    pub more_files: bool,
}

impl fmt::Debug for FileRead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.content {
            Ok(c) => write!(
                f,
                "FileRead({}: {} of {} B)",
                self.path,
                c.bytes.len(),
                c.size
            ),
            Err(e) => write!(f, "FileRead({}: {e})", self.path),
        }
    }
}

impl fmt::Debug for FileContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FileContent({} of {} B)", self.bytes.len(), self.size)
    }
}
