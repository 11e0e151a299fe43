"""The streaming pipeline: text -> vLLM token ids -> codec steps -> windows -> crossfaded audio.

A ``Pipeline`` owns one engine, one codec and the decode scheduler that batches every live
request's windows; its model family (``families``) supplies everything that differs between
codecs. ``synthesize`` validates a request and returns its lazy ``Synthesis``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import replace
from typing import Any, Mapping, Sequence

from ..codecs.base import Codec
from ..normalization import TextNormalizer, check_mode, normalize_off_loop
from ..normalization.normalizer import spoken_lengths_later
from ..validation import check_int
from .adapters import Adapter
from .alarm import SharedAlarm
from .chunking import ChunkerOptions, chunk_text
from .engine import SamplingOptions, VllmEngine
from .engine_options import draw_seed
from .family import ModelFamily, family_for
from .gc_heap import freeze_startup_heap, full_collections, release_closed_heap
from .guards import GuardLog
from .options import MAX_QUEUED_OUTPUT_STEPS, PipelineOptions
from .pacing import planner_sizes
from .parsing import TokenTable
from .request_run import piece_seed
from .sampling_policy import SamplingPolicy
from .scheduler import DecodeScheduler
from .synthesis import AudioChunk, EmptyTextError, Synthesis
from .windowing import WindowOptions, ramp_sizes, steady_window_steps
from ..watermark import PerthWatermarker, check_watermark_mode

logger = logging.getLogger(__name__)

__all__ = ["AudioChunk", "EmptyTextError", "Pipeline", "PipelineOptions", "Synthesis",
           "piece_seed"]


def streamed_window(window: WindowOptions, lookahead: int | None) -> WindowOptions:
    """A streaming codec's windows: no left context (its state carries the past), the
    decoder's reach as right context, and first audio after as many steps as the
    windowed shape waits for (``first + right``), or one more where the reach is longer."""
    if not lookahead:
        return window
    first = max(1, window.first + window.right - lookahead)
    return replace(window, first=first, left=0, right=lookahead).validate()


class Pipeline:
    """Owns one engine, one codec and the decode scheduler that serves them.

    One pipeline per model per process is the intended use (``plugin.tts.shared_pipeline`` and the
    server each build one); two pipelines on one machine would mean two engines and two
    schedulers competing for the same device."""

    def __init__(self, engine: VllmEngine, codec: Codec, profile: Any,
                 options: PipelineOptions = PipelineOptions(), *,
                 watermarker: PerthWatermarker | None = None) -> None:
        """``profile``: a model profile (``models.profiles``), whose ``codec`` picks the
        family that reads it. ``watermarker``: applied to every stream's audio (``load_pipeline``
        resolves it from ``options.watermark``); None: no watermark."""
        if codec.sample_rate != profile.sample_rate:
            raise ValueError(
                f"codec sample rate {codec.sample_rate} != profile {profile.name} "
                f"sample rate {profile.sample_rate}"
            )
        check_int("queued_output_steps", options.queued_output_steps, 0,
                  MAX_QUEUED_OUTPUT_STEPS)
        options.guards.validate()
        check_mode(options.normalization.mode)
        check_watermark_mode(options.watermark)
        self._normalizers: dict[tuple, TextNormalizer] = {}
        self.engine = engine
        self.codec = codec
        self.profile = profile
        self.options = options
        self.watermarker = watermarker
        self.scheduler = DecodeScheduler(codec, options.scheduler)
        self.family: ModelFamily = family_for(profile)
        lookahead = getattr(codec, "lookahead_steps", None)
        shape = self.family.decode_shape(options.decode)
        self.window = streamed_window(shape.window, lookahead)
        logger.info("codec decode", extra={
            "codec": codec.name, "decode": "streamed" if lookahead else "windowed",
            "window_first": self.window.first, "window_left": self.window.left,
            "window_right": self.window.right})
        self.pacing = shape.pacing
        self.alarm = (SharedAlarm(self.pacing.pull_tick_ms / 1000.0)
                      if options.adaptive_windows and self.pacing.pull_tick_ms > 0 else None)
        self._table: TokenTable | None = None
        self.codec_model: str | None = None
        """Where the codec was loaded from (``models.loading``): its speaker encoder lives
        there."""
        self.random_weights = False
        """Whether the model's weights are random (a tiny test model, ``load_format``
        dummy): ``/health`` says so, since it speaks noise."""
        self._ready = False
        self._warm: asyncio.Future | None = None
        self._graphs: asyncio.Future | None = None

    @property
    def sampling(self) -> SamplingPolicy:
        """How this pipeline's requests sample (read from its options as they are now)."""
        return SamplingPolicy(self.profile, self.family, self.options,
                              self.engine.options.max_model_len)

    @property
    def sample_rate(self) -> int:
        return self.profile.sample_rate

    def window_steps(self) -> list[int]:
        """The window shapes (codec steps) this pipeline's planner decodes in steady state."""
        sizes = (planner_sizes(self.window, self.pacing) if self.options.adaptive_windows
                 else ramp_sizes(self.window))
        return steady_window_steps(self.window, sizes)

    def _capture_graphs(self) -> None:
        """Where the codec replays CUDA graphs, every steady window shape is captured now
        rather than in the middle of serving. After vLLM has started: it sizes its KV cache
        from the memory free while it starts, and the graphs' memory pool must not be in it."""
        if getattr(self.codec, "graphs", None) is None:
            return
        from ..codecs.cuda_graphs import capture_windows  # torch: a local engine only

        started = time.perf_counter()
        captured = capture_windows(self.codec, self.window_steps(),
                                   self.options.scheduler.max_batch)
        logger.info("CUDA graphs captured before serving", extra={
            "graphs": captured, "ms": round((time.perf_counter() - started) * 1000)})

    @property
    def ready(self) -> bool:
        """Started, codec warm, and the engine alive."""
        return self._ready and self.engine.health.state == "ready"

    async def _once(self, name: str) -> None:
        """Await the shared start step held in attribute ``name``; a step that failed is
        dropped, so the next start tries it again (a transient CUDA out-of-memory while
        vLLM still starts must not fail every request until the process restarts)."""
        step = getattr(self, name)
        try:
            await asyncio.shield(step)
        except Exception:
            if getattr(self, name) is step and step.done() and not step.cancelled():
                setattr(self, name, None)
            raise

    async def start(self, timeout: float | None = None) -> None:
        """Start vLLM and warm the codec; safe to call many times and from many callers.

        ``timeout`` (default ``EngineOptions.startup_timeout_s``) bounds only this caller's
        wait (``EngineStartingError``); the start itself is never cancelled by a waiter, so
        a timed-out or retried request can never start a second engine."""
        if self._ready and self.engine.started:
            return
        if timeout is None:
            timeout = self.engine.options.startup_timeout_s
        loop = asyncio.get_running_loop()
        if self._warm is None:
            self._warm = self.scheduler.run_on_codec_thread(self.codec.warmup)
        await self.engine.start(timeout)
        await self._once("_warm")
        if self._graphs is None:
            self._graphs = loop.run_in_executor(None, self._capture_graphs)
        await self._once("_graphs")
        if not self._ready:
            self.table.as_lists()  # the tokenizer and token table, before the first request
            self._check_tags()
            if self.options.freeze_gc_heap:
                freeze_startup_heap()
            full_collections.defer(self.options.gc_full_interval_s)
        self._ready = True

    def _check_tags(self) -> None:
        """Each tag the profile performs must be one token of the loaded tokenizer, as the
        model was trained (Maya1's server asserts it at load): a tag this tokenizer splits
        reaches the model as plain text. Named once, in a warning, at start."""
        tags = getattr(self.profile, "tags", ())
        split = [t for t in tags
                 if len(self.engine.tokenizer.encode(f"<{t}>", add_special_tokens=False)) != 1]
        if split:
            logger.warning("tags that are not one token of this tokenizer: the model reads them "
                           "as text", extra={"tags": split, "profile": self.profile.name})

    @property
    def table(self) -> TokenTable:
        """The token table, built once (from the tokenizer's vocabulary where needed)."""
        if self._table is None:
            self._table = self.family.token_table(self.engine.tokenizer)
        return self._table

    def normalizer(self, pronunciations: Mapping[str, str] | None = None) -> TextNormalizer:
        """The profile's normaliser, with the pipeline's pronunciations and these (a few kept:
        one regular expression each)."""
        norm = self.options.normalization
        words = {**norm.pronunciations, **(pronunciations or {})}
        key = tuple(sorted(words.items()))
        found = self._normalizers.get(key)
        if found is None:
            found = TextNormalizer(getattr(self.profile, "languages", ("en",)),
                                   norm.locale or getattr(self.profile, "locale", "en-US"), words)
            if len(self._normalizers) < 64:
                self._normalizers[key] = found
        return found

    async def normalized(self, text: str, request_id: str, mode: str | None = None,
                         pronunciations: Mapping[str, str] | None = None) -> str:
        """``text`` as the model must read it (``mode`` None: the pipeline's; ``off``: as
        written), normalised off the event loop; a failure leaves it as written."""
        if (mode or self.options.normalization.mode) == "off":
            return text
        return await normalize_off_loop(self.normalizer(pronunciations), text, request_id)

    def spoken_lengths(self, words: list[str],
                       pronunciations: Mapping[str, str] | None = None) -> asyncio.Future:
        """Per word of a normalised chunk, the characters it was read as, computed off the
        event loop after the chunk's own text (its transcript's timing weights)."""
        return spoken_lengths_later(self.normalizer(pronunciations), words)

    def adapter(self, name: str) -> Adapter:
        """The adapter served as ``name`` now (ValueError: none)."""
        lora = self.engine.adapters.get(name)
        if lora is None:
            raise ValueError(f"unknown adapter {name!r}; registered: "
                             f"{', '.join(self.engine.adapters.names) or 'none'}")
        return lora

    def synthesize(self, text: str, *, voice: str | None = None,
                   sampling: SamplingOptions | None = None, seed: int | None = None,
                   request_id: str | None = None,
                   speaker_globals: Sequence[int] | None = None,
                   adapter: str | Adapter | None = None,
                   guard_log: GuardLog | None = None) -> Synthesis:
        """Validate everything, then return the (lazy) audio stream of ``text``.

        ``speaker_globals`` (families with speaker tokens: BiCodec) makes this a
        continuation: the prompt pre-fills those 32 globals and the model generates semantic
        tokens only. ``adapter``: a LoRA adapter the engine serves (by name), or one a turn
        holds, applied to every engine request of this synthesis (its name is then a speaker
        name too).
        ``guard_log``: the turn's, where this text is one chunk of a turn (its guards then
        warn once per turn); None: its own.
        """
        if not text or not text.strip():
            raise EmptyTextError("text to synthesize is empty")
        lora = self.adapter(adapter) if isinstance(adapter, str) else adapter
        if lora is not None and not self.engine.adapters.usable(lora):
            raise ValueError(f"adapter {lora.name!r} is no longer served")
        speakers = {} if lora is None else {"speakers": (lora.name,)}
        voice, globals_ = self.family.check_voice(
            self.profile.default_voice if voice is None else voice, speaker_globals, **speakers)
        sampling = (sampling or self.sampling.defaults()).validate()
        if seed is None:
            seed = sampling.seed if sampling.seed is not None else draw_seed()
        sampling = replace(sampling, seed=seed).validate()
        text = " ".join(text.split())
        limit = self.sampling.max_chars_per_request(
            self.family.voice_prompt_tokens(self.engine.tokenizer, voice, globals_))
        pieces = [text] if len(text) <= limit else chunk_text(
            text, ChunkerOptions(first_min_chars=min(12, limit), first_max_chars=limit,
                                 min_chars=min(40, limit), max_chars=limit))
        rid = request_id or self.engine.new_request_id()
        return Synthesis(self, pieces, voice, sampling, seed, rid, globals_, lora,
                         guard_log or GuardLog())

    async def aclose(self) -> None:
        await self.scheduler.aclose()
        await self.engine.aclose()
        if self._ready and self.options.freeze_gc_heap:
            self._ready = False
            release_closed_heap()
