//! A session's system prompt (SPEC A10, docs/context.md): the operator's or the client's
//! prompt, then the project instructions (`AGENTS.md` files, in a delimited section, within a
//! byte budget), then the skills list. Built once when the session opens (and again when it
//! is loaded) from what the runtime read; the session keeps the text, so every request of the
//! session sends the same bytes (the cached prompt prefix stays stable, SPEC L11).

use crate::config::Config;
use crate::project::{
    FileContent, FileRead, MAX_SKILL_BYTES, MAX_SKILL_FILES, MAX_SKILLS, ReadSpec,
};

/// The client's system prompt from `session/new` (or `session/load`) `_meta.systemPrompt`,
/// the convention of Claude Code's ACP adapter: a string replaces the operator's
/// `BUZZ_AGENT_SYSTEM_PROMPT`, `{"append": "…"}` is added after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientPrompt {
    /// `"_meta": {"systemPrompt": "…"}`.
    Replace(String),
    /// `"_meta": {"systemPrompt": {"append": "…"}}`.
    Append(String),
}

/// Something about the files that changed what the user asked for: a WARN line for the log
/// and one sentence for the user (a notice of `kind`), neither with a requirement id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finding {
    /// The notice's kind (`_meta.buzz.notice`).
    pub(crate) kind: &'static str,
    /// The WARN line.
    pub(crate) log: String,
    /// The notice's sentence.
    pub(crate) notice: String,
}

impl Finding {
    pub(crate) fn new(kind: &'static str, log: String, notice: String) -> Finding {
        Finding { kind, log, notice }
    }
}

/// The project instructions a session takes: `(path, text)` in prompt order, and the bytes
/// of text taken.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Instructions {
    pub(crate) files: Vec<(String, String)>,
}

/// What to read for a session in `cwd` (SPEC A10): the configured user-wide paths and caps.
pub(crate) fn read_spec(cfg: &Config, cwd: &str) -> ReadSpec {
    ReadSpec {
        cwd: cwd.to_string(),
        user_instructions: cfg.user_instructions.clone(),
        user_skills: cfg.user_skills_dir.clone(),
        max_instruction_bytes: cfg.instructions_max_bytes,
        max_skill_bytes: MAX_SKILL_BYTES,
        max_skills: MAX_SKILLS,
        max_skill_files: MAX_SKILL_FILES,
    }
}

/// The text of a file's bytes for the prompt: `None` with the reason when it is not text (it
/// holds a NUL byte, the mark of a binary file); else decoded lossily (U+FFFD for invalid
/// UTF-8), a leading BOM dropped. `cut_at` bytes at most, on a character boundary.
pub(crate) fn text_of(content: &FileContent, cut_at: usize) -> Result<String, String> {
    if content.bytes.contains(&0) {
        return Err("it is not text (it holds NUL bytes)".into());
    }
    let bytes = content
        .bytes
        .strip_prefix(b"\xEF\xBB\xBF")
        .unwrap_or(&content.bytes);
    let text = String::from_utf8_lossy(bytes);
    Ok(crate::text::utf8_prefix(&text, cut_at).to_string())
}

/// Takes the `AGENTS.md` files in order within `budget` bytes of text (SPEC A10): a blank
/// file adds nothing; the file where the budget runs out is cut there (marked in the prompt);
/// later files are left out; an unreadable or binary file is skipped. Each cut, left-out or
/// skipped file is a [`Finding`] naming it.
pub(crate) fn take_instructions(files: &[FileRead], budget: usize) -> (Instructions, Vec<Finding>) {
    let mut out = Instructions::default();
    let mut findings = Vec::new();
    let mut left = budget;
    for f in files {
        let path = &f.path;
        let content = match &f.content {
            Ok(c) => c,
            Err(e) => {
                findings.push(skipped(path, e));
                continue;
            }
        };
        let text = match text_of(content, usize::MAX) {
            Ok(t) => t,
            Err(why) => {
                findings.push(skipped(path, &why));
                continue;
            }
        };
        let text = text.trim_end();
        if text.trim().is_empty() {
            continue;
        }
        let whole = content.size <= content.bytes.len() as u64;
        if left == 0 {
            findings.push(Finding::new(
                "instructions_cut",
                format!(
                    "instructions: {path} left out: the {budget}-byte budget (BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES) is used up"
                ),
                format!(
                    "The project instructions in {path} were left out: the instructions are over {budget} bytes in all."
                ),
            ));
            continue;
        }
        if whole && text.len() <= left {
            left -= text.len();
            out.files.push((path.clone(), text.to_string()));
            continue;
        }
        let kept = crate::text::utf8_prefix(text, left);
        left = left.saturating_sub(kept.len());
        findings.push(Finding::new(
            "instructions_cut",
            format!(
                "instructions: {path} cut to {} of {} bytes (BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES={budget})",
                kept.len(),
                content.size
            ),
            format!(
                "The project instructions in {path} were cut at {} bytes: the instructions may take {budget} bytes in all.",
                kept.len()
            ),
        ));
        out.files.push((
            path.clone(),
            format!("{kept}\n[the rest of this file was cut: the instructions are over their size limit]"),
        ));
    }
    (out, findings)
}

fn skipped(path: &str, why: &str) -> Finding {
    Finding::new(
        "instructions_skipped",
        format!("instructions: {path} skipped: {why}"),
        format!("The project instructions in {path} were not read: {why}."),
    )
}

/// The project instructions section of the system prompt, or `None` without files.
pub(crate) fn instructions_section(ins: &Instructions) -> Option<String> {
    if ins.files.is_empty() {
        return None;
    }
    let mut s = String::from(
        "# Project instructions\n\nThe user's AGENTS.md files follow, the most general first; where two disagree, the later (more specific) one wins.",
    );
    for (path, text) in &ins.files {
        s.push_str(&format!(
            "\n\n<instructions path=\"{path}\">\n{text}\n</instructions>"
        ));
    }
    Some(s)
}

/// The session's system prompt (SPEC A10, docs/context.md "Order"): the client's replacing
/// prompt, else `BUZZ_AGENT_SYSTEM_PROMPT`; then the client's appended text; then the project
/// instructions; then the skills list; parts separated by a blank line. `None` when every
/// part is empty.
pub(crate) fn system_prompt(
    cfg: &Config,
    client: Option<&ClientPrompt>,
    instructions: Option<String>,
    skills: Option<String>,
) -> Option<String> {
    let base = match client {
        Some(ClientPrompt::Replace(p)) => Some(p.clone()),
        Some(ClientPrompt::Append(_)) | None => cfg.system_prompt.clone(),
    };
    let append = match client {
        Some(ClientPrompt::Append(p)) => Some(p.clone()),
        Some(ClientPrompt::Replace(_)) | None => None,
    };
    let parts: Vec<String> = [base, append, instructions, skills]
        .into_iter()
        .flatten()
        .filter(|p| !p.trim().is_empty())
        .collect();
    (!parts.is_empty()).then(|| parts.join("\n\n"))
}

/// Decodes `_meta.systemPrompt` of a `session/new` or `session/load` (see [`ClientPrompt`]);
/// any other shape is ignored (`None`): `_meta` is the client's free space.
pub(crate) fn client_prompt(params: &serde_json::Value) -> Option<ClientPrompt> {
    let p = params.get("_meta")?.get("systemPrompt")?;
    match p {
        serde_json::Value::String(s) => Some(ClientPrompt::Replace(s.clone())),
        serde_json::Value::Object(o) => o
            .get("append")
            .and_then(serde_json::Value::as_str)
            .map(|s| ClientPrompt::Append(s.to_string())),
        serde_json::Value::Null
        | serde_json::Value::Bool(_)
        | serde_json::Value::Number(_)
        | serde_json::Value::Array(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ProviderKind;
    use serde_json::json;

    fn file(path: &str, text: &str) -> FileRead {
        FileRead {
            path: path.into(),
            content: Ok(FileContent {
                bytes: text.as_bytes().to_vec(),
                size: text.len() as u64,
            }),
        }
    }

    #[test]
    fn a10_files_are_taken_in_order_until_the_budget_cuts_one_and_leaves_out_the_rest() {
        let files = [
            file("/u/AGENTS.md", "user rule\n\n"),
            file("/r/AGENTS.md", "   \n"),
            file("/r/a/AGENTS.md", "0123456789abcdef"),
            file("/r/a/b/AGENTS.md", "never"),
        ];
        let (ins, findings) = take_instructions(&files, 20);
        assert_eq!(
            ins.files,
            [
                ("/u/AGENTS.md".to_string(), "user rule".to_string()),
                (
                    "/r/a/AGENTS.md".to_string(),
                    "0123456789a\n[the rest of this file was cut: the instructions are over their size limit]"
                        .to_string()
                ),
            ],
            "a blank file adds nothing; the budget counts the text"
        );
        let logs: Vec<&str> = findings.iter().map(|f| f.log.as_str()).collect();
        assert_eq!(
            logs,
            [
                "instructions: /r/a/AGENTS.md cut to 11 of 16 bytes (BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES=20)",
                "instructions: /r/a/b/AGENTS.md left out: the 20-byte budget (BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES) is used up",
            ]
        );
        assert!(findings.iter().all(|f| f.kind == "instructions_cut"));
        assert!(
            findings[0]
                .notice
                .contains("/r/a/AGENTS.md were cut at 11 bytes")
        );
    }

    #[test]
    fn a10_a_file_the_runtime_cut_is_cut_even_when_its_bytes_fit() {
        let mut f = file("/r/AGENTS.md", "short");
        if let Ok(c) = &mut f.content {
            c.size = 100 * 1024 * 1024;
        }
        let (ins, findings) = take_instructions(&[f], 1024);
        assert!(
            ins.files[0]
                .1
                .starts_with("short\n[the rest of this file was cut")
        );
        assert_eq!(
            findings[0].log,
            "instructions: /r/AGENTS.md cut to 5 of 104857600 bytes (BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES=1024)"
        );
    }

    #[test]
    fn a10_unreadable_and_binary_files_are_skipped_by_name_and_a_cut_never_splits_a_character() {
        let unreadable = FileRead {
            path: "/r/AGENTS.md".into(),
            content: Err("Permission denied (os error 13)".into()),
        };
        let binary = FileRead {
            path: "/r/a/AGENTS.md".into(),
            content: Ok(FileContent {
                bytes: b"\x7fELF\x00\x01".to_vec(),
                size: 6,
            }),
        };
        let accents = file("/r/a/b/AGENTS.md", "\u{feff}ééé");
        let (ins, findings) = take_instructions(&[unreadable, binary, accents], 1024 + 3);
        assert_eq!(ins.files.len(), 1);
        assert_eq!(ins.files[0].1, "ééé", "the BOM is dropped");
        assert_eq!(
            findings
                .iter()
                .map(|f| (f.kind, f.log.as_str()))
                .collect::<Vec<_>>(),
            [
                (
                    "instructions_skipped",
                    "instructions: /r/AGENTS.md skipped: Permission denied (os error 13)"
                ),
                (
                    "instructions_skipped",
                    "instructions: /r/a/AGENTS.md skipped: it is not text (it holds NUL bytes)"
                ),
            ]
        );
        let (cut, _) = take_instructions(&[file("/x", "ééé")], 3);
        assert!(cut.files[0].1.starts_with("é\n"), "{:?}", cut.files);
    }

    #[test]
    fn a10_the_prompt_is_the_base_then_the_append_then_instructions_then_skills() {
        let mut cfg = Config::for_tests(ProviderKind::Anthropic, "");
        cfg.system_prompt = Some("operator".into());
        let ins = Some("INS".to_string());
        let sk = Some("SKILLS".to_string());
        assert_eq!(
            system_prompt(&cfg, None, ins.clone(), sk.clone()).as_deref(),
            Some("operator\n\nINS\n\nSKILLS")
        );
        let append = ClientPrompt::Append("client".into());
        assert_eq!(
            system_prompt(&cfg, Some(&append), ins.clone(), None).as_deref(),
            Some("operator\n\nclient\n\nINS")
        );
        let replace = ClientPrompt::Replace("client only".into());
        assert_eq!(
            system_prompt(&cfg, Some(&replace), None, sk).as_deref(),
            Some("client only\n\nSKILLS")
        );
        cfg.system_prompt = None;
        assert_eq!(system_prompt(&cfg, None, None, None), None);
        assert_eq!(
            system_prompt(&cfg, Some(&ClientPrompt::Replace(" ".into())), None, None),
            None
        );
    }

    #[test]
    fn a10_the_client_prompt_is_a_string_or_an_append_object_and_anything_else_is_ignored() {
        let p = |v| client_prompt(&json!({"cwd": "/", "_meta": {"systemPrompt": v}}));
        assert_eq!(p(json!("x")), Some(ClientPrompt::Replace("x".into())));
        assert_eq!(
            p(json!({"append": "y"})),
            Some(ClientPrompt::Append("y".into()))
        );
        assert_eq!(p(json!({"append": 3})), None);
        assert_eq!(p(json!([1])), None);
        assert_eq!(client_prompt(&json!({"cwd": "/"})), None);
    }

    #[test]
    fn a10_the_section_names_each_file_in_order() {
        let ins = Instructions {
            files: vec![("/a".into(), "A".into()), ("/a/b".into(), "B".into())],
        };
        let s = instructions_section(&ins).unwrap_or_default();
        assert!(s.starts_with("# Project instructions\n\n"));
        assert!(s.ends_with(
            "<instructions path=\"/a\">\nA\n</instructions>\n\n<instructions path=\"/a/b\">\nB\n</instructions>"
        ));
        assert_eq!(instructions_section(&Instructions::default()), None);
    }
}
