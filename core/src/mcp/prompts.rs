//! MCP prompts as ACP commands (SPEC A11): what a server's `prompts/list` (MCP 2025-11-25
//! server/prompts) offers, kept per server as [`Prompt`]s, and the ACP `AvailableCommand`s the
//! client is shown for them (`available_commands_update`, ACP schema `AvailableCommand`).
//!
//! A prompt is offered as the command `<server>:<prompt>` (the server's tool prefix, SPEC M3,
//! then the prompt's name), its arguments as the command's input hint (`<required>
//! [optional]`). Prompts whose name starts with `_` (a hook server's own, SPEC H1), or that
//! cannot be typed as one word (empty, whitespace or control characters, over
//! [`MAX_PROMPT_NAME_BYTES`]), or that repeat a name, are not offered (one WARN each). A
//! server offers at most [`MAX_PROMPTS_PER_SERVER`] prompts.

use serde_json::{Value, json};
use std::collections::BTreeSet;

/// The most prompts one server's `prompts/list` may give (SPEC S5 for prompts); the rest is
/// cut off with a WARN.
pub(crate) const MAX_PROMPTS_PER_SERVER: usize = 256;

/// The longest prompt name offered as a command, in bytes.
pub(crate) const MAX_PROMPT_NAME_BYTES: usize = 128;

/// The longest description shown for a command, in characters (longer ones are cut, `…`).
const MAX_DESCRIPTION_CHARS: usize = 1024;

/// The most arguments of one prompt that are kept (the rest are dropped with a WARN).
const MAX_ARGUMENTS: usize = 32;

/// One argument of a prompt (MCP `PromptArgument`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PromptArg {
    /// Its name, as `prompts/get` takes it.
    pub(crate) name: String,
    /// Whether the server needs it.
    pub(crate) required: bool,
}

/// One prompt of a server (MCP `Prompt`), as the commands need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Prompt {
    /// Its name, as `prompts/get` takes it.
    pub(crate) name: String,
    /// Its `title`, else its `description`, on one line (may be empty).
    pub(crate) description: String,
    /// Its arguments, in the server's order.
    pub(crate) arguments: Vec<PromptArg>,
}

impl Prompt {
    /// The command's input hint (ACP `UnstructuredCommandInput.hint`): each argument as
    /// `<name>` when required, `[name]` when optional, in order; `None` without arguments.
    pub(crate) fn input_hint(&self) -> Option<String> {
        if self.arguments.is_empty() {
            return None;
        }
        let parts: Vec<String> = self
            .arguments
            .iter()
            .map(|a| {
                if a.required {
                    format!("<{}>", a.name)
                } else {
                    format!("[{}]", a.name)
                }
            })
            .collect();
        Some(parts.join(" "))
    }
}

/// Whether `name` can be typed as a command word: not empty, at most
/// [`MAX_PROMPT_NAME_BYTES`], no whitespace and no control characters.
fn typable(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_PROMPT_NAME_BYTES
        && !name.chars().any(|c| c.is_whitespace() || c.is_control())
}

/// `text` on one line (runs of whitespace become one space), at most
/// [`MAX_DESCRIPTION_CHARS`] characters.
fn one_line(text: &str) -> String {
    let joined = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if joined.chars().count() <= MAX_DESCRIPTION_CHARS {
        return joined;
    }
    let mut cut: String = joined.chars().take(MAX_DESCRIPTION_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// The prompts of a complete `prompts/list` of server `server` (its entries of every page, in
/// order), with one WARN text for each entry left out: hook prompts (`_…`) silently, names
/// that cannot be typed, repeated names, arguments without a name, and everything past
/// [`MAX_PROMPTS_PER_SERVER`].
pub(crate) fn parse_list(entries: &[Value], server: &str) -> (Vec<Prompt>, Vec<String>) {
    let mut prompts: Vec<Prompt> = Vec::new();
    let mut warns = Vec::new();
    let mut seen = BTreeSet::new();
    for entry in entries {
        let Some(name) = entry.get("name").and_then(Value::as_str) else {
            warns.push(format!(
                "mcp '{server}': a prompt without a name is not offered as a command"
            ));
            continue;
        };
        if crate::tools::is_hook_name(name) {
            continue;
        }
        if !typable(name) {
            warns.push(format!(
                "mcp '{server}': prompt {name:?} is not offered as a command: its name is empty, over {MAX_PROMPT_NAME_BYTES} bytes, or holds spaces or control characters"
            ));
            continue;
        }
        if !seen.insert(name.to_string()) {
            warns.push(format!(
                "mcp '{server}': prompt '{name}' is listed twice; the first one is kept"
            ));
            continue;
        }
        if prompts.len() >= MAX_PROMPTS_PER_SERVER {
            warns.push(format!(
                "mcp '{server}': prompts/list has more than {MAX_PROMPTS_PER_SERVER} prompts; the rest are not offered as commands"
            ));
            break;
        }
        let text = |k: &str| entry.get(k).and_then(Value::as_str).map(str::trim);
        let description = text("description")
            .filter(|d| !d.is_empty())
            .or_else(|| text("title"))
            .unwrap_or("");
        let mut arguments = Vec::new();
        for arg in entry
            .get("arguments")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(arg_name) = arg
                .get("name")
                .and_then(Value::as_str)
                .filter(|n| typable(n))
            else {
                warns.push(format!(
                    "mcp '{server}': prompt '{name}' has an argument without a usable name; it is left out"
                ));
                continue;
            };
            if arguments.len() >= MAX_ARGUMENTS {
                warns.push(format!(
                    "mcp '{server}': prompt '{name}' has more than {MAX_ARGUMENTS} arguments; the rest are left out"
                ));
                break;
            }
            arguments.push(PromptArg {
                name: arg_name.to_string(),
                required: arg.get("required").and_then(Value::as_bool) == Some(true),
            });
        }
        prompts.push(Prompt {
            name: name.to_string(),
            description: one_line(description),
            arguments,
        });
    }
    (prompts, warns)
}

/// The command name of prompt `prompt` of the server whose tool prefix is `prefix` (SPEC A11):
/// `<prefix>:<prompt>`, typed by the user as `/<prefix>:<prompt>`.
pub(crate) fn command_name(prefix: &str, prompt: &str) -> String {
    format!("{prefix}:{prompt}")
}

/// The ACP `AvailableCommand` of `prompt` of the server with tool prefix `prefix` (ACP schema:
/// `name`, `description`, `input: {hint}` or `null`).
pub(crate) fn available_command(prefix: &str, prompt: &Prompt) -> Value {
    let input = prompt.input_hint().map(|hint| json!({"hint": hint}));
    json!({
        "name": command_name(prefix, &prompt.name),
        "description": prompt.description,
        "input": input,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a11_prompts_become_commands_with_a_hint_from_their_arguments() {
        let (prompts, warns) = parse_list(
            &[
                json!({"name": "review", "description": "Review the\n  code", "arguments": [
                    {"name": "file", "required": true}, {"name": "focus"}]}),
                json!({"name": "plain", "title": "Plain prompt"}),
            ],
            "srv",
        );
        assert!(warns.is_empty(), "{warns:?}");
        assert_eq!(prompts.len(), 2);
        assert_eq!(
            available_command("srv", &prompts[0]),
            json!({"name": "srv:review", "description": "Review the code",
                   "input": {"hint": "<file> [focus]"}})
        );
        assert_eq!(
            available_command("srv", &prompts[1]),
            json!({"name": "srv:plain", "description": "Plain prompt", "input": null})
        );
    }

    #[test]
    fn a11_hook_prompts_are_never_offered_and_bad_names_are_left_out_with_a_warning() {
        let long = "x".repeat(MAX_PROMPT_NAME_BYTES + 1);
        let (prompts, warns) = parse_list(
            &[
                json!({"name": "_Stop"}),
                json!({"name": "two words"}),
                json!({"name": "bell\u{7}"}),
                json!({"name": ""}),
                json!({"name": long}),
                json!({"description": "no name"}),
                json!({"name": "ok", "arguments": [{"name": "a b"}, {"name": "b"}]}),
                json!({"name": "ok"}),
            ],
            "srv",
        );
        let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["ok"]);
        assert_eq!(prompts[0].input_hint().as_deref(), Some("[b]"));
        assert_eq!(warns.len(), 7, "{warns:#?}");
        assert!(
            warns.iter().all(|w| !w.contains("_Stop")),
            "hook prompts go unmentioned"
        );
        assert!(warns.iter().any(|w| w.contains("listed twice")));
    }

    #[test]
    fn a11_a_server_offers_at_most_256_prompts_and_descriptions_are_capped() {
        let entries: Vec<Value> = (0..MAX_PROMPTS_PER_SERVER + 10)
            .map(|i| json!({"name": format!("p{i}"), "description": "d".repeat(5000)}))
            .collect();
        let (prompts, warns) = parse_list(&entries, "srv");
        assert_eq!(prompts.len(), MAX_PROMPTS_PER_SERVER);
        assert_eq!(warns.len(), 1, "one warning for the cut: {warns:?}");
        assert_eq!(
            prompts[0].description.chars().count(),
            MAX_DESCRIPTION_CHARS
        );
        assert!(prompts[0].description.ends_with('…'));
    }
}
