"""Shared by the benchmarks: a table on the log, the same numbers as JSON in bench/results/
(or in ``VEENA_BENCH_RESULTS``, so that test runs never overwrite the committed results the
docs' figures are drawn from)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

logger = logging.getLogger("bench")
RESULTS = Path(os.environ.get("VEENA_BENCH_RESULTS") or Path(__file__).resolve().parent / "results")


def fresh_processes() -> multiprocessing.context.BaseContext:
    """Processes that start clean (no threads, no torch thread team, no CUDA context of this
    one) without each importing torch and the package again (~5 s of CPU each with spawn):
    a fork server imports this script's modules once, then forks each of them from it."""
    ctx = multiprocessing.get_context("forkserver")
    script = Path(sys.modules["__main__"].__file__).resolve()
    # Python 3.11's fork server neither preloads ``__main__`` nor takes this process's
    # sys.path: it imports the script as a module, from its folder on PYTHONPATH
    path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(script.parent) not in path:
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(script.parent), *path]))
    ctx.set_forkserver_preload([script.stem])
    return ctx


def setup() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for noisy in ("vllm", "transformers", "torch", "livekit"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def report(name: str, rows: list[dict], notes: dict | None = None) -> Path:
    """Log ``rows`` as a table and write them (with machine facts) to results/NAME.json."""
    cols = list(rows[0]) if rows else []
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    widths = [max(len(c), *(len(fmt(r[c])) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(fmt(r[c]).ljust(w) for c, w in zip(cols, widths)) for r in rows]
    logger.info("\n== %s ==\n%s", name, "\n".join(lines))
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"benchmark": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                "machine": platform.platform(), "processor": platform.processor(),
                                "cpu": _cpu_name(), "cores": os.cpu_count(),
                                "notes": notes or {}, "rows": rows}, indent=2))
    return path


def _cpu_name() -> str:
    """The CPU's model name (Linux), for the figures' captions."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@contextmanager
def model_dir(given: str | None = None, family: str = "veena"):
    """``given``, or a tiny random model in a scratch folder that is removed afterwards (a
    benchmark run in CI must not leave hundreds of megabytes in /tmp each time)."""
    if given:
        yield given
        return
    from livekit.plugins.veena.models.tiny_model import make_tiny_model

    with tempfile.TemporaryDirectory(prefix=f"veena-bench-{family}-") as scratch:
        yield str(make_tiny_model(scratch, family))


class Listener:
    """A listener who plays what it has and pauses when dry: first audio (seconds after
    ``start``), seconds of gap after it, and seconds heard."""

    def __init__(self, sample_rate: int, start: float | None = None) -> None:
        self.sample_rate = sample_rate
        self.start = time.perf_counter() if start is None else start
        self.first_s: float | None = None
        self.gap_s = 0.0
        self.audio_s = 0.0
        self._play_end = 0.0

    def hear(self, samples: int) -> None:
        now = time.perf_counter()
        if self.first_s is None:
            self.first_s, self._play_end = now - self.start, now
        elif now > self._play_end:
            self.gap_s += now - self._play_end
        self._play_end = max(self._play_end, now) + samples / self.sample_rate
        self.audio_s += samples / self.sample_rate


async def listen(chunks, sample_rate: int) -> tuple[float, float]:
    """Hear a stream of ``AudioChunk``s as a ``Listener``: (first audio s from the call,
    seconds of gaps after first audio)."""
    ear = Listener(sample_rate)
    async for chunk in chunks:
        ear.hear(len(chunk.pcm))
    return ear.first_s, ear.gap_s
