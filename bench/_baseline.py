"""A benchmark run alternately on two trees in one run: each of ``pairs`` pairs runs the
script once on the package under ``baseline/plugin`` ("before") and once on the script's own
tree's ("after"), each in a process of its own (so each imports its own tree), and one table of
both. The before and after of a change measured on one machine at one time, alternated, so
a change in the machine's load hits both."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from _common import RESULTS, report


def compare_trees(script: Path, name: str, baseline: Path, pairs: int, label: str,
                  argv: list[str], columns: tuple[str, ...]) -> None:
    """Runs ``script argv --label L`` per tree and pair; reads its ``NAME{L}.json`` rows;
    writes ``NAME{label}_pairs`` (.json, .md) with ``columns`` (``pair`` and ``tree``
    first)."""
    if not (baseline / "plugin" / "livekit" / "plugins" / "veena").is_dir():
        raise SystemExit(f"--baseline {baseline}: no plugin/livekit/plugins/veena there")
    trees = {"before": baseline / "plugin", "after": script.resolve().parent.parent / "plugin"}
    rows = []
    for pair in range(1, pairs + 1):
        for tree, plugin in trees.items():
            env = dict(os.environ)
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin),
                                                              env.get("PYTHONPATH", "")]))
            run_label = f"{label}_{tree}{pair}"
            subprocess.run([sys.executable, str(script), *argv, "--label", run_label],
                           env=env, check=True)
            result = json.loads((RESULTS / f"{name}{run_label}.json").read_text())
            rows += [{"pair": pair, "tree": tree, **r} for r in result["rows"]]
    table = [{c: r.get(c) for c in columns} for r in rows]
    report(f"{name}{label}_pairs", table,
           {"baseline": str(baseline), "pairs": pairs, "argv": argv,
            "what": "the same plan alternately on the baseline's package and this tree's, "
                    "each run its own process"})

    def fmt(v) -> str:
        return "" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r[c]) for c in columns) + " |" for r in table]
    (RESULTS / f"{name}{label}_pairs.md").write_text("\n".join(lines) + "\n")


def without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """``argv`` less ``options`` and their values (``--x v`` or ``--x=v``)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            out.append(a)
    return out
