"""The README stays short and points at pages that exist; the benchmark figures are drawn from
the committed results by bench/plots.py, each naming its machine and date, and the benchmark
page names which results are committed and quotes them as they are. (The site itself
is built with ``mkdocs build --strict`` by scripts/test.sh: before the tests, or with two
lanes in the second one, before its tests.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_readme_is_short_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    local = [link for link in links if not link.startswith("http")]
    assert local, "the README links into the docs"
    for link in local:
        assert (ROOT / link).exists(), link


def test_every_page_in_the_nav_exists_and_every_figure_is_drawn():
    nav = re.findall(r"^\s+- [^:]+: (\S+\.md)$", (ROOT / "mkdocs.yml").read_text(), re.M)
    assert {"index.md", "guards.md", "benchmarks.md", "api.md"} <= set(nav)
    for page in nav:
        assert (ROOT / "docs" / page).exists(), page
    shown = re.findall(r"\(figures/([a-z_]+)\.svg\)", (ROOT / "docs/benchmarks.md").read_text())
    assert len(shown) >= 4
    for name in shown:
        assert (ROOT / "docs/figures" / f"{name}.svg").exists(), name
        assert (ROOT / "bench/results" / f"{name}.json").exists(), name


def test_plots_are_drawn_from_the_committed_results_with_their_machine_and_date(tmp_path):
    subprocess.run([sys.executable, "bench/plots.py", "--out", str(tmp_path)], cwd=ROOT,
                   check=True, capture_output=True, timeout=300)
    drawn = sorted(p.stem for p in tmp_path.glob("*.svg"))
    assert drawn == sorted(p.stem for p in (ROOT / "docs/figures").glob("*.svg"))
    for name in drawn:
        result = json.loads((ROOT / "bench/results" / f"{name}.json").read_text())
        svg = (tmp_path / f"{name}.svg").read_text()
        assert result["time"][:10] in svg  # the date of the run, on the figure


def _result(name: str) -> list[dict]:
    return json.loads((ROOT / "bench/results" / f"{name}.json").read_text())["rows"]


def test_the_benchmark_page_names_which_results_are_committed_and_quotes_them():
    page = " ".join((ROOT / "docs/benchmarks.md").read_text().split())
    committed = sorted(p.stem for p in (ROOT / "bench/results").glob("*.json"))
    listed = page.split("Committed, and", 1)[1].split("Not committed", 1)[0]
    assert sorted(re.findall(r"`(\w+)`", listed)) == committed
    for name in re.findall(r"`(\w+)\.json`", page):
        assert name in committed, name
    snac = {r["scheme"]: r["decoded_per_kept"] for r in _result("snac_decode")}
    parser = _result("parser")[0]
    guards = {r["guards"]: r["cpu_ms_per_audio_s"] for r in _result("guards_pipeline")}
    norm = {(r["profile"], r["chunk"]): r["ms_p50"] for r in _result("normalize")}
    quoted = [
        f"classic Orpheus window {snac['classic 28/7 keep 2048:4096']:.1f}; ours windowed "
        f"{snac['ours N=8 L=2 R=2']:.2f}; streamed {snac['ours streamed, 1 frame per call']:.1f}",
        f"{parser['ours_ns_per_token'] / 1000:.2f} µs per token against "
        f"{parser['baseline_ns_per_token'] / 1000:.0f} µs",
        f"+{guards['on'] - guards['off']:.2f} ms of CPU per audio second at 64 streams "
        f"({guards['off']:.2f} → {guards['on']:.2f})",
        f"nothing to normalise {norm[('veena', 'plain')] * 1000:.0f} µs",
        f"a time {norm[('veena', 'numbers')]:.0f} ms",
    ]
    missing = [q for q in quoted if q not in page]
    assert not missing, missing
