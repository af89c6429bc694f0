#!/usr/bin/env bash
# Where the agents' CPU goes (issue #15; read with docs/performance.md "Where it goes").
#
# Builds both agents with symbols (profile `profiling`: the release code, not stripped) and the
# benchmark harness, then runs one benchmark session (WORKLOAD, default `rounds`: 200 tool
# rounds) per binary under each tool and prints, per binary:
#   callgrind  user-space instructions of the whole session (the stable figure to track: it does
#              not move with machine load) and the inclusive cost of the top functions
#   strace     syscalls of the agent's own threads per round (strace -ff; its MCP server
#              children and their threads are left out)
#   perf       where the CPU time goes, kernel included (cpu-clock samples: hardware counters
#              are often missing in VMs, `perf stat -e instructions true` says "not supported")
# Tools that are not installed are skipped. Raw outputs stay in OUT.
#
# Usage: scripts/profile.sh   (WORKLOAD=rounds|rounds-long|rounds-4k|hooks|stream|startup;
#                              TOOLS="callgrind strace perf"; TOP=N rows; OUT=dir)
# Needs: cargo, python3; valgrind, strace, perf for their sections.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT="$PWD"
TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target}"
WORKLOAD="${WORKLOAD:-rounds}"
TOOLS="${TOOLS:-callgrind strace perf}"
TOP="${TOP:-25}"
OUT="${OUT:-$(mktemp -d -t buzz-profile.XXXXXX)}"
mkdir -p "$OUT"
report() { python3 "$ROOT/scripts/profile_report.py" "$@"; }

echo "== building the agents (profile profiling) and the harness (profile harness)" >&2
cargo build --profile profiling -p buzz-agent -p buzz-agent-smol \
    --bin buzz-agent --bin buzz-agent-smol >&2
cargo build --profile harness -p buzz-agent-e2e --bin bench >&2

# LLM rounds of the workload (for per-round figures).
case "$WORKLOAD" in
rounds | rounds-4k) ROUNDS=201 ;;
rounds-long) ROUNDS=1001 ;;
*) ROUNDS=1 ;;
esac

# Runs the workload once with `$1` (a wrapper script standing in for the agent binary).
session() {
    "$TARGET_DIR/harness/bench" --runs 1 --only "$WORKLOAD" "$1" >"$1.table" 2>"$1.log" ||
        { echo "session under $1 failed:" >&2; tail -5 "$1.log" >&2; exit 1; }
}

# Writes an executable wrapper `$OUT/<name>.<tool>.sh` that runs the agent under a tool.
wrapper() {
    local name=$1 tool=$2
    shift 2
    local w="$OUT/$name.$tool.sh"
    printf '#!/bin/sh\nexec %s "$@"\n' "$*" >"$w"
    chmod +x "$w"
    echo "$w"
}

echo "workload $WORKLOAD ($ROUNDS LLM rounds); raw outputs in $OUT"
for name in buzz-agent buzz-agent-smol; do
    bin="$TARGET_DIR/profiling/$name"
    for tool in $TOOLS; do
        case "$tool" in
        callgrind)
            command -v valgrind >/dev/null || { echo "($name: valgrind missing)"; continue; }
            w=$(wrapper "$name" callgrind valgrind --tool=callgrind \
                "--callgrind-out-file=$OUT/$name.callgrind.out" "$bin")
            session "$w"
            echo "== $name: callgrind"
            report callgrind "$OUT/$name.callgrind.out" "$ROUNDS" "$TOP"
            ;;
        strace)
            command -v strace >/dev/null || { echo "($name: strace missing)"; continue; }
            rm -rf "$OUT/$name.strace"
            mkdir -p "$OUT/$name.strace"
            w=$(wrapper "$name" strace strace -ff -o "$OUT/$name.strace/t" "$bin")
            session "$w"
            echo "== $name: strace"
            report strace "$OUT/$name.strace" "$name" "$ROUNDS" "$TOP"
            ;;
        perf)
            command -v perf >/dev/null || { echo "($name: perf missing)"; continue; }
            w=$(wrapper "$name" perf perf record -q -e cpu-clock -F 20000 -g \
                -o "$OUT/$name.perf.data" "$bin")
            session "$w"
            echo "== $name: perf (cpu-clock)"
            report perf "$OUT/$name.perf.data" "$name" "$TOP"
            ;;
        *) echo "unknown tool $tool" >&2; exit 2 ;;
        esac
    done
done
