//! The YAML frontmatter of a `SKILL.md` (the Agent Skills format): a strict, documented subset
//! of YAML, enough for the `key: value` header skills use (docs/context.md, "Frontmatter").
//! No YAML crate: the core keeps its dependency tree small, and a header of a few keys does
//! not need one.
//!
//! What is accepted, between a first line `---` and the next line `---` (or `...`):
//!
//! - top-level `key: value` lines (a key starts at column 0 and ends at the first `: `), blank
//!   lines and `#` comment lines;
//! - values: plain (a ` #` starts a comment; more-indented lines continue it, folded with
//!   spaces), `'single quoted'` (`''` is a quote), `"double quoted"` (escapes `\\ \" \n \t \r
//!   \0 \/ \xXX \uXXXX \UXXXXXXXX`), both may span lines; block scalars `|` and `>` (with
//!   `-`/`+` chomping and an indentation digit) over the more-indented lines that follow;
//! - a key with nothing after the colon, followed by more-indented `key:` or `- item` lines
//!   (a nested map or list, such as `metadata:`) is kept as [`Value::Nested`] without its
//!   content; followed by other indented text it is a plain scalar.
//!
//! Refused, with a reason naming the line: no opening or closing `---`, a line that is not
//! `key: value` at the top level, a duplicate key, anchors (`&`), aliases (`*`) and tags (`!`),
//! an unterminated quote, text after a closing quote. Every value is trimmed.

use std::collections::BTreeMap;

/// A frontmatter value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Value {
    /// A scalar, as text (trimmed).
    Text(String),
    /// A nested map or list, or a flow collection (`[…]`, `{…}`): present, content not kept.
    Nested,
}

/// A parsed frontmatter: its keys and values, and the Markdown body after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Parsed<'a> {
    pub(crate) fields: BTreeMap<String, Value>,
    pub(crate) body: &'a str,
}

/// Splits `text` (a `SKILL.md`) into its frontmatter and body and parses the frontmatter.
///
/// # Errors
/// One sentence saying what is wrong and where (`line 3: …`).
pub(crate) fn parse(text: &str) -> Result<Parsed<'_>, String> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut lines = text.split_inclusive('\n');
    let first = lines.next().unwrap_or("");
    if first.trim_end() != "---" {
        return Err("it does not start with a YAML frontmatter block (a line ---)".into());
    }
    let mut offset = first.len();
    let mut header: Vec<&str> = Vec::new();
    let mut closed = false;
    for line in lines {
        offset += line.len();
        let bare = line.trim_end();
        if bare == "---" || bare == "..." {
            closed = true;
            break;
        }
        header.push(line.trim_end_matches(['\n', '\r']));
    }
    if !closed {
        return Err("its frontmatter block is not closed with a line ---".into());
    }
    let fields = parse_fields(&header)?;
    Ok(Parsed {
        fields,
        body: text.get(offset..).unwrap_or(""),
    })
}

/// Lines indented (by a space or a tab) or blank: they belong to the value above.
fn is_continuation(line: &str) -> bool {
    line.starts_with([' ', '\t']) || line.trim().is_empty()
}

fn parse_fields(lines: &[&str]) -> Result<BTreeMap<String, Value>, String> {
    let mut fields = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let n = i + 1;
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            i += 1;
            continue;
        }
        if is_continuation(line) {
            return Err(format!("line {n}: an indented line without a key above it"));
        }
        let Some((key, rest)) = split_key(line) else {
            return Err(format!("line {n}: expected `key: value`"));
        };
        // The lines that belong to this value: every following indented or blank line.
        let mut end = i + 1;
        while end < lines.len() && is_continuation(lines[end]) {
            end += 1;
        }
        let more = &lines[i + 1..end];
        let value = parse_value(rest.trim(), more).map_err(|e| format!("line {n}: {e}"))?;
        if fields.insert(key.to_string(), value).is_some() {
            return Err(format!("line {n}: the key {key} appears twice"));
        }
        i = end;
    }
    Ok(fields)
}

/// `key: rest` of a top-level line: the key is what precedes the first `:` that ends the
/// line or is followed by a blank; it may not be empty, start a list or a flow collection, or
/// be quoted.
fn split_key(line: &str) -> Option<(&str, &str)> {
    let bytes = line.as_bytes();
    let at = (0..bytes.len()).find(|&k| {
        bytes[k] == b':' && bytes.get(k + 1).is_none_or(|b| *b == b' ' || *b == b'\t')
    })?;
    let key = line[..at].trim_end();
    let bad_start = key.starts_with(['-', '[', '{', '"', '\'', '?', '&', '*', '!', '|', '>']);
    if key.is_empty() || bad_start || key.contains(": ") {
        return None;
    }
    Some((key, &line[at + 1..]))
}

/// The value after `key:` (`first`, trimmed) with the lines that belong to it (`more`).
fn parse_value(first: &str, more: &[&str]) -> Result<Value, String> {
    match first.chars().next() {
        None => {
            let first_more = more.iter().map(|l| l.trim()).find(|l| !l.is_empty());
            match first_more {
                None => Ok(Value::Text(String::new())),
                Some(l) if l.starts_with("- ") || l == "-" || split_key(l).is_some() => {
                    Ok(Value::Nested)
                }
                Some(_) => Ok(Value::Text(fold_plain(more.iter().copied()))),
            }
        }
        Some('&' | '*' | '!') => Err("anchors, aliases and tags are not supported".into()),
        Some('[' | '{') => Ok(Value::Nested),
        Some('|' | '>') => block_scalar(first, more).map(Value::Text),
        Some('"') => quoted(first, more, '"').map(Value::Text),
        Some('\'') => quoted(first, more, '\'').map(Value::Text),
        Some(_) => {
            let head = strip_comment(first);
            Ok(Value::Text(fold_plain(
                std::iter::once(head).chain(more.iter().map(|l| strip_comment(l.trim()))),
            )))
        }
    }
}

/// A plain scalar's text without its comment (` #` and what follows).
fn strip_comment(s: &str) -> &str {
    match s.find(" #").or_else(|| s.find("\t#")) {
        Some(i) => s[..i].trim_end(),
        None if s.starts_with('#') => "",
        None => s,
    }
}

/// Lines folded as YAML folds plain and quoted scalars: joined with a space, a blank line
/// giving a newline.
fn fold_plain<'a>(lines: impl Iterator<Item = &'a str>) -> String {
    let mut out = String::new();
    let mut pending_newlines = 0;
    for line in lines {
        let t = line.trim();
        if t.is_empty() {
            pending_newlines += 1;
            continue;
        }
        if !out.is_empty() {
            if pending_newlines > 0 {
                out.push_str(&"\n".repeat(pending_newlines));
            } else {
                out.push(' ');
            }
        }
        pending_newlines = 0;
        out.push_str(t);
    }
    out
}

/// `|`/`>` with its indicators (`first`) over `more`: the lines' common indentation (from the
/// first non-blank line, or the indentation digit) removed; `|` keeps the line breaks, `>`
/// folds them. Trailing breaks are dropped (values are trimmed).
fn block_scalar(first: &str, more: &[&str]) -> Result<String, String> {
    let literal = first.starts_with('|');
    let indicators = strip_comment(&first[1..]).trim();
    if !indicators
        .chars()
        .all(|c| c == '-' || c == '+' || c.is_ascii_digit())
        || indicators.len() > 2
    {
        return Err(format!("bad block scalar header {first:?}"));
    }
    let indent = match indicators.chars().find(char::is_ascii_digit) {
        Some(d) => d.to_digit(10).map_or(1, |d| d as usize),
        None => more
            .iter()
            .find(|l| !l.trim().is_empty())
            .map_or(0, |l| l.len() - l.trim_start().len()),
    };
    let body: Vec<&str> = more
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").trim_end())
        .collect();
    let text = if literal {
        body.join("\n")
    } else {
        fold_plain(body.into_iter())
    };
    Ok(text.trim().to_string())
}

/// A quoted scalar starting at `first` (with `quote`), continued over `more`.
fn quoted(first: &str, more: &[&str], quote: char) -> Result<String, String> {
    let mut joined = String::from(&first[1..]);
    for l in more {
        joined.push('\n');
        joined.push_str(l.trim());
    }
    let mut out = String::new();
    let mut chars = joined.chars().peekable();
    let mut closed = false;
    while let Some(c) = chars.next() {
        match c {
            c if c == quote && quote == '\'' && chars.peek() == Some(&'\'') => {
                chars.next();
                out.push('\'');
            }
            c if c == quote => {
                closed = true;
                break;
            }
            '\\' if quote == '"' => out.push(escape(&mut chars)?),
            '\n' => {
                // A line break inside quotes folds to a space; a blank line is a newline.
                if out.ends_with('\n') || chars.peek() == Some(&'\n') {
                    out.push('\n');
                } else {
                    out.push(' ');
                }
            }
            c => out.push(c),
        }
    }
    if !closed {
        return Err(format!("the {quote}quoted{quote} value is not closed"));
    }
    let rest: String = chars.collect();
    if !strip_comment(rest.trim()).is_empty() {
        return Err(format!("text after the closing {quote}"));
    }
    Ok(out.trim().to_string())
}

fn escape(chars: &mut std::iter::Peekable<std::str::Chars<'_>>) -> Result<char, String> {
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| {
        let digits: String = chars.take(n).collect();
        u32::from_str_radix(&digits, 16)
            .ok()
            .filter(|_| digits.len() == n)
            .and_then(char::from_u32)
            .ok_or_else(|| format!("bad escape \\…{digits}"))
    };
    match chars.next() {
        Some('\\') => Ok('\\'),
        Some('"') => Ok('"'),
        Some('/') => Ok('/'),
        Some('n') => Ok('\n'),
        Some('t') => Ok('\t'),
        Some('r') => Ok('\r'),
        Some('0') => Ok('\0'),
        Some(' ') => Ok(' '),
        Some('x') => hex(chars, 2),
        Some('u') => hex(chars, 4),
        Some('U') => hex(chars, 8),
        Some(c) => Err(format!("unknown escape \\{c}")),
        None => Err("a \\ at the end of the value".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(v: &str) -> Value {
        Value::Text(v.into())
    }

    fn fields(src: &str) -> BTreeMap<String, Value> {
        match parse(src) {
            Ok(p) => p.fields,
            Err(e) => panic!("{e}: {src}"),
        }
    }

    #[test]
    fn a10_plain_quoted_and_block_values_and_the_body_after_the_block() {
        let src = "---\nname: pdf-tools   # the id\ndescription: Extracts text\n  and tables from PDFs.\nlicense: 'it''s MIT'\ncompatibility: \"needs \\\"poppler\\\"\\tv2\"\nmetadata:\n  author: me\n  tags:\n    - a\nallowed-tools: [Read, Grep]\n---\n# PDF tools\n\nUse pdftotext.\n";
        let p = parse(src).expect("valid");
        assert_eq!(p.fields["name"], text("pdf-tools"));
        assert_eq!(
            p.fields["description"],
            text("Extracts text and tables from PDFs.")
        );
        assert_eq!(p.fields["license"], text("it's MIT"));
        assert_eq!(p.fields["compatibility"], text("needs \"poppler\"\tv2"));
        assert_eq!(p.fields["metadata"], Value::Nested);
        assert_eq!(p.fields["allowed-tools"], Value::Nested);
        assert_eq!(p.body, "# PDF tools\n\nUse pdftotext.\n");
    }

    #[test]
    fn a10_block_scalars_fold_or_keep_lines_and_a_plain_value_may_start_below_its_key() {
        let f = fields(
            "---\na: >-\n  one\n  two\n\n  three\nb: |\n  x\n   y\nc:\n  starts below\n  and goes on\n---\n",
        );
        assert_eq!(f["a"], text("one two\nthree"));
        assert_eq!(f["b"], text("x\n y"));
        assert_eq!(f["c"], text("starts below and goes on"));
        let f = fields("\u{feff}---\r\nname: crlf\r\n---\r\nbody");
        assert_eq!(f["name"], text("crlf"), "a BOM and CRLF lines");
    }

    #[test]
    fn a10_broken_frontmatter_is_refused_with_the_line() {
        let err = |src: &str| parse(src).err().unwrap_or_default();
        assert_eq!(
            err("# no frontmatter\n"),
            "it does not start with a YAML frontmatter block (a line ---)"
        );
        assert_eq!(
            err("---\nname: x\n"),
            "its frontmatter block is not closed with a line ---"
        );
        assert_eq!(
            err("---\njust words\n---\n"),
            "line 1: expected `key: value`"
        );
        assert_eq!(
            err("---\na: 1\na: 2\n---\n"),
            "line 2: the key a appears twice"
        );
        assert_eq!(
            err("---\n  indented: x\n---\n"),
            "line 1: an indented line without a key above it"
        );
        assert_eq!(
            err("---\nname: &x y\n---\n"),
            "line 1: anchors, aliases and tags are not supported"
        );
        assert_eq!(
            err("---\nname: \"open\n---\n"),
            "line 1: the \"quoted\" value is not closed"
        );
        assert_eq!(
            err("---\nname: 'a' b\n---\n"),
            "line 1: text after the closing '"
        );
        assert_eq!(err("---\n- a\n---\n"), "line 1: expected `key: value`");
        assert_eq!(
            err("---\nd: \"bad \\q\"\n---\n"),
            "line 1: unknown escape \\q"
        );
    }

    #[test]
    fn a10_a_colon_inside_a_value_or_a_url_is_text() {
        let f = fields(
            "---\ndescription: Use when: the user says so. See https://x.y/z\nurl: http://a:8080/b\n---\n",
        );
        assert_eq!(
            f["description"],
            text("Use when: the user says so. See https://x.y/z")
        );
        assert_eq!(f["url"], text("http://a:8080/b"));
    }

    proptest! {
        #[test]
        fn a10_any_text_parses_or_is_refused_without_a_panic(src in "(---\n)?[ -~\t\n'\"|>:#&-]{0,200}(---\n)?") {
            let _ = parse(&src);
        }
    }
}
