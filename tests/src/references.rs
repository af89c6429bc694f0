//! The repository carries its own contract: every requirement id and case id that a doc, the
//! README, a comment, a test name or a test message cites is defined in `docs/spec.md` or
//! `docs/cases.md`, no text names a file outside the repository (the project's design notes and
//! specification kept beside it in a sibling folder, [`OUTSIDE_NAMES`]), every relative Markdown link and
//! anchor resolves, every repository path written in backticks exists, and every test name a doc
//! cites is a function of the repository (issue 25). `tests/tests/references.rs` runs
//! [`check_repository`] on the checkout; the unit tests below feed it small made-up trees, so
//! each rule is seen failing.
//!
//! How ids are read (docs/spec.md, "How to read the ids"): an uppercase family letter and one
//! or two digits, with an optional lowercase variant letter, standing alone as a word (`A9`,
//! `L3b`, `I12`). `C1`–`C3` (one digit) are the configuration requirements; a case is written
//! with two digits (`C01`, `C24`), and `C24a` names variant (a) of case C24. Test functions
//! carry ids as leading lowercase segments (`fn h5_c31_…` cites H5 and C31). In Rust files only
//! comments, string literals and function names are read (code such as `const S1` is not a
//! citation); other text files are read whole.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

/// The letters that start a requirement id (docs/spec.md lists each family).
const FAMILIES: &str = "ACEGHIKLMPSTX";

/// One finding: where, and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Finding {
    /// The file, relative to the repository root.
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// What is wrong, in one sentence.
    pub what: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.file, self.line, self.what)
    }
}

/// A text file of the repository: its path relative to the root and its contents.
#[derive(Debug, Clone)]
pub struct TextFile {
    /// Relative path with `/` separators.
    pub path: String,
    /// Whole contents.
    pub text: String,
}

/// The ids `docs/spec.md` and `docs/cases.md` define.
#[derive(Debug, Default)]
pub struct Definitions {
    /// Requirement ids (`A1`, `L3b`, `I12`) → whether the entry is marked planned.
    pub requirements: BTreeMap<String, bool>,
    /// Case ids (`C01`, `C24`) → the variant letters their entry names as `(a)`, `(b)`, ….
    pub cases: BTreeMap<String, BTreeSet<char>>,
}

/// Directories never read: build outputs, installed peers, vendored third-party data, corpora.
const SKIPPED_DIRS: &[&str] = &[
    ".git",
    "target",
    "node_modules",
    ".venv",
    ".venv-mcp1",
    "fuzz/corpus",
    "fuzz/artifacts",
    "fuzz/target",
    "fuzz/coverage",
    "tests/schema",
    "mutants.out",
    "mutants.out.old",
];

/// Whether `rel` (a relative path) is a text file this check reads.
fn is_checked_file(rel: &str) -> bool {
    let name = rel.rsplit('/').next().unwrap_or(rel);
    let ext = name.rsplit_once('.').map(|(_, e)| e);
    match ext {
        Some("rs" | "md" | "py" | "sh" | "toml" | "txt" | "yml" | "yaml") => true,
        // Scripts without an extension: the CI entry point and `scripts/test`.
        None => rel.starts_with(".ci/") || rel.starts_with("scripts/"),
        Some(_) => false,
    }
}

/// Reads every checked text file under `root` (sorted by path).
pub fn read_tree(root: &Path) -> std::io::Result<Vec<TextFile>> {
    let mut out = Vec::new();
    let mut dirs = vec![PathBuf::new()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(root.join(&dir))? {
            let entry = entry?;
            let rel = dir.join(entry.file_name());
            let rel_s = rel.to_string_lossy().replace('\\', "/");
            let kind = entry.file_type()?;
            if kind.is_dir() {
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if !SKIPPED_DIRS.contains(&rel_s.as_str()) && !SKIPPED_DIRS.contains(&&*name) {
                    dirs.push(rel);
                }
            } else if kind.is_file() && is_checked_file(&rel_s) {
                let bytes = std::fs::read(root.join(&rel))?;
                if let Ok(text) = String::from_utf8(bytes) {
                    out.push(TextFile { path: rel_s, text });
                }
            }
        }
    }
    out.sort_by(|a, b| a.path.cmp(&b.path));
    Ok(out)
}

/// Every finding for the files of one repository tree. `exists(rel)` says whether a relative
/// path (file or directory, no trailing `/`) exists in the repository.
pub fn check_repository(files: &[TextFile], exists: &dyn Fn(&str) -> bool) -> Vec<Finding> {
    let mut findings = Vec::new();
    let spec = files.iter().find(|f| f.path == "docs/spec.md");
    let cases = files.iter().find(|f| f.path == "docs/cases.md");
    let (Some(spec), Some(cases)) = (spec, cases) else {
        findings.push(Finding {
            file: "docs".into(),
            line: 0,
            what: "docs/spec.md and docs/cases.md must both exist".into(),
        });
        return findings;
    };
    let defs = definitions(&spec.text, &cases.text, &mut findings);
    let functions = function_names(files);
    let headings: BTreeMap<&str, BTreeSet<String>> = files
        .iter()
        .filter(|f| f.path.ends_with(".md"))
        .map(|f| (f.path.as_str(), anchors(&f.text)))
        .collect();
    for f in files {
        // This file's own tests cite made-up ids (and the outside names, spelled in pieces).
        if f.path == "tests/src/references.rs" {
            continue;
        }
        let cited = cited_text(f);
        for (line, text) in &cited {
            for (id, _) in ids_in(text) {
                if let Some(why) = unresolved(&id, &defs) {
                    findings.push(finding(f, *line, format!("`{id}`: {why}")));
                }
            }
            for name in outside_references(text) {
                findings.push(finding(
                    f,
                    *line,
                    format!("names `{name}`, which is outside the repository"),
                ));
            }
        }
        if f.path.ends_with(".rs") {
            for (line, name) in rust_function_names(&f.text) {
                for id in ids_in_function_name(&name) {
                    if let Some(why) = unresolved(&id, &defs) {
                        findings.push(finding(f, line, format!("`fn {name}` cites `{id}`: {why}")));
                    }
                }
            }
        }
        if f.path.ends_with(".md") {
            check_links(f, &headings, exists, &mut findings);
        }
        check_backticked(f, &cited, exists, &functions, &mut findings);
    }
    findings.sort();
    findings.dedup();
    findings
}

fn finding(f: &TextFile, line: usize, what: String) -> Finding {
    Finding {
        file: f.path.clone(),
        line,
        what,
    }
}

/// Parses the definitions: in the spec, a bullet `- **ID**` (planned when the entry's first line
/// says `*planned`); in the cases, a heading `### Cnn …`. A definition made twice is a finding.
pub fn definitions(spec: &str, cases: &str, findings: &mut Vec<Finding>) -> Definitions {
    let mut defs = Definitions::default();
    for (i, line) in spec.lines().enumerate() {
        let Some(rest) = line.strip_prefix("- **") else {
            continue;
        };
        let Some((id, after)) = rest.split_once("**") else {
            continue;
        };
        if !is_requirement_id(id) {
            continue;
        }
        let planned = after.trim_start().starts_with("*(planned");
        if defs.requirements.insert(id.to_string(), planned).is_some() {
            findings.push(Finding {
                file: "docs/spec.md".into(),
                line: i + 1,
                what: format!("`{id}` is defined twice"),
            });
        }
    }
    let mut current: Option<String> = None;
    for (i, line) in cases.lines().enumerate() {
        if let Some(rest) = line.strip_prefix("### ") {
            let id: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric())
                .collect();
            if is_case_id(&id) {
                if defs.cases.insert(id.clone(), BTreeSet::new()).is_some() {
                    findings.push(Finding {
                        file: "docs/cases.md".into(),
                        line: i + 1,
                        what: format!("`{id}` is defined twice"),
                    });
                }
                current = Some(id);
            } else {
                current = None;
            }
            continue;
        }
        if line.starts_with("## ") {
            current = None;
        }
        if let Some(id) = &current {
            let variants = defs.cases.get_mut(id).expect("inserted above");
            let b = line.as_bytes();
            for w in b.windows(3) {
                if w[0] == b'(' && w[1].is_ascii_lowercase() && w[2] == b')' {
                    variants.insert(w[1] as char);
                }
            }
        }
    }
    defs
}

/// `A1`, `L3b`, `I12`, `C2`: a family letter, one or two digits, an optional variant letter.
fn is_requirement_id(id: &str) -> bool {
    let b = id.as_bytes();
    if b.is_empty() || !FAMILIES.as_bytes().contains(&b[0]) {
        return false;
    }
    let digits = b[1..].iter().take_while(|c| c.is_ascii_digit()).count();
    let rest = &b[1 + digits..];
    (1..=2).contains(&digits)
        && (rest.is_empty() || (rest.len() == 1 && rest[0].is_ascii_lowercase()))
}

/// `C01`, `C24`: a case heading id (two digits, no variant).
fn is_case_id(id: &str) -> bool {
    let b = id.as_bytes();
    b.len() == 3 && b[0] == b'C' && b[1].is_ascii_digit() && b[2].is_ascii_digit()
}

/// Why `id` does not resolve, or `None` when it does.
fn unresolved(id: &str, defs: &Definitions) -> Option<String> {
    if defs.requirements.contains_key(id) {
        return None;
    }
    let b = id.as_bytes();
    let digits = b[1..].iter().take_while(|c| c.is_ascii_digit()).count();
    if b[0] == b'C' && digits == 2 {
        let base = &id[..3];
        let variant = id[3..].chars().next();
        return match (defs.cases.get(base), variant) {
            (None, _) => Some(format!("no case {base} in docs/cases.md")),
            (Some(_), None) => None,
            (Some(v), Some(c)) if v.contains(&c) => None,
            (Some(_), Some(c)) => {
                Some(format!("case {base} in docs/cases.md has no variant ({c})"))
            }
        };
    }
    if b[0] == b'C' && digits == 1 && !matches!(b[1], b'1'..=b'3') {
        return Some(format!(
            "a case is written with two digits (C0{}); C1–C3 are the configuration requirements",
            b[1] as char
        ));
    }
    Some("not defined in docs/spec.md".into())
}

/// The ids standing alone as words in `text`, with their byte offsets.
pub fn ids_in(text: &str) -> Vec<(String, usize)> {
    let b = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let boundary_before = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if boundary_before && FAMILIES.as_bytes().contains(&b[i]) {
            let digits = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
            if (1..=2).contains(&digits) {
                let mut end = i + 1 + digits;
                if end < b.len() && b[end].is_ascii_lowercase() {
                    end += 1;
                }
                let boundary_after = end == b.len() || !b[end].is_ascii_alphanumeric();
                if boundary_after {
                    out.push((text[i..end].to_string(), i));
                    i = end;
                    continue;
                }
            }
        }
        i += 1;
    }
    out
}

/// The ids a test function's name cites: its leading segments that are lowercase ids
/// (`h5_c31_always_…` → H5, C31; `i1_to_i11_…` → I1).
pub fn ids_in_function_name(name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for seg in name.split('_') {
        let up: String = seg
            .char_indices()
            .map(|(i, c)| if i == 0 { c.to_ascii_uppercase() } else { c })
            .collect();
        if seg.starts_with(|c: char| c.is_ascii_lowercase()) && is_requirement_id(&up) {
            out.push(up);
        } else {
            break;
        }
    }
    out
}

/// Names of files the repository does not hold: the specification, design notes, style notes
/// and case list kept beside the repository, and the folder they live in. Each is spelled in
/// pieces (`concat!`), so that this file, which must hold them to find them, is no match of a
/// plain search of the tree for such references.
pub const OUTSIDE_NAMES: [&str; 5] = [
    concat!("SPEC", ".md"),
    concat!("DESIGN", ".md"),
    concat!("STYLE", ".md"),
    concat!("cases/", "README", ".md"),
    concat!("..", "/", "shared"),
];

/// The folder of [`OUTSIDE_NAMES`] as a path segment of its own, spelled in pieces as they are.
const OUTSIDE_FOLDER: &str = concat!("shared", "/");

/// The [`OUTSIDE_NAMES`] that `text` names, then the outside folder named on its own.
pub fn outside_references(text: &str) -> Vec<String> {
    let mut out: Vec<String> = OUTSIDE_NAMES
        .iter()
        .filter(|n| contains_word(text, n))
        .map(|n| n.to_string())
        .collect();
    // The folder as a path segment of its own (followed by `cases`, or "the folder" in prose).
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(pos) = text[from..].find(OUTSIDE_FOLDER) {
        let at = from + pos;
        let before = if at == 0 { b' ' } else { b[at - 1] };
        let glued = before.is_ascii_alphanumeric() || before == b'_' || before == b'-';
        let named = out.iter().any(|o| o == OUTSIDE_NAMES[4]);
        if !glued && !named {
            out.push(OUTSIDE_FOLDER.into());
            break;
        }
        from = at + 1;
    }
    out
}

/// `needle` in `text` not glued to a longer name before it (a letter, digit or `_` before the
/// name makes it another name).
fn contains_word(text: &str, needle: &str) -> bool {
    let b = text.as_bytes();
    let mut from = 0;
    while let Some(pos) = text[from..].find(needle) {
        let at = from + pos;
        let ok = at == 0 || !(b[at - 1].is_ascii_alphanumeric() || b[at - 1] == b'_');
        if ok {
            return true;
        }
        from = at + 1;
    }
    false
}

/// The text of `f` that can cite: for Rust, its comments and string literals; for every other
/// file, all of it. Returned as (1-based line, text) pieces.
pub fn cited_text(f: &TextFile) -> Vec<(usize, String)> {
    if f.path.ends_with(".rs") {
        rust_prose(&f.text)
    } else {
        f.text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.to_string()))
            .collect()
    }
}

/// The comments and string literals of Rust source, one piece per line they span.
pub fn rust_prose(src: &str) -> Vec<(usize, String)> {
    let b = src.as_bytes();
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut line = 1;
    let mut i = 0;
    let mut piece = String::new();
    let mut piece_line;
    // Pushes the piece collected so far (it began on `piece_line`).
    macro_rules! flush {
        () => {
            if !piece.is_empty() {
                out.push((piece_line, std::mem::take(&mut piece)));
            }
        };
    }
    while i < b.len() {
        let c = b[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if b[i..].starts_with(b"//") {
            let end = src[i..].find('\n').map_or(b.len(), |p| i + p);
            piece_line = line;
            piece.push_str(&src[i + 2..end]);
            flush!();
            i = end;
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            piece_line = line;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if b[i] == b'\n' {
                        flush!();
                        line += 1;
                        piece_line = line;
                    } else {
                        piece.push(src[i..].chars().next().unwrap_or(' '));
                    }
                    i += src[i..].chars().next().map_or(1, char::len_utf8);
                }
            }
            flush!();
        } else if c == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0
                || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
                || (b[i - 1] == b'b' && (i < 2 || !b[i - 2].is_ascii_alphanumeric())))
        {
            // A raw string r"…", r#"…"#.
            let hashes = b[i + 1..].iter().take_while(|&&h| h == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let start = i + 2 + hashes;
            let end = src[start..].find(&close).map_or(b.len(), |p| start + p);
            piece_line = line;
            for (k, l) in src[start..end].split('\n').enumerate() {
                if k > 0 {
                    flush!();
                    line += 1;
                    piece_line = line;
                }
                piece.push_str(l);
            }
            flush!();
            i = (end + close.len()).min(b.len());
        } else if c == b'"' {
            i += 1;
            piece_line = line;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    // Escapes are kept as written; an escaped newline continues the line.
                    if b[i + 1] == b'\n' {
                        flush!();
                        line += 1;
                        piece_line = line;
                        i += 2;
                        continue;
                    }
                    // `\x41`, `\u{1F600}`, `\n`: skipped whole, read as a blank.
                    piece.push(' ');
                    i += match b[i + 1] {
                        b'x' => 4,
                        b'u' => src[i..].find('}').map_or(2, |p| p + 1),
                        _ => 2,
                    };
                    continue;
                }
                if b[i] == b'\n' {
                    flush!();
                    line += 1;
                    piece_line = line;
                    i += 1;
                    continue;
                }
                let ch = src[i..].chars().next().unwrap_or(' ');
                piece.push(ch);
                i += ch.len_utf8();
            }
            flush!();
            i += 1;
        } else if c == b'\'' {
            // A char literal ('"', '\'', '\n') or a lifetime ('a): skip a char literal whole.
            if b.get(i + 1) == Some(&b'\\') {
                let from = (i + 3).min(b.len());
                let end = src[from..].find('\'').map_or(b.len(), |p| from + p);
                i = end + 1;
            } else if b.get(i + 2) == Some(&b'\'') {
                i += 3;
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                if b.get(i + 1 + ch) == Some(&b'\'') {
                    i += 2 + ch;
                } else {
                    i += 1;
                }
            }
        } else {
            i += src[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    out
}

/// Every `fn name` of Rust source with its line (comments and strings are not looked at,
/// which the simple scan accepts: a `fn` in a comment is rare and names a function anyway).
pub fn rust_function_names(src: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, l) in src.lines().enumerate() {
        let mut rest = l;
        while let Some(pos) = rest.find("fn ") {
            let before = rest[..pos].chars().last();
            let after = &rest[pos + 3..];
            let name: String = after
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if before.is_none_or(|c| !(c.is_ascii_alphanumeric() || c == '_')) && !name.is_empty() {
                out.push((i + 1, name));
            }
            rest = &rest[pos + 3..];
        }
    }
    out
}

/// The functions of the repository's Rust files, and the test names registered as strings
/// (`"peers::a9_…"`: libtest-mimic trials), by their last segment.
fn function_names(files: &[TextFile]) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for f in files.iter().filter(|f| f.path.ends_with(".rs")) {
        out.extend(rust_function_names(&f.text).into_iter().map(|(_, n)| n));
        for (_, piece) in rust_prose(&f.text) {
            let p = piece.trim();
            let is_path = p.contains("::")
                && p.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':');
            if is_path && let Some(last) = p.rsplit("::").next() {
                out.insert(last.to_string());
            }
        }
    }
    out
}

/// The anchors of a Markdown file's headings, as GitHub makes them: lower case, punctuation
/// other than `-` and `_` removed, spaces to `-`; repeats get `-1`, `-2`, ….
pub fn anchors(md: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in md.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let t = line.trim_start_matches('#');
        if t.len() == line.len() || !t.starts_with(' ') {
            continue;
        }
        let slug: String = t
            .trim()
            .to_lowercase()
            .chars()
            .filter_map(|c| {
                if c == ' ' {
                    Some('-')
                } else if c.is_alphanumeric() || c == '-' || c == '_' {
                    Some(c)
                } else {
                    None
                }
            })
            .collect();
        let n = seen.entry(slug.clone()).or_insert(0);
        if *n == 0 {
            out.insert(slug);
        } else {
            out.insert(format!("{slug}-{n}"));
        }
        *n += 1;
    }
    out
}

/// `a/b/../c` → `a/c`; `None` when it climbs out of the repository.
fn normalize(path: &str) -> Option<String> {
    let mut parts: Vec<&str> = Vec::new();
    for p in path.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            p => parts.push(p),
        }
    }
    Some(parts.join("/"))
}

fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(d, _)| d)
}

/// Relative Markdown links `[text](target)` must name an existing file, and an anchor must be
/// one of the target's headings.
fn check_links(
    f: &TextFile,
    headings: &BTreeMap<&str, BTreeSet<String>>,
    exists: &dyn Fn(&str) -> bool,
    findings: &mut Vec<Finding>,
) {
    let mut fenced = false;
    for (i, line) in f.text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut rest = line;
        while let Some(pos) = rest.find("](") {
            let after = &rest[pos + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            rest = &after[end..];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if file.is_empty() {
                Some(f.path.clone())
            } else {
                normalize(&format!("{}/{file}", parent_dir(&f.path)))
            };
            let Some(resolved) = resolved.filter(|r| exists(r.trim_end_matches('/'))) else {
                findings.push(finding(
                    f,
                    i + 1,
                    format!("link `{target}` does not resolve"),
                ));
                continue;
            };
            if !anchor.is_empty()
                && let Some(h) = headings.get(resolved.as_str())
                && !h.contains(anchor)
            {
                findings.push(finding(
                    f,
                    i + 1,
                    format!("link `{target}`: {resolved} has no heading `#{anchor}`"),
                ));
            }
        }
    }
}

/// The top-level directories of the repository: a backticked path starting with one of them
/// must exist.
const REPO_DIRS: &[&str] = &[
    "core/",
    "runtime-common/",
    "runtime-tokio/",
    "runtime-smol/",
    "tests/",
    "fuzz/",
    "docs/",
    "scripts/",
    ".ci/",
];

/// Backticked spans of the cited text: a repository path must exist; a cited test name
/// (`hooks::h5_…`, `i1_to_i11_…`) must be a function of the repository.
fn check_backticked(
    f: &TextFile,
    cited: &[(usize, String)],
    exists: &dyn Fn(&str) -> bool,
    functions: &BTreeSet<String>,
    findings: &mut Vec<Finding>,
) {
    let markdown = f.path.ends_with(".md");
    let mut fenced = false;
    for (line, text) in cited {
        if markdown && text.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = text.split('`');
        parts.next();
        while let Some(span) = parts.next() {
            parts.next();
            let span = span.trim();
            if let Some(path) = repo_path(span) {
                // From the root, from the file's directory, or from the file's crate
                // (`tests/fuzz_corpus.rs` in `core/src/…` is `core/tests/fuzz_corpus.rs`).
                let here = normalize(&format!("{}/{path}", parent_dir(&f.path)));
                let krate = f.path.split_once('/').map(|(c, _)| format!("{c}/{path}"));
                let ok = exists(path.trim_end_matches('/'))
                    || here.is_some_and(|h| exists(h.trim_end_matches('/')))
                    || krate.is_some_and(|k| exists(k.trim_end_matches('/')));
                if !ok {
                    findings.push(finding(f, *line, format!("`{span}` does not exist")));
                }
            } else if let Some(name) = cited_test_name(span) {
                let ok = match name.strip_suffix('…') {
                    Some(prefix) => functions.iter().any(|n| n.starts_with(prefix)),
                    None => functions.contains(name),
                };
                if !ok {
                    findings.push(finding(
                        f,
                        *line,
                        format!("test `{span}` is not a function of the repository"),
                    ));
                }
            }
        }
    }
}

/// A span that is a repository path: starts with a top-level directory, only path characters,
/// no placeholder (`*`, `<…>`, `{…}`, `$`, `…`). A position (`core/src/mcp.rs:31:49`) is not
/// checked: it is a record of the tree it was taken from (docs/mutants.md lists mutants of
/// files that have moved since).
fn repo_path(span: &str) -> Option<&str> {
    if span.contains(':') {
        return None;
    }
    let p = span;
    if !REPO_DIRS.iter().any(|d| p.starts_with(d)) {
        return None;
    }
    if p.chars()
        .any(|c| !(c.is_ascii_alphanumeric() || "/._-".contains(c)))
    {
        return None;
    }
    // Made by installing the peers or by running cargo-fuzz, never committed.
    if p.split('/').any(|seg| {
        seg.starts_with(".venv") || matches!(seg, "node_modules" | "artifacts" | "coverage")
    }) {
        return None;
    }
    Some(p)
}

/// A span that names a test: optional `module::` prefixes, then a function name that starts
/// with an id segment (`h5_…`); it may end in `…` (a cited prefix).
fn cited_test_name(span: &str) -> Option<&str> {
    let name = span.rsplit("::").next()?;
    let body = name.strip_suffix('…').unwrap_or(name);
    let valid = span
        .trim_end_matches('…')
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == ':');
    if !valid || !body.contains('_') || ids_in_function_name(body).is_empty() {
        return None;
    }
    Some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "# spec\n\n- **A1** initialize.\n- **C3** allowlist.\n- **L3b** *(planned, issue 21)* surrogates.\n- **I12** determinism.\n";
    const CASES: &str =
        "# cases\n\n### C01 — garbage\n\ntext\n\n### C24 — streams\n\n* (a) no done; (c) cut.\n";

    fn tree(extra: &[(&str, &str)]) -> Vec<TextFile> {
        let mut v = vec![
            TextFile {
                path: "docs/spec.md".into(),
                text: SPEC.into(),
            },
            TextFile {
                path: "docs/cases.md".into(),
                text: CASES.into(),
            },
        ];
        for (p, t) in extra {
            v.push(TextFile {
                path: (*p).into(),
                text: (*t).into(),
            });
        }
        v
    }

    fn check(extra: &[(&str, &str)]) -> Vec<String> {
        let files = tree(extra);
        let paths: BTreeSet<String> = files
            .iter()
            .map(|f| f.path.clone())
            .chain(["docs".to_string(), "core".into(), "core/src".into()])
            .collect();
        check_repository(&files, &|p| paths.contains(p))
            .into_iter()
            .map(|f| f.to_string())
            .collect()
    }

    #[test]
    fn defined_ids_and_variants_resolve() {
        assert_eq!(
            check(&[(
                "docs/x.md",
                "A1, C3, L3b, I12, C01 and C24a, C24c (SPEC C3).\n"
            )]),
            Vec::<String>::new()
        );
        let defs = definitions(SPEC, CASES, &mut Vec::new());
        assert_eq!(defs.requirements.get("L3b"), Some(&true), "planned");
        assert_eq!(defs.requirements.get("A1"), Some(&false));
        assert_eq!(defs.cases["C24"], BTreeSet::from(['a', 'c']));
    }

    #[test]
    fn an_undefined_id_a_missing_case_a_missing_variant_and_a_one_digit_case_are_findings() {
        let got = check(&[("docs/x.md", "See A2, C02, C24b and C7.\n")]);
        assert_eq!(
            got,
            [
                "docs/x.md:1: `A2`: not defined in docs/spec.md",
                "docs/x.md:1: `C02`: no case C02 in docs/cases.md",
                "docs/x.md:1: `C24b`: case C24 in docs/cases.md has no variant (b)",
                "docs/x.md:1: `C7`: a case is written with two digits (C07); C1–C3 are the configuration requirements",
            ]
        );
    }

    #[test]
    fn rust_cites_in_comments_strings_and_test_names_but_not_in_code() {
        let src = "//! SPEC A1 and X9.\nconst T0: u8 = 0; // fine\nfn h5_c01_x() { assert!(true, \"C24 and M99\"); }\nfn i12_y() {}\nlet s = r#\"K3 \"#; let c = '\"'; let d = \"A1\";\n";
        let got = check(&[("core/src/x.rs", src)]);
        assert_eq!(
            got,
            [
                "core/src/x.rs:1: `X9`: not defined in docs/spec.md",
                "core/src/x.rs:3: `M99`: not defined in docs/spec.md",
                "core/src/x.rs:3: `fn h5_c01_x` cites `H5`: not defined in docs/spec.md",
                "core/src/x.rs:5: `K3`: not defined in docs/spec.md",
            ]
        );
    }

    #[test]
    fn names_of_files_beside_the_repository_are_findings() {
        // Spelled here on their own (not read from `OUTSIDE_NAMES`), so a wrong name there fails.
        let (spec, design) = (concat!("SP", "EC.md"), concat!("DES", "IGN.md"));
        let (cases, up) = (concat!("cases/READ", "ME.md"), concat!("../sh", "ared"));
        let folder = concat!("sha", "red/");
        let readme = format!("The contract is {spec}; see {design} and `{up}/{cases}`.\n");
        let comment = format!("// the {folder} folder\nfn f() {{}}\n");
        let fine = format!("Shared state; MY_{spec}; pre-{folder}keys.\n");
        let got = check(&[
            ("README.md", readme.as_str()),
            ("tests/src/y.rs", comment.as_str()),
            ("docs/ok.md", fine.as_str()),
        ]);
        let outside = |file: &str, name: &str| {
            format!("{file}:1: names `{name}`, which is outside the repository")
        };
        assert_eq!(
            got,
            [
                outside("README.md", up),
                outside("README.md", design),
                outside("README.md", spec),
                outside("README.md", cases),
                outside("tests/src/y.rs", folder),
            ]
        );
    }

    #[test]
    fn links_anchors_paths_and_cited_tests_must_resolve() {
        let got = check(&[
            (
                "docs/a.md",
                "# Title\n\n## Models (C01)\n\n[b](b.md) [s](spec.md#spec) [m](#models-c01) [x](#nope) [g](../core/src/gone.rs)\n`core/src/x.rs` `core/src/gone.rs` `core/src/moved.rs:12:4` `core/<dir>/x` `h5_a1_fine` `hooks::a1_missing` `a1_fi…`\n",
            ),
            ("docs/b.md", "```\n[not](a link)\n```\n"),
            ("core/src/x.rs", "fn a1_fine() {}\n"),
        ]);
        assert_eq!(
            got,
            [
                "docs/a.md:5: link `#nope`: docs/a.md has no heading `#nope`",
                "docs/a.md:5: link `../core/src/gone.rs` does not resolve",
                "docs/a.md:6: `core/src/gone.rs` does not exist",
                "docs/a.md:6: test `h5_a1_fine` is not a function of the repository",
                "docs/a.md:6: test `hooks::a1_missing` is not a function of the repository",
            ]
        );
    }

    #[test]
    fn github_anchors_drop_punctuation_and_number_repeats() {
        let a = anchors("# A `b` (C58)\n## Notices\n## Notices\n```\n# not\n```\n");
        assert_eq!(
            a,
            BTreeSet::from(["a-b-c58".to_string(), "notices".into(), "notices-1".into()])
        );
    }

    #[test]
    fn function_name_ids_stop_at_the_first_word() {
        assert_eq!(
            ids_in_function_name("h5_c31_always_blocking"),
            ["H5", "C31"]
        );
        assert_eq!(ids_in_function_name("i1_to_i11_random"), ["I1"]);
        assert_eq!(ids_in_function_name("c24a_no_done"), ["C24a"]);
        assert!(ids_in_function_name("due_timers_fire").is_empty());
    }
}
