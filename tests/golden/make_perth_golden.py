"""Golden output of Perth's own implicit watermarker (``resemble-perth`` 1.0.1,
``perth.PerthImplicitWatermarker``), for ``tests/watermark/test_perth_golden.py``: the
project's port (``livekit.plugins.veena.watermark.perth``) must write the same samples.

Not run by CI, nor by the test suite. It needs torchaudio and librosa, which cannot be
installed beside vLLM's CPU torch, so it was run once in a side environment:

    python3 -m venv /tmp/side-perth
    /tmp/side-perth/bin/pip install "torch==2.11.0" "torchaudio==2.11.0" \\
        "resemble-perth==1.0.1" "soxr==1.1.0" librosa scipy pyyaml "setuptools<82" numpy
    /tmp/side-perth/bin/python tests/golden/make_perth_golden.py

(resolved: torch 2.11.0+cu130 run on the CPU, torchaudio 2.11.0+cu130, librosa 0.11.0,
soxr 1.1.0, numpy 2.4.6, Python 3.11.7; torchaudio 2.11.1 does not load beside torch 2.11.0).
Perth is imported and run unchanged, with its published weights; nothing is copied.

Writes ``tests/golden/perth/golden.npz``: two seeded speech-like clips at 24 kHz (a voiced
1.2 s clip whose length is a whole number of Perth hops, and a short one that is not, which
Perth's output is shorter than), each clip's watermarked output, and Perth's detector
(``get_watermark``, unrounded) on each clip and on its watermarked output.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

RATE = 24000
OUT = Path(__file__).resolve().parent / "perth" / "golden.npz"


def speech_like(seconds: float, extra: int, seed: int) -> np.ndarray:
    """Harmonics of a gliding pitch under a syllable-rate envelope, with breath noise and
    a silent gap (the encoder's mask skips near-silent frames)."""
    rng = np.random.default_rng(seed)
    n = int(seconds * RATE) + extra
    t = np.arange(n) / RATE
    f0 = 120 + 40 * np.sin(2 * np.pi * 0.7 * t) + 10 * rng.standard_normal() * t
    phase = 2 * np.pi * np.cumsum(f0) / RATE
    voiced = sum((0.5 / k) * np.sin(k * phase + rng.uniform(0, 2 * np.pi))
                 for k in range(1, 25))
    envelope = np.clip(np.sin(2 * np.pi * 3.1 * t + 0.3), 0, None) ** 0.7
    clip = 0.3 * voiced * envelope + 0.01 * rng.standard_normal(n)
    gap = slice(int(0.55 * RATE), int(0.62 * RATE))
    clip[gap] = 0.0
    return clip.astype(np.float32)


def main() -> None:
    import perth

    marker = perth.PerthImplicitWatermarker()
    out = {}
    for name, seconds, extra, seed in (("voiced", 1.2, 0, 1), ("odd", 0.4, 77, 2)):
        clip = speech_like(seconds, extra, seed)
        marked = marker.apply_watermark(clip, sample_rate=RATE)
        out[f"{name}_input"] = clip
        out[f"{name}_watermarked"] = np.asarray(marked, dtype=np.float32)
        out[f"{name}_detect_clean"] = np.float32(
            marker.get_watermark(clip, sample_rate=RATE, round=False))
        out[f"{name}_detect_marked"] = np.float32(
            marker.get_watermark(marked, sample_rate=RATE, round=False))
        print(name, len(clip), len(marked), out[f"{name}_detect_clean"],
              out[f"{name}_detect_marked"])
    OUT.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT, **out)


if __name__ == "__main__":
    main()
