//! Replays the fuzz layer on stable `cargo test` (DESIGN "Testing pyramid", layer 4): every
//! committed corpus file (`fuzz/corpus/<target>/`) and every crash reproducer
//! (`fuzz/regressions/<target>/`, copied there from `fuzz/artifacts/`) runs through its target
//! body in `buzz_agent_core::fuzzing`. A body panics when a property is violated, so a crash
//! found once fails this test until it is fixed. See docs/fuzzing.md.

#![allow(clippy::panic, reason = "a corpus file that fails is a test failure")]
#![allow(
    clippy::disallowed_methods,
    reason = "the test reads the committed corpus files; the core itself does no file IO"
)]

use buzz_agent_core::fuzzing::{self, Route};
use std::path::{Path, PathBuf};

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz")
}

/// The files of `fuzz/<kind>/<target>/`, sorted (empty when the folder is missing).
fn files(kind: &str, target: &str) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fuzz_dir().join(kind).join(target))
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    out.retain(|p| p.is_file() && p.file_name().is_some_and(|n| n != ".gitkeep"));
    out.sort();
    out
}

/// Runs `body` on every corpus file and reproducer of `target`; the corpus must not be empty.
fn replay(target: &str, body: &dyn Fn(&[u8])) {
    let corpus = files("corpus", target);
    assert!(
        !corpus.is_empty(),
        "fuzz/corpus/{target}/ is empty or missing"
    );
    for path in corpus.iter().chain(files("regressions", target).iter()) {
        let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let name = path.display().to_string();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| body(&data)));
        assert!(
            outcome.is_ok(),
            "{target}: {name} fails (see the panic above)"
        );
    }
}

#[test]
fn line_codec_corpus_replays() {
    replay("line_codec", &fuzzing::line_codec);
}

#[test]
fn acp_input_corpus_replays() {
    replay("acp_input", &fuzzing::acp_input);
}

#[test]
fn mcp_output_corpus_replays() {
    replay("mcp_output", &fuzzing::mcp_output);
}

/// Every route's stream decoder target (`fuzzing::decoder_target`), from the one list of
/// routes: its corpus replays, and it is a target of `fuzz/` (a source file and a `[[bin]]`), so
/// a new route cannot be left out of the fuzz layer.
#[test]
fn every_routes_sse_decoder_corpus_replays_and_is_a_fuzz_target() {
    let manifest = std::fs::read_to_string(fuzz_dir().join("Cargo.toml")).expect("fuzz/Cargo.toml");
    for route in Route::ALL {
        let target = fuzzing::decoder_target(route);
        replay(target, &|d| fuzzing::sse_decoder(route, d));
        let source = format!("fuzz_targets/{target}.rs");
        let body = std::fs::read_to_string(fuzz_dir().join(&source))
            .unwrap_or_else(|e| panic!("fuzz/{source}: {e}"));
        assert!(
            body.contains(&format!("Route::{route:?}")),
            "fuzz/{source} does not fuzz {route:?}"
        );
        assert!(
            manifest.contains(&format!("name = \"{target}\"\npath = \"{source}\"")),
            "fuzz/Cargo.toml has no [[bin]] {target}"
        );
    }
}

#[test]
fn config_env_corpus_replays() {
    replay("config_env", &fuzzing::config_env);
}

#[test]
fn session_corpus_replays() {
    replay("session", &fuzzing::session::session);
}
