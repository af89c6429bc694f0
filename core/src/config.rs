//! Configuration read from the environment, once, at start (SPEC C1–C3; M1 and S1 for the
//! environment MCP children get: [`child_environment`]).
//!
//! The core never reads the environment or the file system: the runtime passes a snapshot of
//! the environment as a `BTreeMap` and a closure that reads the system-prompt file
//! ([`Config::from_env_map`]). Every failure is one [`ConfigError`] whose `Display` is a single
//! line naming the variable, the value and what is allowed; the runtime prints it and exits 2.
//!
//! Rules applied to every variable (C1), including choices the SPEC leaves open:
//! - Surrounding blanks (Unicode whitespace) are trimmed. A value that is empty after trimming
//!   is treated as unset, so the default applies (or, for a required variable, it is missing).
//! - Numbers are plain decimal integers: ASCII digits only after trimming (no sign, `_`,
//!   exponent or fraction); leading zeros are allowed.
//! - Booleans are `1/0/true/false/yes/no/on/off` in any case.
//! - Keywords (`anthropic`, `chat`, `ask`, `info`, `json`, …) are matched in any case.
//! - Only the selected provider's variables are read; the other provider's are ignored, so an
//!   environment that also serves other tools does not fail on them.
//! - Durations configured in seconds accept 1..=4294967295 s (about 136 years: large enough to
//!   mean "never", small enough that a deadline can never overflow a clock).

use std::collections::BTreeMap;
use std::fmt;

pub use crate::oauth::settings::OAuthConfig;

/// Which LLM API the agent talks to (C2 `BUZZ_AGENT_PROVIDER`, `OPENAI_COMPAT_API`; L6–L8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProviderKind {
    /// `BUZZ_AGENT_PROVIDER=anthropic`: Anthropic Messages API (L6).
    Anthropic,
    /// `BUZZ_AGENT_PROVIDER=openai` (alias `openai-compat`) with `OPENAI_COMPAT_API=chat`
    /// (the default): Chat Completions (L7).
    OpenAiChat,
    /// `BUZZ_AGENT_PROVIDER=openai` with `OPENAI_COMPAT_API=responses`: Responses API (L8).
    OpenAiResponses,
}

impl ProviderKind {
    /// Every route, the one list the dispatch (`llm::route`), the route tests, the fuzz targets
    /// and the fake LLM of the e2e suite follow (docs/architecture.md, "Adding a provider
    /// route").
    pub const ALL: [ProviderKind; 3] = [
        ProviderKind::Anthropic,
        ProviderKind::OpenAiChat,
        ProviderKind::OpenAiResponses,
    ];

    /// The `BUZZ_AGENT_PROVIDER` value that selects it, as the user writes it.
    #[must_use]
    pub fn env_value(self) -> &'static str {
        match self {
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses => "openai",
        }
    }

    /// The `OPENAI_COMPAT_API` value of an OpenAI-compatible route (`chat`, `responses`);
    /// `None` for Anthropic.
    #[must_use]
    pub fn api_value(self) -> Option<&'static str> {
        match self {
            ProviderKind::Anthropic => None,
            ProviderKind::OpenAiChat => Some("chat"),
            ProviderKind::OpenAiResponses => Some("responses"),
        }
    }
}

/// A server allowlist in C3 syntax: the hook allowlist from `MCP_HOOK_SERVERS` (H2), and the
/// interceptor servers from `BUZZ_AGENT_INTERCEPTOR_SERVERS` (X1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookAllowlist {
    /// Unset, empty, or only blanks and commas: hooks are off (the default).
    Off,
    /// `*` as the only entry: every server's hooks run.
    All,
    /// Comma-separated server names, trimmed, empties and duplicates dropped, in the order
    /// given. Matched exactly (case-sensitive) against the `name` from `session/new`.
    Names(Vec<String>),
}

impl HookAllowlist {
    /// The allowlist as `MCP_HOOK_SERVERS` is written: `*`, the names joined by `,`, or
    /// `unset` when off (for log lines).
    #[must_use]
    pub fn env_value(&self) -> String {
        match self {
            HookAllowlist::Off => "unset".to_owned(),
            HookAllowlist::All => "*".to_owned(),
            HookAllowlist::Names(n) => n.join(","),
        }
    }

    /// Whether hooks of the MCP server named `server` (its `session/new` name) may run (C3, H2).
    #[must_use]
    pub fn allows(&self, server: &str) -> bool {
        match self {
            HookAllowlist::Off => false,
            HookAllowlist::All => true,
            HookAllowlist::Names(names) => names.iter().any(|n| n == server),
        }
    }
}

/// `BUZZ_AGENT_PERMISSION` (C2, A7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PermissionMode {
    /// `ask` (default): `session/request_permission` before every model tool call.
    Ask,
    /// `allow`: model tool calls run without asking.
    Allow,
}

impl PermissionMode {
    /// The `BUZZ_AGENT_PERMISSION` value, as the user writes it (`ask`, `allow`).
    #[must_use]
    pub fn env_value(self) -> &'static str {
        match self {
            PermissionMode::Ask => "ask",
            PermissionMode::Allow => "allow",
        }
    }
}

/// `BUZZ_AGENT_LOG` stderr log level (C2, P2). Ordered from least to most verbose, so a record
/// at `level` is emitted when `level <= config.log_level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    /// `error`
    Error,
    /// `warn` (also accepted: `warning`)
    Warn,
    /// `info` (default)
    Info,
    /// `debug`: adds prompt and tool text (P2)
    Debug,
    /// `trace`
    Trace,
}

/// `BUZZ_AGENT_LOG_FORMAT` (C2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `text` (default): one human-readable line per record.
    Text,
    /// `json`: one compact JSON object per line.
    Json,
}

/// A reasoning effort (SPEC L12, `BUZZ_AGENT_THINKING_EFFORT`, the session's `thought_level`
/// config option): how much the model may think before it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Effort {
    /// `low`
    Low,
    /// `medium`
    Medium,
    /// `high`
    High,
    /// `max`: the most the provider offers (OpenAI's routes: `high`).
    Max,
}

impl Effort {
    /// Every effort, lowest first.
    pub const ALL: [Effort; 4] = [Effort::Low, Effort::Medium, Effort::High, Effort::Max];

    /// The configuration spelling: `low`, `medium`, `high`, `max`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Effort::Low => "low",
            Effort::Medium => "medium",
            Effort::High => "high",
            Effort::Max => "max",
        }
    }

    /// The effort spelled `s` (trimmed, any case), if it is one.
    #[must_use]
    pub fn parse(s: &str) -> Option<Effort> {
        let s = s.trim();
        Effort::ALL
            .into_iter()
            .find(|e| e.as_str().eq_ignore_ascii_case(s))
    }
}

/// What tokens cost (`BUZZ_AGENT_PRICES`): the prices of a million tokens, in millionths of
/// the currency (`3.75` is `3_750_000`), for the cost figure of `usage_update` and of the
/// prompt response (ACP `Cost`). One list for every model: the agent keeps no price table of
/// its own, which would go stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prices {
    /// `currency=` (default `USD`): an ISO 4217 code, or another unit such as `credits`.
    pub currency: String,
    /// `input=`: input tokens neither read from nor written to the prompt cache (required).
    pub input_micros: u64,
    /// `output=`: output tokens (required).
    pub output_micros: u64,
    /// `cache_read=` (default the input price): input tokens read from the prompt cache.
    pub cache_read_micros: u64,
    /// `cache_write=` (default the input price): input tokens written to the prompt cache.
    pub cache_write_micros: u64,
}

/// Where session transcripts live (SPEC A9, `BUZZ_AGENT_STATE_DIR`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateDir {
    /// `off`, or no directory could be worked out (no `HOME`): sessions are not persisted and
    /// `initialize` advertises `loadSession: false`.
    Off,
    /// An absolute directory path. The runtime creates it (mode 0700) with the first
    /// transcript; the core only ever names files directly inside it.
    Dir(String),
}

/// The validated configuration (C2). Durations are in milliseconds (`*_ms`); the variables
/// that configure them in seconds are multiplied by 1000. `Debug` redacts the API key and
/// prints the system prompt's length only (P2).
#[derive(Clone, PartialEq, Eq)]
pub struct Config {
    /// `BUZZ_AGENT_PROVIDER` (+ `OPENAI_COMPAT_API`); required.
    pub provider: ProviderKind,
    /// `ANTHROPIC_API_KEY` (required, non-blank, for Anthropic) or `OPENAI_COMPAT_API_KEY`
    /// (optional: empty means no `Authorization` header, for local servers). Trimmed.
    pub api_key: String,
    /// `BUZZ_AGENT_MODEL`, else `ANTHROPIC_MODEL` / `OPENAI_COMPAT_MODEL`; required. Trimmed.
    pub model: String,
    /// `BUZZ_AGENT_MODELS` (default empty): more model ids a client may switch a session to
    /// (A5, C58); comma list, trimmed, empties and duplicates dropped. `session/new` advertises
    /// [`Config::model`] first, then these.
    pub models: Vec<String>,
    /// `ANTHROPIC_BASE_URL` (default `https://api.anthropic.com`) / `OPENAI_COMPAT_BASE_URL`
    /// (default `https://api.openai.com/v1`); `http://` or `https://` (scheme in any case) followed
    /// by a host; trailing `/` removed, so endpoints are `{base_url}/v1/messages` etc.
    pub base_url: String,
    /// `ANTHROPIC_API_VERSION` (default `2023-06-01`), the `anthropic-version` header. Always
    /// filled (with the default) even for OpenAI-compatible providers.
    pub anthropic_version: String,
    /// `BUZZ_AGENT_PROMPT_CACHING` (default true): prompt caching (L11). On the Anthropic route
    /// every round's request marks `cache_control` breakpoints (the end of the tools and system
    /// prompt, the end of the previous request, the end of the conversation); on the OpenAI
    /// routes `prompt_cache_key` is sent where [`Config::prompt_cache_key`] allows. Off: none
    /// of either.
    pub prompt_caching: bool,
    /// `OPENAI_COMPAT_PROMPT_CACHE_KEY` (default unset = `auto`): whether the OpenAI routes send
    /// `prompt_cache_key` (one per session) with prompt caching on. `None` (auto): only to
    /// OpenAI's own API (a base URL on `api.openai.com`), since other servers may reject a field
    /// they do not know; `Some(true)`: to any server (a gateway in front of OpenAI);
    /// `Some(false)`: never.
    pub prompt_cache_key: Option<bool>,
    /// `BUZZ_AGENT_PRICES` (default unset): prices per million tokens, e.g.
    /// `input=3,output=15,cache_read=0.3,cache_write=3.75,currency=USD`; `None`: no cost
    /// figure is reported, only token counts.
    pub prices: Option<Prices>,
    /// `BUZZ_AGENT_THINKING_EFFORT` (`low|medium|high|max`, default unset): the reasoning
    /// effort of a new session's requests (SPEC L12); `None`: no reasoning parameter at all.
    pub thinking_effort: Option<Effort>,
    /// `BUZZ_AGENT_THINKING_SUMMARY` (`auto|concise|detailed`, default unset): the Responses
    /// route's `reasoning.summary` (SPEC L12).
    pub thinking_summary: Option<String>,
    /// `BUZZ_AGENT_SYSTEM_PROMPT` (as given, untrimmed), or the content of the file named by
    /// `BUZZ_AGENT_SYSTEM_PROMPT_FILE` (path trimmed; a leading BOM and trailing whitespace of
    /// the content removed); both set (non-blank) is an error. `None` if unset or blank.
    pub system_prompt: Option<String>,
    /// `BUZZ_AGENT_MAX_ROUNDS` (default 0): LLM calls per prompt; 0 = unlimited.
    pub max_rounds: u32,
    /// `BUZZ_AGENT_MAX_OUTPUT_TOKENS` (default 32768): tokens per LLM call, >= 1 and
    /// < `max_context_tokens`.
    pub max_output_tokens: u32,
    /// `BUZZ_AGENT_MAX_CONTEXT_TOKENS` (default 200000), >= 2: tokens, the compaction gate's
    /// window.
    pub max_context_tokens: u64,
    /// `BUZZ_AGENT_MAX_HANDOFFS` (default 10): compactions per prompt.
    pub max_handoffs: u32,
    /// `BUZZ_AGENT_MAX_TOKEN_RECOVERIES` (default 3): nudges after a `max_tokens`-truncated
    /// response.
    pub max_token_recoveries: u32,
    /// `BUZZ_AGENT_LLM_TIMEOUT_SECS` (default 240) × 1000: idle timeout of an LLM attempt, ms.
    pub llm_timeout_ms: u64,
    /// `BUZZ_AGENT_LLM_MAX_ATTEMPTS` (default 3), >= 1: attempts per LLM call (L5).
    pub llm_max_attempts: u32,
    /// `BUZZ_AGENT_TOOL_TIMEOUT_SECS` (default 660) × 1000: per model tool call, ms.
    pub tool_timeout_ms: u64,
    /// `BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS` (default 30) × 1000: per MCP handshake step, ms.
    pub mcp_init_timeout_ms: u64,
    /// `BUZZ_AGENT_MAX_PARALLEL_TOOLS` (default 8), >= 1: concurrent tool calls per model response.
    pub max_parallel_tools: usize,
    /// `BUZZ_AGENT_MAX_SESSIONS`: live sessions, >= 1; `None` (unset) = unlimited.
    pub max_sessions: Option<usize>,
    /// `BUZZ_AGENT_MAX_LINE_BYTES` (default 4194304), >= 1024: inbound ACP line cap, bytes (T3).
    pub max_line_bytes: usize,
    /// `BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES` (default 51200), 1024..=8388608: per tool result
    /// text, bytes, middle-elided beyond.
    pub max_tool_result_text_bytes: usize,
    /// `BUZZ_AGENT_CHILD_ENV` (default empty; S1): more of the agent's environment variables
    /// MCP servers get, beyond [`CHILD_ENV_ALLOWLIST`]: exact names, `PREFIX*` patterns, or
    /// `*` (every variable but the agent's own). Comma list, trimmed, empties and duplicates
    /// dropped; see [`child_environment`].
    pub child_env: Vec<String>,
    /// `MCP_HOOK_SERVERS` (default off) (C3).
    pub hook_servers: HookAllowlist,
    /// `BUZZ_AGENT_INTERCEPTOR_SERVERS` (default off; C3 syntax): the servers asked for
    /// SEP-2624 interceptors (X1, experimental) when a session opens; their `tools/call`
    /// interceptors screen every model tool call of the session (docs/interceptors.md).
    pub interceptor_servers: HookAllowlist,
    /// `BUZZ_AGENT_HOOK_TIMEOUT_MS` (default 2500), 1..=600000 ms: per hook call (H3). The upper
    /// bound (10 minutes) follows cases C30: a bigger value is almost surely a unit mistake.
    pub hook_timeout_ms: u64,
    /// `BUZZ_AGENT_STOP_MAX_REJECTIONS` (default 3): `_Stop` objection budget per prompt; 0
    /// disables `_Stop` and the reply guard (H5, G1).
    pub stop_max_rejections: u32,
    /// `BUZZ_AGENT_REQUIRE_REPLY` (default false): the reply guard (G1).
    pub require_reply: bool,
    /// `BUZZ_AGENT_REPLY_TOOLS` (default empty): qualified tool names that count as a posting
    /// attempt (G2); comma list, trimmed, empties and duplicates dropped.
    pub reply_tools: Vec<String>,
    /// `BUZZ_AGENT_PERMISSION` (default ask) (A7).
    pub permission: PermissionMode,
    /// `BUZZ_AGENT_PERMISSION_TIMEOUT_SECS` (default 330) × 1000, ms (A7). Must be >= 1 s: 0 would
    /// deny every tool call at once.
    pub permission_timeout_ms: u64,
    /// `BUZZ_AGENT_LOG` (default info).
    pub log_level: LogLevel,
    /// `BUZZ_AGENT_LOG_FORMAT` (default text).
    pub log_format: LogFormat,
    /// Where session transcripts are kept (SPEC A9): `BUZZ_AGENT_STATE_DIR` (an absolute path,
    /// or `off`), else `$XDG_STATE_HOME/buzz-agent/sessions` (when that variable is an
    /// absolute path), else `$HOME/.local/state/buzz-agent/sessions`, else off.
    pub state_dir: StateDir,
    /// `BUZZ_AGENT_SEED` (default unset = random): a fixed seed for reproducible runs and
    /// tests. It sets [`Config::seed`] and [`Config::session_id_seed`], and the runtime keeps
    /// them instead of drawing random ones (DESIGN: randomness is an input). Session ids then
    /// repeat from run to run, so a fixed seed goes with a fresh `BUZZ_AGENT_STATE_DIR` or
    /// `off`.
    pub fixed_seed: Option<u64>,
    /// Seed of the retry jitter (L5): `BUZZ_AGENT_SEED`, else 0 from
    /// [`Config::from_env_map`], which the runtime overwrites with random bits.
    pub seed: u64,
    /// The 128 bits new session ids are derived from (SPEC A9: random, unique across
    /// processes and hosts): derived from `BUZZ_AGENT_SEED`, else `None` from
    /// [`Config::from_env_map`], which the runtime replaces with 16 bytes from the OS. An
    /// agent without one numbers its sessions `sess_1`, `sess_2`, … (the core's own tests).
    pub session_id_seed: Option<u128>,
    /// Authorization to remote MCP servers (SPEC M11): per-server clients and the time a
    /// login may take (the defaults until remote servers are started).
    pub oauth: OAuthConfig,
    /// The 32 bytes PKCE verifiers, OAuth `state` values and JWT ids are derived from
    /// (DESIGN: randomness is an input): derived from `BUZZ_AGENT_SEED`, else all zero from
    /// [`Config::from_env_map`], which the runtime replaces with 32 bytes from the OS.
    pub oauth_seed: [u8; 32],
    /// The wall clock at [`MonoTime::ZERO`](crate::MonoTime::ZERO), in milliseconds since
    /// the Unix epoch: set by the runtime when it starts its clock (0 until then). Only OAuth
    /// reads it (JWT `iat`/`exp`, token expiry kept across runs).
    pub unix_ms_at_start: u64,
    /// `BUZZ_AGENT_NO_HINTS` (default false): no project instructions and no skills are read
    /// (SPEC A10, docs/context.md).
    pub no_hints: bool,
    /// `BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES` (default 32768), 1024..=1048576: bytes of
    /// `AGENTS.md` text a session's system prompt takes in all; the file where the budget runs
    /// out is cut with a warning, later ones are left out (SPEC A10).
    pub instructions_max_bytes: usize,
    /// The user-wide instructions file: `$XDG_CONFIG_HOME/buzz-agent/AGENTS.md` (when that
    /// variable is an absolute path), else `$HOME/.config/buzz-agent/AGENTS.md`, else none.
    pub user_instructions: Option<String>,
    /// The user's skills directory: `$HOME/.agents/skills`, else none.
    pub user_skills_dir: Option<String>,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let key = if self.api_key.is_empty() {
            "<empty>"
        } else {
            "<redacted>"
        };
        let prompt = self
            .system_prompt
            .as_ref()
            .map(|p| format!("<{} bytes>", p.len()));
        f.debug_struct("Config")
            .field("provider", &self.provider)
            .field("api_key", &format_args!("{key}"))
            .field("model", &self.model)
            .field("models", &self.models)
            .field("base_url", &self.base_url)
            .field("anthropic_version", &self.anthropic_version)
            .field("prompt_caching", &self.prompt_caching)
            .field("prompt_cache_key", &self.prompt_cache_key)
            .field("prices", &self.prices)
            .field("thinking_effort", &self.thinking_effort)
            .field("thinking_summary", &self.thinking_summary)
            .field("system_prompt", &prompt)
            .field("max_rounds", &self.max_rounds)
            .field("max_output_tokens", &self.max_output_tokens)
            .field("max_context_tokens", &self.max_context_tokens)
            .field("max_handoffs", &self.max_handoffs)
            .field("max_token_recoveries", &self.max_token_recoveries)
            .field("llm_timeout_ms", &self.llm_timeout_ms)
            .field("llm_max_attempts", &self.llm_max_attempts)
            .field("tool_timeout_ms", &self.tool_timeout_ms)
            .field("mcp_init_timeout_ms", &self.mcp_init_timeout_ms)
            .field("max_parallel_tools", &self.max_parallel_tools)
            .field("max_sessions", &self.max_sessions)
            .field("max_line_bytes", &self.max_line_bytes)
            .field(
                "max_tool_result_text_bytes",
                &self.max_tool_result_text_bytes,
            )
            .field("child_env", &self.child_env)
            .field("hook_servers", &self.hook_servers)
            .field("interceptor_servers", &self.interceptor_servers)
            .field("hook_timeout_ms", &self.hook_timeout_ms)
            .field("stop_max_rejections", &self.stop_max_rejections)
            .field("require_reply", &self.require_reply)
            .field("reply_tools", &self.reply_tools)
            .field("permission", &self.permission)
            .field("permission_timeout_ms", &self.permission_timeout_ms)
            .field("log_level", &self.log_level)
            .field("log_format", &self.log_format)
            .field("state_dir", &self.state_dir)
            .field("fixed_seed", &self.fixed_seed)
            .field("seed", &self.seed)
            .field("session_id_seed", &self.session_id_seed.map(|_| "<set>"))
            .field("oauth", &self.oauth)
            .field("oauth_seed", &"<set>")
            .field("unix_ms_at_start", &self.unix_ms_at_start)
            .field("no_hints", &self.no_hints)
            .field("instructions_max_bytes", &self.instructions_max_bytes)
            .field("user_instructions", &self.user_instructions)
            .field("user_skills_dir", &self.user_skills_dir)
            .finish()
    }
}

/// A configuration error (C1). `Display` is one line: the variable, the value (quoted,
/// escaped, cut to 200 bytes) and what is allowed, e.g.
/// `BUZZ_AGENT_HOOK_TIMEOUT_MS: invalid value "abc": expected an integer from 1 to 600000`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The variable is set to a value it does not accept.
    #[error("{var}: invalid value {value:?}: expected {expected}")]
    Invalid {
        /// The variable's name.
        var: &'static str,
        /// The value as given (untrimmed), cut to 200 bytes.
        value: String,
        /// What is allowed.
        expected: String,
    },
    /// A required variable is unset or blank.
    #[error("{var}: not set: {expected}")]
    Missing {
        /// The variable's name.
        var: &'static str,
        /// What to set it to.
        expected: String,
    },
    /// `BUZZ_AGENT_SYSTEM_PROMPT_FILE` names a file that could not be read.
    #[error("{var}: cannot read {path:?}: {reason}")]
    ReadFile {
        /// The variable's name.
        var: &'static str,
        /// The path as given (trimmed).
        path: String,
        /// The reader's error, on one line.
        reason: String,
    },
    /// Two mutually exclusive variables are both set.
    #[error("{var} and {other} are both set: set only one of them")]
    Conflict {
        /// The variable reported.
        var: &'static str,
        /// The variable it excludes.
        other: &'static str,
    },
}

impl ConfigError {
    /// The name of the variable at fault (C1).
    #[must_use]
    pub fn variable(&self) -> &'static str {
        match self {
            ConfigError::Invalid { var, .. }
            | ConfigError::Missing { var, .. }
            | ConfigError::ReadFile { var, .. }
            | ConfigError::Conflict { var, .. } => var,
        }
    }
}

/// Every configuration error of one environment (C1), at least one, in the order of the
/// `--help` table. `Display` writes one line per error (each as [`ConfigError`]'s), joined by
/// `\n`; the runtime prints each after `<binary>: configuration error: ` and exits 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(Vec<ConfigError>);

impl ConfigErrors {
    /// `None` for no error; else the errors sorted (stably) by their variable's place in the
    /// `--help` table.
    fn from_vec(mut errors: Vec<ConfigError>) -> Option<ConfigErrors> {
        if errors.is_empty() {
            return None;
        }
        let place = |e: &ConfigError| VARIABLES.iter().position(|(n, _, _)| *n == e.variable());
        errors.sort_by_key(place);
        Some(ConfigErrors(errors))
    }

    /// The first error (in `--help` order).
    #[must_use]
    pub fn first(&self) -> &ConfigError {
        &self.0[0]
    }

    /// Every error, in `--help` order.
    pub fn iter(&self) -> std::slice::Iter<'_, ConfigError> {
        self.0.iter()
    }

    /// How many errors (at least 1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: there is at least one error.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

impl<'a> IntoIterator for &'a ConfigErrors {
    type Item = &'a ConfigError;
    type IntoIter = std::slice::Iter<'a, ConfigError>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// Collects the errors of [`Config::from_env_map`] while it goes on checking.
#[derive(Default)]
struct Collect {
    errors: Vec<ConfigError>,
}

impl Collect {
    /// The value, or `fallback` with the error recorded.
    fn or<T>(&mut self, r: Result<T, ConfigError>, fallback: T) -> T {
        self.opt(r).unwrap_or(fallback)
    }

    /// The value, or `None` with the error recorded.
    fn opt<T>(&mut self, r: Result<T, ConfigError>) -> Option<T> {
        r.map_err(|e| self.errors.push(e)).ok()
    }
}

const PROVIDER: &str = "BUZZ_AGENT_PROVIDER";
const ANTHROPIC_API_KEY: &str = "ANTHROPIC_API_KEY";
const ANTHROPIC_MODEL: &str = "ANTHROPIC_MODEL";
const ANTHROPIC_BASE_URL: &str = "ANTHROPIC_BASE_URL";
const ANTHROPIC_API_VERSION: &str = "ANTHROPIC_API_VERSION";
const OPENAI_API_KEY: &str = "OPENAI_COMPAT_API_KEY";
const OPENAI_MODEL: &str = "OPENAI_COMPAT_MODEL";
const OPENAI_BASE_URL: &str = "OPENAI_COMPAT_BASE_URL";
const OPENAI_API: &str = "OPENAI_COMPAT_API";
const MODEL: &str = "BUZZ_AGENT_MODEL";
const MODELS: &str = "BUZZ_AGENT_MODELS";
const SYSTEM_PROMPT: &str = "BUZZ_AGENT_SYSTEM_PROMPT";
const SYSTEM_PROMPT_FILE: &str = "BUZZ_AGENT_SYSTEM_PROMPT_FILE";
const MAX_ROUNDS: &str = "BUZZ_AGENT_MAX_ROUNDS";
const MAX_OUTPUT_TOKENS: &str = "BUZZ_AGENT_MAX_OUTPUT_TOKENS";
const MAX_CONTEXT_TOKENS: &str = "BUZZ_AGENT_MAX_CONTEXT_TOKENS";
const MAX_HANDOFFS: &str = "BUZZ_AGENT_MAX_HANDOFFS";
const MAX_TOKEN_RECOVERIES: &str = "BUZZ_AGENT_MAX_TOKEN_RECOVERIES";
const LLM_TIMEOUT_SECS: &str = "BUZZ_AGENT_LLM_TIMEOUT_SECS";
const LLM_MAX_ATTEMPTS: &str = "BUZZ_AGENT_LLM_MAX_ATTEMPTS";
const TOOL_TIMEOUT_SECS: &str = "BUZZ_AGENT_TOOL_TIMEOUT_SECS";
const MCP_INIT_TIMEOUT_SECS: &str = "BUZZ_AGENT_MCP_INIT_TIMEOUT_SECS";
const MAX_PARALLEL_TOOLS: &str = "BUZZ_AGENT_MAX_PARALLEL_TOOLS";
const MAX_SESSIONS: &str = "BUZZ_AGENT_MAX_SESSIONS";
const MAX_LINE_BYTES: &str = "BUZZ_AGENT_MAX_LINE_BYTES";
const MAX_TOOL_RESULT_TEXT_BYTES: &str = "BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES";
const HOOK_SERVERS: &str = "MCP_HOOK_SERVERS";
const INTERCEPTOR_SERVERS: &str = "BUZZ_AGENT_INTERCEPTOR_SERVERS";
const HOOK_TIMEOUT_MS: &str = "BUZZ_AGENT_HOOK_TIMEOUT_MS";
const STOP_MAX_REJECTIONS: &str = "BUZZ_AGENT_STOP_MAX_REJECTIONS";
const REQUIRE_REPLY: &str = "BUZZ_AGENT_REQUIRE_REPLY";
const REPLY_TOOLS: &str = "BUZZ_AGENT_REPLY_TOOLS";
const PERMISSION: &str = "BUZZ_AGENT_PERMISSION";
const PERMISSION_TIMEOUT_SECS: &str = "BUZZ_AGENT_PERMISSION_TIMEOUT_SECS";
const LOG: &str = "BUZZ_AGENT_LOG";
const LOG_FORMAT: &str = "BUZZ_AGENT_LOG_FORMAT";
const STATE_DIR: &str = "BUZZ_AGENT_STATE_DIR";
const SEED: &str = "BUZZ_AGENT_SEED";
const PROMPT_CACHING: &str = "BUZZ_AGENT_PROMPT_CACHING";
const PROMPT_CACHE_KEY: &str = "OPENAI_COMPAT_PROMPT_CACHE_KEY";
const PRICES: &str = "BUZZ_AGENT_PRICES";
const THINKING_EFFORT: &str = "BUZZ_AGENT_THINKING_EFFORT";
const THINKING_SUMMARY: &str = "BUZZ_AGENT_THINKING_SUMMARY";
const CHILD_ENV: &str = "BUZZ_AGENT_CHILD_ENV";
const OAUTH_CLIENTS_FILE: &str = "BUZZ_AGENT_OAUTH_CLIENTS_FILE";
const OAUTH_TIMEOUT_SECS: &str = "BUZZ_AGENT_OAUTH_TIMEOUT_SECS";
const NO_HINTS: &str = "BUZZ_AGENT_NO_HINTS";
const INSTRUCTIONS_MAX_BYTES: &str = "BUZZ_AGENT_INSTRUCTIONS_MAX_BYTES";

const DEFAULT_ANTHROPIC_BASE_URL: &str = "https://api.anthropic.com";
const DEFAULT_OPENAI_BASE_URL: &str = "https://api.openai.com/v1";
const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// Largest accepted value of a `*_SECS` variable (u32::MAX seconds, about 136 years).
const MAX_SECS: u64 = 4_294_967_295;
/// Largest accepted `BUZZ_AGENT_HOOK_TIMEOUT_MS` (10 minutes, cases C30).
const MAX_HOOK_TIMEOUT_MS: u64 = 600_000;
/// Largest accepted `BUZZ_AGENT_MAX_TOOL_RESULT_TEXT_BYTES` (8 MiB, C2).
const MAX_TOOL_RESULT_TEXT_BYTES_LIMIT: u64 = 8 * 1024 * 1024;
/// Longest value quoted in an error message, bytes.
const MAX_QUOTED_VALUE_BYTES: usize = 200;

/// The bounds of every numeric variable: (name, least, greatest); `u64::MAX` as the greatest
/// means no upper bound. One table for the parser, its error messages and `--help`, so that
/// they cannot disagree (issue 12). A count stored in 32 bits goes up to `u32::MAX`.
#[rustfmt::skip]
const NUMBERS: &[(&str, u64, u64)] = &[
    (MAX_ROUNDS, 0, U32_MAX),
    (MAX_OUTPUT_TOKENS, 1, U32_MAX),
    (MAX_CONTEXT_TOKENS, 2, u64::MAX),
    (MAX_HANDOFFS, 0, U32_MAX),
    (MAX_TOKEN_RECOVERIES, 0, U32_MAX),
    (LLM_TIMEOUT_SECS, 1, MAX_SECS),
    (LLM_MAX_ATTEMPTS, 1, U32_MAX),
    (TOOL_TIMEOUT_SECS, 1, MAX_SECS),
    (MCP_INIT_TIMEOUT_SECS, 1, MAX_SECS),
    (MAX_PARALLEL_TOOLS, 1, u64::MAX),
    (MAX_SESSIONS, 1, u64::MAX),
    (MAX_LINE_BYTES, 1024, u64::MAX),
    (MAX_TOOL_RESULT_TEXT_BYTES, 1024, MAX_TOOL_RESULT_TEXT_BYTES_LIMIT),
    (HOOK_TIMEOUT_MS, 1, MAX_HOOK_TIMEOUT_MS),
    (STOP_MAX_REJECTIONS, 0, U32_MAX),
    (PERMISSION_TIMEOUT_SECS, 1, MAX_SECS),
    (OAUTH_TIMEOUT_SECS, 1, MAX_SECS),
    (SEED, 0, u64::MAX),
    (INSTRUCTIONS_MAX_BYTES, 1024, 1_048_576),
];

/// `u32::MAX` as a `u64`.
const U32_MAX: u64 = 4_294_967_295;

/// The values a numeric variable accepts, `(least, greatest)`, `None` as the greatest meaning
/// no upper bound; `None` for a variable that is not a number (C1, C2).
#[must_use]
pub fn numeric_range(var: &str) -> Option<(u64, Option<u64>)> {
    NUMBERS
        .iter()
        .find(|(n, _, _)| *n == var)
        .map(|(_, min, max)| (*min, (*max != u64::MAX).then_some(*max)))
}

/// The range as `--help` and the README write it: `0..4294967295` or `>= 1024`.
#[must_use]
pub fn numeric_range_text(var: &str) -> Option<String> {
    numeric_range(var).map(|(min, max)| match max {
        Some(max) => format!("{min}..{max}"),
        None => format!(">= {min}"),
    })
}

/// Every variable the agent reads: name, default (as shown by `--help`), meaning (C1, C2).
#[rustfmt::skip]
const VARIABLES: &[(&str, &str, &str)] = &[
    (PROVIDER, "required", "LLM provider: anthropic, or openai (alias openai-compat)"),
    (ANTHROPIC_API_KEY, "", "Anthropic API key; required for provider anthropic"),
    (ANTHROPIC_MODEL, "", "Anthropic model; required for provider anthropic unless BUZZ_AGENT_MODEL is set"),
    (ANTHROPIC_BASE_URL, DEFAULT_ANTHROPIC_BASE_URL, "Anthropic API base URL (http:// or https://)"),
    (ANTHROPIC_API_VERSION, DEFAULT_ANTHROPIC_VERSION, "anthropic-version header"),
    (OPENAI_API_KEY, "", "OpenAI-compatible API key; may be empty (no Authorization header)"),
    (OPENAI_MODEL, "", "OpenAI-compatible model; required for provider openai unless BUZZ_AGENT_MODEL is set"),
    (OPENAI_BASE_URL, DEFAULT_OPENAI_BASE_URL, "OpenAI-compatible API base URL (http:// or https://)"),
    (OPENAI_API, "chat", "chat = Chat Completions, responses = Responses API"),
    (MODEL, "", "model name; overrides ANTHROPIC_MODEL / OPENAI_COMPAT_MODEL"),
    (MODELS, "", "comma-separated model ids a client may switch a session to (its model picker)"),
    (PROMPT_CACHING, "true", "prompt caching: Anthropic cache_control breakpoints, OpenAI prompt_cache_key (boolean)"),
    (PROMPT_CACHE_KEY, "auto", "send prompt_cache_key on the OpenAI routes: auto = only to api.openai.com, or a boolean"),
    (PRICES, "unset = no cost figure", "prices per million tokens for the reported cost: input=N,output=N[,cache_read=N][,cache_write=N][,currency=USD]"),
    (THINKING_EFFORT, "unset = no reasoning parameter", "reasoning effort: low, medium, high or max (Anthropic thinking, OpenAI reasoning effort)"),
    (THINKING_SUMMARY, "unset", "Responses reasoning summary: auto, concise or detailed"),
    (SYSTEM_PROMPT, "", "system prompt text (excludes BUZZ_AGENT_SYSTEM_PROMPT_FILE)"),
    (SYSTEM_PROMPT_FILE, "", "path of a file holding the system prompt (excludes BUZZ_AGENT_SYSTEM_PROMPT)"),
    (MAX_ROUNDS, "0", "LLM calls per prompt, 0 = unlimited; reaching it ends the turn max_turn_requests"),
    (MAX_OUTPUT_TOKENS, "32768", "output tokens per LLM call, below BUZZ_AGENT_MAX_CONTEXT_TOKENS"),
    (MAX_CONTEXT_TOKENS, "200000", "context window in tokens, used by the compaction gate"),
    (MAX_HANDOFFS, "10", "compactions per prompt"),
    (MAX_TOKEN_RECOVERIES, "3", "nudges after a max_tokens-truncated response"),
    (LLM_TIMEOUT_SECS, "240", "seconds without a byte from the provider before an attempt fails"),
    (LLM_MAX_ATTEMPTS, "3", "attempts per LLM call"),
    (TOOL_TIMEOUT_SECS, "660", "seconds per model tool call"),
    (MCP_INIT_TIMEOUT_SECS, "30", "seconds per MCP handshake step"),
    (MAX_PARALLEL_TOOLS, "8", "concurrent tool calls per model response; 1 = sequential"),
    (MAX_SESSIONS, "unlimited", "live sessions; unset = unlimited"),
    (MAX_LINE_BYTES, "4194304", "inbound ACP line cap in bytes"),
    (MAX_TOOL_RESULT_TEXT_BYTES, "51200", "bytes of text per tool result, middle-elided beyond"),
    (HOOK_SERVERS, "unset = hooks off", "hook allowlist: * = every server, or comma-separated server names"),
    (HOOK_TIMEOUT_MS, "2500", "milliseconds per hook call"),
    (INTERCEPTOR_SERVERS, "unset = off", "experimental SEP-2624 interceptor servers whose validators and mutators screen every model tool call, syntax as MCP_HOOK_SERVERS"),
    (STOP_MAX_REJECTIONS, "3", "_Stop objection budget per prompt; 0 disables _Stop and the reply guard"),
    (REQUIRE_REPLY, "false", "reply guard: remind the model to post its answer (boolean)"),
    (REPLY_TOOLS, "", "comma-separated qualified tool names that count as posting a reply"),
    (PERMISSION, "ask", "ask = request permission before each tool call, allow = never ask"),
    (PERMISSION_TIMEOUT_SECS, "330", "seconds to wait for a permission answer before denying"),
    (OAUTH_CLIENTS_FILE, "", "path of a JSON file of OAuth clients for remote MCP servers (pre-registered clients, client_credentials, client ID metadata document URL, redirect port)"),
    (OAUTH_TIMEOUT_SECS, "300", "seconds to wait for the user to authorize a remote MCP server in the browser"),
    (LOG, "info", "stderr log level: error, warn, info, debug (adds prompt and tool text), trace"),
    (LOG_FORMAT, "text", "stderr log format: text, or json (one JSON object per line)"),
    (STATE_DIR, "$XDG_STATE_HOME/buzz-agent/sessions, else ~/.local/state/buzz-agent/sessions", "where session transcripts are kept (an absolute path), or off: sessions are not persisted"),
    (SEED, "random", "fixed seed for reproducible runs (retry jitter, session ids); use with a fresh BUZZ_AGENT_STATE_DIR or off"),
    (CHILD_ENV, "", "comma-separated names (NAME, or PREFIX* for every variable starting so) of more of the agent's environment variables to pass to MCP servers; * passes all but the agent's own"),
    (NO_HINTS, "false", "read no AGENTS.md project instructions and no .agents/skills skills (boolean)"),
    (INSTRUCTIONS_MAX_BYTES, "32768", "bytes of AGENTS.md text a session's system prompt takes in all; the rest is cut with a warning"),
];

/// The names of every variable the agent reads (C1), in `--help` order.
#[must_use]
pub fn variable_names() -> Vec<&'static str> {
    VARIABLES.iter().map(|(name, _, _)| *name).collect()
}

/// The configuration section of `buzz-agent --help` (C1): every variable with its default and
/// meaning, one per line, plus the value rules. Ends with `\n`.
#[must_use]
pub fn help_text() -> String {
    let width = VARIABLES.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    let mut s = String::from(
        "CONFIGURATION (environment variables, read once at start; a bad value exits with status 2):\n\
         Numbers are decimal integers; booleans are 1/0/true/false/yes/no/on/off (any case);\n\
         a blank value counts as unset.\n\n",
    );
    for (name, default, meaning) in VARIABLES {
        let default = if default.is_empty() {
            String::new()
        } else {
            format!(" [{default}]")
        };
        let range = numeric_range_text(name)
            .map(|r| format!(" ({r})"))
            .unwrap_or_default();
        s.push_str(&format!("  {name:<width$}  {meaning}{range}{default}\n"));
    }
    s
}

/// Whether `name` is one of the agent's own variables, which never reach an MCP child, whatever
/// `BUZZ_AGENT_CHILD_ENV` says (M1, S1): the provider keys `ANTHROPIC_API_KEY` and
/// `OPENAI_COMPAT_API_KEY`, every `BUZZ_AGENT_*` variable and `MCP_HOOK_SERVERS`.
/// Case-sensitive. (Other variables pass only when [`child_environment`] allows them.)
#[must_use]
pub fn is_agent_secret_or_own_variable(name: &str) -> bool {
    name == ANTHROPIC_API_KEY
        || name == OPENAI_API_KEY
        || name == HOOK_SERVERS
        || name.starts_with("BUZZ_AGENT_")
}

/// The variables of the agent's environment every MCP server gets (SPEC S1), as the official
/// MCP SDKs do (their `DEFAULT_INHERITED_ENV_VARS`) plus the locale, time zone, temporary and
/// XDG base directories: `HOME`, `LOGNAME`, `PATH`, `SHELL`, `TERM`, `USER`, `LANG`, every
/// `LC_*`, `TMPDIR`, `TZ` and the `XDG_*` base directories. A pattern ending in `*` matches
/// every name that starts with what comes before it. `BUZZ_AGENT_CHILD_ENV` adds more
/// ([`Config::child_env`]); the client's `env` entries come on top (SPEC M1).
pub const CHILD_ENV_ALLOWLIST: &[&str] = &[
    "HOME",
    "LOGNAME",
    "PATH",
    "SHELL",
    "TERM",
    "USER",
    "LANG",
    "LC_*",
    "TMPDIR",
    "TZ",
    "XDG_CACHE_HOME",
    "XDG_CONFIG_DIRS",
    "XDG_CONFIG_HOME",
    "XDG_DATA_DIRS",
    "XDG_DATA_HOME",
    "XDG_RUNTIME_DIR",
    "XDG_STATE_HOME",
];

/// Whether `name` matches the allowlist `pattern`: `*` matches everything, `PREFIX*` every
/// name starting with `PREFIX`, anything else exactly (case-sensitive, as the environment is).
fn env_pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// The part of the agent's environment `env` that MCP servers get (SPEC S1): the variables
/// [`CHILD_ENV_ALLOWLIST`] or `extra` (`BUZZ_AGENT_CHILD_ENV`, [`Config::child_env`]) name,
/// never the agent's own ([`is_agent_secret_or_own_variable`]), in `env`'s order. The client's
/// `env` entries of a server are added on top by the server table.
///
/// ```
/// use buzz_agent_core::config::child_environment;
/// let env = [("PATH", "/bin"), ("GITHUB_TOKEN", "ghp_x"), ("LC_ALL", "C"), ("NPM_CONFIG_CACHE", "/c")]
///     .map(|(k, v)| (k.to_string(), v.to_string()));
/// let names = |extra: &[String]| -> Vec<String> {
///     child_environment(env.clone(), extra).into_iter().map(|(k, _)| k).collect()
/// };
/// assert_eq!(names(&[]), ["PATH", "LC_ALL"]);
/// assert_eq!(names(&["NPM_CONFIG_*".into()]), ["PATH", "LC_ALL", "NPM_CONFIG_CACHE"]);
/// ```
#[must_use]
pub fn child_environment(
    env: impl IntoIterator<Item = (String, String)>,
    extra: &[String],
) -> Vec<(String, String)> {
    env.into_iter()
        .filter(|(name, _)| {
            !is_agent_secret_or_own_variable(name)
                && CHILD_ENV_ALLOWLIST
                    .iter()
                    .copied()
                    .chain(extra.iter().map(String::as_str))
                    .any(|p| env_pattern_matches(p, name))
        })
        .collect()
}

/// `BUZZ_AGENT_CHILD_ENV` (SPEC S1): comma-separated variable names (`[A-Za-z_][A-Za-z0-9_]*`),
/// `PREFIX*` patterns or `*`. Naming one of the agent's own variables (a provider key,
/// `BUZZ_AGENT_*`, `MCP_HOOK_SERVERS`) is an error: those never reach a server (a server that
/// needs a key gets it from its own `env` entry in `session/new`).
fn child_env(env: &Env<'_>) -> Result<Vec<String>, ConfigError> {
    let entries = env.list(CHILD_ENV);
    for entry in &entries {
        let name = entry.strip_suffix('*').unwrap_or(entry);
        let well_formed = (name.is_empty() && entry == "*")
            || (!name.is_empty()
                && !name.starts_with(|c: char| c.is_ascii_digit())
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
        if !well_formed {
            return Err(env.invalid(
                CHILD_ENV,
                format!(
                    "comma-separated variable names (letters, digits and _), each optionally ending in * to match a prefix, or * alone; {entry:?} is not one"
                ),
            ));
        }
        if entry == name && is_agent_secret_or_own_variable(name) {
            return Err(env.invalid(
                CHILD_ENV,
                format!(
                    "names of variables MCP servers may get; {name} is the agent's own and never reaches a server (give a server what it needs in its env entry of session/new)"
                ),
            ));
        }
    }
    Ok(entries)
}

/// The `BUZZ_AGENT_*` variables in `env` that the agent does not know (probably typos), in
/// name order, so the runtime can warn about them (C1: a misspelt variable otherwise does
/// nothing silently). Not an error: a newer or older configuration may carry extra ones.
#[must_use]
pub fn unknown_agent_variables(env: &BTreeMap<String, String>) -> Vec<String> {
    env.keys()
        .filter(|k| k.starts_with("BUZZ_AGENT_"))
        .filter(|k| !VARIABLES.iter().any(|(n, _, _)| n == k))
        .cloned()
        .collect()
}

/// The warnings to log at start-up (C1, issue 12), one line each, no secret: every unknown
/// `BUZZ_AGENT_*` variable ([`unknown_agent_variables`]), sessions that cannot be saved for
/// want of a directory (SPEC A9: no `HOME`, unless `BUZZ_AGENT_STATE_DIR=off` says so), and an
/// OpenAI-compatible provider on
/// the default URL (`https://api.openai.com/v1`) without `OPENAI_COMPAT_API_KEY`, where every
/// request would be refused (401): most likely a local server's URL was forgotten. Neither
/// stops the agent (an empty key is valid for local servers).
#[must_use]
pub fn startup_warnings(env: &BTreeMap<String, String>, config: &Config) -> Vec<String> {
    let mut out: Vec<String> = unknown_agent_variables(env)
        .into_iter()
        .map(|name| format!("unknown variable {name} ignored (typo?)"))
        .collect();
    let openai = matches!(
        config.provider,
        ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses
    );
    if config.state_dir == StateDir::Off
        && !env
            .get(STATE_DIR)
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("off"))
    {
        out.push(format!(
            "sessions are not saved: neither {STATE_DIR}, XDG_STATE_HOME nor HOME names an absolute directory (set {STATE_DIR}, or {STATE_DIR}=off to silence this)"
        ));
    }
    if openai
        && config.api_key.is_empty()
        && config
            .base_url
            .eq_ignore_ascii_case(DEFAULT_OPENAI_BASE_URL)
    {
        out.push(format!(
            "{OPENAI_API_KEY} is empty and {OPENAI_BASE_URL} is {DEFAULT_OPENAI_BASE_URL}: OpenAI \
             refuses requests without a key (401); set {OPENAI_API_KEY}, or set \
             {OPENAI_BASE_URL} to your server's URL (e.g. http://127.0.0.1:8000/v1)"
        ));
    }
    out
}

/// Reads variables from an environment snapshot with C1's rules.
struct Env<'a> {
    map: &'a BTreeMap<String, String>,
}

impl<'a> Env<'a> {
    /// The trimmed value, `None` if unset or blank.
    fn get(&self, var: &str) -> Option<&'a str> {
        self.map
            .get(var)
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
    }

    /// The untrimmed raw value for error messages ("" if unset).
    fn raw(&self, var: &str) -> &'a str {
        self.map.get(var).map_or("", String::as_str)
    }

    fn invalid(&self, var: &'static str, expected: impl Into<String>) -> ConfigError {
        invalid(var, self.raw(var), expected)
    }

    /// A decimal integer within the variable's bounds ([`NUMBERS`]), `default` if unset or
    /// blank.
    fn uint<T: TryFrom<u64>>(&self, var: &'static str, default: T) -> Result<T, ConfigError> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        let (min, max) = NUMBERS
            .iter()
            .find(|(n, _, _)| *n == var)
            .map_or((0, u64::MAX), |(_, min, max)| (*min, *max));
        let expected = range_text(min, max);
        let n = parse_decimal(v).filter(|n| (min..=max).contains(n));
        let n = n.ok_or_else(|| self.invalid(var, expected.clone()))?;
        T::try_from(n).map_err(|_| self.invalid(var, expected))
    }

    /// A `*_SECS` duration converted to milliseconds.
    fn secs_as_ms(&self, var: &'static str, default_secs: u64) -> Result<u64, ConfigError> {
        let secs: u64 = self.uint(var, default_secs)?;
        Ok(secs.saturating_mul(1000))
    }

    /// A C1 boolean, `default` if unset or blank.
    fn flag(&self, var: &'static str, default: bool) -> Result<bool, ConfigError> {
        let Some(v) = self.get(var) else {
            return Ok(default);
        };
        match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "0" | "false" | "no" | "off" => Ok(false),
            _ => Err(self.invalid(var, "a boolean: 1/0/true/false/yes/no/on/off")),
        }
    }

    /// An `http(s)://host…` URL without trailing `/`, `default` if unset or blank.
    fn url(&self, var: &'static str, default: &str) -> Result<String, ConfigError> {
        let Some(v) = self.get(var) else {
            return Ok(default.to_owned());
        };
        let trimmed = v.trim_end_matches('/');
        let lower = trimmed.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("https://")
            .or_else(|| lower.strip_prefix("http://"));
        match rest {
            Some(host) if !host.is_empty() && !host.chars().any(char::is_whitespace) => {
                Ok(trimmed.to_owned())
            }
            Some(_) | None => Err(self.invalid(
                var,
                "an http:// or https:// URL with a host, such as https://example.com/v1",
            )),
        }
    }

    /// A comma-separated list: entries trimmed, empties and duplicates dropped, order kept.
    fn list(&self, var: &str) -> Vec<String> {
        let mut seen = std::collections::BTreeSet::new();
        let mut out: Vec<String> = Vec::new();
        for entry in self.get(var).unwrap_or("").split(',').map(str::trim) {
            if !entry.is_empty() && seen.insert(entry) {
                out.push(entry.to_owned());
            }
        }
        out
    }
}

fn invalid(var: &'static str, value: &str, expected: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: elide_end(value, MAX_QUOTED_VALUE_BYTES),
        expected: expected.into(),
    }
}

/// `s` if it is at most `max` bytes, else its first `max` bytes (cut back to a char boundary)
/// with `…` appended.
fn elide_end(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// `BUZZ_AGENT_PRICES`: comma-separated `key=price` entries (blanks trimmed), prices per
/// million tokens as decimals with at most 6 fractional digits; `input` and `output` required,
/// each key at most once.
fn prices(env: &Env<'_>) -> Result<Option<Prices>, ConfigError> {
    let Some(value) = env.get(PRICES) else {
        return Ok(None);
    };
    let bad = || {
        env.invalid(
            PRICES,
            "input=<price>,output=<price>[,cache_read=<price>][,cache_write=<price>][,currency=<code>], \
             prices per million tokens such as 3 or 0.375 (at most 6 decimals), \
             e.g. input=3,output=15,cache_read=0.3,cache_write=3.75",
        )
    };
    let mut found: BTreeMap<&str, &str> = BTreeMap::new();
    for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (key, v) = entry.split_once('=').ok_or_else(bad)?;
        let key = key.trim();
        let known = ["input", "output", "cache_read", "cache_write", "currency"];
        if !known.contains(&key) || found.insert(key, v.trim()).is_some() {
            return Err(bad());
        }
    }
    let price = |key: &str| {
        found
            .get(key)
            .map(|v| parse_micros(v).ok_or_else(bad))
            .transpose()
    };
    let (Some(input), Some(output)) = (price("input")?, price("output")?) else {
        return Err(bad());
    };
    let currency = match found.get("currency") {
        Some(c) if !c.is_empty() && !c.contains(char::is_whitespace) => (*c).to_owned(),
        Some(_) => return Err(bad()),
        None => "USD".to_owned(),
    };
    Ok(Some(Prices {
        currency,
        input_micros: input,
        output_micros: output,
        cache_read_micros: price("cache_read")?.unwrap_or(input),
        cache_write_micros: price("cache_write")?.unwrap_or(input),
    }))
}

/// A non-negative decimal (`3`, `0.375`, `.5`) in millionths: at most 6 fractional digits.
fn parse_micros(s: &str) -> Option<u64> {
    let (whole, frac) = s.split_once('.').unwrap_or((s, ""));
    let digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || frac.len() > 6 || !digits(whole) || !digits(frac) {
        return None;
    }
    let whole: u64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac: u64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    whole.checked_mul(1_000_000)?.checked_add(frac)
}

/// A plain decimal integer: ASCII digits only (the caller trims).
fn parse_decimal(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn range_text(min: u64, max: u64) -> String {
    if max == u64::MAX {
        format!("an integer >= {min}")
    } else {
        format!("an integer from {min} to {max}")
    }
}

/// A C3 server allowlist (`MCP_HOOK_SERVERS`, `BUZZ_AGENT_INTERCEPTOR_SERVERS`).
fn parse_server_allowlist(env: &Env<'_>, var: &'static str) -> Result<HookAllowlist, ConfigError> {
    let entries = env.list(var);
    if entries.is_empty() {
        return Ok(HookAllowlist::Off);
    }
    let stars = entries.iter().filter(|e| *e == "*").count();
    if stars == entries.len() {
        return Ok(HookAllowlist::All);
    }
    if stars > 0 {
        return Err(env.invalid(
            var,
            "either * alone (every server) or comma-separated server names, not * mixed with names",
        ));
    }
    // Entries are matched exactly against the names clients give in `session/new`, which may
    // be anything (`My Files`, `github/copilot`, A2, C55): no character is refused here.
    Ok(HookAllowlist::Names(entries))
}

/// The system prompt from the variable or the file (mutually exclusive).
fn system_prompt(
    env: &Env<'_>,
    read_file: &dyn Fn(&str) -> Result<String, String>,
) -> Result<Option<String>, ConfigError> {
    let inline = env.get(SYSTEM_PROMPT).map(|_| env.raw(SYSTEM_PROMPT));
    let path = env.get(SYSTEM_PROMPT_FILE);
    match (inline, path) {
        (Some(_), Some(_)) => Err(ConfigError::Conflict {
            var: SYSTEM_PROMPT_FILE,
            other: SYSTEM_PROMPT,
        }),
        (Some(text), None) => Ok(Some(text.to_owned())),
        (None, Some(path)) => {
            let text = read_file(path).map_err(|reason| ConfigError::ReadFile {
                var: SYSTEM_PROMPT_FILE,
                path: elide_end(path, MAX_QUOTED_VALUE_BYTES),
                reason: one_line(&reason),
            })?;
            let text = text.strip_prefix('\u{feff}').unwrap_or(&text).trim_end();
            Ok((!text.trim().is_empty()).then(|| text.to_owned()))
        }
        (None, None) => Ok(None),
    }
}

/// The authorization settings (SPEC M11): the clients file, the user's time limit and
/// `$BROWSER` (not ours: the user's browser, for the authorization URL).
fn oauth(
    env: &Env<'_>,
    read_file: &dyn Fn(&str) -> Result<String, String>,
) -> Result<OAuthConfig, ConfigError> {
    let mut config = match env.get(OAUTH_CLIENTS_FILE) {
        None => OAuthConfig::default(),
        Some(path) => {
            let quoted = elide_end(path, MAX_QUOTED_VALUE_BYTES);
            let text = read_file(path).map_err(|reason| ConfigError::ReadFile {
                var: OAUTH_CLIENTS_FILE,
                path: quoted.clone(),
                reason: one_line(&reason),
            })?;
            crate::oauth::settings::parse_clients_file(&text, env.map, read_file).map_err(
                |reason| ConfigError::Invalid {
                    var: OAUTH_CLIENTS_FILE,
                    value: quoted,
                    expected: format!("a valid clients file: {}", one_line(&reason)),
                },
            )?
        }
    };
    config.user_timeout_ms = env.secs_as_ms(
        OAUTH_TIMEOUT_SECS,
        crate::oauth::settings::DEFAULT_USER_TIMEOUT_SECS,
    )?;
    config.browser = env.get("BROWSER").map(str::to_owned);
    Ok(config)
}

fn one_line(s: &str) -> String {
    let joined: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    elide_end(joined.trim(), MAX_QUOTED_VALUE_BYTES)
}

/// `BUZZ_AGENT_PROVIDER` (required) with `OPENAI_COMPAT_API` for the OpenAI routes.
fn provider_kind(env: &Env<'_>) -> Result<ProviderKind, ConfigError> {
    match env.get(PROVIDER).map(str::to_ascii_lowercase).as_deref() {
        None => Err(ConfigError::Missing {
            var: PROVIDER,
            expected: "set it to anthropic or openai".into(),
        }),
        Some("anthropic") => Ok(ProviderKind::Anthropic),
        Some("openai" | "openai-compat") => {
            match env.get(OPENAI_API).map(str::to_ascii_lowercase).as_deref() {
                None | Some("chat") => Ok(ProviderKind::OpenAiChat),
                Some("responses") => Ok(ProviderKind::OpenAiResponses),
                Some(_) => Err(env.invalid(OPENAI_API, "chat or responses")),
            }
        }
        Some(_) => Err(env.invalid(PROVIDER, "anthropic, openai or openai-compat")),
    }
}

/// `BUZZ_AGENT_STATE_DIR` with its fallbacks (SPEC A9).
fn state_dir(env: &Env<'_>) -> Result<StateDir, ConfigError> {
    const SUFFIX: &str = "buzz-agent/sessions";
    match env.get(STATE_DIR) {
        Some(v) if v.eq_ignore_ascii_case("off") => Ok(StateDir::Off),
        Some(v) if v.starts_with('/') => Ok(StateDir::Dir(without_trailing_slash(v))),
        Some(_) => Err(env.invalid(STATE_DIR, "an absolute directory path, or off")),
        None => {
            // XDG Base Directory: a relative $XDG_STATE_HOME is invalid and ignored.
            let base = env
                .get("XDG_STATE_HOME")
                .filter(|p| p.starts_with('/'))
                .map(|p| format!("{}/{SUFFIX}", p.trim_end_matches('/')))
                .or_else(|| {
                    env.get("HOME")
                        .filter(|p| p.starts_with('/'))
                        .map(|p| format!("{}/.local/state/{SUFFIX}", p.trim_end_matches('/')))
                });
            Ok(base.map_or(StateDir::Off, StateDir::Dir))
        }
    }
}

/// The user-wide instructions file (SPEC A10): `$XDG_CONFIG_HOME/buzz-agent/AGENTS.md` (a
/// relative `XDG_CONFIG_HOME` is ignored, as the XDG Base Directory spec says), else
/// `$HOME/.config/buzz-agent/AGENTS.md`.
fn user_instructions(env: &Env<'_>) -> Option<String> {
    let file = crate::project::INSTRUCTIONS_FILE;
    env.get("XDG_CONFIG_HOME")
        .filter(|p| p.starts_with('/'))
        .map(|p| format!("{}/buzz-agent/{file}", p.trim_end_matches('/')))
        .or_else(|| {
            env.get("HOME")
                .filter(|p| p.starts_with('/'))
                .map(|p| format!("{}/.config/buzz-agent/{file}", p.trim_end_matches('/')))
        })
}

/// An absolute path without its trailing `/`s (`/` itself stays `/`).
fn without_trailing_slash(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    }
}

/// The OAuth secret seed of a fixed `BUZZ_AGENT_SEED` (reproducible runs).
fn oauth_seed_of(seed: u64) -> [u8; 32] {
    crate::oauth::secrets::sha256(
        &[b"buzz-agent oauth seed".as_slice(), &seed.to_le_bytes()].concat(),
    )
}

/// The session-id seed of a fixed `BUZZ_AGENT_SEED`: both halves of the 128 bits from it.
fn expand_seed(seed: u64) -> u128 {
    (u128::from(seed) << 64) | u128::from(seed ^ 0x5851_f42d_4c95_7f2d)
}

impl Config {
    /// Builds and validates the configuration from an environment snapshot (C1–C3).
    ///
    /// `env` maps variable names to values (the runtime passes its process environment; names
    /// or values that are not UTF-8 are left out). `read_file(path)` returns a file's content
    /// or a one-line reason; it is called only for `BUZZ_AGENT_SYSTEM_PROMPT_FILE`, `BUZZ_AGENT_OAUTH_CLIENTS_FILE` and the files that one names. Without
    /// `BUZZ_AGENT_SEED`, `seed` is 0 and `session_id_seed` is `None`: the runtime sets them
    /// from the OS's randomness.
    ///
    /// # Errors
    /// Every error found, in one [`ConfigErrors`] (so a user fixes them all in one go, not one
    /// run at a time), in the order of the `--help` table. A check that depends on another
    /// variable is skipped while that one is wrong: without a valid `BUZZ_AGENT_PROVIDER` the
    /// provider's key, model and URL are not checked, and the output-token bound is checked
    /// only against a valid context size.
    pub fn from_env_map(
        env: &BTreeMap<String, String>,
        read_file: &dyn Fn(&str) -> Result<String, String>,
    ) -> Result<Config, ConfigErrors> {
        let env = Env { map: env };
        let mut c = Collect::default();
        let provider = c.opt(provider_kind(&env));
        let (mut api_key, mut model, mut base_url) = (String::new(), String::new(), String::new());
        if let Some(provider) = provider {
            let (key_var, model_var, url_var, default_url) = match provider {
                ProviderKind::Anthropic => (
                    ANTHROPIC_API_KEY,
                    ANTHROPIC_MODEL,
                    ANTHROPIC_BASE_URL,
                    DEFAULT_ANTHROPIC_BASE_URL,
                ),
                ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses => (
                    OPENAI_API_KEY,
                    OPENAI_MODEL,
                    OPENAI_BASE_URL,
                    DEFAULT_OPENAI_BASE_URL,
                ),
            };
            match (provider, env.get(key_var)) {
                (_, Some(key)) => key.clone_into(&mut api_key),
                (ProviderKind::Anthropic, None) => c.errors.push(ConfigError::Missing {
                    var: ANTHROPIC_API_KEY,
                    expected: "an API key is required when BUZZ_AGENT_PROVIDER=anthropic".into(),
                }),
                (ProviderKind::OpenAiChat | ProviderKind::OpenAiResponses, None) => {}
            }
            match env.get(MODEL).or_else(|| env.get(model_var)) {
                Some(m) => m.clone_into(&mut model),
                None => c.errors.push(ConfigError::Missing {
                    var: model_var,
                    expected: format!("a model name is required (set {model_var} or {MODEL})"),
                }),
            }
            base_url = c.or(env.url(url_var, default_url), String::new());
        }
        let anthropic_version = match provider {
            Some(ProviderKind::Anthropic) => env
                .get(ANTHROPIC_API_VERSION)
                .unwrap_or(DEFAULT_ANTHROPIC_VERSION),
            _ => DEFAULT_ANTHROPIC_VERSION,
        }
        .to_owned();
        let system_prompt = c.or(system_prompt(&env, read_file), None);

        let max_output_tokens = c.opt(env.uint(MAX_OUTPUT_TOKENS, 32_768_u32));
        let max_context_tokens = c.opt(env.uint(MAX_CONTEXT_TOKENS, 200_000_u64));
        if let (Some(output), Some(context)) = (max_output_tokens, max_context_tokens)
            && u64::from(output) >= context
        {
            let value = match env.get(MAX_OUTPUT_TOKENS) {
                Some(_) => env.raw(MAX_OUTPUT_TOKENS).to_owned(),
                None => format!("{output} (the default)"),
            };
            c.errors.push(invalid(
                MAX_OUTPUT_TOKENS,
                &value,
                format!("an integer >= 1 and < {MAX_CONTEXT_TOKENS} ({context})"),
            ));
        }
        let max_sessions = match env.get(MAX_SESSIONS) {
            None => None,
            Some(_) => c.or(
                env.uint(MAX_SESSIONS, usize::MAX).map(Some).map_err(|_| {
                    env.invalid(MAX_SESSIONS, "an integer >= 1 (unset for unlimited)")
                }),
                None,
            ),
        };
        let permission = match env.get(PERMISSION).map(str::to_ascii_lowercase).as_deref() {
            None | Some("ask") => Ok(PermissionMode::Ask),
            Some("allow") => Ok(PermissionMode::Allow),
            Some(_) => Err(env.invalid(PERMISSION, "ask or allow")),
        };
        let log_level = match env.get(LOG).map(str::to_ascii_lowercase).as_deref() {
            None | Some("info") => Ok(LogLevel::Info),
            Some("error") => Ok(LogLevel::Error),
            Some("warn" | "warning") => Ok(LogLevel::Warn),
            Some("debug") => Ok(LogLevel::Debug),
            Some("trace") => Ok(LogLevel::Trace),
            Some(_) => Err(env.invalid(LOG, "error, warn, info, debug or trace")),
        };
        let fixed_seed = match env.get(SEED) {
            None => None,
            Some(_) => c.opt(env.uint(SEED, 0_u64)),
        };
        let prompt_cache_key = match env.get(PROMPT_CACHE_KEY).map(str::to_ascii_lowercase) {
            None => Ok(None),
            Some(v) if v == "auto" => Ok(None),
            Some(_) => env.flag(PROMPT_CACHE_KEY, false).map(Some).map_err(|_| {
                env.invalid(
                    PROMPT_CACHE_KEY,
                    "auto, or a boolean: 1/0/true/false/yes/no/on/off",
                )
            }),
        };
        let thinking_effort = match env.get(THINKING_EFFORT) {
            None => Ok(None),
            Some(v) => Effort::parse(v)
                .map(Some)
                .ok_or_else(|| env.invalid(THINKING_EFFORT, "low, medium, high or max")),
        };
        let thinking_summary = match env.get(THINKING_SUMMARY).map(str::to_ascii_lowercase) {
            None => Ok(None),
            Some(v) if ["auto", "concise", "detailed"].contains(&v.as_str()) => Ok(Some(v)),
            Some(_) => Err(env.invalid(THINKING_SUMMARY, "auto, concise or detailed")),
        };
        let log_format = match env.get(LOG_FORMAT).map(str::to_ascii_lowercase).as_deref() {
            None | Some("text") => Ok(LogFormat::Text),
            Some("json") => Ok(LogFormat::Json),
            Some(_) => Err(env.invalid(LOG_FORMAT, "text or json")),
        };

        // A failed value is replaced by a fallback so that every variable is checked; the
        // configuration built from fallbacks is returned only when nothing failed.
        let config = Config {
            provider: provider.unwrap_or(ProviderKind::OpenAiChat),
            api_key,
            model,
            models: env.list(MODELS),
            base_url,
            anthropic_version,
            prompt_caching: c.or(env.flag(PROMPT_CACHING, true), true),
            prompt_cache_key: c.or(prompt_cache_key, None),
            prices: c.or(prices(&env), None),
            thinking_effort: c.or(thinking_effort, None),
            thinking_summary: c.or(thinking_summary, None),
            system_prompt,
            max_rounds: c.or(env.uint(MAX_ROUNDS, 0), 0),
            max_output_tokens: max_output_tokens.unwrap_or(1),
            max_context_tokens: max_context_tokens.unwrap_or(2),
            max_handoffs: c.or(env.uint(MAX_HANDOFFS, 10), 0),
            max_token_recoveries: c.or(env.uint(MAX_TOKEN_RECOVERIES, 3), 0),
            llm_timeout_ms: c.or(env.secs_as_ms(LLM_TIMEOUT_SECS, 240), 0),
            llm_max_attempts: c.or(env.uint(LLM_MAX_ATTEMPTS, 3), 1),
            tool_timeout_ms: c.or(env.secs_as_ms(TOOL_TIMEOUT_SECS, 660), 0),
            mcp_init_timeout_ms: c.or(env.secs_as_ms(MCP_INIT_TIMEOUT_SECS, 30), 0),
            max_parallel_tools: c.or(env.uint(MAX_PARALLEL_TOOLS, 8), 1),
            max_sessions,
            max_line_bytes: c.or(env.uint(MAX_LINE_BYTES, 4_194_304), 1024),
            max_tool_result_text_bytes: c.or(env.uint(MAX_TOOL_RESULT_TEXT_BYTES, 51_200), 1024),
            child_env: c.or(child_env(&env), Vec::new()),
            hook_servers: c.or(
                parse_server_allowlist(&env, HOOK_SERVERS),
                HookAllowlist::Off,
            ),
            hook_timeout_ms: c.or(env.uint(HOOK_TIMEOUT_MS, 2500), 1),
            interceptor_servers: c.or(
                parse_server_allowlist(&env, INTERCEPTOR_SERVERS),
                HookAllowlist::Off,
            ),
            stop_max_rejections: c.or(env.uint(STOP_MAX_REJECTIONS, 3), 0),
            require_reply: c.or(env.flag(REQUIRE_REPLY, false), false),
            reply_tools: env.list(REPLY_TOOLS),
            permission: c.or(permission, PermissionMode::Ask),
            permission_timeout_ms: c.or(env.secs_as_ms(PERMISSION_TIMEOUT_SECS, 330), 0),
            log_level: c.or(log_level, LogLevel::Info),
            log_format: c.or(log_format, LogFormat::Text),
            state_dir: c.or(state_dir(&env), StateDir::Off),
            fixed_seed,
            seed: fixed_seed.unwrap_or(0),
            session_id_seed: fixed_seed.map(expand_seed),
            oauth: c.or(oauth(&env, read_file), OAuthConfig::default()),
            oauth_seed: fixed_seed.map_or([0; 32], oauth_seed_of),
            unix_ms_at_start: 0,
            no_hints: c.or(env.flag(NO_HINTS, false), false),
            instructions_max_bytes: c.or(env.uint(INSTRUCTIONS_MAX_BYTES, 32_768), 1024),
            user_instructions: user_instructions(&env),
            user_skills_dir: env
                .get("HOME")
                .filter(|p| p.starts_with('/'))
                .map(|p| format!("{}/{}", p.trim_end_matches('/'), crate::project::SKILLS_DIR)),
        };
        match ConfigErrors::from_vec(c.errors) {
            Some(errors) => Err(errors),
            None => Ok(config),
        }
    }

    /// A valid configuration for tests and tools that do not read the environment: every C2
    /// default, model `test-model`, key `test-key`, the given provider, and `base_url` with
    /// trailing `/` removed (not otherwise validated).
    #[cfg(any(test, feature = "testing"))]
    #[must_use]
    pub fn for_tests(provider: ProviderKind, base_url: &str) -> Config {
        Config {
            provider,
            api_key: "test-key".to_owned(),
            model: "test-model".to_owned(),
            models: Vec::new(),
            base_url: base_url.trim_end_matches('/').to_owned(),
            anthropic_version: DEFAULT_ANTHROPIC_VERSION.to_owned(),
            prompt_caching: true,
            prompt_cache_key: None,
            prices: None,
            thinking_effort: None,
            thinking_summary: None,
            system_prompt: None,
            max_rounds: 0,
            max_output_tokens: 32_768,
            max_context_tokens: 200_000,
            max_handoffs: 10,
            max_token_recoveries: 3,
            llm_timeout_ms: 240_000,
            llm_max_attempts: 3,
            tool_timeout_ms: 660_000,
            mcp_init_timeout_ms: 30_000,
            max_parallel_tools: 8,
            max_sessions: None,
            max_line_bytes: 4_194_304,
            max_tool_result_text_bytes: 51_200,
            child_env: Vec::new(),
            hook_servers: HookAllowlist::Off,
            interceptor_servers: HookAllowlist::Off,
            hook_timeout_ms: 2500,
            stop_max_rejections: 3,
            require_reply: false,
            reply_tools: Vec::new(),
            permission: PermissionMode::Ask,
            permission_timeout_ms: 330_000,
            log_level: LogLevel::Info,
            log_format: LogFormat::Text,
            state_dir: StateDir::Off,
            fixed_seed: None,
            seed: 0,
            session_id_seed: None,
            oauth: OAuthConfig::default(),
            oauth_seed: [0; 32],
            unix_ms_at_start: 0,
            // The core's tests drive no file reads unless they ask for them.
            no_hints: true,
            instructions_max_bytes: 32_768,
            user_instructions: None,
            user_skills_dir: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_file(_: &str) -> Result<String, String> {
        Err("no such file".to_owned())
    }

    fn env_of(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// A minimal valid Anthropic environment plus `extra` (later entries win).
    fn anthropic(extra: &[(&str, &str)]) -> BTreeMap<String, String> {
        let mut env = env_of(&[
            (PROVIDER, "anthropic"),
            (ANTHROPIC_API_KEY, "sk-1"),
            (ANTHROPIC_MODEL, "claude"),
        ]);
        env.extend(env_of(extra));
        env
    }

    /// The configuration, or the first error.
    fn load(env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        Config::from_env_map(env, &no_file).map_err(|e| e.first().clone())
    }

    fn err(env: &BTreeMap<String, String>) -> ConfigError {
        match load(env) {
            Ok(c) => unreachable!("expected an error, got {c:?}"),
            Err(e) => e,
        }
    }

    fn ok(env: &BTreeMap<String, String>) -> Config {
        match load(env) {
            Ok(c) => c,
            Err(e) => unreachable!("expected a config, got {e}"),
        }
    }

    #[test]
    fn m11_a_fixed_seed_fixes_the_oauth_seed_and_none_leaves_it_to_the_runtime() {
        let a = ok(&anthropic(&[(SEED, "42")]));
        let b = ok(&anthropic(&[(SEED, "42")]));
        let c = ok(&anthropic(&[(SEED, "43")]));
        assert_eq!(a.oauth_seed, b.oauth_seed);
        assert_ne!(a.oauth_seed, c.oauth_seed);
        assert_ne!(a.oauth_seed, [0; 32]);
        assert_eq!(ok(&anthropic(&[])).oauth_seed, [0; 32]);
        assert!(!format!("{a:?}").contains(&format!("{:?}", a.oauth_seed)));
        assert_eq!(
            ok(&anthropic(&[("BROWSER", " firefox ")]))
                .oauth
                .browser
                .as_deref(),
            Some("firefox")
        );
        assert_eq!(ok(&anthropic(&[("BROWSER", " ")])).oauth.browser, None);
    }

    #[test]
    fn m11_the_clients_file_and_the_user_s_time_limit_are_read_at_start() {
        let read = |p: &str| {
            match p {
            "/oauth.json" => Ok(r#"{"redirect_port": 8765, "servers": {"github": {"client_id": "Iv1.abc", "client_secret_env": "GH"}}}"#.to_owned()),
            "/typo.json" => Ok(r#"{"servers": {"github": {"client_id": "a", "client_secert": "s3cret"}}}"#.to_owned()),
            _ => Err("No such file or directory".to_owned()),
        }
        };
        let c = Config::from_env_map(
            &anthropic(&[
                (OAUTH_CLIENTS_FILE, " /oauth.json "),
                ("GH", "s"),
                (OAUTH_TIMEOUT_SECS, "60"),
            ]),
            &read,
        )
        .unwrap();
        assert_eq!(c.oauth.configured_servers(), 1);
        assert_eq!(c.oauth.redirect_port, 8765);
        assert_eq!(c.oauth.user_timeout_ms, 60_000);
        assert_eq!(ok(&anthropic(&[])).oauth.user_timeout_ms, 300_000);
        let e = Config::from_env_map(&anthropic(&[(OAUTH_CLIENTS_FILE, "/typo.json")]), &read)
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("BUZZ_AGENT_OAUTH_CLIENTS_FILE: invalid value \"/typo.json\""),
            "{e}"
        );
        assert!(
            e.contains("client_secert"),
            "the unknown field is named: {e}"
        );
        assert!(!e.contains("s3cret"), "never a secret: {e}");
        let e = Config::from_env_map(&anthropic(&[(OAUTH_CLIENTS_FILE, "/missing")]), &read)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "BUZZ_AGENT_OAUTH_CLIENTS_FILE: cannot read \"/missing\": No such file or directory"
        );
        assert_eq!(
            err(&anthropic(&[(OAUTH_TIMEOUT_SECS, "0")])).variable(),
            OAUTH_TIMEOUT_SECS
        );
    }

    #[test]
    fn c2_every_default_applies_when_only_required_variables_are_set() {
        let c = ok(&anthropic(&[]));
        let mut expected = Config::for_tests(ProviderKind::Anthropic, DEFAULT_ANTHROPIC_BASE_URL);
        expected.api_key = "sk-1".into();
        expected.model = "claude".into();
        expected.no_hints = false;
        assert_eq!(c, expected);
        assert_eq!(c.base_url, "https://api.anthropic.com");
        assert_eq!(c.anthropic_version, "2023-06-01");
        assert_eq!(c.system_prompt, None);
        assert_eq!(c.max_rounds, 0);
        assert_eq!(c.max_output_tokens, 32_768);
        assert_eq!(c.max_context_tokens, 200_000);
        assert_eq!(c.max_handoffs, 10);
        assert_eq!(c.max_token_recoveries, 3);
        assert_eq!(c.llm_timeout_ms, 240_000);
        assert_eq!(c.llm_max_attempts, 3);
        assert_eq!(c.tool_timeout_ms, 660_000);
        assert_eq!(c.mcp_init_timeout_ms, 30_000);
        assert_eq!(c.max_parallel_tools, 8);
        assert_eq!(c.max_sessions, None);
        assert_eq!(c.max_line_bytes, 4_194_304);
        assert_eq!(c.max_tool_result_text_bytes, 51_200);
        assert_eq!(c.hook_servers, HookAllowlist::Off);
        assert_eq!(c.hook_timeout_ms, 2500);
        assert_eq!(c.stop_max_rejections, 3);
        assert!(!c.require_reply);
        assert!(c.reply_tools.is_empty());
        assert_eq!(c.permission, PermissionMode::Ask);
        assert_eq!(c.permission_timeout_ms, 330_000);
        assert_eq!(c.log_level, LogLevel::Info);
        assert_eq!(c.log_format, LogFormat::Text);
        assert_eq!(c.seed, 0);
    }

    #[test]
    fn c2_openai_defaults_to_chat_with_optional_empty_key_and_openai_base_url() {
        let c = ok(&env_of(&[(PROVIDER, "openai"), (OPENAI_MODEL, "gpt")]));
        assert_eq!(c.provider, ProviderKind::OpenAiChat);
        assert_eq!(c.api_key, "");
        assert_eq!(c.model, "gpt");
        assert_eq!(c.base_url, "https://api.openai.com/v1");
        assert_eq!(c.anthropic_version, "2023-06-01");
    }

    #[test]
    fn c2_openai_compat_alias_and_responses_api_select_the_responses_provider() {
        let c = ok(&env_of(&[
            (PROVIDER, " OpenAI-Compat "),
            (OPENAI_MODEL, "m"),
            (OPENAI_API, "Responses"),
            (OPENAI_API_KEY, " k "),
        ]));
        assert_eq!(c.provider, ProviderKind::OpenAiResponses);
        assert_eq!(c.api_key, "k");
        let e = err(&env_of(&[
            (PROVIDER, "openai"),
            (OPENAI_MODEL, "m"),
            (OPENAI_API, "completions"),
        ]));
        assert_eq!(
            e.to_string(),
            "OPENAI_COMPAT_API: invalid value \"completions\": expected chat or responses"
        );
    }

    #[test]
    fn c2_provider_is_required_and_validated() {
        let e = err(&env_of(&[]));
        assert_eq!(e.variable(), PROVIDER);
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_PROVIDER: not set: set it to anthropic or openai"
        );
        assert_eq!(err(&env_of(&[(PROVIDER, "  ")])).variable(), PROVIDER);
        let e = err(&env_of(&[(PROVIDER, "gemini")]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_PROVIDER: invalid value \"gemini\": expected anthropic, openai or openai-compat"
        );
    }

    #[test]
    fn c2_anthropic_key_is_required_and_non_blank() {
        let mut env = anthropic(&[]);
        env.remove(ANTHROPIC_API_KEY);
        assert_eq!(err(&env).variable(), ANTHROPIC_API_KEY);
        let e = err(&anthropic(&[(ANTHROPIC_API_KEY, " \t")]));
        assert_eq!(e.variable(), ANTHROPIC_API_KEY);
        assert!(e.to_string().contains("required"), "{e}");
    }

    #[test]
    fn c2_model_is_required_and_the_error_names_the_providers_variable() {
        let mut env = anthropic(&[]);
        env.remove(ANTHROPIC_MODEL);
        assert_eq!(err(&env).variable(), ANTHROPIC_MODEL);
        let e = err(&env_of(&[
            (PROVIDER, "openai"),
            (ANTHROPIC_MODEL, "claude"),
        ]));
        assert_eq!(e.variable(), OPENAI_MODEL);
        assert!(e.to_string().contains(MODEL), "{e}");
    }

    #[test]
    fn c2_buzz_agent_model_overrides_the_providers_model() {
        assert_eq!(ok(&anthropic(&[(MODEL, " opus ")])).model, "opus");
        assert_eq!(ok(&anthropic(&[(MODEL, " ")])).model, "claude");
        let mut env = anthropic(&[(MODEL, "opus")]);
        env.remove(ANTHROPIC_MODEL);
        assert_eq!(ok(&env).model, "opus");
    }

    #[test]
    fn l11_prompt_caching_is_on_by_default_and_a_boolean_turns_it_off() {
        assert!(ok(&anthropic(&[])).prompt_caching);
        for (value, on) in [
            ("0", false),
            ("off", false),
            ("FALSE", false),
            ("yes", true),
        ] {
            assert_eq!(
                ok(&anthropic(&[(PROMPT_CACHING, value)])).prompt_caching,
                on,
                "{value}"
            );
        }
        let e = err(&anthropic(&[(PROMPT_CACHING, "sometimes")]));
        assert!(
            e.to_string()
                .starts_with("BUZZ_AGENT_PROMPT_CACHING: invalid value \"sometimes\""),
            "{e}"
        );
    }

    #[test]
    fn l11_the_prompt_cache_key_is_auto_unless_a_boolean_says_otherwise() {
        let openai = |v: &str| {
            let env = env_of(&[
                (PROVIDER, "openai"),
                (OPENAI_MODEL, "m"),
                (PROMPT_CACHE_KEY, v),
            ]);
            load(&env).map(|c| c.prompt_cache_key)
        };
        assert_eq!(openai(""), Ok(None));
        assert_eq!(openai(" Auto "), Ok(None));
        assert_eq!(openai("1"), Ok(Some(true)));
        assert_eq!(openai("off"), Ok(Some(false)));
        let e = openai("maybe").unwrap_err().to_string();
        assert!(e.contains("expected auto, or a boolean"), "{e}");
    }

    #[test]
    fn l12_thinking_effort_and_summary_are_unset_by_default_and_validated() {
        let c = ok(&anthropic(&[]));
        assert_eq!((c.thinking_effort, c.thinking_summary), (None, None));
        for (v, e) in [
            ("low", Effort::Low),
            (" Medium ", Effort::Medium),
            ("HIGH", Effort::High),
            ("max", Effort::Max),
        ] {
            assert_eq!(
                ok(&anthropic(&[(THINKING_EFFORT, v)])).thinking_effort,
                Some(e)
            );
        }
        let e = err(&anthropic(&[(THINKING_EFFORT, "extreme")])).to_string();
        assert!(
            e.starts_with("BUZZ_AGENT_THINKING_EFFORT: invalid value")
                && e.contains("low, medium, high or max"),
            "{e}"
        );
        assert_eq!(
            ok(&anthropic(&[(THINKING_SUMMARY, "Detailed")])).thinking_summary,
            Some("detailed".into())
        );
        let e = err(&anthropic(&[(THINKING_SUMMARY, "long")])).to_string();
        assert!(e.contains("auto, concise or detailed"), "{e}");
    }

    #[test]
    fn l11_prices_are_per_million_tokens_with_the_cache_prices_defaulting_to_input() {
        assert_eq!(ok(&anthropic(&[])).prices, None);
        let p = ok(&anthropic(&[(
            PRICES,
            " input=3, output=15 ,cache_read=0.3,cache_write=3.75,currency=EUR",
        )]))
        .prices;
        assert_eq!(
            p,
            Some(Prices {
                currency: "EUR".into(),
                input_micros: 3_000_000,
                output_micros: 15_000_000,
                cache_read_micros: 300_000,
                cache_write_micros: 3_750_000,
            })
        );
        let p = ok(&anthropic(&[(PRICES, "output=.000001,input=0.5")])).prices;
        assert_eq!(
            p,
            Some(Prices {
                currency: "USD".into(),
                input_micros: 500_000,
                output_micros: 1,
                cache_read_micros: 500_000,
                cache_write_micros: 500_000,
            })
        );
        for bad in [
            "input=3",
            "output=3",
            "input=3,output=x",
            "input=-1,output=2",
            "input=1.0000001,output=2",
            "input=1,output=2,input=3",
            "input=1,output=2,tax=3",
            "input 1,output=2",
            "input=.,output=2",
            "input=1,output=2,currency=",
            "input=99999999999999999999,output=2",
        ] {
            let e = err(&anthropic(&[(PRICES, bad)])).to_string();
            assert!(
                e.starts_with("BUZZ_AGENT_PRICES: invalid value"),
                "{bad}: {e}"
            );
            assert!(e.contains("prices per million tokens"), "{e}");
        }
    }

    #[test]
    fn c2_base_url_is_trimmed_of_trailing_slashes_and_must_be_http_or_https() {
        assert_eq!(
            ok(&anthropic(&[(ANTHROPIC_BASE_URL, " http://127.0.0.1:9/ ")])).base_url,
            "http://127.0.0.1:9"
        );
        assert_eq!(
            ok(&anthropic(&[(ANTHROPIC_BASE_URL, "HTTPS://x/v1//")])).base_url,
            "HTTPS://x/v1"
        );
        assert_eq!(
            ok(&anthropic(&[(ANTHROPIC_BASE_URL, "")])).base_url,
            DEFAULT_ANTHROPIC_BASE_URL
        );
        for bad in [
            "ftp://x",
            "api.anthropic.com",
            "https://",
            "https:///",
            "http://a b",
        ] {
            let e = err(&anthropic(&[(ANTHROPIC_BASE_URL, bad)]));
            assert_eq!(e.variable(), ANTHROPIC_BASE_URL, "{bad}");
            assert!(e.to_string().contains("http:// or https://"), "{e}");
        }
        let e = err(&env_of(&[
            (PROVIDER, "openai"),
            (OPENAI_MODEL, "m"),
            (OPENAI_BASE_URL, "localhost:8080"),
        ]));
        assert_eq!(e.variable(), OPENAI_BASE_URL);
    }

    #[test]
    fn c2_other_providers_variables_are_ignored() {
        let c = ok(&anthropic(&[
            (OPENAI_BASE_URL, "nonsense"),
            (OPENAI_API, "nonsense"),
        ]));
        assert_eq!(c.provider, ProviderKind::Anthropic);
        let c = ok(&env_of(&[
            (PROVIDER, "openai"),
            (OPENAI_MODEL, "m"),
            (ANTHROPIC_API_VERSION, "x"),
        ]));
        assert_eq!(c.anthropic_version, DEFAULT_ANTHROPIC_VERSION);
    }

    #[test]
    fn c2_anthropic_version_is_read_and_trimmed() {
        assert_eq!(
            ok(&anthropic(&[(ANTHROPIC_API_VERSION, " 2024-01-01 ")])).anthropic_version,
            "2024-01-01"
        );
    }

    #[test]
    fn c2_system_prompt_comes_from_the_variable_or_the_file_but_not_both() {
        assert_eq!(
            ok(&anthropic(&[(SYSTEM_PROMPT, "Be brief.")]))
                .system_prompt
                .as_deref(),
            Some("Be brief.")
        );
        assert_eq!(ok(&anthropic(&[(SYSTEM_PROMPT, "  ")])).system_prompt, None);
        let read = |p: &str| {
            if p == "/p.txt" {
                Ok("\u{feff}From file.\n\n".to_owned())
            } else {
                Err("nope".to_owned())
            }
        };
        let c = Config::from_env_map(&anthropic(&[(SYSTEM_PROMPT_FILE, " /p.txt ")]), &read);
        assert_eq!(
            c.map(|c| c.system_prompt),
            Ok(Some("From file.".to_owned()))
        );
        let read_blank = |_: &str| Ok(" \n".to_owned());
        let c = Config::from_env_map(&anthropic(&[(SYSTEM_PROMPT_FILE, "/p")]), &read_blank);
        assert_eq!(c.map(|c| c.system_prompt), Ok(None));
        let e = err(&anthropic(&[
            (SYSTEM_PROMPT, "a"),
            (SYSTEM_PROMPT_FILE, "/p.txt"),
        ]));
        assert_eq!(e.variable(), SYSTEM_PROMPT_FILE);
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_SYSTEM_PROMPT_FILE and BUZZ_AGENT_SYSTEM_PROMPT are both set: set only one of them"
        );
    }

    #[test]
    fn c1_unreadable_system_prompt_file_is_one_line_naming_the_variable_and_path() {
        let read = |_: &str| Err("No such file\nor directory".to_owned());
        let e = Config::from_env_map(&anthropic(&[(SYSTEM_PROMPT_FILE, "/missing")]), &read);
        let Err(e) = e else {
            unreachable!("expected an error")
        };
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_SYSTEM_PROMPT_FILE: cannot read \"/missing\": No such file or directory"
        );
    }

    /// (variable, value given, expected field value read back)
    fn numeric_fields(c: &Config) -> [(&'static str, u64); 19] {
        [
            (MAX_ROUNDS, u64::from(c.max_rounds)),
            (MAX_OUTPUT_TOKENS, u64::from(c.max_output_tokens)),
            (MAX_CONTEXT_TOKENS, c.max_context_tokens),
            (MAX_HANDOFFS, u64::from(c.max_handoffs)),
            (MAX_TOKEN_RECOVERIES, u64::from(c.max_token_recoveries)),
            (LLM_TIMEOUT_SECS, c.llm_timeout_ms),
            (LLM_MAX_ATTEMPTS, u64::from(c.llm_max_attempts)),
            (TOOL_TIMEOUT_SECS, c.tool_timeout_ms),
            (MCP_INIT_TIMEOUT_SECS, c.mcp_init_timeout_ms),
            (MAX_PARALLEL_TOOLS, c.max_parallel_tools as u64),
            (MAX_SESSIONS, c.max_sessions.map_or(0, |n| n as u64)),
            (MAX_LINE_BYTES, c.max_line_bytes as u64),
            (
                MAX_TOOL_RESULT_TEXT_BYTES,
                c.max_tool_result_text_bytes as u64,
            ),
            (HOOK_TIMEOUT_MS, c.hook_timeout_ms),
            (STOP_MAX_REJECTIONS, u64::from(c.stop_max_rejections)),
            (PERMISSION_TIMEOUT_SECS, c.permission_timeout_ms),
            (OAUTH_TIMEOUT_SECS, c.oauth.user_timeout_ms),
            (SEED, c.fixed_seed.unwrap_or(0)),
            (INSTRUCTIONS_MAX_BYTES, c.instructions_max_bytes as u64),
        ]
    }

    #[test]
    fn c1_numbers_are_decimal_integers_with_blanks_trimmed_and_seconds_become_ms() {
        let names: Vec<&str> = numeric_fields(&Config::for_tests(ProviderKind::Anthropic, ""))
            .map(|(n, _)| n)
            .to_vec();
        for name in names {
            // Output tokens at 1000 so that a context of 2048 stays valid.
            let c = ok(&anthropic(&[
                (MAX_OUTPUT_TOKENS, "1000"),
                (name, " \t2048\n"),
            ]));
            let got = numeric_fields(&c)
                .into_iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v);
            let want = if name.ends_with("_SECS") {
                2_048_000
            } else {
                2048
            };
            assert_eq!(got, Some(want), "{name}");
            assert_eq!(
                ok(&anthropic(&[(MAX_OUTPUT_TOKENS, "1000"), (name, "002048")])),
                c,
                "{name}: leading zeros"
            );
        }
    }

    #[test]
    fn c1_every_numeric_variable_rejects_non_decimal_values_naming_itself() {
        let names: Vec<&str> = numeric_fields(&Config::for_tests(ProviderKind::Anthropic, ""))
            .map(|(n, _)| n)
            .to_vec();
        for name in names {
            for bad in [
                "abc",
                "-1",
                "+5",
                "1.5",
                "1e3",
                "1_000",
                "0x10",
                "99999999999999999999999",
            ] {
                let e = err(&anthropic(&[(name, bad)]));
                assert_eq!(e.variable(), name, "{bad}");
                let line = e.to_string();
                assert!(
                    line.starts_with(&format!(
                        "{name}: invalid value \"{bad}\": expected an integer"
                    )),
                    "{line}"
                );
                assert!(!line.contains('\n'));
            }
        }
    }

    #[test]
    fn c1_blank_numeric_values_count_as_unset() {
        let names: Vec<&str> = numeric_fields(&Config::for_tests(ProviderKind::Anthropic, ""))
            .map(|(n, _)| n)
            .to_vec();
        for name in names {
            assert_eq!(
                ok(&anthropic(&[(name, "  ")])),
                ok(&anthropic(&[])),
                "{name}"
            );
        }
    }

    #[test]
    fn c2_lower_bounds_are_enforced_with_the_allowed_range_in_the_message() {
        let secs = "an integer from 1 to 4294967295";
        let cases = [
            (LLM_TIMEOUT_SECS, "0", secs),
            (LLM_MAX_ATTEMPTS, "0", secs),
            (TOOL_TIMEOUT_SECS, "0", secs),
            (MCP_INIT_TIMEOUT_SECS, "0", secs),
            (PERMISSION_TIMEOUT_SECS, "0", secs),
            (MAX_PARALLEL_TOOLS, "0", "an integer >= 1"),
            (MAX_SESSIONS, "0", "an integer >= 1 (unset for unlimited)"),
            (MAX_LINE_BYTES, "1023", "an integer >= 1024"),
            (
                MAX_TOOL_RESULT_TEXT_BYTES,
                "1023",
                "an integer from 1024 to 8388608",
            ),
            (
                MAX_TOOL_RESULT_TEXT_BYTES,
                "8388609",
                "an integer from 1024 to 8388608",
            ),
            (HOOK_TIMEOUT_MS, "0", "an integer from 1 to 600000"),
            (HOOK_TIMEOUT_MS, "600001", "an integer from 1 to 600000"),
            (MAX_OUTPUT_TOKENS, "0", secs),
            (MAX_CONTEXT_TOKENS, "1", "an integer >= 2"),
            (LLM_TIMEOUT_SECS, "4294967296", secs),
            (MAX_ROUNDS, "4294967296", "an integer from 0 to 4294967295"),
        ];
        for (name, value, expected) in cases {
            let e = err(&anthropic(&[(name, value)]));
            assert_eq!(
                e.to_string(),
                format!("{name}: invalid value \"{value}\": expected {expected}")
            );
        }
    }

    #[test]
    fn c2_bounds_themselves_are_accepted() {
        let c = ok(&anthropic(&[
            (MAX_LINE_BYTES, "1024"),
            (MAX_TOOL_RESULT_TEXT_BYTES, "8388608"),
            (HOOK_TIMEOUT_MS, "600000"),
            (MAX_SESSIONS, "1"),
            (STOP_MAX_REJECTIONS, "0"),
            (MAX_HANDOFFS, "0"),
            (MAX_TOKEN_RECOVERIES, "0"),
            (LLM_TIMEOUT_SECS, "4294967295"),
        ]));
        assert_eq!(c.max_line_bytes, 1024);
        assert_eq!(c.max_tool_result_text_bytes, 8_388_608);
        assert_eq!(c.hook_timeout_ms, 600_000);
        assert_eq!(c.max_sessions, Some(1));
        assert_eq!(c.stop_max_rejections, 0);
        assert_eq!(c.llm_timeout_ms, 4_294_967_295_000);
    }

    #[test]
    fn c1_every_numeric_variable_has_one_range_for_parser_errors_and_help() {
        let names: Vec<&str> = numeric_fields(&Config::for_tests(ProviderKind::Anthropic, ""))
            .map(|(n, _)| n)
            .to_vec();
        assert_eq!(names.len(), NUMBERS.len());
        let help = help_text();
        for name in names {
            let (min, max) = numeric_range(name).unwrap_or_else(|| unreachable!("{name}"));
            let text = numeric_range_text(name).unwrap_or_default();
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")))
                .unwrap_or_default();
            assert!(line.contains(&format!("({text})")), "{line}");
            // Just outside the range is an error quoting the same bounds.
            let below = min.checked_sub(1).map(|b| b.to_string());
            let above = max.map(|m| (u128::from(m) + 1).to_string());
            for bad in [below, above].into_iter().flatten() {
                let e = err(&anthropic(&[(MAX_OUTPUT_TOKENS, "1000"), (name, &bad)]));
                assert_eq!(e.variable(), name, "{bad}");
                let quoted = match max {
                    Some(max) => format!("from {min} to {max}"),
                    None => format!(">= {min}"),
                };
                assert!(e.to_string().contains(&quoted), "{e}");
            }
        }
        assert_eq!(numeric_range(LOG), None);
    }

    #[test]
    fn c2_max_output_tokens_must_be_below_max_context_tokens() {
        let e = err(&anthropic(&[
            (MAX_OUTPUT_TOKENS, "1000"),
            (MAX_CONTEXT_TOKENS, "1000"),
        ]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_MAX_OUTPUT_TOKENS: invalid value \"1000\": expected an integer >= 1 and < BUZZ_AGENT_MAX_CONTEXT_TOKENS (1000)"
        );
        let e = err(&anthropic(&[(MAX_CONTEXT_TOKENS, "1000")]));
        assert_eq!(e.variable(), MAX_OUTPUT_TOKENS);
        assert!(e.to_string().contains("\"32768 (the default)\""), "{e}");
        let c = ok(&anthropic(&[
            (MAX_OUTPUT_TOKENS, "999"),
            (MAX_CONTEXT_TOKENS, "1000"),
        ]));
        assert_eq!((c.max_output_tokens, c.max_context_tokens), (999, 1000));
    }

    #[test]
    fn c1_booleans_accept_the_six_spellings_in_any_case() {
        for (v, want) in [
            ("1", true),
            ("0", false),
            ("TRUE", true),
            ("False", false),
            ("yes", true),
            ("No", false),
            (" on ", true),
            ("OFF", false),
            ("", false),
        ] {
            assert_eq!(
                ok(&anthropic(&[(REQUIRE_REPLY, v)])).require_reply,
                want,
                "{v:?}"
            );
        }
        let e = err(&anthropic(&[(REQUIRE_REPLY, "y")]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_REQUIRE_REPLY: invalid value \"y\": expected a boolean: 1/0/true/false/yes/no/on/off"
        );
    }

    #[test]
    fn c3_unset_empty_or_only_blanks_and_commas_turn_hooks_off() {
        assert_eq!(ok(&anthropic(&[])).hook_servers, HookAllowlist::Off);
        for v in ["", "   ", " , ,", ",,,"] {
            assert_eq!(
                ok(&anthropic(&[(HOOK_SERVERS, v)])).hook_servers,
                HookAllowlist::Off,
                "{v:?}"
            );
        }
        assert!(!HookAllowlist::Off.allows("a"));
    }

    #[test]
    fn c3_star_alone_allows_every_server() {
        for v in ["*", " * ", "*,", ", * ,*"] {
            assert_eq!(
                ok(&anthropic(&[(HOOK_SERVERS, v)])).hook_servers,
                HookAllowlist::All,
                "{v:?}"
            );
        }
        assert!(HookAllowlist::All.allows("anything"));
    }

    #[test]
    fn c3_names_are_trimmed_empties_dropped_and_matched_exactly() {
        let hooks = ok(&anthropic(&[(HOOK_SERVERS, "a, b,,a")])).hook_servers;
        assert_eq!(hooks, HookAllowlist::Names(vec!["a".into(), "b".into()]));
        assert!(hooks.allows("a"));
        assert!(hooks.allows("b"));
        assert!(!hooks.allows("A"));
        assert!(!hooks.allows("c"));
        assert!(!hooks.allows(""));
    }

    #[test]
    fn c3_star_mixed_with_names_is_an_error_that_says_so() {
        let e = err(&anthropic(&[(HOOK_SERVERS, "*,a")]));
        assert_eq!(e.variable(), HOOK_SERVERS);
        assert_eq!(
            e.to_string(),
            "MCP_HOOK_SERVERS: invalid value \"*,a\": expected either * alone (every server) or comma-separated server names, not * mixed with names"
        );
    }

    #[test]
    fn c55_c3_names_clients_give_are_accepted_as_written_without_case_folding() {
        let hooks = ok(&anthropic(&[(
            HOOK_SERVERS,
            "My Files, my.fs,github/copilot,ünï,a__b",
        )]))
        .hook_servers;
        for name in ["My Files", "my.fs", "github/copilot", "ünï", "a__b"] {
            assert!(hooks.allows(name), "{name}");
        }
        assert!(!hooks.allows("my files"), "no case folding");
        assert!(
            !hooks.allows("My_Files"),
            "the original name, not the tool prefix"
        );
    }

    #[test]
    fn c58_models_are_a_trimmed_list_without_empties() {
        let c = ok(&anthropic(&[(
            MODELS,
            " fast-model, ,big-model,fast-model ",
        )]));
        assert_eq!(c.models, vec!["fast-model".to_string(), "big-model".into()]);
        assert!(ok(&anthropic(&[])).models.is_empty());
    }

    #[test]
    fn x1_interceptor_servers_use_the_c3_syntax_and_are_off_by_default() {
        assert_eq!(ok(&anthropic(&[])).interceptor_servers, HookAllowlist::Off);
        assert_eq!(
            ok(&anthropic(&[(INTERCEPTOR_SERVERS, " , ")])).interceptor_servers,
            HookAllowlist::Off
        );
        assert_eq!(
            ok(&anthropic(&[(INTERCEPTOR_SERVERS, " * ")])).interceptor_servers,
            HookAllowlist::All
        );
        let c = ok(&anthropic(&[
            (INTERCEPTOR_SERVERS, "policy, audit,policy"),
            (HOOK_SERVERS, "guard"),
        ]));
        assert_eq!(
            c.interceptor_servers,
            HookAllowlist::Names(vec!["policy".into(), "audit".into()])
        );
        // Independent of the hook allowlist.
        assert_eq!(c.hook_servers, HookAllowlist::Names(vec!["guard".into()]));
        let e = err(&anthropic(&[(INTERCEPTOR_SERVERS, "*,policy")]));
        assert_eq!(e.variable(), INTERCEPTOR_SERVERS);
        assert!(
            e.to_string().starts_with(
                "BUZZ_AGENT_INTERCEPTOR_SERVERS: invalid value \"*,policy\": expected either * alone"
            ),
            "{e}"
        );
        assert_eq!(
            ok(&anthropic(&[(INTERCEPTOR_SERVERS, "my policy")])).interceptor_servers,
            HookAllowlist::Names(vec!["my policy".into()]),
            "a client's name as written"
        );
        assert!(is_agent_secret_or_own_variable(INTERCEPTOR_SERVERS));
    }

    #[test]
    fn g2_reply_tools_are_a_trimmed_list_without_empties() {
        let c = ok(&anthropic(&[(
            REPLY_TOOLS,
            " chat__send, ,x__post,chat__send ",
        )]));
        assert_eq!(
            c.reply_tools,
            vec!["chat__send".to_owned(), "x__post".to_owned()]
        );
    }

    #[test]
    fn a7_permission_mode_is_ask_or_allow_in_any_case() {
        assert_eq!(
            ok(&anthropic(&[(PERMISSION, "ALLOW")])).permission,
            PermissionMode::Allow
        );
        assert_eq!(
            ok(&anthropic(&[(PERMISSION, "ask")])).permission,
            PermissionMode::Ask
        );
        let e = err(&anthropic(&[(PERMISSION, "deny")]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_PERMISSION: invalid value \"deny\": expected ask or allow"
        );
    }

    #[test]
    fn c2_log_level_and_format_parse_and_levels_are_ordered_by_verbosity() {
        for (v, want) in [
            ("error", LogLevel::Error),
            ("WARN", LogLevel::Warn),
            ("warning", LogLevel::Warn),
            ("Info", LogLevel::Info),
            ("debug", LogLevel::Debug),
            ("trace", LogLevel::Trace),
        ] {
            assert_eq!(ok(&anthropic(&[(LOG, v)])).log_level, want);
        }
        assert_eq!(err(&anthropic(&[(LOG, "loud")])).variable(), LOG);
        assert_eq!(
            ok(&anthropic(&[(LOG_FORMAT, "JSON")])).log_format,
            LogFormat::Json
        );
        assert_eq!(
            err(&anthropic(&[(LOG_FORMAT, "xml")])).variable(),
            LOG_FORMAT
        );
        assert!(LogLevel::Error < LogLevel::Warn && LogLevel::Warn < LogLevel::Info);
        assert!(LogLevel::Info < LogLevel::Debug && LogLevel::Debug < LogLevel::Trace);
    }

    #[test]
    fn p2_debug_of_config_redacts_the_api_key_and_prompt_text() {
        let mut c = Config::for_tests(ProviderKind::Anthropic, "http://x");
        c.api_key = "sk-secret-123".into();
        c.system_prompt = Some("hidden words".into());
        let dbg = format!("{c:?}");
        assert!(!dbg.contains("sk-secret"), "{dbg}");
        assert!(dbg.contains("api_key: <redacted>"), "{dbg}");
        assert!(
            !dbg.contains("hidden words") && dbg.contains("<12 bytes>"),
            "{dbg}"
        );
        c.api_key.clear();
        assert!(format!("{c:?}").contains("api_key: <empty>"));
    }

    #[test]
    fn c1_error_values_are_quoted_escaped_and_cut_to_stay_one_line() {
        let e = err(&anthropic(&[(LOG, "a\nb")]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_LOG: invalid value \"a\\nb\": expected error, warn, info, debug or trace"
        );
        let long = "é".repeat(300);
        let line = err(&anthropic(&[(LOG, &long)])).to_string();
        assert!(!line.contains('\n') && line.len() < 300, "{line}");
    }

    #[test]
    fn c1_help_text_lists_every_variable_with_its_default() {
        let help = help_text();
        for (name, default, _) in VARIABLES {
            let line = help
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("{name} ")));
            let Some(line) = line else {
                unreachable!("{name} missing from help")
            };
            if !default.is_empty() {
                assert!(line.contains(&format!("[{default}]")), "{line}");
            }
        }
        assert!(help.contains("BUZZ_AGENT_HOOK_TIMEOUT_MS") && help.ends_with('\n'));
    }

    #[test]
    fn c1_every_variable_read_by_from_env_map_is_in_the_help_table() {
        // Each constant above appears in VARIABLES exactly once.
        let mut names: Vec<&str> = VARIABLES.iter().map(|(n, _, _)| *n).collect();
        let count = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), count);
        assert_eq!(count, 48);
    }

    #[test]
    fn a10_hints_are_on_by_default_and_the_user_files_follow_xdg_then_home() {
        let c = ok(&anthropic(&[
            ("HOME", "/home/u/"),
            ("XDG_CONFIG_HOME", "rel"),
        ]));
        assert!(!c.no_hints);
        assert_eq!(c.instructions_max_bytes, 32_768);
        assert_eq!(
            c.user_instructions.as_deref(),
            Some("/home/u/.config/buzz-agent/AGENTS.md"),
            "a relative XDG_CONFIG_HOME is ignored"
        );
        assert_eq!(c.user_skills_dir.as_deref(), Some("/home/u/.agents/skills"));
        let c = ok(&anthropic(&[
            ("XDG_CONFIG_HOME", "/cfg"),
            (NO_HINTS, "yes"),
            (INSTRUCTIONS_MAX_BYTES, "4096"),
        ]));
        assert!(c.no_hints);
        assert_eq!(c.instructions_max_bytes, 4096);
        assert_eq!(
            c.user_instructions.as_deref(),
            Some("/cfg/buzz-agent/AGENTS.md")
        );
        assert_eq!(c.user_skills_dir, None, "no HOME, no user skills");
        let e = err(&anthropic(&[(INSTRUCTIONS_MAX_BYTES, "100")]));
        assert!(e.to_string().contains(INSTRUCTIONS_MAX_BYTES), "{e}");
    }

    #[test]
    fn a9_the_state_directory_falls_back_from_the_variable_to_xdg_to_home() {
        let dir = |pairs: &[(&str, &str)]| ok(&anthropic(pairs)).state_dir;
        let d = |p: &str| StateDir::Dir(p.to_owned());
        assert_eq!(dir(&[]), StateDir::Off, "no HOME: nowhere to keep sessions");
        assert_eq!(
            dir(&[("HOME", "/home/u")]),
            d("/home/u/.local/state/buzz-agent/sessions")
        );
        assert_eq!(
            dir(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "/x/state/")]),
            d("/x/state/buzz-agent/sessions")
        );
        assert_eq!(
            dir(&[("HOME", "/home/u"), ("XDG_STATE_HOME", "rel")]),
            d("/home/u/.local/state/buzz-agent/sessions"),
            "a relative XDG_STATE_HOME is ignored (XDG Base Directory)"
        );
        assert_eq!(
            dir(&[("HOME", "/home/u"), (STATE_DIR, " /srv/agent/ ")]),
            d("/srv/agent")
        );
        assert_eq!(
            dir(&[("HOME", "/home/u"), (STATE_DIR, "OFF")]),
            StateDir::Off
        );
        assert_eq!(dir(&[(STATE_DIR, "/")]), d("/"));
        let e = err(&anthropic(&[(STATE_DIR, "state")]));
        assert_eq!(
            e.to_string(),
            "BUZZ_AGENT_STATE_DIR: invalid value \"state\": expected an absolute directory path, or off"
        );
    }

    #[test]
    fn a9_a_fixed_seed_fixes_the_jitter_and_the_session_ids_else_the_runtime_draws_them() {
        let c = ok(&anthropic(&[]));
        assert_eq!((c.fixed_seed, c.seed, c.session_id_seed), (None, 0, None));
        let c = ok(&anthropic(&[(SEED, "42")]));
        assert_eq!((c.fixed_seed, c.seed), (Some(42), 42));
        assert!(c.session_id_seed.is_some());
        assert_eq!(
            ok(&anthropic(&[(SEED, "42")])).session_id_seed,
            c.session_id_seed
        );
        assert_ne!(
            ok(&anthropic(&[(SEED, "43")])).session_id_seed,
            c.session_id_seed
        );
    }

    fn child_names(env: &[(&str, &str)], extra: &[&str]) -> Vec<String> {
        let extra: Vec<String> = extra.iter().map(|e| (*e).to_owned()).collect();
        child_environment(env_of(env), &extra)
            .into_iter()
            .map(|(k, _)| k)
            .collect()
    }

    #[test]
    fn s1_children_get_only_the_allowlist_and_what_buzz_agent_child_env_adds() {
        let env = [
            ("HOME", "/home/u"),
            ("PATH", "/bin"),
            ("LANG", "C.UTF-8"),
            ("LC_ALL", "C"),
            ("XDG_CACHE_HOME", "/c"),
            ("TZ", "UTC"),
            ("GITHUB_TOKEN", "ghp_secret"),
            ("AWS_SECRET_ACCESS_KEY", "aws"),
            ("SSH_AUTH_SOCK", "/tmp/agent.sock"),
            ("OPENAI_API_KEY", "sk-openai"),
            ("HF_TOKEN", "hf"),
            ("NPM_CONFIG_CACHE", "/npm"),
            ("NPM_CONFIG_REGISTRY", "https://r"),
            (ANTHROPIC_API_KEY, "sk-ant"),
            (OPENAI_API_KEY, "sk-compat"),
            (HOOK_SERVERS, "*"),
            ("BUZZ_AGENT_LOG", "debug"),
            ("LCX", "not a locale"),
        ];
        // BTreeMap order: names sorted.
        assert_eq!(
            child_names(&env, &[]),
            ["HOME", "LANG", "LC_ALL", "PATH", "TZ", "XDG_CACHE_HOME"]
        );
        assert_eq!(
            child_names(&env, &["NPM_CONFIG_*", "HF_TOKEN"]),
            [
                "HF_TOKEN",
                "HOME",
                "LANG",
                "LC_ALL",
                "NPM_CONFIG_CACHE",
                "NPM_CONFIG_REGISTRY",
                "PATH",
                "TZ",
                "XDG_CACHE_HOME"
            ]
        );
        // `*` passes everything but the agent's own variables, whatever a pattern says.
        let all = child_names(&env, &["*", "BUZZ_*", "ANTHROPIC_*"]);
        assert!(all.contains(&"GITHUB_TOKEN".to_owned()) && all.contains(&"LCX".to_owned()));
        for own in [
            ANTHROPIC_API_KEY,
            OPENAI_API_KEY,
            HOOK_SERVERS,
            "BUZZ_AGENT_LOG",
        ] {
            assert!(!all.contains(&own.to_owned()), "{own}");
        }
        assert_eq!(all.len(), env.len() - 4);
    }

    #[test]
    fn s1_buzz_agent_child_env_is_parsed_and_refuses_the_agents_own_variables() {
        assert_eq!(ok(&anthropic(&[])).child_env, Vec::<String>::new());
        assert_eq!(
            ok(&anthropic(&[(
                CHILD_ENV,
                " NPM_CONFIG_*, ,HF_TOKEN,HF_TOKEN,_X "
            )]))
            .child_env,
            ["NPM_CONFIG_*", "HF_TOKEN", "_X"]
        );
        assert_eq!(ok(&anthropic(&[(CHILD_ENV, "*")])).child_env, ["*"]);
        for bad in ["A B", "1X", "X-Y", "**", "*X", "A=1"] {
            let e = err(&anthropic(&[(CHILD_ENV, bad)]));
            assert_eq!(e.variable(), CHILD_ENV, "{bad}");
            assert!(e.to_string().contains("variable names"), "{bad}: {e}");
        }
        for own in [ANTHROPIC_API_KEY, "BUZZ_AGENT_MODEL", HOOK_SERVERS] {
            let e = err(&anthropic(&[(CHILD_ENV, &format!("PATHX,{own}"))]));
            assert!(
                e.to_string().contains(&format!("{own} is the agent's own")),
                "{e}"
            );
        }
        // A pattern may cover the agent's variables; they are still withheld.
        assert_eq!(
            ok(&anthropic(&[(CHILD_ENV, "BUZZ_*")])).child_env,
            ["BUZZ_*"]
        );
    }

    #[test]
    fn m1_agent_secrets_and_own_variables_are_withheld_from_children() {
        for name in [
            ANTHROPIC_API_KEY,
            OPENAI_API_KEY,
            HOOK_SERVERS,
            PROVIDER,
            "BUZZ_AGENT_ANYTHING",
        ] {
            assert!(is_agent_secret_or_own_variable(name), "{name}");
        }
        for name in [
            "PATH",
            "HOME",
            "ANTHROPIC_MODEL",
            "OPENAI_API_KEY",
            "buzz_agent_log",
            "BUZZ_AGENTX",
        ] {
            assert!(!is_agent_secret_or_own_variable(name), "{name}");
        }
    }

    #[test]
    fn c1_every_error_is_reported_in_one_run_in_help_order() {
        let e = Config::from_env_map(
            &env_of(&[
                (LOG, "loud"),
                (HOOK_TIMEOUT_MS, "0"),
                (REQUIRE_REPLY, "y"),
                (MAX_LINE_BYTES, "12"),
            ]),
            &no_file,
        );
        let Err(e) = e else {
            unreachable!("expected errors")
        };
        let vars: Vec<&str> = e.iter().map(ConfigError::variable).collect();
        assert_eq!(
            vars,
            [
                PROVIDER,
                MAX_LINE_BYTES,
                HOOK_TIMEOUT_MS,
                REQUIRE_REPLY,
                LOG
            ]
        );
        assert_eq!(e.len(), 5);
        assert_eq!(e.first().variable(), PROVIDER);
        let text = e.to_string();
        assert_eq!(text.lines().count(), 5, "{text}");
        for (line, err) in text.lines().zip(&e) {
            assert_eq!(line, err.to_string());
        }
    }

    #[test]
    fn c1_provider_errors_do_not_hide_the_providers_own_variables() {
        // A valid provider: its missing key and model and its bad URL all show, with the rest.
        let e = Config::from_env_map(
            &env_of(&[
                (PROVIDER, "anthropic"),
                (ANTHROPIC_BASE_URL, "localhost"),
                (MAX_CONTEXT_TOKENS, "1000"),
                (PERMISSION, "deny"),
            ]),
            &no_file,
        );
        let Err(e) = e else {
            unreachable!("expected errors")
        };
        let vars: Vec<&str> = e.iter().map(ConfigError::variable).collect();
        assert_eq!(
            vars,
            [
                ANTHROPIC_API_KEY,
                ANTHROPIC_MODEL,
                ANTHROPIC_BASE_URL,
                MAX_OUTPUT_TOKENS,
                PERMISSION
            ]
        );
        // A bad context size is reported once; the output bound is not checked against it.
        let e = Config::from_env_map(&anthropic(&[(MAX_CONTEXT_TOKENS, "x")]), &no_file);
        let Err(e) = e else {
            unreachable!("expected errors")
        };
        assert_eq!(e.len(), 1, "{e}");
        assert_eq!(e.first().variable(), MAX_CONTEXT_TOKENS);
    }

    #[test]
    fn c1_default_openai_url_without_a_key_is_a_startup_warning() {
        let env = env_of(&[
            (PROVIDER, "openai"),
            (OPENAI_MODEL, "gpt"),
            ("HOME", "/home/u"),
        ]);
        let warnings = startup_warnings(&env, &ok(&env));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(
            warnings[0].contains("OPENAI_COMPAT_API_KEY is empty")
                && warnings[0].contains("https://api.openai.com/v1")
                && warnings[0].contains("401"),
            "{warnings:?}"
        );
        // Set explicitly (any case, trailing slash) counts the same.
        let env = env_of(&[
            (PROVIDER, "openai"),
            (OPENAI_MODEL, "gpt"),
            (OPENAI_BASE_URL, "HTTPS://api.openai.com/v1/"),
            ("HOME", "/home/u"),
        ]);
        assert_eq!(startup_warnings(&env, &ok(&env)).len(), 1);
        for quiet in [
            env_of(&[
                (PROVIDER, "openai"),
                (OPENAI_MODEL, "gpt"),
                (OPENAI_API_KEY, "k"),
                ("HOME", "/home/u"),
            ]),
            env_of(&[
                (PROVIDER, "openai"),
                (OPENAI_MODEL, "gpt"),
                (OPENAI_BASE_URL, "http://127.0.0.1:8000/v1"),
                ("HOME", "/home/u"),
            ]),
            anthropic(&[("HOME", "/home/u")]),
            anthropic(&[(STATE_DIR, "off")]),
        ] {
            assert!(
                startup_warnings(&quiet, &ok(&quiet)).is_empty(),
                "{quiet:?}"
            );
        }
        let typo = anthropic(&[("BUZZ_AGENT_HOOK_TIMEOUT", "5"), ("HOME", "/home/u")]);
        assert_eq!(
            startup_warnings(&typo, &ok(&typo)),
            vec!["unknown variable BUZZ_AGENT_HOOK_TIMEOUT ignored (typo?)".to_owned()]
        );
        // A9: nowhere to save sessions, and no one said off.
        let homeless = anthropic(&[]);
        assert_eq!(
            startup_warnings(&homeless, &ok(&homeless)),
            vec!["sessions are not saved: neither BUZZ_AGENT_STATE_DIR, XDG_STATE_HOME nor HOME names an absolute directory (set BUZZ_AGENT_STATE_DIR, or BUZZ_AGENT_STATE_DIR=off to silence this)".to_owned()]
        );
    }

    #[test]
    fn c1_unknown_buzz_agent_variables_are_listed_for_a_warning() {
        let env = anthropic(&[
            ("BUZZ_AGENT_HOOK_TIMEOUT", "5"),
            (LOG, "info"),
            ("PATH", "/bin"),
        ]);
        assert_eq!(
            unknown_agent_variables(&env),
            vec!["BUZZ_AGENT_HOOK_TIMEOUT".to_owned()]
        );
    }

    #[test]
    fn for_tests_builds_a_valid_config_with_defaults() {
        let c = Config::for_tests(ProviderKind::OpenAiChat, "http://127.0.0.1:1/v1/");
        assert_eq!(c.base_url, "http://127.0.0.1:1/v1");
        assert_eq!(
            (c.model.as_str(), c.api_key.as_str()),
            ("test-model", "test-key")
        );
        assert!(u64::from(c.max_output_tokens) < c.max_context_tokens);
    }

    #[test]
    fn c1_the_values_the_start_line_logs_read_back_as_the_configuration() {
        // Issue 12: the `starting:` line writes each setting as the environment takes it.
        assert_eq!(ProviderKind::Anthropic.api_value(), None);
        for kind in [
            ProviderKind::Anthropic,
            ProviderKind::OpenAiChat,
            ProviderKind::OpenAiResponses,
        ] {
            let mut env = anthropic(&[(PROVIDER, kind.env_value()), (OPENAI_MODEL, "m")]);
            if let Some(api) = kind.api_value() {
                env.insert(OPENAI_API.to_owned(), api.to_owned());
            }
            assert_eq!(ok(&env).provider, kind, "{env:?}");
        }
        assert_eq!(ProviderKind::OpenAiChat.env_value(), "openai");
        assert_eq!(ProviderKind::OpenAiChat.api_value(), Some("chat"));
        for list in [
            HookAllowlist::All,
            HookAllowlist::Names(vec!["a b".into(), "c".into()]),
        ] {
            let written = list.env_value();
            assert_eq!(
                ok(&anthropic(&[(HOOK_SERVERS, &written)])).hook_servers,
                list,
                "{written}"
            );
        }
        assert_eq!(HookAllowlist::Off.env_value(), "unset");
        for mode in [PermissionMode::Ask, PermissionMode::Allow] {
            assert_eq!(
                ok(&anthropic(&[(PERMISSION, mode.env_value())])).permission,
                mode
            );
        }
        assert_eq!(PermissionMode::Ask.env_value(), "ask");
    }

    #[test]
    fn c1_the_errors_of_a_run_are_never_empty_and_iterate_in_help_order() {
        let e = Config::from_env_map(&env_of(&[(LOG, "loud"), (MAX_ROUNDS, "x")]), &no_file);
        let Err(e) = e else {
            unreachable!("expected errors")
        };
        assert!(!e.is_empty());
        let mut vars = Vec::new();
        for error in &e {
            vars.push(error.variable());
        }
        assert_eq!(vars, [PROVIDER, MAX_ROUNDS, LOG]);
        assert_eq!(vars.len(), e.len());
    }

    #[test]
    fn c1_a_range_is_written_as_help_and_the_readme_show_it() {
        assert_eq!(
            numeric_range_text(HOOK_TIMEOUT_MS).as_deref(),
            Some("1..600000")
        );
        assert_eq!(
            numeric_range_text(MAX_LINE_BYTES).as_deref(),
            Some(">= 1024")
        );
        assert_eq!(numeric_range_text(LOG), None);
        let help = help_text();
        let line = help
            .lines()
            .find(|l| l.trim_start().starts_with(&format!("{MAX_ROUNDS} ")))
            .unwrap_or_default();
        assert!(line.contains(" (0..4294967295) [0]"), "{line}");
    }

    #[test]
    fn c1_variable_names_are_the_help_table_s_names_in_its_order() {
        let help = help_text();
        let listed: Vec<&str> = help
            .lines()
            .filter(|l| l.starts_with("  "))
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        assert_eq!(variable_names(), listed);
        assert_eq!(variable_names().first(), Some(&PROVIDER));
        assert_eq!(variable_names().len(), 48);
    }

    #[test]
    fn c1_a_long_value_is_cut_to_200_bytes_before_a_character_it_would_split() {
        // Byte 200 falls inside an `é` (bytes 199 and 200): the cut goes back to 199.
        let long = format!("a{}", "é".repeat(300));
        let e = err(&anthropic(&[(LOG, &long)]));
        let ConfigError::Invalid { value, .. } = &e else {
            unreachable!("expected an invalid value, got {e}")
        };
        assert_eq!(*value, format!("a{}…", "é".repeat(99)));
        // On a boundary: exactly 200 bytes are kept.
        let e = err(&anthropic(&[(LOG, &"é".repeat(300))]));
        let ConfigError::Invalid { value, .. } = &e else {
            unreachable!("expected an invalid value, got {e}")
        };
        assert_eq!(*value, format!("{}…", "é".repeat(100)));
    }

    #[test]
    fn a9_i12_the_session_id_seed_of_a_fixed_seed_is_the_same_in_every_build() {
        // Known answer: a fixed seed names the same sessions from run to run and from build to
        // build; both halves of the 128 bits come from the seed.
        assert_eq!(
            ok(&anthropic(&[(SEED, "42")])).session_id_seed,
            Some(0x0000_0000_0000_002a_5851_f42d_4c95_7f07)
        );
        assert_eq!(
            ok(&anthropic(&[(SEED, "0")])).session_id_seed,
            Some(0x5851_f42d_4c95_7f2d)
        );
    }
}
