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
//!
//! A user prompt that starts with `/<command>` (a command of the session) is run: its words
//! are bound to the prompt's arguments ([`bind_arguments`]), `prompts/get` is sent, and the
//! messages it answers become the text of the user's turn ([`render_messages`]).

use crate::ids::{McpRequestId, ServerSlot};
use crate::jsonrpc::RpcId;
use serde_json::{Map, Value, json};
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

/// A command of a session waiting for its `prompts/get` (SPEC A11): the `session/prompt` to
/// answer (or to start the turn of), and what to send after the prompt's messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PendingCommand {
    /// The `session/prompt` request.
    pub(crate) rpc: RpcId,
    /// The server asked.
    pub(crate) server: ServerSlot,
    /// The `prompts/get` request in flight.
    pub(crate) request: McpRequestId,
    /// The command as typed, without its `/` (for messages).
    pub(crate) command: String,
    /// The user's text after the command of a prompt without arguments (sent after the
    /// prompt's messages); `None` when there was none.
    pub(crate) extra: Option<String>,
}

/// The command word and the rest of a user prompt `text` that starts with `/`: `/docs:review
/// src/main.rs` → `("docs:review", "src/main.rs")`. `None` when `text` does not start with `/`
/// or has no word after it.
pub(crate) fn parse_command(text: &str) -> Option<(&str, &str)> {
    let body = text.strip_prefix('/')?;
    let end = body.find(char::is_whitespace).unwrap_or(body.len());
    let (word, rest) = body.split_at(end);
    (!word.is_empty()).then(|| (word, rest.trim()))
}

/// How prompt `prompt` of the server with prefix `prefix` is typed: `/docs:review <file>
/// [focus]`.
pub(crate) fn usage(prefix: &str, prompt: &Prompt) -> String {
    let name = command_name(prefix, &prompt.name);
    match prompt.input_hint() {
        Some(hint) => format!("/{name} {hint}"),
        None => format!("/{name}"),
    }
}

/// The next word of `text` (after leading whitespace) and what follows it: a word in double
/// quotes may hold spaces (`"two words"`); otherwise a word ends at whitespace.
fn next_word(text: &str) -> Option<(String, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    if let Some(quoted) = text.strip_prefix('"')
        && let Some(end) = quoted.find('"')
    {
        return Some((quoted[..end].to_string(), &quoted[end + 1..]));
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((text[..end].to_string(), &text[end..]))
}

/// The text of the last argument: `rest` trimmed, without the quotes when it is one quoted
/// word.
fn last_argument(rest: &str) -> String {
    let rest = rest.trim();
    match rest.strip_prefix('"').and_then(|r| r.strip_suffix('"')) {
        Some(inner) if !inner.contains('"') => inner.to_string(),
        _ => rest.to_string(),
    }
}

/// Binds the text typed after a command (`rest`) to the arguments of `prompt` (SPEC A11): one
/// word per argument in order (`"…"` quotes a word with spaces), the last argument taking all
/// the text that is left; arguments without text are not sent. A prompt without arguments
/// takes no words: the text, if any, is handed back to be sent after the prompt's messages.
///
/// # Errors
/// A sentence naming the first required argument without text.
pub(crate) fn bind_arguments(
    prompt: &Prompt,
    rest: &str,
) -> Result<(Map<String, Value>, Option<String>), String> {
    let mut args = Map::new();
    if prompt.arguments.is_empty() {
        let extra = rest.trim();
        return Ok((args, (!extra.is_empty()).then(|| extra.to_string())));
    }
    let mut left = rest;
    let last = prompt.arguments.len() - 1;
    for (i, arg) in prompt.arguments.iter().enumerate() {
        let value = if i == last {
            Some(last_argument(left)).filter(|v| !v.is_empty())
        } else {
            next_word(left).map(|(word, after)| {
                left = after;
                word
            })
        };
        match value {
            Some(v) => {
                args.insert(arg.name.clone(), Value::String(v));
            }
            None if arg.required => {
                return Err(format!("the argument <{}> is missing", arg.name));
            }
            None => {}
        }
    }
    Ok((args, None))
}

/// The text of the user's turn from a `prompts/get` result (MCP `GetPromptResult`, SPEC A11):
/// the content of every message, in order, converted as a tool result's is (SPEC L3: text as
/// it is, an embedded text resource as `[resource: uri]` and its text, images, audio and blobs
/// as a short marker, a block for the user alone left out), one paragraph each, the whole
/// middle-elided over `cap` bytes. The messages' roles are not kept: the turn is one user
/// message.
///
/// # Errors
/// A sentence when the result has no `messages` array or they hold no text.
pub(crate) fn render_messages(result: &Value, cap: usize) -> Result<String, String> {
    let Some(messages) = result.get("messages").and_then(Value::as_array) else {
        return Err("its prompts/get answer has no messages".into());
    };
    let parts: Vec<String> = messages
        .iter()
        .filter_map(|m| m.get("content"))
        .map(|c| crate::tools::convert_result(&json!({"content": [c]}), cap).text)
        .filter(|t| !t.trim().is_empty())
        .collect();
    if parts.is_empty() {
        return Err("its prompts/get answer holds no text".into());
    }
    Ok(crate::tools::elide_middle(parts.join("\n\n"), cap))
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

#[cfg(test)]
mod run_tests {
    use super::*;

    fn review() -> Prompt {
        Prompt {
            name: "review".into(),
            description: String::new(),
            arguments: vec![
                PromptArg {
                    name: "file".into(),
                    required: true,
                },
                PromptArg {
                    name: "focus".into(),
                    required: false,
                },
            ],
        }
    }

    #[test]
    fn a11_a_command_is_the_first_word_after_the_slash() {
        assert_eq!(
            parse_command("/docs:review  src/a.rs  "),
            Some(("docs:review", "src/a.rs"))
        );
        assert_eq!(parse_command("/docs:greet"), Some(("docs:greet", "")));
        assert_eq!(parse_command("/ x"), None);
        assert_eq!(parse_command("docs:greet"), None);
    }

    #[test]
    fn a11_words_bind_in_order_and_the_last_argument_takes_the_rest() {
        let p = review();
        let (args, extra) =
            bind_arguments(&p, "src/a.rs error handling and logs").unwrap_or_default();
        assert_eq!(
            Value::Object(args),
            json!({"file": "src/a.rs", "focus": "error handling and logs"})
        );
        assert_eq!(extra, None);
        let (args, _) = bind_arguments(&p, r#""my file.rs" "the tests""#).unwrap_or_default();
        assert_eq!(
            Value::Object(args),
            json!({"file": "my file.rs", "focus": "the tests"})
        );
        let (args, _) = bind_arguments(&p, "a.rs").unwrap_or_default();
        assert_eq!(
            Value::Object(args),
            json!({"file": "a.rs"}),
            "no empty optional argument"
        );
        assert_eq!(
            bind_arguments(&p, "   "),
            Err("the argument <file> is missing".into())
        );
        assert_eq!(usage("docs", &p), "/docs:review <file> [focus]");
    }

    #[test]
    fn a11_a_prompt_without_arguments_hands_the_text_back() {
        let p = Prompt {
            name: "greet".into(),
            description: String::new(),
            arguments: Vec::new(),
        };
        let (args, extra) = bind_arguments(&p, " and be brief ").unwrap_or_default();
        assert!(args.is_empty());
        assert_eq!(extra.as_deref(), Some("and be brief"));
        assert_eq!(bind_arguments(&p, "").map(|(_, e)| e), Ok(None));
    }

    #[test]
    fn a11_messages_become_one_text_converted_as_tool_results_are() {
        let result = json!({"messages": [
            {"role": "user", "content": {"type": "text", "text": "Describe this."}},
            {"role": "user", "content": {"type": "image", "mimeType": "image/png", "data": "AAAA"}},
            {"role": "user", "content": {"type": "resource", "resource": {"uri": "file:///p.md", "text": "# Plan"}}},
            {"role": "assistant", "content": {"type": "text", "text": "I will."}},
            {"role": "user", "content": {"type": "text", "text": "for the user only",
                                         "annotations": {"audience": ["user"]}}},
        ]});
        assert_eq!(
            render_messages(&result, 10_000),
            Ok("Describe this.\n\n[image elided: image/png, 3 bytes]\n\n[resource: file:///p.md]\n# Plan\n\nI will.".into())
        );
        assert!(render_messages(&json!({}), 100).is_err());
        assert!(render_messages(&json!({"messages": []}), 100).is_err());
        let long = json!({"messages": [{"role": "user", "content": {"type": "text", "text": "x".repeat(5000)}}]});
        assert!(render_messages(&long, 1000).is_ok_and(|t| t.len() < 1200));
    }
}
