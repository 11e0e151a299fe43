"""Benchmark 3: the parser hot loop, ns per token.

Ours: the lookup-table SNAC framer, one step per generated token. Baseline (common in
Orpheus servers): at every step, decode ALL ids so far to text and regex-scan it for
``<custom_token_N>``. Both on the tiny Veena tokenizer (Veena's exact vocabulary layout).
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

import numpy as np
from _common import report, setup

from livekit.plugins.veena.models.profiles import VEENA
from livekit.plugins.veena.models.tiny_model import write_snac_tokenizer
from livekit.plugins.veena.pipeline.parsing import SnacFramer, TokenTable

_CUSTOM = re.compile(r"<custom_token_(\d+)>")


def stream(n: int) -> list[int]:
    rng = np.random.default_rng(0)
    codes = rng.integers(0, 4096, n)
    return [VEENA.audio_token_base + (i % 7) * 4096 + int(c) for i, c in enumerate(codes)]


def ours(ids: list[int]) -> tuple[float, int]:
    framer = SnacFramer(VEENA, TokenTable.for_snac(VEENA))
    t = time.perf_counter_ns()
    frames = 0
    for tid in ids:
        frames += len(framer.feed((tid,)))
    return (time.perf_counter_ns() - t) / len(ids), frames


def baseline(tok, ids: list[int]) -> tuple[float, int]:
    t = time.perf_counter_ns()
    frames = 0
    for i in range(1, len(ids) + 1):
        text = tok.decode(ids[:i])
        codes = [int(m) - 10 for m in _CUSTOM.findall(text)]
        frames = len(codes) // 7
    return (time.perf_counter_ns() - t) / len(ids), frames


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    args = ap.parse_args()
    setup()
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as d:
        write_snac_tokenizer(VEENA, Path(d))
        tok = AutoTokenizer.from_pretrained(d)
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        ids = stream(n)
        ours_ns, f1 = ours(ids)
        base_ns, f2 = baseline(tok, ids)
        assert f1 == f2 == n // 7
        rows.append({"tokens": n, "ours_ns_per_token": ours_ns,
                     "baseline_ns_per_token": base_ns, "speedup": base_ns / ours_ns})
    report("parser", rows)


if __name__ == "__main__":
    main()
