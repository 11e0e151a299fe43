"""Where Perth's published implicit-watermark weights are.

They ship inside the ``resemble-perth`` wheel (``pretrained/implicit``: ``hparams.yaml`` and one
checkpoint). The wheel's own package is never imported: it imports torchaudio, librosa and
``pkg_resources`` at import time, and the CPU torch that vLLM's CPU build pins has no loadable
torchaudio. The files are found through the distribution's file list instead."""

from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass
from pathlib import Path

PERTH_DISTRIBUTION = "resemble-perth"
PERTH_VERSION = "1.0.1"
"""The release whose weights and hyperparameters the port was checked against."""
_FOLDER = "perth/perth_net/pretrained/implicit"
_CHECKPOINT_SUFFIX = ".pth.tar"


@dataclass(frozen=True)
class PerthWeights:
    """One implicit-watermarker checkpoint and its hyperparameters."""

    checkpoint: Path
    hparams: Path


def weights_in(folder: str | Path) -> PerthWeights:
    """The checkpoint in ``folder`` (the ``pretrained/implicit`` layout: ``hparams.yaml`` and
    ``perth_net_<step>.pth.tar``; the latest step where there are several, as Perth loads it).
    ValueError naming what is missing."""
    root = Path(folder)
    hparams = root / "hparams.yaml"
    if not hparams.is_file():
        raise ValueError(f"no Perth hparams.yaml in {root}")
    checkpoints = [p for p in root.iterdir() if p.name.endswith(_CHECKPOINT_SUFFIX)]
    if not checkpoints:
        raise ValueError(f"no Perth checkpoint (*{_CHECKPOINT_SUFFIX}) in {root}")
    return PerthWeights(max(checkpoints, key=_step), hparams)


def _step(path: Path) -> int:
    tail = path.name[: -len(_CHECKPOINT_SUFFIX)].rsplit("_", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def installed_perth_weights() -> PerthWeights | None:
    """The weights of the installed ``resemble-perth`` distribution, or None where it is not
    installed (or ships no implicit checkpoint)."""
    try:
        dist = importlib.metadata.distribution(PERTH_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for f in dist.files or ():
        if str(f.parent) == _FOLDER and f.name == "hparams.yaml":
            folder = Path(str(dist.locate_file(f))).parent
            try:
                return weights_in(folder)
            except ValueError:
                return None
    return None


def find_perth_weights(folder: str | Path | None = None) -> PerthWeights | None:
    """``folder`` where given (ValueError where it holds no weights), else the installed
    distribution's (None: not installed)."""
    if folder:
        return weights_in(folder)
    return installed_perth_weights()
