#!/usr/bin/env bash
# Memory soak (issue 27: no leak per MCP server): does an agent's RSS follow its live sessions?
#
# Builds both agent binaries and the e2e crate's `soak` harness, then runs, for each binary, one
# agent process through SESSIONS sessions one after the other (default 1,500), each with its own
# stdio MCP server (the fake), one tool round and `session/close`; with RESTARTS=1 each session's
# server also crashes and is restarted once (SPEC M9). Prints the agent's VmRSS every EVERY
# sessions (default 100) and the growth from the first sample to the last; exits 1 when a binary
# grew more than MAX_GROWTH_KIB (default 1024, the bound of issue 27) or a session failed.
#
# Usage: scripts/soak.sh            (SESSIONS=N EVERY=K RESTARTS=1 MAX_GROWTH_KIB=G PROFILE=dev|release)
# PROFILE: the agents' cargo profile (default release, as shipped; dev builds in a fraction of the
# time and shows the same growth, at a higher base RSS). Needs: cargo; Linux /proc.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
TARGET_DIR="${CARGO_TARGET_DIR:-target}"
PROFILE="${PROFILE:-release}"
case "$PROFILE" in
    release) OUT=release ;;
    dev) OUT=debug ;;
    *) echo "PROFILE must be dev or release" >&2; exit 2 ;;
esac

echo "== building the agents (profile $PROFILE) and the soak harness" >&2
cargo build --profile "$PROFILE" -p buzz-agent -p buzz-agent-smol \
    --bin buzz-agent --bin buzz-agent-smol >&2
cargo build --profile "$PROFILE" -p buzz-agent-e2e --bin soak >&2

args=(--sessions "${SESSIONS:-1500}" --every "${EVERY:-100}" --max-growth-kib "${MAX_GROWTH_KIB:-1024}")
if [[ "${RESTARTS:-0}" == 1 ]]; then args+=(--restarts); fi
exec "$TARGET_DIR/$OUT/soak" "${args[@]}" \
    "$TARGET_DIR/$OUT/buzz-agent" "$TARGET_DIR/$OUT/buzz-agent-smol"
