#!/usr/bin/env python3
"""Per-file table of a scripts/mutants.sh run: tried, caught (by the unit tests in pass 1, by
the rest of the core's suite in pass 2), timeout, unviable, missed; then the missed mutants.

    python3 scripts/mutants_table.py /tmp/buzz-mutants/RUN [more runs…]

With several runs (e.g. the whole core, then --in-diff runs of code changed since), a mutant
is counted once, with its outcome in the last run that tested it.
"""

import json
import pathlib
import sys
from collections import defaultdict

KINDS = {
    "CaughtMutant": "caught",
    "MissedMutant": "missed",
    "Timeout": "timeout",
    "Unviable": "unviable",
}


def outcomes(path):
    """(name, file, kind) of every mutant in one cargo-mutants output directory."""
    data = json.loads((path / "mutants.out" / "outcomes.json").read_text())
    for outcome in data["outcomes"]:
        mutant = outcome["scenario"]
        if not isinstance(mutant, dict) or "Mutant" not in mutant:
            continue  # the unmutated baseline
        mutant = mutant["Mutant"]
        yield mutant["name"], mutant["file"], KINDS.get(outcome["summary"], outcome["summary"])


def main(runs):
    result = {}  # name -> (file, kind, pass)
    for run in map(pathlib.Path, runs):
        for name, file, kind in outcomes(run / "lib"):
            result[name] = (file, kind, 1)
        if (run / "full").exists():
            for name, file, kind in outcomes(run / "full"):
                result[name] = (file, kind, 2)
    table = defaultdict(lambda: defaultdict(int))
    for file, kind, pass_ in result.values():
        row = table[file]
        row["tried"] += 1
        key = kind if kind != "caught" else ("caught (unit)" if pass_ == 1 else "caught (suite)")
        row[key] += 1
    cols = ["tried", "caught (unit)", "caught (suite)", "timeout", "unviable", "missed"]
    print("| file | " + " | ".join(cols) + " |")
    print("|---" * (len(cols) + 1) + "|")
    total = defaultdict(int)
    for file in sorted(table):
        print(f"| `{file}` | " + " | ".join(str(table[file][c]) for c in cols) + " |")
        for c in cols:
            total[c] += table[file][c]
    print("| **total** | " + " | ".join(f"**{total[c]}**" for c in cols) + " |")
    missed = sorted(n for n, (_, kind, _) in result.items() if kind == "missed")
    if missed:
        print(f"\nmissed ({len(missed)}):")
        for name in missed:
            print("  " + name)


if __name__ == "__main__":
    main(sys.argv[1:])
