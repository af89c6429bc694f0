#!/usr/bin/env bash
# Mutation testing of the core, file by file, in three tiers (docs/mutants.md has the results).
#
#   scripts/mutants.sh RUN core/src/time.rs core/src/ids.rs    # results in $MUTANTS_OUT/RUN/
#   MUTANTS_DIFF=x.diff scripts/mutants.sh RUN core/src/turn.rs  # only code x.diff touches
#
# It mutates the files IN PLACE (`cargo mutants --in-place`), so run it in a scratch copy of the
# tree, never in a checkout you are editing:
#
#   rm -rf /tmp/mut-src && mkdir /tmp/mut-src && git archive HEAD | tar -x -C /tmp/mut-src
#   /tmp/mut-src/scripts/mutants.sh RUN core/src/time.rs …
#
# (in place, the copy keeps one target directory: every mutant is an incremental build of the
# core, and no run pays a from-scratch baseline build). For each file, every mutant is tried
# against the tests of the file's own module (`--lib <module>::`, ~1 s); the survivors against
# all the core's unit tests (`--lib`, ~7 s); the survivors of that against the core's whole
# suite (core/tests/*: properties, snapshots, the fuzz corpus replay; ~35 s). A mutant caught at
# any tier is caught by a test of the core; a survivor of the last tier is missed. The settings
# every tier shares (excluded files and mutants, the `mutants` build profile) are in
# .cargo/mutants.toml. The machine is shared: one job (in place implies it), nice, and 32 cases
# per property. The last lines printed are the per-file table (scripts/mutants_table.py) and
# the missed mutants.
#
# MUTANTS_TIERS=2 stops after tier 2 (the whole suite costs ~50 s a mutant on a loaded machine
# and caught few of the unit tests' survivors): its survivors are missed until a new test kills
# them. After writing tests, re-run only the missed ones against the unit tests, as tier `new`:
#
#   MUTANTS_TIER=new MUTANTS_RE=missed.txt scripts/mutants.sh RUN core/src/turn.rs
set -euo pipefail
cd "$(dirname "$0")/.."
run="$1"
shift
out_root="${MUTANTS_OUT:-${TMPDIR:-/tmp}/buzz-mutants}/$run"
export PROPTEST_CASES="${PROPTEST_CASES:-32}"
common=(-p buzz-agent-core --in-place --baseline skip)
if [[ -n "${MUTANTS_DIFF:-}" ]]; then
    common+=(--in-diff "$MUTANTS_DIFF")
fi
# An unmutated build first, so that a broken tree is not mistaken for unviable mutants.
nice -n 19 cargo test --profile mutants -p buzz-agent-core --no-run -q

# The mutant names in file $1 (a missed.txt) as anchored, escaped `--re` arguments.
survivors() {
    while IFS= read -r name; do
        printf '%s\n' --re "^$(printf '%s' "$name" | sed 's/[][\\.^$*+?(){}|]/\\&/g')\$"
    done <"$1"
}

for file in "$@"; do
    out="$out_root/${file//\//_}"
    rm -rf "$out"
    mkdir -p "$out"
    if [[ "${MUTANTS_TIER:-}" == new ]]; then
        mapfile -t re < <(grep -F "$file:" "$MUTANTS_RE" | survivors /dev/stdin)
        [[ ${#re[@]} -gt 0 ]] || continue
        nice -n 19 cargo mutants "${common[@]}" --timeout 60 --file "$file" -C --lib "${re[@]}" \
            --output "$out/new" >"$out/new.log" 2>&1 || true
        echo "== $file: new tests: $(tail -1 "$out/new.log")"
        continue
    fi
    module="${file#core/src/}"
    module="${module%.rs}"
    module="${module%/mod}"
    module="${module//\//::}::"
    echo "== $file"
    nice -n 19 cargo mutants "${common[@]}" --timeout 60 --file "$file" -C --lib \
        --output "$out/t1" -- "$module" >"$out/t1.log" 2>&1 || true
    echo "   tier 1 ($module): $(tail -1 "$out/t1.log")"
    [[ -s "$out/t1/mutants.out/missed.txt" ]] || continue
    mapfile -t re < <(survivors "$out/t1/mutants.out/missed.txt")
    nice -n 19 cargo mutants "${common[@]}" --timeout 60 --file "$file" -C --lib "${re[@]}" \
        --output "$out/t2" >"$out/t2.log" 2>&1 || true
    echo "   tier 2 (unit tests): $(tail -1 "$out/t2.log")"
    [[ -s "$out/t2/mutants.out/missed.txt" && "${MUTANTS_TIERS:-3}" -ge 3 ]] || continue
    mapfile -t re < <(survivors "$out/t2/mutants.out/missed.txt")
    nice -n 19 cargo mutants "${common[@]}" --timeout 150 --file "$file" "${re[@]}" \
        --output "$out/t3" >"$out/t3.log" 2>&1 || true
    echo "   tier 3 (whole suite): $(tail -1 "$out/t3.log")"
done
python3 scripts/mutants_table.py "$out_root"
