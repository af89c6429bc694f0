//! The file half of a session's project instructions and skills (SPEC A10): reads what an
//! [`Action::ReadProject`] asks for, on a thread of its own (file IO blocks; the loop must
//! not), and answers with one [`Input::ProjectRead`]. The core decides everything about the
//! bytes; this only looks for files, bounded whatever the disk holds:
//!
//! - each file is opened non-blocking and must be a regular file (a FIFO or a device named
//!   `AGENTS.md` is refused, never waited on), and at most the spec's cap is read (its whole
//!   size comes from its metadata): a 100 MB `SKILL.md` costs one 64 KiB read;
//! - a skills directory is looked at up to [`MAX_DIR_ENTRIES`] entries, at most
//!   [`ReadSpec::max_skills`] skill folders are read, and each skill's other files are listed
//!   up to [`ReadSpec::max_skill_files`], walking real directories only (a symbolic link is
//!   listed, never followed), so a symbolic link loop ends the walk instead of looping;
//! - a missing file or directory is simply absent; any other failure is reported with the
//!   path and the OS error.

use crate::runtime::InputSender;
use buzz_agent_core::project::{
    FileContent, FileRead, INSTRUCTIONS_FILE, MAX_DIR_ENTRIES, ProjectFiles, ReadSpec, SKILL_FILE,
    SKILLS_DIR, SkillFolder,
};
use buzz_agent_core::{Action, Input};
use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Depth of directories below a skill folder that its file list walks at most.
const MAX_SKILL_DEPTH: usize = 4;

/// Starts the read of `action` (an [`Action::ReadProject`]) on a thread that sends its
/// answer to `tx`; returns the answer at once when no thread could be started (an empty
/// read naming the failure) or when `action` is not a project read (`None`).
pub fn start(action: Action, tx: &InputSender) -> Option<Input> {
    let Action::ReadProject { request, spec } = action else {
        return None;
    };
    let tx = tx.clone();
    let spawned = std::thread::Builder::new()
        .name("project-read".into())
        .spawn(move || {
            let files = read(&spec);
            let _ = tx.send_blocking(Input::ProjectRead { request, files });
        });
    match spawned {
        Ok(_) => None,
        Err(e) => Some(Input::ProjectRead {
            request,
            files: ProjectFiles {
                problems: vec![format!(
                    "the project files were not read: cannot start a thread: {e}"
                )],
                ..ProjectFiles::default()
            },
        }),
    }
}

/// Reads what `spec` asks for (blocking, bounded; see the module docs).
#[must_use]
pub fn read(spec: &ReadSpec) -> ProjectFiles {
    let cwd = Path::new(&spec.cwd);
    let git_root = find_git_root(cwd);
    let mut out = ProjectFiles {
        git_root: git_root.as_ref().map(|p| p.display().to_string()),
        ..ProjectFiles::default()
    };
    if let Some(user) = &spec.user_instructions
        && let Some(f) = read_if_present(Path::new(user), spec.max_instruction_bytes)
    {
        out.instructions.push(f);
    }
    for dir in root_to_cwd(git_root.as_deref(), cwd) {
        if let Some(f) = read_if_present(&dir.join(INSTRUCTIONS_FILE), spec.max_instruction_bytes) {
            out.instructions.push(f);
        }
    }
    let mut skill_dirs: Vec<PathBuf> = vec![cwd.join(SKILLS_DIR)];
    if let Some(root) = &git_root {
        skill_dirs.push(root.join(SKILLS_DIR));
    }
    if let Some(user) = &spec.user_skills {
        skill_dirs.push(PathBuf::from(user));
    }
    let mut seen: Vec<PathBuf> = Vec::new();
    let mut left_out = 0usize;
    for dir in skill_dirs {
        if seen.contains(&dir) {
            continue;
        }
        seen.push(dir.clone());
        read_skills_dir(&dir, spec, &mut out, &mut left_out);
    }
    if left_out > 0 {
        out.problems.push(format!(
            "{left_out} more skill folder(s) were not read: a session reads at most {} skills",
            spec.max_skills
        ));
    }
    out
}

/// The nearest directory at or above `cwd` that holds a `.git` entry (a directory, or the
/// file of a worktree or submodule).
fn find_git_root(cwd: &Path) -> Option<PathBuf> {
    cwd.ancestors()
        .find(|dir| std::fs::symlink_metadata(dir.join(".git")).is_ok())
        .map(Path::to_path_buf)
}

/// The directories from the git root down to `cwd`, root first; only `cwd` without a root.
fn root_to_cwd(root: Option<&Path>, cwd: &Path) -> Vec<PathBuf> {
    let Some(root) = root else {
        return vec![cwd.to_path_buf()];
    };
    let mut dirs: Vec<PathBuf> = cwd
        .ancestors()
        .take_while(|d| d.starts_with(root))
        .map(Path::to_path_buf)
        .collect();
    dirs.reverse();
    dirs
}

/// `path` read up to `cap` bytes; `None` when it does not exist.
fn read_if_present(path: &Path, cap: usize) -> Option<FileRead> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == ErrorKind::NotFound => None,
        _ => Some(read_capped(path, cap)),
    }
}

/// `path` read up to `cap` bytes: a regular file only, opened without blocking.
fn read_capped(path: &Path, cap: usize) -> FileRead {
    let content = open_regular(path).and_then(|(file, size)| {
        let mut bytes = Vec::with_capacity(cap.min(usize::try_from(size).unwrap_or(cap)));
        file.take(cap as u64)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Ok(FileContent { bytes, size })
    });
    FileRead {
        path: path.display().to_string(),
        content,
    }
}

/// Opens `path` for reading without blocking (a FIFO never waits for a writer) and checks
/// that it is a regular file; the file and its size.
fn open_regular(path: &Path) -> Result<(File, u64), String> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err("not a regular file".into());
    }
    Ok((file, meta.len()))
}

/// The entry names of `dir`, sorted, at most [`MAX_DIR_ENTRIES`] looked at (`true` when there
/// were more); `Ok(None)` when it does not exist.
fn list(dir: &Path) -> Result<Option<(Vec<String>, bool)>, String> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e.to_string()),
    };
    let mut names = Vec::new();
    let mut more = false;
    for entry in entries {
        if names.len() >= MAX_DIR_ENTRIES {
            more = true;
            break;
        }
        let entry = entry.map_err(|e| e.to_string())?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(Some((names, more)))
}

/// The skill folders of one skills directory, by name, into `out`.
fn read_skills_dir(dir: &Path, spec: &ReadSpec, out: &mut ProjectFiles, left_out: &mut usize) {
    let (names, more) = match list(dir) {
        Ok(Some(listed)) => listed,
        Ok(None) => return,
        Err(e) => {
            out.problems.push(format!(
                "the skills folder {} cannot be read: {e}",
                dir.display()
            ));
            return;
        }
    };
    if more {
        out.problems.push(format!(
            "the skills folder {} holds more than {MAX_DIR_ENTRIES} entries; only the first {MAX_DIR_ENTRIES} were looked at",
            dir.display()
        ));
    }
    for name in names.iter().filter(|n| !n.starts_with('.')) {
        let folder = dir.join(name);
        match std::fs::metadata(&folder) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => continue,
            Err(e) => {
                out.problems.push(format!(
                    "the skill folder {} cannot be read: {e}",
                    folder.display()
                ));
                continue;
            }
        }
        let skill_md = folder.join(SKILL_FILE);
        match std::fs::symlink_metadata(&skill_md) {
            Err(e) if e.kind() == ErrorKind::NotFound => continue,
            _ => {}
        }
        if out.skills.len() >= spec.max_skills {
            *left_out += 1;
            continue;
        }
        let (files, more_files) = skill_files(&folder, spec.max_skill_files);
        out.skills.push(SkillFolder {
            dir: folder.display().to_string(),
            skill_md: read_capped(&skill_md, spec.max_skill_bytes),
            files,
            more_files,
        });
    }
}

/// The files of a skill folder other than its `SKILL.md`, relative, sorted, at most `max`
/// (`true` when there were more; a folder's own files are taken before its subfolders'): real
/// directories are walked up to [`MAX_SKILL_DEPTH`] levels, symbolic links are listed and never followed, hidden entries are skipped.
fn skill_files(folder: &Path, max: usize) -> (Vec<String>, bool) {
    let mut files = Vec::new();
    let mut more = false;
    let mut stack: Vec<(PathBuf, String, usize)> = vec![(folder.to_path_buf(), String::new(), 0)];
    while let Some((dir, prefix, depth)) = stack.pop() {
        let Ok(Some((names, cut))) = list(&dir) else {
            continue;
        };
        more |= cut;
        for name in names.iter().rev().filter(|n| !n.starts_with('.')) {
            let rel = format!("{prefix}{name}");
            if depth == 0 && name == SKILL_FILE {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(dir.join(name)) else {
                continue;
            };
            if meta.is_dir() {
                if depth + 1 < MAX_SKILL_DEPTH {
                    stack.push((dir.join(name), format!("{rel}/"), depth + 1));
                } else {
                    more = true;
                }
            } else if files.len() < max {
                files.push(rel);
            } else {
                more = true;
            }
        }
        if files.len() >= max && !stack.is_empty() {
            more = true;
            break;
        }
    }
    files.sort();
    (files, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    /// A fresh directory under the system's temporary directory, removed when dropped.
    struct Scratch(PathBuf);

    impl Scratch {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn scratch(tag: &str) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("buzz-project-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        Scratch(dir)
    }

    fn spec(cwd: &Path, home: &Path) -> ReadSpec {
        ReadSpec {
            cwd: cwd.display().to_string(),
            user_instructions: Some(
                home.join(".config/buzz-agent/AGENTS.md")
                    .display()
                    .to_string(),
            ),
            user_skills: Some(home.join(".agents/skills").display().to_string()),
            max_instruction_bytes: 1024,
            max_skill_bytes: 64,
            max_skills: 3,
            max_skill_files: 2,
        }
    }

    fn write(path: &Path, text: &str) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }

    #[test]
    fn a10_instructions_come_user_first_then_root_down_to_the_cwd() {
        let t = scratch("order");
        let (repo, home) = (t.path().join("repo"), t.path().join("home"));
        std::fs::create_dir_all(repo.join(".git")).expect("git");
        let cwd = repo.join("a/b");
        std::fs::create_dir_all(&cwd).expect("cwd");
        write(&home.join(".config/buzz-agent/AGENTS.md"), "user");
        write(&repo.join("AGENTS.md"), "root");
        write(&repo.join("a/b/AGENTS.md"), "leaf");
        write(&t.path().join("AGENTS.md"), "above the root: never read");
        let files = read(&spec(&cwd, &home));
        assert_eq!(files.git_root, Some(repo.display().to_string()));
        let got: Vec<(String, Vec<u8>)> = files
            .instructions
            .iter()
            .map(|f| {
                let c = f.content.as_ref().expect("read");
                (f.path.clone(), c.bytes.clone())
            })
            .collect();
        assert_eq!(
            got,
            [
                (
                    home.join(".config/buzz-agent/AGENTS.md")
                        .display()
                        .to_string(),
                    b"user".to_vec()
                ),
                (
                    repo.join("AGENTS.md").display().to_string(),
                    b"root".to_vec()
                ),
                (
                    repo.join("a/b/AGENTS.md").display().to_string(),
                    b"leaf".to_vec()
                ),
            ]
        );
    }

    #[test]
    fn a10_without_a_git_root_only_the_cwd_counts_and_odd_files_are_reported_not_waited_on() {
        let t = scratch("noroot");
        let cwd = t.path().join("w");
        std::fs::create_dir_all(cwd.join("AGENTS.md")).expect("a directory named AGENTS.md");
        let files = read(&spec(&cwd, &t.path().join("nohome")));
        assert_eq!(files.git_root, None);
        assert_eq!(files.instructions.len(), 1);
        assert_eq!(
            files.instructions[0].content,
            Err("not a regular file".to_string())
        );
        // A FIFO is refused at once, never waited on.
        let fifo = t.path().join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo runs");
        assert!(made.success());
        assert_eq!(
            read_capped(&fifo, 10).content,
            Err("not a regular file".to_string())
        );
    }

    #[test]
    fn a10_a_big_file_costs_one_capped_read_and_reports_its_size() {
        let t = scratch("big");
        let big = t.path().join("big");
        let f = File::create(&big).expect("create");
        f.set_len(100 * 1024 * 1024).expect("a sparse 100 MB file");
        let r = read_capped(&big, 64);
        let c = r.content.expect("read");
        assert_eq!((c.bytes.len(), c.size), (64, 100 * 1024 * 1024));
    }

    #[test]
    fn a10_skills_are_read_by_name_cwd_first_capped_and_loops_are_reported() {
        let t = scratch("skills");
        let (cwd, home) = (t.path().join("w"), t.path().join("home"));
        let skills = cwd.join(SKILLS_DIR);
        write(&skills.join("b-skill/SKILL.md"), "b");
        write(&skills.join("a-skill/SKILL.md"), "a");
        write(&skills.join("a-skill/scripts/run.sh"), "#!/bin/sh");
        write(&skills.join("a-skill/ref.md"), "r");
        write(&skills.join("a-skill/zzz.md"), "z");
        write(&skills.join("not-a-skill/README.md"), "no SKILL.md here");
        write(&skills.join("stray-file"), "x");
        symlink(skills.join("loop"), skills.join("loop")).expect("a link to itself");
        symlink(skills.join("a-skill"), skills.join("a-skill/scripts/up")).expect("a link up");
        write(&home.join(".agents/skills/c-skill/SKILL.md"), "c");
        write(&home.join(".agents/skills/d-skill/SKILL.md"), "d");
        let files = read(&spec(&cwd, &home));
        let dirs: Vec<String> = files.skills.iter().map(|s| s.dir.clone()).collect();
        assert_eq!(
            dirs,
            [
                skills.join("a-skill").display().to_string(),
                skills.join("b-skill").display().to_string(),
                home.join(".agents/skills/c-skill").display().to_string(),
            ]
        );
        let a = &files.skills[0];
        assert_eq!(
            a.files,
            ["ref.md", "zzz.md"],
            "two at most: the folder's own files come before its subfolders'"
        );
        assert!(a.more_files);
        assert!(!files.skills[1].more_files);
        assert_eq!(files.problems.len(), 2, "{:?}", files.problems);
        assert!(files.problems[0].starts_with(&format!(
            "the skill folder {} cannot be read: ",
            skills.join("loop").display()
        )));
        assert_eq!(
            files.problems[1],
            "1 more skill folder(s) were not read: a session reads at most 3 skills"
        );
    }

    #[test]
    fn a10_a_symlink_loop_inside_a_skill_ends_the_walk() {
        let t = scratch("loop");
        let folder = t.path().join("s");
        std::fs::create_dir_all(folder.join("x")).expect("mkdir");
        symlink(&folder, folder.join("x/again")).expect("a loop");
        let (files, more) = skill_files(&folder, 50);
        assert_eq!(files, ["x/again"]);
        assert!(!more);
    }
}
