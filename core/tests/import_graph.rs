//! The core's module graph has no loop, and no sub-machine sees the `Agent` (DESIGN "Habits",
//! issue 13): every `crate::<module>` path in a module's code (comments and its `#[cfg(test)]
//! mod tests` left out) is an edge; the test fails on any cycle, naming it.
#![allow(
    clippy::disallowed_methods,
    clippy::expect_used,
    reason = "the test reads the core's source files (the core itself does no file IO); an unreadable tree fails it"
)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// Files that may use the agent: the agent itself, the crate root that re-exports it, and the
/// drivers of tests and fuzzing that run it (not sub-machines).
const MAY_USE_AGENT: [&str; 4] = ["agent", "lib", "testing", "fuzzing"];

/// The top-level module a source file belongs to (`mcp.rs` → `mcp`, `interceptor/chain.rs` →
/// `interceptor`).
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_string()
}

/// The code of a file without its unit-test module and without comment lines.
fn code_lines(source: &str) -> Vec<&str> {
    let source = source
        .find("#[cfg(test)]\nmod tests")
        .map_or(source, |i| &source[..i]);
    source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect()
}

/// Every module named as `crate::<module>` (also inside `use crate::{a::…, b::…}`).
fn referenced_modules(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                if let Some((module, _)) = item.trim().split_once("::") {
                    out.push(module.trim().to_string());
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            out.push(name);
        }
    }
    out
}

fn collect(dir: &Path, root: &Path, graph: &mut Graph, agent_users: &mut Vec<String>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("core/src is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            collect(&path, root, graph, agent_users);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let module = module_of(path.strip_prefix(root).expect("under core/src"));
        let source = std::fs::read_to_string(&path).expect("a source file");
        let edges = graph.entry(module.clone()).or_default();
        for line in code_lines(&source) {
            for target in referenced_modules(line) {
                let lowercase = target
                    .chars()
                    .next()
                    .is_some_and(|c| c.is_ascii_lowercase());
                if lowercase && target != module {
                    edges.insert(target.clone());
                }
                if (target == "agent" || target == "Agent") && !MAY_USE_AGENT.contains(&&*module) {
                    agent_users.push(format!("{module}: {}", line.trim()));
                }
            }
        }
    }
}

/// A cycle of `graph` as its modules in order (the first repeated at the end), if any.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        node: &str,
        graph: &Graph,
        marks: &mut BTreeMap<String, Mark>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        match marks.get(node) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let start = path.iter().position(|n| n == node).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(node.to_string());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(node.to_string(), Mark::Open);
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, marks, path) {
                return Some(cycle);
            }
        }
        path.pop();
        marks.insert(node.to_string(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for node in graph.keys() {
        if let Some(cycle) = visit(node, graph, &mut marks, &mut Vec::new()) {
            return Some(cycle);
        }
    }
    None
}

#[test]
fn the_core_module_graph_has_no_loop_and_only_the_agent_sees_the_agent() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph = Graph::new();
    let mut agent_users = Vec::new();
    collect(&root, &root, &mut graph, &mut agent_users);
    for sub_machine in [
        "mcp",
        "turn",
        "hooks",
        "compaction",
        "shutdown",
        "tool_calls",
    ] {
        assert!(
            graph.contains_key(sub_machine),
            "{sub_machine}.rs was not read"
        );
    }
    assert!(
        graph["agent"].contains("turn") && graph["turn"].contains("hooks"),
        "the parser sees the edges it should: {graph:?}"
    );
    assert!(
        agent_users.is_empty(),
        "sub-machines must not use the Agent: {agent_users:#?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import loop: {}", cycle.join(" -> "));
    }
}

#[test]
fn the_cycle_finder_finds_a_loop_and_the_parser_reads_grouped_uses() {
    let mut graph = Graph::new();
    let edge = |g: &mut Graph, a: &str, b: &str| {
        g.entry(a.into()).or_default().insert(b.into());
    };
    edge(&mut graph, "agent", "turn");
    edge(&mut graph, "turn", "hooks");
    assert_eq!(find_cycle(&graph), None);
    edge(&mut graph, "hooks", "turn");
    assert_eq!(
        find_cycle(&graph),
        Some(vec!["turn".into(), "hooks".into(), "turn".into()])
    );
    assert_eq!(
        referenced_modules("use crate::{hooks::HookPoint, ids::SessionId};"),
        vec!["hooks", "ids"]
    );
    assert_eq!(
        referenced_modules("let x = crate::text::utf8_prefix(a, crate::mcp::MAX);"),
        vec!["text", "mcp"]
    );
    assert!(code_lines("/// [`crate::Agent`]\nuse crate::io;").len() == 1);
}
