"""Freeze the start-up heap, so a full garbage collection no longer pauses every stream.

After start-up the process holds torch, vLLM, transformers and their modules: about 160,000
tracked objects. A full (oldest-generation) collection walks them all, and streaming's
allocation churn triggers one every second or two: measured with 256 real-time streams
(``bench/control_plane.py``), each paused the one event loop that every stream shares for
90-340 ms, which every listener hears as a gap. Frozen after start-up (``gc.freeze``, as
vLLM's own API server does), a collection walks only what was allocated since. What start-up
left behind is never freed; it is alive for the process's life anyway. Anything loaded after
the freeze (a lazy import on a first request) is walked again by every full collection, so
the pipeline loads its tokenizer and token table before it freezes.
"""

from __future__ import annotations

import gc
import logging
import time

logger = logging.getLogger(__name__)


def freeze_startup_heap() -> None:
    """Collect once, then freeze every object alive now. Called when a pipeline has started
    (engine, codec, tokenizer and token table loaded); a second pipeline's start freezes what
    was loaded since (cheap: the frozen part is not walked again)."""
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    logger.info("froze the start-up heap (full collections skip it from now on)",
                extra={"objects": gc.get_freeze_count(),
                       "ms": round((time.perf_counter() - started) * 1000, 1)})
