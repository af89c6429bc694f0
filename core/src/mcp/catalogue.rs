//! The tool catalogue (SPEC M3, M4, H1, A6): what each server offers once its `tools/list`
//! is complete — its tools under provider-safe exposed names with usable schemas, its hooks
//! (tools whose bare name starts with `_`), and the rules by which the tools of a session's
//! servers become the one list the model sees and the routes back from a name to a server.
//!
//! Everything about names, schemas and what the model may call is decided here: a new rule
//! (caps on a list, collisions between servers, per-provider schemas, prompts) belongs in
//! this file, beside [`Catalogue::install`] and [`visible_tools`].

use crate::config::{HookAllowlist, LogLevel};
use crate::ids::ServerSlot;
use crate::llm::ToolDef;
use crate::outbox::Outbox;
use crate::tool_schema::{self, Offered, SchemaDialect};
use crate::tools;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The most entries (tools and hooks) one server's `tools/list` may give (SPEC S5); the rest
/// is cut off with a WARN. Real servers list tens to a few hundred tools.
pub(crate) const MAX_TOOLS_PER_SERVER: usize = 1_000;

/// The most bytes (compact JSON of its entries) one server's tool list may hold (SPEC S5): every
/// LLM request carries the list, so a server listing 84,000 tools would make each request
/// hundreds of megabytes. The entries past the cap are cut off with a WARN.
pub(crate) const MAX_TOOL_LIST_BYTES: usize = 4 * 1024 * 1024;

/// `tools/list` (and `prompts/list`) pages followed at most (SPEC M2, A11).
pub(super) const MAX_LIST_PAGES: u32 = 100;

/// One server's `tools/list` read page by page as the agent reads it (SPEC M2, S5): the
/// entries of every page, in order, within 1,000 entries (`MAX_TOOLS_PER_SERVER`) and 4 MiB
/// (`MAX_TOOL_LIST_BYTES`), and the cursor of the next page to ask for, until the list ends,
/// a cap cuts it, a cursor repeats or 100 pages (`MAX_LIST_PAGES`) were read.
///
/// The MCP session of every server collects its listings with it, and so does
/// `buzz-agent hooks check`, which asks for the pages itself: feed each page's `result`
/// (`{"tools": [...], "nextCursor": "c2"}`) to [`ToolListing::page`], ask for the page it
/// names (`{"cursor": "c2"}`) until it names none, then [`ToolListing::take`] the entries
/// (for [`ToolsSeen::of`]).
#[derive(Debug, Default)]
pub struct ToolListing {
    tools: Vec<Value>,
    bytes: usize,
    cut: bool,
    /// The cursors followed so far.
    cursors: BTreeSet<String>,
}

impl ToolListing {
    /// Takes one `tools/list` result: its `tools` entries, in order, while both caps hold, then
    /// the cursor of the next page to ask for: its non-empty `nextCursor`, unless a cap cut the
    /// list, the cursor repeats one followed before or this was page 100 (`MAX_LIST_PAGES`).
    /// `None`: the listing is complete as the agent takes it. What cut or stopped it is pushed
    /// to `warnings`, once, without the server's name (`tools/list has more than 1000 tools;
    /// the rest is cut off`, `tools/list repeated cursor "c1"; stopping`, `tools/list exceeded
    /// 100 pages; stopping`).
    pub fn page(&mut self, result: &Value, warnings: &mut Vec<String>) -> Option<String> {
        if let Some(list) = result.get("tools").and_then(Value::as_array) {
            warnings.extend(self.add_entries(list));
        }
        if self.cut {
            return None;
        }
        next_cursor(result, &mut self.cursors, "tools/list").unwrap_or_else(|w| {
            warnings.push(w);
            None
        })
    }

    /// Adds one page's entries, in order, while both caps hold. The first page that passes a
    /// cap cuts the list there and gives the WARN text (naming the cap); after a cut no more
    /// entries are taken.
    fn add_entries(&mut self, page: &[Value]) -> Option<String> {
        if self.cut {
            return None;
        }
        for t in page {
            if self.tools.len() >= MAX_TOOLS_PER_SERVER {
                self.cut = true;
                return Some(format!(
                    "tools/list has more than {MAX_TOOLS_PER_SERVER} tools; the rest is cut off"
                ));
            }
            let size = serde_json::to_string(t).map_or(0, |j| j.len());
            if self.bytes.saturating_add(size) > MAX_TOOL_LIST_BYTES {
                self.cut = true;
                return Some(format!(
                    "tools/list is over {} MiB after {} tools; the rest is cut off",
                    MAX_TOOL_LIST_BYTES >> 20,
                    self.tools.len()
                ));
            }
            self.bytes += size;
            self.tools.push(t.clone());
        }
        None
    }

    /// The entries collected, in order; the listing starts again (no entries, no cursors).
    pub fn take(&mut self) -> Vec<Value> {
        self.bytes = 0;
        self.cut = false;
        self.cursors.clear();
        std::mem::take(&mut self.tools)
    }
}

/// The cursor of the next page of a paginated list (`method`, SPEC M2, A11): the page's
/// non-empty `nextCursor`, unless it repeats one already followed (`seen`) or the list is over
/// [`MAX_LIST_PAGES`] pages; those stop the listing, `Err` with the WARN text (without the
/// server's name).
pub(super) fn next_cursor(
    page: &Value,
    seen: &mut BTreeSet<String>,
    method: &str,
) -> Result<Option<String>, String> {
    let Some(c) = page
        .get("nextCursor")
        .and_then(Value::as_str)
        .filter(|c| !c.is_empty())
    else {
        return Ok(None);
    };
    let page_no = seen.len() as u32 + 1;
    if seen.contains(c) {
        Err(format!("{method} repeated cursor {c:?}; stopping"))
    } else if page_no >= MAX_LIST_PAGES {
        Err(format!(
            "{method} exceeded {MAX_LIST_PAGES} pages; stopping"
        ))
    } else {
        seen.insert(c.to_string());
        Ok(Some(c.to_string()))
    }
}

/// A tool a server offers (hooks excluded), SPEC M3.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct McpTool {
    /// The name the server knows.
    pub(crate) bare: String,
    /// The provider-safe qualified name the model sees (SPEC M3).
    pub(crate) exposed: String,
    pub(crate) description: String,
    pub(crate) schema: Value,
    /// The ACP title of its calls (SPEC A6, case C53).
    pub(crate) title: String,
    /// The ACP kind of its calls, from its annotations (SPEC A6, case C53).
    pub(crate) kind: &'static str,
    /// Its schema as the last provider asked for takes it (SPEC M14), converted on first use
    /// and kept until the next listing or another provider's rules.
    offered: Option<(SchemaDialect, Offered)>,
}

/// Who runs a tool the model may call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ToolTarget {
    /// An MCP server (SPEC M3).
    Server(ServerSlot),
    /// A built-in tool of the core (SPEC A10: `load_skill`).
    Builtin(Builtin),
}

/// The core's built-in tools (DESIGN "Built-in tools"): provider-safe names that never start
/// with `_` and are never `<server>__<tool>` names, offered before the MCP tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Builtin {
    /// `load_skill` (SPEC A10, `skills.rs`).
    LoadSkill,
}

/// Where a tool name the model may call leads (SPEC M3, L2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolRoute {
    /// The server that offers it, or the core itself.
    pub(crate) target: ToolTarget,
    /// The name the server knows.
    pub(crate) bare: String,
    /// `<prefix>__<tool>` (the server's tool prefix, SPEC M3, A2), the key of remembered
    /// permission answers and `BUZZ_AGENT_REPLY_TOOLS`.
    pub(crate) qualified: String,
    /// The ACP title of a call (SPEC A6).
    pub(crate) title: String,
    /// The ACP kind of a call (SPEC A6).
    pub(crate) kind: &'static str,
}

impl ToolRoute {
    /// The MCP server that offers the tool; `None` for a built-in.
    pub(crate) fn server(&self) -> Option<ServerSlot> {
        match self.target {
            ToolTarget::Server(slot) => Some(slot),
            ToolTarget::Builtin(_) => None,
        }
    }
}

/// What one server offers: its tools and its hooks, from its last complete `tools/list`.
#[derive(Debug, Default)]
pub(crate) struct Catalogue {
    tools: Vec<McpTool>,
    /// Hook names (bare, starting with `_`) the server exposes (SPEC H1).
    hooks: BTreeSet<String>,
    /// The "hooks are off for this server" warning was logged (case C56: once per session).
    warned_hooks_off: bool,
    /// Tools (bare names) dropped for an unusable input schema that the user was told about
    /// (once per tool and session; every listing still logs its WARN).
    told_dropped: BTreeSet<String>,
}

/// The server a catalogue belongs to, as [`Catalogue::install`] names it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner<'a> {
    /// Its slot (the claim on its tools' names, [`NameClaims`]).
    pub(crate) slot: ServerSlot,
    /// The name the client gave (logs, titles, the hook allowlist).
    pub(crate) name: &'a str,
    /// Its tool prefix (SPEC M3, A2).
    pub(crate) prefix: &'a str,
}

/// The exposed tool names of one session, each claimed for the whole session by the tool that
/// listed it first (issue 26, names that collide): a later tool of another server, or another
/// tool of the same server, that would be offered under a claimed name is renamed or dropped
/// at listing time. A claim outlives its server's death and its tool's removal from a later
/// listing, so a name the model once called never leads to another server's tool.
///
/// Qualified names (`<prefix>__<tool>`, the key of remembered permission answers) need no
/// claim: prefixes are unique in a session (A2) and never contain `__` or end in `_`
/// ([`tools::server_prefix`]), so each one is one server's. Exposed names do: the hash suffix
/// of a long or sanitized name ([`tools::exposed_name`], 32 bits) can be forged, so that two
/// servers' tools get the same exposed name.
#[derive(Debug, Default)]
pub(crate) struct NameClaims {
    /// Exposed name → (server slot, the server's name, the tool's bare name).
    owners: BTreeMap<String, (ServerSlot, String, String)>,
}

impl NameClaims {
    /// The exposed name of tool `bare` of `owner`: `plain`, or, when another tool holds it (or
    /// it is in `taken`, the names given earlier in this listing), the shortened name with the
    /// stable hash of `bare`; claimed for that tool. `Err(None)` when both are this listing's
    /// (a duplicate), `Err(Some(holder))` when another tool holds them.
    fn place(
        &mut self,
        plain: &str,
        owner: Owner<'_>,
        bare: &str,
        taken: &BTreeSet<String>,
    ) -> Result<String, Option<String>> {
        let renamed = format!(
            "{}_{:08x}",
            &plain[..plain.len().min(55)],
            tools::fnv1a(bare.as_bytes()) & 0xffff_ffff
        );
        let mut holder = None;
        for candidate in [plain, renamed.as_str()] {
            if taken.contains(candidate) {
                continue;
            }
            match self.owners.get(candidate) {
                Some((slot, _, held)) if *slot == owner.slot && held == bare => {
                    return Ok(candidate.to_string());
                }
                Some(other) => {
                    holder.get_or_insert_with(|| self.describe(candidate, other));
                }
                None => {
                    let claim = (owner.slot, owner.name.to_string(), bare.to_string());
                    self.owners.insert(candidate.to_string(), claim);
                    return Ok(candidate.to_string());
                }
            }
        }
        Err(holder)
    }

    /// Who holds `name`, for a WARN.
    fn describe(&self, name: &str, (_, server, bare): &(ServerSlot, String, String)) -> String {
        format!("{name} is tool '{bare}' of server '{server}'")
    }
}

impl Catalogue {
    /// Whether it has a tool for the model.
    pub(crate) fn has_tools(&self) -> bool {
        !self.tools.is_empty()
    }

    /// Whether the server exposes hook `hook` (SPEC H1).
    pub(crate) fn has_hook(&self, hook: &str) -> bool {
        self.hooks.contains(hook)
    }

    /// Whether the last listing has a (non-hook) tool the server calls `bare`.
    pub(crate) fn has_tool(&self, bare: &str) -> bool {
        self.tools.iter().any(|t| t.bare == bare)
    }

    /// The tool `exposed` as sent to a provider with `dialect`'s schema rules (SPEC M14,
    /// `tool_schema`): converted on first use after a listing (or when the rules change, a
    /// session switching models), logging the rewrite's one WARN then; `None` for a name it
    /// does not offer.
    pub(crate) fn offered(
        &mut self,
        exposed: &str,
        dialect: SchemaDialect,
        server: &str,
        out: &mut Outbox,
    ) -> Option<ToolDef> {
        let t = self.tools.iter_mut().find(|t| t.exposed == exposed)?;
        let offered = match &t.offered {
            Some((d, o)) if *d == dialect => o,
            Some(_) | None => {
                let o = tool_schema::offer(&t.schema, dialect);
                if let Some(w) = o.warning(server, &t.bare, dialect) {
                    out.log(LogLevel::Warn, w);
                }
                &t.offered.insert((dialect, o)).1
            }
        };
        Some(offered.tool_def(&t.exposed, &t.description))
    }

    /// Replaces the catalogue with a complete `tools/list` (`raw`, every page's `tools` in
    /// order), sorted by [`sort_listing`]. Logs the warnings, the C56 warning about hooks the
    /// allowlist does not name (once), and the server's ready line. Returns the sentences for
    /// the user about tools dropped for an unusable schema that were not told before (one per
    /// tool, naming server, tool and what the schema says).
    pub(crate) fn install(
        &mut self,
        raw: Vec<Value>,
        owner: Owner<'_>,
        claims: &mut NameClaims,
        allowlist: &HookAllowlist,
        out: &mut Outbox,
    ) -> Vec<String> {
        let name = owner.name;
        let Sorted {
            tools: tools_out,
            hooks,
            notes,
        } = sort_listing(raw, owner, claims);
        let mut warnings = Vec::new();
        let mut told = Vec::new();
        for note in notes {
            match note {
                ListingNote::Dropped(d) => {
                    if let (Some(bare), DropWhy::Schema(e)) = (&d.name, &d.why)
                        && self.told_dropped.insert(bare.clone())
                    {
                        told.push(format!(
                            "MCP server '{name}' offers tool '{bare}' with an input schema the agent cannot use ({e}); it is not offered to the model."
                        ));
                    }
                    warnings.push(d.warning(name));
                }
                ListingNote::Renamed {
                    bare,
                    exposed,
                    holder,
                } => warnings.push(format!(
                    "mcp '{name}': tool '{bare}' is offered as {exposed}: {holder}"
                )),
            }
        }
        let count = tools_out.len();
        self.tools = tools_out;
        self.hooks = hooks.into_iter().collect();
        for w in warnings {
            out.log(LogLevel::Warn, w);
        }
        // C56: hooks this server exposes but may not run, once per session and server.
        if !self.hooks.is_empty() && !allowlist.allows(name) && !self.warned_hooks_off {
            self.warned_hooks_off = true;
            let listed = self.hooks.iter().cloned().collect::<Vec<_>>().join(", ");
            out.log(
                LogLevel::Warn,
                format!(
                    "server '{name}' exposes hooks {listed} but is not in MCP_HOOK_SERVERS ({}); they will not be called",
                    allowlist.env_value()
                ),
            );
        }
        out.log(
            LogLevel::Info,
            format!(
                "mcp '{name}': ready with {count} tool(s), hooks {:?}",
                self.hooks
            ),
        );
        told
    }
}

/// What one complete `tools/list` comes to, before it is installed.
struct Sorted {
    /// The tools the model is offered, in listing order.
    tools: Vec<McpTool>,
    /// The hooks (bare names starting with `_`), in listing order, each once.
    hooks: Vec<String>,
    /// What was dropped or renamed, in listing order.
    notes: Vec<ListingNote>,
}

/// An entry of a listing that is not offered as the server named it.
enum ListingNote {
    /// Left out.
    Dropped(Dropped),
    /// Offered under another name than its plain exposed one, which `holder` (worded) holds.
    Renamed {
        bare: String,
        exposed: String,
        holder: String,
    },
}

/// An entry left out of a listing: its name (`None` without one) and why.
struct Dropped {
    name: Option<String>,
    why: DropWhy,
}

/// Why an entry is left out of a listing (SPEC M3, M4).
enum DropWhy {
    /// It has no `name`.
    Unnamed,
    /// Its `inputSchema` is unusable ([`tools::normalize_schema`]'s reason).
    Schema(String),
    /// An earlier tool of this listing is offered under both its names (the same name twice).
    Duplicate,
    /// Other tools of the session hold both its names (worded: which).
    Taken(String),
}

impl Dropped {
    /// The WARN text naming server `server`.
    fn warning(&self, server: &str) -> String {
        let bare = self.name.as_deref().unwrap_or("");
        match &self.why {
            DropWhy::Unnamed => format!("mcp '{server}': dropping a tool without a name"),
            DropWhy::Duplicate => format!("mcp '{server}': dropping duplicate tool '{bare}'"),
            DropWhy::Schema(_) | DropWhy::Taken(_) => {
                format!("mcp '{server}': dropping tool '{bare}': {}", self.reason())
            }
        }
    }

    /// Why, as a clause (`inputSchema root type is "string", not "object"`).
    fn reason(&self) -> String {
        match &self.why {
            DropWhy::Unnamed => "it has no name".to_string(),
            DropWhy::Schema(e) => e.clone(),
            DropWhy::Duplicate => {
                "a duplicate: an earlier tool of the list has its name".to_string()
            }
            DropWhy::Taken(holder) => format!("its names are taken ({holder})"),
        }
    }
}

/// The rules by which a complete `tools/list` (`raw`, every page's `tools` in order) becomes
/// what a server offers (SPEC M3, M4, H1, A6): a tool without a name or with an unusable
/// schema is dropped; `_` names are hooks; a tool whose exposed name another tool of the
/// session holds (`claims`, the same server's included) gets a hash suffix once and is then
/// dropped.
fn sort_listing(raw: Vec<Value>, owner: Owner<'_>, claims: &mut NameClaims) -> Sorted {
    let Owner { name, prefix, .. } = owner;
    let mut tools_out: Vec<McpTool> = Vec::new();
    let mut hooks: Vec<String> = Vec::new();
    let mut notes = Vec::new();
    let mut seen_exposed = BTreeSet::new();
    let dropped = |name: Option<&str>, why| {
        ListingNote::Dropped(Dropped {
            name: name.map(str::to_string),
            why,
        })
    };
    for t in raw {
        let Some(bare) = t.get("name").and_then(Value::as_str) else {
            notes.push(dropped(None, DropWhy::Unnamed));
            continue;
        };
        if tools::is_hook_name(bare) {
            if !hooks.iter().any(|h| h == bare) {
                hooks.push(bare.to_string());
            }
            continue;
        }
        let schema = match tools::normalize_schema(t.get("inputSchema")) {
            Ok(s) => s,
            Err(e) => {
                notes.push(dropped(Some(bare), DropWhy::Schema(e)));
                continue;
            }
        };
        let plain = tools::exposed_name(prefix, bare);
        let exposed = match claims.place(&plain, owner, bare, &seen_exposed) {
            Ok(e) => e,
            Err(None) => {
                notes.push(dropped(Some(bare), DropWhy::Duplicate));
                continue;
            }
            Err(Some(holder)) => {
                notes.push(dropped(Some(bare), DropWhy::Taken(holder)));
                continue;
            }
        };
        if exposed != plain
            && !seen_exposed.contains(&plain)
            && let Some(holder) = claims.owners.get(&plain)
        {
            notes.push(ListingNote::Renamed {
                bare: bare.to_string(),
                exposed: exposed.clone(),
                holder: claims.describe(&plain, holder),
            });
        }
        seen_exposed.insert(exposed.clone());
        let description = t
            .get("description")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        tools_out.push(McpTool {
            bare: bare.to_string(),
            exposed,
            description,
            schema,
            title: tools::tool_title(name, bare, &t),
            kind: tools::tool_kind(bare, t.get("annotations")),
            offered: None,
        });
    }
    Sorted {
        tools: tools_out,
        hooks,
        notes,
    }
}

/// What the agent makes of one server's complete tool listing on its own (the entries of a
/// [`ToolListing`]), by the rules it installs every listing with (SPEC M3, M4, H1): the tools
/// it offers the model, the hooks it may call, and the entries it leaves out, each with the
/// reason. For a caller that checks a server outside a session (`buzz-agent hooks check`).
///
/// The names the model sees (`<prefix>__<tool>`, SPEC M3) depend on the name a client gives
/// the server, so the tools are named as the server names them. Whether the hooks run also
/// depends on that name (`MCP_HOOK_SERVERS`); `hooks` is what a server on the allowlist runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolsSeen {
    /// The tools offered to the model, by their names on the server, in listing order:
    /// `["echo", "add"]`.
    pub offered: Vec<String>,
    /// The hook tools (names starting with `_`), in listing order, each once:
    /// `["_Stop", "_Other"]`.
    pub hooks: Vec<String>,
    /// The entries left out, in listing order: the name (`None` for an entry without one)
    /// and why (`(Some("scalar"), "inputSchema root type is \"string\", not \"object\"")`).
    pub dropped: Vec<(Option<String>, String)>,
}

impl ToolsSeen {
    /// The agent's view of `raw` (every page's `tools` entries, in order), as
    /// the catalogue sorts (`Catalogue::install`) a first listing of the session's only server.
    #[must_use]
    pub fn of(raw: Vec<Value>) -> ToolsSeen {
        let owner = Owner {
            slot: ServerSlot(0),
            name: "server",
            prefix: "server",
        };
        let sorted = sort_listing(raw, owner, &mut NameClaims::default());
        ToolsSeen {
            offered: sorted.tools.into_iter().map(|t| t.bare).collect(),
            hooks: sorted.hooks,
            dropped: sorted
                .notes
                .into_iter()
                .filter_map(|n| match n {
                    ListingNote::Dropped(d) => Some((d.name.clone(), d.reason())),
                    ListingNote::Renamed { .. } => None,
                })
                .collect(),
        }
    }
}

/// The tools the model may call now, from the catalogues of the offering servers in
/// registration order (`(slot, prefix, catalogue)`): every non-hook tool, the first of equal
/// exposed names winning (SPEC M3, M4, M9, I10), with the route of each exposed name. The
/// schemas are the servers' own; [`Catalogue::offered`] gives each in a provider's form.
pub(crate) fn visible_tools<'a>(
    offering: impl IntoIterator<Item = (ServerSlot, &'a str, &'a Catalogue)>,
) -> (Vec<ToolDef>, BTreeMap<String, ToolRoute>) {
    let mut defs = Vec::new();
    let mut routes = BTreeMap::new();
    for (slot, prefix, catalogue) in offering {
        for t in &catalogue.tools {
            if routes.contains_key(&t.exposed) {
                continue;
            }
            defs.push(ToolDef {
                name: t.exposed.clone(),
                description: t.description.clone(),
                input_schema: t.schema.clone(),
            });
            routes.insert(
                t.exposed.clone(),
                ToolRoute {
                    target: ToolTarget::Server(slot),
                    bare: t.bare.clone(),
                    qualified: format!("{prefix}{}{}", tools::QUALIFIER, t.bare),
                    title: t.title.clone(),
                    kind: t.kind,
                },
            );
        }
    }
    (defs, routes)
}

/// The tools of one request: the built-ins first, then the MCP tools of `mcp` (from
/// [`visible_tools`]). An MCP tool with a built-in's exposed name is dropped (a server may not
/// shadow a built-in; MCP names are `<prefix>__<tool>` or carry a hash suffix, so this cannot
/// happen by accident).
pub(crate) fn with_builtins(
    builtins: Vec<(ToolDef, ToolRoute)>,
    mcp: (Vec<ToolDef>, BTreeMap<String, ToolRoute>),
) -> (Vec<ToolDef>, BTreeMap<String, ToolRoute>) {
    if builtins.is_empty() {
        return mcp;
    }
    let (mcp_defs, mcp_routes) = mcp;
    let mut defs = Vec::with_capacity(builtins.len() + mcp_defs.len());
    let mut routes = BTreeMap::new();
    for (def, route) in builtins {
        routes.insert(def.name.clone(), route);
        defs.push(def);
    }
    for def in mcp_defs {
        if routes.contains_key(&def.name) {
            continue;
        }
        if let Some(route) = mcp_routes.get(&def.name) {
            routes.insert(def.name.clone(), route.clone());
        }
        defs.push(def);
    }
    (defs, routes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::Action;
    use crate::time::MonoTime;
    use serde_json::json;

    fn install(raw: Vec<Value>, allowlist: &HookAllowlist) -> (Catalogue, Vec<String>) {
        let owner = Owner {
            slot: ServerSlot(1),
            name: "srv",
            prefix: "srv",
        };
        install_as(owner, raw, &mut NameClaims::default(), allowlist)
    }

    fn install_as(
        owner: Owner<'_>,
        raw: Vec<Value>,
        claims: &mut NameClaims,
        allowlist: &HookAllowlist,
    ) -> (Catalogue, Vec<String>) {
        let mut out = Outbox::new(LogLevel::Debug, MonoTime::ZERO);
        let mut c = Catalogue::default();
        c.install(raw, owner, claims, allowlist, &mut out);
        let logs = std::iter::from_fn(|| out.pop())
            .map(|a| {
                let Action::Log(r) = a else {
                    panic!("a catalogue only logs: {a:?}");
                };
                r.message
            })
            .collect();
        (c, logs)
    }

    #[test]
    fn m3_m4_hooks_are_kept_apart_and_unnamed_or_unusable_tools_are_dropped_alone() {
        let (c, logs) = install(
            vec![
                json!({"name": "echo", "inputSchema": {"properties": {}}}),
                json!({"name": "_Stop"}),
                json!({"description": "no name"}),
                json!({"name": "bad", "inputSchema": "not a schema"}),
            ],
            &HookAllowlist::Off,
        );
        assert_eq!(c.tools.len(), 1);
        assert_eq!(c.tools[0].exposed, "srv__echo");
        assert_eq!(c.tools[0].schema["type"], "object", "M3: type object added");
        assert!(c.has_hook("_Stop") && !c.has_hook("_PostCompact"));
        assert!(
            logs.iter()
                .any(|l| l.contains("dropping a tool without a name"))
        );
        assert!(logs.iter().any(|l| l.contains("dropping tool 'bad'")));
        assert!(logs.iter().any(|l| l.contains("not in MCP_HOOK_SERVERS")));
        assert!(
            logs.last()
                .is_some_and(|l| l.contains("ready with 1 tool(s)"))
        );
    }

    #[test]
    fn a_tool_dropped_for_its_schema_is_told_to_the_user_once_per_tool() {
        let owner = Owner {
            slot: ServerSlot(1),
            name: "srv",
            prefix: "srv",
        };
        let raw = || {
            vec![
                json!({"name": "echo"}),
                json!({"name": "bad", "inputSchema": {"type": "string"}}),
            ]
        };
        let mut claims = NameClaims::default();
        let mut out = Outbox::new(LogLevel::Debug, MonoTime::ZERO);
        let mut c = Catalogue::default();
        let told = c.install(raw(), owner, &mut claims, &HookAllowlist::Off, &mut out);
        assert_eq!(
            told,
            vec![
                "MCP server 'srv' offers tool 'bad' with an input schema the agent cannot use \
                 (inputSchema root type is \"string\", not \"object\"); it is not offered to the \
                 model."
                    .to_string()
            ]
        );
        let relisted = c.install(raw(), owner, &mut claims, &HookAllowlist::Off, &mut out);
        assert!(relisted.is_empty(), "told once: {relisted:?}");
        let warns = std::iter::from_fn(|| out.pop())
            .filter(|a| matches!(a, Action::Log(r) if r.message.contains("dropping tool 'bad'")))
            .count();
        assert_eq!(warns, 2, "every listing still logs its WARN");
    }

    /// One `tools/list` result of `tools`, with `next` as its `nextCursor`.
    fn result(tools: Vec<Value>, next: Option<&str>) -> Value {
        match next {
            Some(c) => json!({"tools": tools, "nextCursor": c}),
            None => json!({"tools": tools}),
        }
    }

    #[test]
    fn s5_a_tool_list_is_cut_at_the_tool_cap_and_at_the_byte_cap_with_one_warn() {
        let tool = |i: usize| json!({"name": format!("t{i}"), "inputSchema": {"type": "object"}});
        let mut listing = ToolListing::default();
        let mut warns = Vec::new();
        let page: Vec<Value> = (0..600).map(tool).collect();
        let next = listing.page(&result(page, Some("c1")), &mut warns);
        assert_eq!((next.as_deref(), warns.len()), (Some("c1"), 0));
        let page: Vec<Value> = (600..1200).map(tool).collect();
        let next = listing.page(&result(page.clone(), Some("c2")), &mut warns);
        assert_eq!(next, None, "no page is asked for after a cut");
        assert_eq!(
            warns,
            ["tools/list has more than 1000 tools; the rest is cut off"]
        );
        assert_eq!(listing.page(&result(page, None), &mut warns), None);
        assert_eq!(warns.len(), 1, "one WARN");
        let tools = listing.take();
        assert_eq!(tools.len(), MAX_TOOLS_PER_SERVER);
        assert_eq!(tools[999]["name"], "t999", "the first ones, in order");
        let next = listing.page(&result(vec![tool(0)], Some("c1")), &mut warns);
        assert_eq!(next.as_deref(), Some("c1"), "a new listing starts whole");
        listing.take();

        // 10 tools of ~1 MiB each: the fourth crosses 4 MiB.
        let big = |i: usize| json!({"name": format!("b{i}"), "description": "d".repeat(1 << 20)});
        let page: Vec<Value> = (0..10).map(big).collect();
        let mut warns = Vec::new();
        assert_eq!(listing.page(&result(page, Some("c1")), &mut warns), None);
        assert_eq!(
            warns,
            ["tools/list is over 4 MiB after 3 tools; the rest is cut off"]
        );
        assert_eq!(listing.take().len(), 3);
    }

    #[test]
    fn m2_a_listing_stops_at_a_repeated_cursor_and_after_100_pages() {
        let mut listing = ToolListing::default();
        let mut warns = Vec::new();
        let page = |c: &str| result(vec![json!({"name": "echo"})], Some(c));
        assert_eq!(listing.page(&page("a"), &mut warns).as_deref(), Some("a"));
        assert_eq!(listing.page(&page("b"), &mut warns).as_deref(), Some("b"));
        assert_eq!(listing.page(&page("a"), &mut warns), None);
        assert_eq!(warns, ["tools/list repeated cursor \"a\"; stopping"]);
        assert_eq!(listing.take().len(), 3, "the entries of every page read");

        let mut warns = Vec::new();
        let mut pages = 1;
        while listing
            .page(&page(&format!("c{pages}")), &mut warns)
            .is_some()
        {
            pages += 1;
        }
        assert_eq!(pages, MAX_LIST_PAGES, "the first page and 99 more");
        assert_eq!(warns, ["tools/list exceeded 100 pages; stopping"]);
        assert_eq!(listing.take().len(), 100);
        assert_eq!(
            listing.page(&json!({"tools": []}), &mut warns),
            None,
            "the end"
        );
    }

    #[test]
    fn m3_m4_h1_tools_seen_are_the_catalogues_tools_hooks_and_drops() {
        let raw = vec![
            json!({"name": "echo", "inputSchema": {"type": "object"}}),
            json!({"name": "scalar", "inputSchema": {"type": "string"}}),
            json!({"name": "_Stop"}),
            json!({"description": "no name"}),
            json!({"name": "echo", "description": "again"}),
            json!({"name": "read.file"}),
            json!({"name": "echo", "description": "a third time"}),
            json!({"name": "_Other", "inputSchema": "not a schema"}),
        ];
        let seen = ToolsSeen::of(raw.clone());
        let (c, _) = install(raw, &HookAllowlist::Off);
        let bare: Vec<&str> = c.tools.iter().map(|t| t.bare.as_str()).collect();
        assert_eq!(seen.offered, bare, "what install offers");
        // The second `echo` takes the hashed name, the third finds both taken.
        assert_eq!(seen.offered, ["echo", "echo", "read.file"]);
        assert_eq!(
            seen.hooks,
            ["_Stop", "_Other"],
            "a hook's schema is not its listing's"
        );
        assert!(seen.hooks.iter().all(|h| c.has_hook(h)));
        assert_eq!(
            seen.dropped,
            [
                (
                    Some("scalar".to_string()),
                    "inputSchema root type is \"string\", not \"object\"".to_string()
                ),
                (None, "it has no name".to_string()),
                (
                    Some("echo".to_string()),
                    "a duplicate: an earlier tool of the list has its name".to_string()
                ),
            ]
        );
    }

    #[test]
    fn m3_visible_tools_keep_registration_order_and_the_first_equal_name_wins() {
        let allow = HookAllowlist::Off;
        let (a, _) = install(
            vec![json!({"name": "echo"}), json!({"name": "_Stop"})],
            &allow,
        );
        let (b, _) = install(
            vec![json!({"name": "echo"}), json!({"name": "grep"})],
            &allow,
        );
        let (defs, routes) =
            visible_tools([(ServerSlot(1), "srv", &a), (ServerSlot(2), "srv", &b)]);
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["srv__echo", "srv__grep"], "I10: no hook is offered");
        assert_eq!(
            routes["srv__echo"].target,
            ToolTarget::Server(ServerSlot(1))
        );
        assert_eq!(
            routes["srv__grep"].target,
            ToolTarget::Server(ServerSlot(2))
        );
        assert_eq!(routes["srv__grep"].qualified, "srv__grep");
    }

    #[test]
    fn a10_built_ins_come_first_and_no_server_shadows_one() {
        let (mut c, _) = install(vec![json!({"name": "echo"})], &HookAllowlist::Off);
        // A catalogue entry that somehow took the built-in's name (cannot come from install).
        let mut shadow = c.tools[0].clone();
        shadow.exposed = "load_skill".into();
        c.tools.push(shadow);
        let mcp = visible_tools([(ServerSlot(1), "srv", &c)]);
        let route = ToolRoute {
            target: ToolTarget::Builtin(Builtin::LoadSkill),
            bare: "load_skill".into(),
            qualified: "load_skill".into(),
            title: "Load skill".into(),
            kind: "read",
        };
        let def = ToolDef {
            name: "load_skill".into(),
            description: "built in".into(),
            input_schema: json!({"type": "object"}),
        };
        let (defs, routes) = with_builtins(vec![(def, route.clone())], mcp);
        let names: Vec<&str> = defs.iter().map(|d| d.name.as_str()).collect();
        assert_eq!(names, ["load_skill", "srv__echo"]);
        assert_eq!(routes["load_skill"], route);
        assert_eq!(
            routes["srv__echo"].target,
            ToolTarget::Server(ServerSlot(1))
        );
    }

    /// Two server names forged so that their `echo` tools get the same exposed name (the first
    /// 55 bytes and the 32-bit hash of the qualified name agree).
    const FORGED: [&str; 2] = [
        "forged-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaass9eimhx",
        "forged-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa2n51vgvs",
    ];

    #[test]
    fn m3_names_that_collide_an_exposed_name_is_one_tools_for_the_whole_session() {
        let [a_name, b_name] = FORGED;
        assert_eq!(
            tools::exposed_name(a_name, "echo"),
            tools::exposed_name(b_name, "echo"),
            "the forgery holds"
        );
        let allow = HookAllowlist::Off;
        let owner = |slot, name| Owner {
            slot: ServerSlot(slot),
            name,
            prefix: name,
        };
        let mut claims = NameClaims::default();
        let echo = || vec![json!({"name": "echo"})];
        let (a, _) = install_as(owner(1, a_name), echo(), &mut claims, &allow);
        let (b, logs) = install_as(owner(2, b_name), echo(), &mut claims, &allow);
        let plain = tools::exposed_name(a_name, "echo");
        let renamed = b.tools[0].exposed.clone();
        assert_eq!(a.tools[0].exposed, plain);
        assert_ne!(renamed, plain, "the later server's tool is renamed");
        assert!(tools::is_provider_safe(&renamed));
        assert!(
            logs.iter().any(|l| l
                == &format!("mcp '{b_name}': tool 'echo' is offered as {renamed}: {plain} is tool 'echo' of server '{a_name}'")),
            "{logs:?}"
        );
        let (_, routes) = visible_tools([(ServerSlot(1), a_name, &a), (ServerSlot(2), b_name, &b)]);
        assert_eq!(routes[&plain].target, ToolTarget::Server(ServerSlot(1)));
        assert_eq!(routes[&renamed].target, ToolTarget::Server(ServerSlot(2)));
        // The first server is gone (dead, or its listing dropped the tool): its name leads
        // nowhere, never to the other server's tool, whatever the other lists again.
        let (b, _) = install_as(owner(2, b_name), echo(), &mut claims, &allow);
        assert_eq!(b.tools[0].exposed, renamed, "a re-listing keeps the name");
        let (a, _) = install_as(owner(1, a_name), Vec::new(), &mut claims, &allow);
        let (_, routes) = visible_tools([(ServerSlot(1), a_name, &a), (ServerSlot(2), b_name, &b)]);
        assert!(!routes.contains_key(&plain), "{routes:?}");
        let (_, routes) = visible_tools([(ServerSlot(2), b_name, &b)]);
        assert_eq!(routes.keys().collect::<Vec<_>>(), [&renamed]);
        // A third server forged onto both names gets neither: its tool is dropped.
        let (c, logs) = install_as(owner(3, a_name), echo(), &mut claims, &allow);
        assert!(c.tools.is_empty());
        assert!(
            logs.iter()
                .any(|l| l.contains("dropping tool 'echo': its names are taken")),
            "{logs:?}"
        );
    }
}
