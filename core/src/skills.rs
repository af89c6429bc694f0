//! Agent Skills (SPEC A10, docs/context.md): the `SKILL.md` folders the runtime found for a
//! session become its skills — validated, listed by name and description in the system
//! prompt, and loaded on demand through the built-in tool [`LOAD_SKILL`], which returns a
//! skill's body and names its other files. A skill that cannot be used is skipped with a
//! [`Finding`] (a WARN and a notice); the session starts anyway.

use crate::frontmatter::{self, Value as Field};
use crate::instructions::{Finding, text_of};
use crate::llm::ToolDef;
use crate::mcp::{Builtin, ToolRoute, ToolTarget};
use crate::project::SkillFolder;
use crate::tools::ToolOutput;
use serde_json::{Value, json};

/// The built-in tool that loads a skill (provider-safe, never `_`-prefixed, never a
/// `<server>__<tool>` name, so no MCP tool can take it).
pub(crate) const LOAD_SKILL: &str = "load_skill";
/// Longest skill name (the Agent Skills format), characters.
const MAX_NAME_CHARS: usize = 64;
/// Longest skill description (the Agent Skills format), characters.
const MAX_DESCRIPTION_CHARS: usize = 1024;

/// One usable skill of a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Skill {
    /// Its `name` (lowercase letters, digits and single hyphens).
    pub(crate) name: String,
    /// Its `description`, on one line.
    pub(crate) description: String,
    /// Its folder.
    pub(crate) dir: String,
    /// Its instructions: the Markdown after the frontmatter, trimmed.
    pub(crate) body: String,
    /// Its other files, relative to `dir`.
    pub(crate) files: Vec<String>,
    /// More files than listed.
    pub(crate) more_files: bool,
}

/// The skills of the folders read, in their order (SPEC A10): a `SKILL.md` that cannot be read,
/// is over the size cap, is not text, has a broken frontmatter or a missing or invalid `name`
/// or `description`, or repeats an earlier skill's name is skipped with a [`Finding`]; a name
/// that differs from its folder's is only warned about. `max_bytes` is the `SKILL.md` cap.
pub(crate) fn take_skills(
    folders: &[SkillFolder],
    max_bytes: usize,
) -> (Vec<Skill>, Vec<Finding>, Vec<String>) {
    let mut skills: Vec<Skill> = Vec::new();
    let mut findings = Vec::new();
    let mut warnings = Vec::new();
    for f in folders {
        let path = &f.skill_md.path;
        let parsed = read_skill(f, max_bytes);
        let skill = match parsed {
            Ok(s) => s,
            Err(why) => {
                findings.push(skipped(path, &why));
                continue;
            }
        };
        if let Some(first) = skills.iter().find(|s| s.name == skill.name) {
            let why = format!(
                "the skill name {} is already taken by {}",
                skill.name, first.dir
            );
            findings.push(skipped(path, &why));
            continue;
        }
        let folder = f.dir.rsplit('/').next().unwrap_or("");
        if folder != skill.name {
            warnings.push(format!(
                "skills: {path}: the name {} differs from its folder {folder}; loaded as {}",
                skill.name, skill.name
            ));
        }
        skills.push(skill);
    }
    (skills, findings, warnings)
}

fn skipped(path: &str, why: &str) -> Finding {
    Finding::new(
        "skill_skipped",
        format!("skills: {path} skipped: {why}"),
        format!("The skill in {path} is not offered: {why}."),
    )
}

/// One folder's skill, or why it cannot be used.
fn read_skill(f: &SkillFolder, max_bytes: usize) -> Result<Skill, String> {
    let content = f.skill_md.content.as_ref().map_err(Clone::clone)?;
    if content.size > max_bytes as u64 {
        return Err(format!(
            "SKILL.md is {} bytes, over the {} KiB limit",
            content.size,
            max_bytes / 1024
        ));
    }
    let text = text_of(content, usize::MAX)?;
    let parsed =
        frontmatter::parse(&text).map_err(|e| format!("the frontmatter is broken: {e}"))?;
    let field = |key: &str| match parsed.fields.get(key) {
        Some(Field::Text(t)) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        Some(Field::Text(_)) | None => Err(format!("the frontmatter has no {key}")),
        Some(Field::Nested) => Err(format!("the frontmatter's {key} is not text")),
    };
    let name = field("name")?;
    check_name(&name)?;
    let description = field("description")?;
    if description.chars().count() > MAX_DESCRIPTION_CHARS {
        return Err(format!(
            "its description is over {MAX_DESCRIPTION_CHARS} characters"
        ));
    }
    Ok(Skill {
        name,
        description: description.split_whitespace().collect::<Vec<_>>().join(" "),
        dir: f.dir.clone(),
        body: parsed.body.trim().to_string(),
        files: f.files.clone(),
        more_files: f.more_files,
    })
}

/// The Agent Skills name rule: 1–64 lowercase letters, digits and hyphens, no hyphen at
/// either end or twice in a row.
fn check_name(name: &str) -> Result<(), String> {
    let ok_chars = name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    let shown: String = name.chars().take(MAX_NAME_CHARS + 1).collect();
    if name.is_empty()
        || name.chars().count() > MAX_NAME_CHARS
        || !ok_chars
        || name.starts_with('-')
        || name.ends_with('-')
        || name.contains("--")
    {
        return Err(format!(
            "its name {shown:?} is not 1-64 lowercase letters, digits and single hyphens"
        ));
    }
    Ok(())
}

/// The skills section of the system prompt (names and descriptions only), or `None`.
pub(crate) fn skills_section(skills: &[Skill]) -> Option<String> {
    if skills.is_empty() {
        return None;
    }
    let mut s = format!(
        "# Skills\n\nSkills are folders of instructions for particular tasks. When a task matches a skill's description, call the tool {LOAD_SKILL} with the skill's name before you start, and follow the instructions it returns.\n"
    );
    for sk in skills {
        s.push_str(&format!("\n- {}: {}", sk.name, sk.description));
    }
    Some(s)
}

/// The title of a `load_skill` call as the client shows it (its kind is `read`, so clients
/// that allow reads without asking allow it).
pub(crate) const LOAD_SKILL_TITLE: &str = "Load skill";

/// The built-in tools of a session with `skills`, with their routes (none without skills).
pub(crate) fn builtin_tools(skills: &[Skill]) -> Vec<(ToolDef, ToolRoute)> {
    builtin_defs(skills)
        .into_iter()
        .map(|def| {
            let route = ToolRoute {
                target: ToolTarget::Builtin(Builtin::LoadSkill),
                bare: LOAD_SKILL.to_string(),
                qualified: LOAD_SKILL.to_string(),
                title: LOAD_SKILL_TITLE.to_string(),
                kind: "read",
            };
            (def, route)
        })
        .collect()
}

/// The built-in tool definitions of a session with `skills` (none without skills).
fn builtin_defs(skills: &[Skill]) -> Vec<ToolDef> {
    if skills.is_empty() {
        return Vec::new();
    }
    let names: Vec<&str> = skills.iter().map(|s| s.name.as_str()).collect();
    vec![ToolDef {
        name: LOAD_SKILL.to_string(),
        description: "Loads a skill listed in the Skills section of the system prompt: returns its instructions and names its other files.".to_string(),
        input_schema: json!({
            "type": "object",
            "properties": {"name": {"type": "string", "enum": names, "description": "the skill's name"}},
            "required": ["name"]
        }),
    }]
}

/// What `load_skill` with `args` returns (SPEC A10): the skill's body in a `<skill>` element
/// naming its folder, then its other files (to be read with the session's own tools: paths are
/// relative to the folder); an unknown or missing name is an error result listing the names.
pub(crate) fn load_skill(skills: &[Skill], args: &Value) -> ToolOutput {
    let names = || {
        skills
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(name) = args.get("name").and_then(Value::as_str) else {
        return ToolOutput::plain(
            format!(
                "{LOAD_SKILL} needs a skill name; the skills are: {}",
                names()
            ),
            true,
        );
    };
    let Some(skill) = skills.iter().find(|s| s.name == name) else {
        return ToolOutput::plain(
            format!("unknown skill {name:?}; the skills are: {}", names()),
            true,
        );
    };
    let body = if skill.body.is_empty() {
        "(this skill has no instructions beyond its description)"
    } else {
        &skill.body
    };
    let mut text = format!(
        "<skill name=\"{}\" path=\"{}\">\n{body}\n</skill>",
        skill.name, skill.dir
    );
    if !skill.files.is_empty() {
        text.push_str(&format!(
            "\n\nThe skill's other files, relative to {} (read them with the session's file tools when its instructions call for them):",
            skill.dir
        ));
        for f in &skill.files {
            text.push_str(&format!("\n- {f}"));
        }
        if skill.more_files {
            text.push_str("\n- … (more files, not listed)");
        }
    }
    ToolOutput::plain(text, false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::project::{FileContent, FileRead, MAX_SKILL_BYTES};

    fn folder(dir: &str, text: &str) -> SkillFolder {
        SkillFolder {
            dir: dir.into(),
            skill_md: FileRead {
                path: format!("{dir}/SKILL.md"),
                content: Ok(FileContent {
                    bytes: text.as_bytes().to_vec(),
                    size: text.len() as u64,
                }),
            },
            files: vec!["scripts/run.sh".into()],
            more_files: false,
        }
    }

    fn skill_md(name: &str, description: &str, body: &str) -> String {
        format!("---\nname: {name}\ndescription: {description}\n---\n{body}")
    }

    #[test]
    fn a10_valid_skills_are_kept_in_order_with_their_bodies() {
        let (skills, findings, warnings) = take_skills(
            &[
                folder(
                    "/r/.agents/skills/pdf",
                    &skill_md("pdf", "Reads PDFs.\n  Use for PDFs.", "\n# PDF\nRun it.\n"),
                ),
                folder(
                    "/r/.agents/skills/notes",
                    &skill_md("release-notes", "Writes release notes.", ""),
                ),
            ],
            MAX_SKILL_BYTES,
        );
        assert!(findings.is_empty(), "{findings:?}");
        assert_eq!(skills.len(), 2);
        assert_eq!(skills[0].name, "pdf");
        assert_eq!(skills[0].body, "# PDF\nRun it.");
        assert_eq!(skills[1].name, "release-notes");
        assert_eq!(
            warnings,
            [
                "skills: /r/.agents/skills/notes/SKILL.md: the name release-notes differs from its folder notes; loaded as release-notes"
            ]
        );
        let section = skills_section(&skills).unwrap_or_default();
        assert!(section.contains(
            "\n- pdf: Reads PDFs. Use for PDFs.\n- release-notes: Writes release notes."
        ));
        assert!(
            !section.contains("Run it."),
            "the listing never carries a body"
        );
    }

    #[test]
    fn a10_broken_duplicate_oversized_and_binary_skills_are_skipped_by_path() {
        let mut big = folder("/r/s/big", &skill_md("big", "Big.", "x"));
        if let Ok(c) = &mut big.skill_md.content {
            c.size = 100 * 1024 * 1024;
        }
        let mut binary = folder("/r/s/bin", "---\nname: bin\n");
        if let Ok(c) = &mut binary.skill_md.content {
            c.bytes.push(0);
        }
        let unreadable = SkillFolder {
            skill_md: FileRead {
                path: "/r/s/gone/SKILL.md".into(),
                content: Err("Permission denied (os error 13)".into()),
            },
            ..folder("/r/s/gone", "")
        };
        let (skills, findings, _) = take_skills(
            &[
                folder("/r/s/one", &skill_md("one", "First.", "")),
                folder("/r/s/again", &skill_md("one", "Second.", "")),
                folder("/r/s/nofm", "# just markdown"),
                folder("/r/s/noname", "---\ndescription: d\n---\n"),
                folder("/r/s/caps", &skill_md("Caps", "d", "")),
                folder("/r/s/long", &skill_md("long", &"d".repeat(1025), "")),
                big,
                binary,
                unreadable,
            ],
            MAX_SKILL_BYTES,
        );
        assert_eq!(
            skills.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["one"]
        );
        let logs: Vec<&str> = findings.iter().map(|f| f.log.as_str()).collect();
        assert_eq!(
            logs,
            [
                "skills: /r/s/again/SKILL.md skipped: the skill name one is already taken by /r/s/one",
                "skills: /r/s/nofm/SKILL.md skipped: the frontmatter is broken: it does not start with a YAML frontmatter block (a line ---)",
                "skills: /r/s/noname/SKILL.md skipped: the frontmatter has no name",
                "skills: /r/s/caps/SKILL.md skipped: its name \"Caps\" is not 1-64 lowercase letters, digits and single hyphens",
                "skills: /r/s/long/SKILL.md skipped: its description is over 1024 characters",
                "skills: /r/s/big/SKILL.md skipped: SKILL.md is 104857600 bytes, over the 64 KiB limit",
                "skills: /r/s/bin/SKILL.md skipped: it is not text (it holds NUL bytes)",
                "skills: /r/s/gone/SKILL.md skipped: Permission denied (os error 13)",
            ]
        );
        assert!(findings.iter().all(|f| f.kind == "skill_skipped"));
        assert_eq!(
            findings[0].notice,
            "The skill in /r/s/again/SKILL.md is not offered: the skill name one is already taken by /r/s/one."
        );
    }

    #[test]
    fn a10_names_follow_the_agent_skills_rule() {
        for ok in ["a", "pdf-tools", "x1-2", &"a".repeat(64)] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "a-",
            "a--b",
            "A",
            "a_b",
            "a b",
            "é",
            &"a".repeat(65),
        ] {
            assert!(check_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a10_load_skill_returns_the_body_and_the_files_and_names_the_skills_when_asked_wrong() {
        let (skills, _, _) = take_skills(
            &[folder(
                "/r/s/pdf",
                &skill_md("pdf", "Reads PDFs.", "Run pdftotext."),
            )],
            MAX_SKILL_BYTES,
        );
        let out = load_skill(&skills, &json!({"name": "pdf"}));
        assert!(!out.is_error);
        assert_eq!(
            out.text,
            "<skill name=\"pdf\" path=\"/r/s/pdf\">\nRun pdftotext.\n</skill>\n\nThe skill's other files, relative to /r/s/pdf (read them with the session's file tools when its instructions call for them):\n- scripts/run.sh"
        );
        let out = load_skill(&skills, &json!({"name": "nope"}));
        assert!(out.is_error);
        assert_eq!(out.text, "unknown skill \"nope\"; the skills are: pdf");
        assert!(load_skill(&skills, &json!({})).is_error);
        let defs = builtin_defs(&skills);
        assert_eq!(defs[0].name, LOAD_SKILL);
        assert_eq!(
            defs[0].input_schema["properties"]["name"]["enum"],
            json!(["pdf"])
        );
        assert!(builtin_defs(&[]).is_empty());
        let (_, route) = &builtin_tools(&skills)[0];
        assert_eq!(
            (route.kind, route.title.as_str()),
            ("read", LOAD_SKILL_TITLE)
        );
        assert!(crate::tools::is_provider_safe(LOAD_SKILL) && !LOAD_SKILL.starts_with('_'));
    }
}
