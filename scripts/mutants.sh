#!/usr/bin/env bash
# Mutation testing of the core in two passes (docs/mutants.md has the results).
#
#   scripts/mutants.sh RUN core/src/time.rs core/src/ids.rs   # results in $MUTANTS_OUT/RUN/
#   MUTANTS_DIFF=x.diff scripts/mutants.sh RUN core/src/turn.rs  # only code x.diff touches
#   scripts/mutants.sh RUN core/src/**/*.rs                    # everything (hours)
#
# Pass 1 runs every mutant of the files against the core's unit tests (`--lib`: a few seconds
# of build and ~7 s of tests per mutant). Pass 2 runs only pass 1's survivors against the
# core's whole suite (the unit tests, then core/tests/*: properties, snapshots, the fuzz corpus
# replay; ~35 s), so a mutant that only an integration test catches counts as caught, and a
# survivor of pass 2 is missed. The settings both passes share (excluded files and mutants, the
# `mutants` build profile, the minimum timeout) are in .cargo/mutants.toml. The machine is
# shared: one job, nice, and 32 cases per property. The last lines printed are the per-file
# table (scripts/mutants_table.py) and the missed mutants.
set -euo pipefail
cd "$(dirname "$0")/.."
run="$1"
shift
out="${MUTANTS_OUT:-${TMPDIR:-/tmp}/buzz-mutants}/$run"
export PROPTEST_CASES="${PROPTEST_CASES:-32}"
file_args=()
for file in "$@"; do
    file_args+=(--file "$file")
done
if [[ -n "${MUTANTS_DIFF:-}" ]]; then
    file_args+=(--in-diff "$MUTANTS_DIFF")
fi
rm -rf "$out"
mkdir -p "$out"

echo "== pass 1: $# files, unit tests"
nice -n 10 cargo mutants -p buzz-agent-core --jobs 1 --timeout 60 "${file_args[@]}" \
    --output "$out/lib" -- --lib >"$out/lib.log" 2>&1 || true
tail -1 "$out/lib.log"
missed="$out/lib/mutants.out/missed.txt"
if [[ -s "$missed" ]]; then
    # The survivors' names as anchored, escaped regexes: pass 2 runs exactly them.
    re_args=()
    while IFS= read -r name; do
        re_args+=(--re "^$(printf '%s' "$name" | sed 's/[][\\.^$*+?(){}|]/\\&/g')\$")
    done <"$missed"
    echo "== pass 2: $(wc -l <"$missed") survivors, whole core suite"
    nice -n 10 cargo mutants -p buzz-agent-core --jobs 1 --timeout 120 "${file_args[@]}" \
        "${re_args[@]}" --output "$out/full" >"$out/full.log" 2>&1 || true
    tail -1 "$out/full.log"
fi
python3 scripts/mutants_table.py "$out"
