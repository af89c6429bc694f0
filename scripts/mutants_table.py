#!/usr/bin/env python3
"""Per-file table of scripts/mutants.sh runs: mutants tried, caught (by the module's own unit
tests, by another module's, by core/tests/*), timeout, unviable, missed; then the missed ones.

    python3 scripts/mutants_table.py /tmp/buzz-mutants/RUN [more runs…]

With several runs (the whole core, then e.g. `--in-diff` runs over code changed since, or a
re-run of one file after new tests), a mutant is counted once, with its outcome in the last
run (in argument order) that tried it; a re-run after new tests (`new`) only changes mutants
that were missed.
"""

import json
import pathlib
import re
import sys
import tomllib
from collections import defaultdict

# t1..t3: the tiers of scripts/mutants.sh; new: a re-run of mutants missed before, after the
# tests written to kill them (scripts/mutants.sh with MUTANTS_TIER=new).
TIERS = {"t1": "module", "t2": "unit", "t3": "suite", "new": "new test"}
KINDS = {
    "CaughtMutant": "caught",
    "MissedMutant": "missed",
    "Timeout": "timeout",
    "Unviable": "unviable",
}
COLS = ["tried", "caught (module)", "caught (unit)", "caught (suite)", "caught (new test)",
        "timeout", "unviable", "equivalent", "missed"]
# Missed mutants that are equivalent (docs/mutants.md gives each one's reason): one name a line.
EQUIVALENT = pathlib.Path(__file__).with_name("mutants_equivalent.txt")
# Mutants the configuration excludes now (`exclude_re`): a run made before a pattern was added
# may still hold them; they are not counted.
CONFIG = pathlib.Path(__file__).parent.parent / ".cargo" / "mutants.toml"
EXCLUDED = [re.compile(p) for p in tomllib.loads(CONFIG.read_text()).get("exclude_re", [])]


def outcomes(path):
    """(name, file, kind) of every mutant in one cargo-mutants output directory."""
    data = json.loads((path / "mutants.out" / "outcomes.json").read_text())
    for outcome in data["outcomes"]:
        scenario = outcome["scenario"]
        if not isinstance(scenario, dict) or "Mutant" not in scenario:
            continue  # the unmutated baseline
        mutant = scenario["Mutant"]
        yield mutant["name"], mutant["file"], KINDS.get(outcome["summary"], outcome["summary"])


def collect(runs):
    """name -> (file, column) over the runs, later runs and tiers overriding earlier ones."""
    result = {}
    for run in map(pathlib.Path, runs):
        for file_dir in sorted(p for p in run.iterdir() if p.is_dir()):
            for tier, label in TIERS.items():
                if not (file_dir / tier / "mutants.out" / "outcomes.json").exists():
                    continue
                for name, file, kind in outcomes(file_dir / tier):
                    if any(p.search(name) for p in EXCLUDED):
                        continue
                    column = f"caught ({label})" if kind == "caught" else kind
                    if tier == "new" and result.get(name, (file, "missed"))[1] != "missed":
                        continue  # caught by the tiers already: the new test is not why
                    result[name] = (file, column)
    return result


def main(runs):
    result = collect(runs)
    if EQUIVALENT.exists():
        for name in EQUIVALENT.read_text().splitlines():
            if result.get(name, ("", ""))[1] == "missed":
                result[name] = (result[name][0], "equivalent")
    table = defaultdict(lambda: defaultdict(int))
    for file, column in result.values():
        table[file]["tried"] += 1
        table[file][column] += 1
    print("| file | " + " | ".join(COLS) + " |")
    print("|---" * (len(COLS) + 1) + "|")
    total = defaultdict(int)
    for file in sorted(table):
        print(f"| `{file}` | " + " | ".join(str(table[file][c]) for c in COLS) + " |")
        for c in COLS:
            total[c] += table[file][c]
    print("| **total** | " + " | ".join(f"**{total[c]}**" for c in COLS) + " |")
    missed = sorted(n for n, (_, column) in result.items() if column == "missed")
    if missed:
        print(f"\nmissed ({len(missed)}):")
        for name in missed:
            print("  " + name)


if __name__ == "__main__":
    main(sys.argv[1:])
