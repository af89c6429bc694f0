#!/usr/bin/env bash
# Performance benchmark (issue #15): agent CPU, wall time, peak RSS, streaming latency and
# start-up of both agent binaries next to an in-repo IO floor, in one table of medians.
#
# Builds `buzz-agent` and `buzz-agent-smol` in release (as shipped) and the harness `bench` of the
# e2e crate (profile `harness`: optimised, unwinding), then runs every workload in every column,
# the columns interleaved run by run: the IO floor (the harness doing the same LLM and MCP traffic
# itself, no agent between), the two binaries and any peers. Progress goes to stderr, the table
# (Markdown) to stdout. How to read it, the costs and the baseline: docs/performance.md.
#
# Usage: scripts/bench.sh [--runs N] [--only NAME,…] [--quick] [extra-agent-binary…]
# Environment:
#   BENCH_RUNS=N               runs per cell (default 5); the table shows medians
#   BENCH_QUICK=1              small workloads (seconds; CI smoke), no targets column
#   BENCH_WORKLOADS=a,b        only these: rounds, rounds-long, rounds-4k, hooks, stream, startup
#   BENCH_GOALS=0              skip the goals table of issue 27 (the limit probe; each binary
#                              with sessions saved and off; syscalls per round by strace -ff;
#                              printed after the table, not in quick mode; needs strace)
#   BENCH_COST=0               skip the cost workload (billed input tokens with prompt caching
#                              on and off; run after the table, not in quick mode)
#   BENCH_PEER=/path/to/agent  any other ACP agent as one more column (several: comma-separated);
#                              it gets the same environment (OpenAI-compatible provider at the
#                              fake LLM: OPENAI_COMPAT_* and OPENAI_BASE_URL/_API_KEY/_MODEL)
# Needs: cargo; Linux (/proc, process CPU clocks). Exit status 1 when a run failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-target}"

echo "== building the agents (release) and the harness (profile harness)" >&2
cargo build --release -p buzz-agent -p buzz-agent-smol \
    --bin buzz-agent --bin buzz-agent-smol >&2
cargo build --profile harness -p buzz-agent-e2e --bin bench --bin cost >&2

status=0
"$TARGET_DIR/harness/bench" \
    "$TARGET_DIR/release/buzz-agent" "$TARGET_DIR/release/buzz-agent-smol" "$@" || status=$?

quick="${BENCH_QUICK:-}"
for a in "$@"; do [ "$a" = --quick ] && quick=1; done

# The goals table (issue 27): the limit probe, each binary with sessions saved (the default)
# and off, CPU as a multiple of the probe, syscalls per round, peak RSS, streaming p99.
if [ "${BENCH_GOALS:-1}" != 0 ] && { [ -z "$quick" ] || [ "$quick" = 0 ]; }; then
    if command -v strace >/dev/null; then
        echo "== goals (issue 27): the limit probe, saving on and off (docs/performance.md)" >&2
        echo
        "$TARGET_DIR/harness/bench" --goals \
            "$TARGET_DIR/release/buzz-agent" "$TARGET_DIR/release/buzz-agent-smol" "$@" || status=$?
    else
        echo "== goals table skipped: strace is not installed" >&2
    fi
fi

# The cost workload (issue 23): billed input tokens of a 200-round session on the Anthropic
# route, prompt caching on and off, against a fake applying Anthropic's caching rules. Not in
# quick mode; BENCH_COST=0 skips it.
if [ "${BENCH_COST:-1}" != 0 ] && { [ -z "$quick" ] || [ "$quick" = 0 ]; }; then
    echo "== cost: billed input tokens, Anthropic route (docs/performance.md)" >&2
    echo
    "$TARGET_DIR/harness/cost" "$TARGET_DIR/release/buzz-agent" || status=$?
fi
exit "$status"
