"""The output watermark: Perth's implicit watermark, applied where a model's reference applies
it (NeuTTS), once per emitted sample (``streaming``).

``watermarker_for`` is the one place that decides, from ``VEENA_WATERMARK`` (``auto``, ``on``,
``off``) and the profile, whether a pipeline watermarks, and loads the weights once.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

from .perth import PerthWatermarker
from .streaming import WatermarkStream
from .weights import PERTH_DISTRIBUTION, PERTH_VERSION, PerthWeights, find_perth_weights

logger = logging.getLogger(__name__)

WATERMARK_MODES = ("auto", "on", "off")

__all__ = ["WATERMARK_MODES", "PerthWatermarker", "WatermarkStream", "check_watermark_mode",
           "watermarker_for"]


def check_watermark_mode(mode: Any) -> str:
    """``mode`` as given, or ValueError naming the choices."""
    if mode not in WATERMARK_MODES:
        raise ValueError(f"watermark must be one of {', '.join(WATERMARK_MODES)}, not {mode!r}")
    return mode


def watermarker_for(mode: str, profile: Any, weights: str | Path | None = None
                    ) -> PerthWatermarker | None:
    """The watermarker a pipeline of ``profile`` applies, or None.

    ``auto``: where the profile's reference watermarks its output (its ``watermark``) and the
    weights are found (``weights``, else the installed ``resemble-perth``); where they are
    not, it is off, said once in the log. ``on``: always; no weights is a ValueError at start.
    ``off``: never."""
    check_watermark_mode(mode)
    if mode == "off" or (mode == "auto" and not getattr(profile, "watermark", "")):
        return None
    found = find_perth_weights(weights)
    if found is None:
        if mode == "on":
            raise ValueError(
                f"VEENA_WATERMARK=on, but the Perth watermark weights were not found: install "
                f"{PERTH_DISTRIBUTION}=={PERTH_VERSION} (the [neutts] extra) or point "
                "VEENA_WATERMARK_WEIGHTS at its pretrained/implicit folder")
        logger.warning("output watermark off: %s is not installed (its reference watermarks "
                       "profile %s's audio; VEENA_WATERMARK=off says so without this warning)",
                       PERTH_DISTRIBUTION, profile.name)
        return None
    marker = _load(found)
    logger.info("output watermark on (Perth implicit)",
                extra={"profile": profile.name, "weights": str(found.checkpoint)})
    return marker


@functools.lru_cache(maxsize=4)
def _load(weights: PerthWeights) -> PerthWatermarker:
    """Once per process and checkpoint (several pipelines share the weights)."""
    return PerthWatermarker(weights)
