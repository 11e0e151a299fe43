"""The committed benchmark results (bench/results/*.json) as figures for the docs' benchmark
page (docs/figures/*.svg). Each figure names the machine and the date of its run; a result
that is not there is skipped with a log line.

    python bench/plots.py [--results bench/results] [--out docs/figures]
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # files only, no display
matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable figures
matplotlib.rcParams["svg.hashsalt"] = "veena"  # the same file for the same results
import matplotlib.pyplot as plt  # noqa: E402

logger = logging.getLogger("bench.plots")
ROOT = Path(__file__).resolve().parents[1]


def _caption(result: dict) -> str:
    """Where and when: the run's machine (as ``_common.report`` wrote it) and date."""
    machine = (f"{result['cpu']}, {result['cores']} cores" if result.get("cpu")
               else result.get("processor") or result.get("machine") or "unknown machine")
    return f"bench/{result['benchmark']}: {machine}, {result['time'][:10]}"


def _figure(result: dict, title: str):
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    fig.suptitle(title, fontsize=11)
    ax.set_title(_caption(result), fontsize=7, color="0.4")
    ax.grid(alpha=0.3)
    return fig, ax


def server_load(r: dict):
    rows = r["rows"]
    fig, ax = _figure(r, "First audio against concurrent streams (server, tiny model)")
    n = [x["streams"] for x in rows]
    for key, label in (("first_audio_p50_ms", "p50"), ("first_audio_p95_ms", "p95")):
        ax.plot(n, [x[key] for x in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("first audio (ms)")
    ax.legend()
    return fig


def scheduler(r: dict):
    rows = [x for x in r["rows"] if x["token_rate_x_realtime"] is not None]
    fig, ax = _figure(r, "Gaps heard against the token rate (one stream)")
    for mode in dict.fromkeys(x["mode"] for x in rows):
        pts = sorted((x["token_rate_x_realtime"], x["gap_s_after_first_audio"])
                     for x in rows if x["mode"] == mode and x["streams"] == 1)
        if pts:
            ax.plot(*zip(*pts), marker="o", label=mode)
    ax.set_xlabel("token rate (x real time)")
    ax.set_ylabel("gap after first audio (s)")
    ax.legend()
    return fig


def _bars(r: dict, title: str, labels: list[str], values: list[float], xlabel: str):
    fig, ax = _figure(r, title)
    ax.barh(labels, values)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.tick_params(axis="y", labelsize=8)
    return fig


def snac_decode(r: dict):
    rows = r["rows"]
    return _bars(r, "SNAC decode work per kept sample", [x["scheme"] for x in rows],
                 [x["decoded_per_kept"] for x in rows],
                 "decoded samples per kept sample (1 = one pass)")


def guards_pipeline(r: dict):
    rows = r["rows"]
    fig, ax = _figure(r, f"Pipeline CPU per audio second, {rows[0]['streams']} streams, "
                         "guards on and off")
    ax.bar([f"guards {x['guards']}" for x in rows], [x["cpu_ms_per_audio_s"] for x in rows])
    ax.set_ylabel("CPU ms per audio second")
    return fig


def guards_each(r: dict):
    rows = r["rows"]
    return _bars(r, "Each guard's CPU per audio second (one stream)",
                 [x["guard"] for x in rows], [x["cpu_ms_per_audio_s"] for x in rows],
                 "CPU ms per audio second")


def parser(r: dict):
    rows = r["rows"]
    fig, ax = _figure(r, "Token parsing cost per token")
    n = [x["tokens"] for x in rows]
    ax.plot(n, [x["ours_ns_per_token"] for x in rows], marker="o", label="ours (lookup table)")
    ax.plot(n, [x["baseline_ns_per_token"] for x in rows], marker="o",
            label="decode all text + regex per step")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("tokens in the stream")
    ax.set_ylabel("ns per token")
    ax.legend()
    return fig


def lora(r: dict):
    rows = r["rows"]
    return _bars(r, f"LoRA on vLLM-CPU, {rows[0]['streams']} streams: tokens/s",
                 [f"{x['batch']} ({x['adapters']} adapters)" for x in rows],
                 [x["throughput_vs_lora_off"] for x in rows], "tokens/s relative to LoRA off")


def neucodec_stream(r: dict):
    """Neuphonic's streaming decode against ours: work, error and gaps, each scheme's runs."""
    rows = r["rows"]
    fig, axes = plt.subplots(1, 3, figsize=(9.6, 3.4), layout="constrained")
    fig.suptitle("NeuCodec streaming decode, same full-size random weights: Neuphonic's "
                 "windows against ours", fontsize=11)
    axes[1].set_title(_caption(r), fontsize=7, color="0.4")
    names = list(dict.fromkeys(x["scheme"].split(" first")[0].replace(" ramp", "").replace(
        " paced", "") for x in rows))

    def of(name: str, key: str, live: bool) -> list[float]:
        return [x[key] for x in rows if x["scheme"].startswith(name)
                and (x["rate_x_realtime"] != "offline") == live]

    first = {n: of(n, "first_audio_codes", False)[0] for n in names}
    labels = [f"{n}\n(first audio after {first[n]} codes)" for n in names]
    for ax, key, live, xlabel in (
            (axes[0], "decoded_per_kept", False, "decoded frames per kept frame"),
            (axes[1], "rel_rms_err", False, "relative RMS error vs one pass"),
            (axes[2], "gap_s_after_first_audio", True, "gaps heard at 1x (s per run)")):
        for i, n in enumerate(names):
            values = of(n, key, live)
            ax.scatter(values, [i] * len(values), s=30, color=f"C{i}")
            ax.barh(i, sum(values) / len(values), alpha=0.35, color=f"C{i}")
        ax.set_yticks(range(len(names)), labels if ax is axes[0] else [""] * len(names),
                      fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(alpha=0.3)
    return fig


FIGURES: dict[str, Callable] = {
    "server_load": server_load, "scheduler": scheduler, "snac_decode": snac_decode,
    "guards_pipeline": guards_pipeline, "guards_each": guards_each, "parser": parser,
    "lora": lora, "neucodec_stream": neucodec_stream,
}


def plot_all(results: Path, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    made = []
    for name, draw in FIGURES.items():
        path = results / f"{name}.json"
        if not path.exists():
            logger.info("no %s: skipped", path)
            continue
        fig = draw(json.loads(path.read_text()))
        target = out / f"{name}.svg"
        fig.savefig(target, metadata={"Date": None})  # the same file for the same results
        plt.close(fig)
        made.append(target)
        logger.info("wrote %s", target)
    return made


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", type=Path, default=ROOT / "bench" / "results")
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "figures")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    plot_all(args.results, args.out)


if __name__ == "__main__":
    main()
