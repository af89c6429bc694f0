#!/usr/bin/env bash
# Footprint of both agent binaries (issue #6).
#
# Builds `buzz-agent` (tokio) and `buzz-agent-smol` in release, then for each prints:
#   size      the stripped binary's size (stat)
#   idle_rss  peak RSS of `<bin> --version` (/usr/bin/time -v; skipped when it is absent)
#   peak_rss  peak RSS (VmHWM of /proc/<pid>/status, read before stdin EOF) over one session of
#             ROUNDS LLM rounds (default 200): the `footprint` bench of the e2e crate runs the
#             benchmark's tool-rounds session (scripts/bench.sh, docs/performance.md): the fake
#             LLM (ROUNDS-1 `fs__echo` tool calls, then a text reply) and the fake MCP server,
#             driving the agent as an ACP client
#   cpu, wall the agent's own utime+stime before stdin EOF and the prompt's wall time
# and compares size and peak RSS with the targets (smol 4 MiB / 4 MiB, tokio 6 MiB / 6 MiB).
#
# Usage: scripts/footprint.sh        (ROUNDS=N to change the session; STRICT=1 to exit 1 when a
#                                     figure is over its target; SMAPS=1 for the largest mappings)
# Needs: cargo, stat, awk; Linux /proc. Public tools only.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROUNDS="${ROUNDS:-200}"
STRICT="${STRICT:-0}"
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
REL="$TARGET_DIR/release"

echo "== building release binaries (lto, codegen-units=1, strip, panic=abort, opt-level 3/\"s\")" >&2
cargo build --release \
    -p buzz-agent -p buzz-agent-smol -p buzz-agent-e2e \
    --bin buzz-agent --bin buzz-agent-smol --bin footprint >&2

# name:size-target-MiB:rss-target-MiB
BINARIES=("buzz-agent-smol:4:4" "buzz-agent:6:6")

mib() { awk -v b="$1" 'BEGIN { printf "%.2f MiB", b / 1048576 }'; }

bench_args=(--rounds "$ROUNDS")
if [[ "${SMAPS:-0}" == 1 ]]; then bench_args+=(--smaps); fi

over=0
printf '%-16s %12s %12s %12s %9s %9s  %s\n' binary size idle_rss peak_rss cpu_ms wall_ms verdict
for entry in "${BINARIES[@]}"; do
    IFS=: read -r name size_target rss_target <<<"$entry"
    bin="$REL/$name"
    size=$(stat -c %s "$bin")

    idle="n/a"
    if [[ -x /usr/bin/time ]]; then
        idle_kib=$(/usr/bin/time -v "$bin" --version 2>&1 >/dev/null |
            awk -F: '/Maximum resident set size/ { gsub(/ /, "", $2); print $2 }')
        idle="$(mib $((idle_kib * 1024)))"
    fi

    line=$("$REL/footprint" "${bench_args[@]}" "$bin" | grep '^footprint ')
    field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$line"; }
    peak_kib=$(field peak_rss_kib)
    cpu_ms=$(field cpu_ms)
    wall_ms=$(field wall_ms)

    verdict="ok"
    if ((size > size_target * 1048576)); then verdict="size over ${size_target} MiB"; over=1; fi
    if ((peak_kib > rss_target * 1024)); then
        [[ "$verdict" == ok ]] && verdict="" || verdict="$verdict, "
        verdict="${verdict}rss over ${rss_target} MiB"
        over=1
    fi
    printf '%-16s %12s %12s %12s %9s %9s  %s\n' "$name" "$(mib "$size")" "$idle" \
        "$(mib $((peak_kib * 1024)))" "$cpu_ms" "$wall_ms" "$verdict"
done
echo "(session: $ROUNDS LLM rounds, one fs__echo tool call each but the last)"

if [[ "$STRICT" == 1 && "$over" == 1 ]]; then exit 1; fi
