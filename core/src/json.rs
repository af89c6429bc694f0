//! Decoding the JSON text peers write (SPEC L3b, L9; cases C36, C64).
//!
//! Every JSON text that comes from outside — an ACP line on stdin, an MCP server's stdout line,
//! an MCP HTTP body or SSE event, a provider's SSE event or error body, a model's tool-call
//! arguments — is decoded here (directly, or through the JSON-RPC codec's `parse_message`), so
//! that what real serialisers write never drops a whole message:
//!
//! - invalid UTF-8 becomes U+FFFD (as `String::from_utf8_lossy`, C36);
//! - a `\uD800`–`\uDFFF` escape that is not half of a surrogate pair (JavaScript's
//!   `JSON.stringify` and Python's `json.dumps` write them for text cut inside a pair, C64)
//!   becomes U+FFFD, exactly as `String::from_utf16_lossy` decodes the same UTF-16;
//! - an invalid escape (`\q`, `\u` with fewer than four hex digits) becomes U+FFFD, the
//!   character after it kept;
//! - a raw control character (U+0000–U+001F) inside a string is kept, as if it were escaped
//!   (hand-written servers print tabs and carriage returns into their strings);
//! - the bare `NaN`, `Infinity` and `-Infinity` that Python's `json.dumps` writes for
//!   non-finite floats become `null` (what JavaScript's `JSON.stringify` writes for them).
//!
//! Text that is JSON is parsed once, unchanged. Only when the strict parse fails is the text
//! repaired (one pass) and parsed again, so decoding stays linear in the input.

use serde_json::Value;

/// Parses one JSON text, repairing what real peers get wrong (see the module docs).
///
/// # Errors
/// The text is not JSON even after the repairs (a cut or garbage line): the strict parser's
/// error for the original text.
pub(crate) fn parse_lossy(text: &str) -> Result<Value, serde_json::Error> {
    match serde_json::from_str(text) {
        Ok(value) => Ok(value),
        Err(err) => match repaired(text) {
            Some(fixed) => serde_json::from_str(&fixed).map_err(|_| err),
            None => Err(err),
        },
    }
}

/// [`parse_lossy`] of bytes: invalid UTF-8 is decoded lossily first (each invalid sequence
/// becomes U+FFFD, SPEC L9); valid UTF-8 is not copied.
///
/// # Errors
/// As [`parse_lossy`].
pub(crate) fn parse_bytes_lossy(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    parse_lossy(&String::from_utf8_lossy(bytes))
}

/// Applies the repairs of the module docs to a JSON text kept as text (a model's tool-call
/// arguments, SPEC L3b), so that what is stored and replayed to the provider is the text that
/// was decoded and run: no lone surrogate escape survives. Strict JSON is left as it is (it
/// never needs a repair).
pub(crate) fn repair_in_place(text: &mut String) {
    if let Some(fixed) = repaired(text) {
        *text = fixed;
    }
}

/// `text` with the repairs of the module docs applied, or `None` when nothing needed one.
///
/// One pass, tracking only whether it is inside a string and the escape it is in: a `\` is
/// always read together with what it escapes, so in `\\ud800` the `\\` is the escape and
/// `ud800` plain text. Every cut is at an ASCII byte, so the result stays UTF-8.
fn repaired(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut fix = Repair {
        bytes,
        out: Vec::new(),
        copied: 0,
        changed: false,
    };
    let mut in_string = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if !in_string {
            let word = |w: &[u8]| bytes.get(i..i + w.len()) == Some(w);
            i = match b {
                b'"' => {
                    in_string = true;
                    i + 1
                }
                b'N' if word(b"NaN") => fix.replace(i, i + 3, b"null"),
                b'I' if word(b"Infinity") => fix.replace(i, i + 8, b"null"),
                b'-' if word(b"-Infinity") => fix.replace(i, i + 9, b"null"),
                _ => i + 1,
            };
            continue;
        }
        i = match b {
            b'"' => {
                in_string = false;
                i + 1
            }
            b'\\' => fix.escape(i),
            0x00..=0x1F => {
                let escaped = format!("\\u{b:04x}");
                fix.replace(i, i + 1, escaped.as_bytes())
            }
            _ => i + 1,
        };
    }
    if !fix.changed {
        return None;
    }
    fix.out
        .extend_from_slice(bytes.get(fix.copied..).unwrap_or_default());
    String::from_utf8(fix.out).ok()
}

/// The output of [`repaired`] being built: `bytes[..copied]` are in `out` (or replaced).
struct Repair<'a> {
    bytes: &'a [u8],
    out: Vec<u8>,
    copied: usize,
    changed: bool,
}

/// The replacement of an escape that cannot stand: U+FFFD, escaped.
const REPLACEMENT: &[u8] = b"\\ufffd";

impl Repair<'_> {
    /// Writes `with` instead of `bytes[start..end]`; returns `end` (where the scan goes on).
    fn replace(&mut self, start: usize, end: usize, with: &[u8]) -> usize {
        self.out
            .extend_from_slice(self.bytes.get(self.copied..start).unwrap_or_default());
        self.out.extend_from_slice(with);
        self.copied = end;
        self.changed = true;
        end
    }

    /// The escape starting with the `\` at `i`, inside a string; returns the index after it.
    fn escape(&mut self, i: usize) -> usize {
        let bytes = self.bytes;
        match bytes.get(i + 1) {
            Some(b'u') => match hex4(bytes, i + 2) {
                Some(0xD800..=0xDBFF) => {
                    let paired = bytes.get(i + 6) == Some(&b'\\')
                        && bytes.get(i + 7) == Some(&b'u')
                        && matches!(hex4(bytes, i + 8), Some(0xDC00..=0xDFFF));
                    if paired {
                        i + 12
                    } else {
                        self.replace(i, i + 6, REPLACEMENT)
                    }
                }
                Some(0xDC00..=0xDFFF) => self.replace(i, i + 6, REPLACEMENT),
                Some(_) => i + 6,
                None => {
                    let mut end = i + 2;
                    while end < i + 6 && bytes.get(end).is_some_and(u8::is_ascii_hexdigit) {
                        end += 1;
                    }
                    self.replace(i, end, REPLACEMENT)
                }
            },
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i + 2,
            Some(_) | None => self.replace(i, i + 1, REPLACEMENT),
        }
    }
}

/// The value of four hex digits at `bytes[at..at + 4]`, if they are all there.
fn hex4(bytes: &[u8], at: usize) -> Option<u16> {
    let digits = bytes.get(at..at + 4)?;
    digits.iter().try_fold(0u16, |acc, &b| {
        let digit = char::from(b).to_digit(16)?;
        Some(acc * 16 + u16::try_from(digit).ok()?)
    })
}

/// The string `key` of each object in the array `list`, in order (a test's view of a list of
/// objects; anything else gives nothing).
#[cfg(test)]
pub(crate) fn strs_of<'a>(list: &'a Value, key: &str) -> Vec<&'a str> {
    let items = list.as_array().map_or(&[][..], Vec::as_slice);
    items.iter().filter_map(|o| o.get(key)?.as_str()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    #[test]
    fn l9_valid_json_parses_unchanged() {
        let text = r#"{"a":"\ud83d\udc1d \u00e9 \\ud800","b":[1,2]}"#;
        assert_eq!(repaired(text), None, "nothing to repair");
        let value = parse_lossy(text).unwrap();
        assert_eq!(value, json!({"a": "🐝 é \\ud800", "b": [1, 2]}));
    }

    #[test]
    fn c64_a_pair_a_lone_high_and_a_lone_low_surrogate_in_one_text() {
        let value =
            parse_lossy(r#"{"text":"ok \ud83d\ude00 cut \ud83d here \udc00 end"}"#).unwrap();
        assert_eq!(
            value,
            json!({"text": "ok 😀 cut \u{FFFD} here \u{FFFD} end"})
        );
    }

    #[test]
    fn l3b_lone_high_and_low_surrogates_become_replacement_characters() {
        for (input, expected) in [
            (r#"{"t":"a\ud800b"}"#, "a\u{fffd}b"),
            (r#"{"t":"a\udc00b"}"#, "a\u{fffd}b"),
            (r#"{"t":"\ud800"}"#, "\u{fffd}"),
            (r#"{"t":"\uD83D"}"#, "\u{fffd}"),
            (r#"{"t":"\ud800\u0041"}"#, "\u{fffd}A"),
            (r#"{"t":"\ud800\ud83d\udc1d"}"#, "\u{fffd}🐝"),
            (r#"{"t":"\udc00\ud800"}"#, "\u{fffd}\u{fffd}"),
            (r#"{"t":"\\\ud800 é"}"#, "\\\u{fffd} é"),
        ] {
            let value = parse_lossy(input).unwrap();
            assert_eq!(value, json!({ "t": expected }), "{input}");
        }
    }

    #[test]
    fn l3b_a_lone_surrogate_in_a_member_name_is_repaired_too() {
        let value = parse_lossy(r#"{"k\ud800":1}"#).unwrap();
        assert_eq!(value, json!({"k\u{fffd}": 1}));
    }

    #[test]
    fn l9_escaped_backslash_before_u_is_not_an_escape() {
        let value = parse_lossy(r#"{"t":"\\ud800","u":"\udc01"}"#).unwrap();
        assert_eq!(value, json!({"t": "\\ud800", "u": "\u{fffd}"}));
    }

    #[test]
    fn l9_short_hex_and_unknown_escapes_become_replacement_characters() {
        let value = parse_lossy(r#"{"t":"a\u12g\qz"}"#).unwrap();
        assert_eq!(value, json!({"t": "a\u{fffd}g\u{fffd}qz"}));
    }

    #[test]
    fn l9_only_a_backslash_u_right_after_a_high_surrogate_can_pair_with_it() {
        let value = parse_lossy(r#"{"t":"\u0041\ud800xudc00"}"#).unwrap();
        assert_eq!(value, json!({"t": "A\u{fffd}xudc00"}));
        let value = parse_lossy(r#"{"t":"\ud800\\udc00"}"#).unwrap();
        assert_eq!(value, json!({"t": "\u{fffd}\\udc00"}));
    }

    #[test]
    fn l9_every_escape_after_a_pair_a_lone_surrogate_or_a_valid_escape_is_still_checked() {
        for (input, expected) in [
            (r#"{"t":"\ud83d\udc1d\ud800\q"}"#, "🐝\u{fffd}\u{fffd}q"),
            (r#"{"t":"\u0041\q"}"#, "A\u{fffd}q"),
            (r#"{"t":"\udc00\q"}"#, "\u{fffd}\u{fffd}q"),
            (r#"{"t":"\n\q"}"#, "\n\u{fffd}q"),
        ] {
            let value = parse_lossy(input).unwrap();
            assert_eq!(value, json!({ "t": expected }), "{input}");
        }
    }

    #[test]
    fn l9_raw_control_characters_inside_strings_are_kept() {
        let value = parse_lossy("{\"t\":\"a\tb\rc\u{1}d\"}").unwrap();
        assert_eq!(value, json!({"t": "a\tb\rc\u{1}d"}));
        // Outside strings a tab or CR is whitespace and stays so.
        assert_eq!(parse_lossy("{\t\"t\":\r1}").unwrap(), json!({"t": 1}));
    }

    #[test]
    fn l9_python_non_finite_floats_become_null_outside_strings_only() {
        let value =
            parse_lossy(r#"{"x":NaN,"y":[Infinity,-Infinity,1.5],"s":"NaN Infinity"}"#).unwrap();
        assert_eq!(
            value,
            json!({"x": null, "y": [null, null, 1.5], "s": "NaN Infinity"})
        );
    }

    #[test]
    fn l3b_arguments_kept_as_text_are_repaired_in_place_and_strict_json_is_left_alone() {
        let mut args = r#"{"text":"cut \ud83d","n":NaN}"#.to_string();
        repair_in_place(&mut args);
        assert_eq!(args, r#"{"text":"cut \ufffd","n":null}"#);
        assert_eq!(
            serde_json::from_str::<Value>(&args).unwrap(),
            json!({"text": "cut \u{fffd}", "n": null})
        );
        let mut strict = r#"{"text":"😀 \ud83d\ude00"}"#.to_string();
        repair_in_place(&mut strict);
        assert_eq!(strict, r#"{"text":"😀 \ud83d\ude00"}"#);
    }

    #[test]
    fn l9_text_that_is_not_json_is_still_an_error() {
        assert!(parse_lossy(r#"{"t":"abc"#).is_err());
        assert!(parse_lossy(r#"{"t":"\ud800"#).is_err());
        assert!(parse_lossy("").is_err());
        assert!(parse_lossy("Welcome back user").is_err());
        assert!(parse_lossy("{\"jsonrpc\":\"2.0\",\"id\":9,\"method\":").is_err());
    }

    #[test]
    fn l9_invalid_utf8_bytes_and_a_lone_surrogate_in_one_line() {
        let value = parse_bytes_lossy(b"{\"t\":\"caf\xE9 \\ud83d\"}").unwrap();
        assert_eq!(value, json!({"t": "caf\u{fffd} \u{fffd}"}));
    }

    #[test]
    fn l3b_a_text_of_100000_lone_surrogates_decodes_in_one_pass() {
        // A quadratic repair would take minutes here; the scan is linear.
        let n = 100_000;
        let text = format!("{{\"t\":\"{}\"}}", "\\ud83d".repeat(n));
        let value = parse_lossy(&text).unwrap();
        assert_eq!(value["t"].as_str().map(|s| s.chars().count()), Some(n));
        assert!(
            value["t"]
                .as_str()
                .unwrap()
                .chars()
                .all(|c| c == '\u{fffd}')
        );
    }

    /// One UTF-16 code unit of a string as a peer might write it: escaped `\uXXXX` (the only
    /// way to write a surrogate), or the character itself when it is one.
    fn unit() -> impl Strategy<Value = (u16, bool)> {
        (
            prop_oneof![
                0xD800u16..=0xDFFF,
                0x20u16..0x80,
                0x80u16..0xD800,
                0xE000u16..=0xFFFF,
            ],
            any::<bool>(),
        )
    }

    proptest! {
        /// SPEC L3b: a JSON string holding any sequence of UTF-16 code units, lone surrogates
        /// included, decodes exactly as `String::from_utf16_lossy` decodes those units.
        #[test]
        fn l3b_any_utf16_escaped_decodes_as_from_utf16_lossy(units in prop::collection::vec(unit(), 0..40)) {
            let mut text = String::from("[\"");
            for (u, escape) in &units {
                let c = char::from_u32(u32::from(*u));
                match c {
                    Some(c) if !*escape && c != '"' && c != '\\' => text.push(c),
                    _ => text.push_str(&format!("\\u{u:04x}")),
                }
            }
            text.push_str("\"]");
            let code_units: Vec<u16> = units.iter().map(|(u, _)| *u).collect();
            let want = String::from_utf16_lossy(&code_units);
            prop_assert_eq!(parse_lossy(&text).ok(), Some(json!([want])));
        }

        /// Repairing never changes a text that already parses, and whatever parses after the
        /// repair serialises back to text that parses strictly (nothing lone survives).
        #[test]
        fn l3b_repair_is_a_no_op_on_json_and_its_output_is_strict_json(s in "\\PC{0,40}", raw in "[\\\\\"a-z0-9 :{}\\[\\],NaIfty-]{0,40}") {
            let valid = serde_json::to_string(&json!({"s": s})).unwrap();
            prop_assert_eq!(repaired(&valid), None);
            if let Ok(v) = parse_lossy(&raw) {
                let back = serde_json::to_string(&v).unwrap();
                prop_assert!(serde_json::from_str::<Value>(&back).is_ok());
            }
        }
    }
}
