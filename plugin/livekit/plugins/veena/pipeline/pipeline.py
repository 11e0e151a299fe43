"""The streaming pipeline: text -> vLLM token ids -> codec steps -> windows -> crossfaded audio.

A ``Pipeline`` owns one engine, one codec and the decode scheduler that batches every live
request's windows; its model family (``families``) supplies everything that differs between
codecs. ``synthesize`` validates a request and returns its lazy ``Synthesis``.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import math
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..codecs.base import Codec
from ..codecs.torch_threads import single_threaded_torch
from ..models.download import llm_location, local_checkpoint
from ..models.families import ModelFamily, family_for
from ..models.profiles import (
    ModelProfile,
    check_cloned_voice,
    read_manifest,
    resolve_profile,
)
from ..settings import env_bool, env_bool_or_auto, env_float, env_int, env_str
from ..validation import check_int
from .alarm import SharedAlarm
from .chunking import ChunkerOptions, chunk_text
from .engine import EngineOptions, SamplingOptions, VllmEngine
from .engine_options import draw_seed
from .gc_heap import freeze_startup_heap, full_collections
from .pacing import PacingOptions, planner_sizes
from .parsing import TokenTable
from .request_run import piece_seed
from .scheduler import DecodeScheduler, SchedulerOptions
from .synthesis import AudioChunk, EmptyTextError, Synthesis
from .windowing import WindowOptions, ramp_sizes, steady_window_steps

logger = logging.getLogger(__name__)

__all__ = ["AudioChunk", "EmptyTextError", "Pipeline", "PipelineOptions", "Synthesis",
           "piece_seed"]


LOCAL_ENGINE_MODULES = ("torch", "vllm", "snac", "safetensors", "yaml")
"""What running a model in this process needs beyond the base (client-side) install."""


class MissingExtraError(ImportError):
    """The local engine's packages are not installed (the base install is the client)."""


def require_local_engine() -> None:
    """Say exactly what to install before anything tries to import torch or vLLM."""
    missing = [m for m in LOCAL_ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            "running a model in this process (veena.TTS(model=...), veena-tts say/serve) needs "
            "the local engine: pip install 'livekit-plugins-veena[cpu]' on a machine without "
            "CUDA, or 'livekit-plugins-veena[cuda]' with CUDA (missing: " + ", ".join(missing)
            + "); or speak through a server with veena.TTS(base_url=...)")


MAX_QUEUED_OUTPUT_STEPS = 64
"""``PipelineOptions.queued_output_steps`` at most (vLLM's interval stays within reason)."""


@dataclass(frozen=True)
class PipelineOptions:
    """Decode-side tunables; ``from_env`` reads each from its ``VEENA_*`` variable."""

    snac_window: WindowOptions = WindowOptions(first=2, new=8, left=2, right=2)
    bicodec_window: WindowOptions = WindowOptions(first=10, new=50, left=40, right=20)
    adaptive_windows: bool = True
    """Size windows from the listener's buffer (``pacing``); False: the fixed ramp."""
    snac_pacing: PacingOptions = PacingOptions(max_new=32)
    bicodec_pacing: PacingOptions = PacingOptions(max_new=160)
    crossfade_ms: float = 10.0
    scheduler: SchedulerOptions = SchedulerOptions()
    codec_device: str = "cpu"
    codec_cuda_graphs: bool = True
    """Where the codec runs on CUDA, replay its decoder from a CUDA graph per window shape
    (``codecs.cuda_graphs``): one launch instead of hundreds of kernels per call."""
    snac_streaming: bool | None = None
    """Decode SNAC incrementally (``codecs.snac_streaming``): every step once, exactly the
    one-pass audio, first audio after as many steps; no CUDA graphs. False: overlapping
    windows (``windowing``). None (``auto``): streaming where the codec runs on the CPU,
    where it measured better at every stream count tried (1-8); windows on CUDA, where the captured
    graphs are what a GPU's many streams were measured with."""
    torch_threads: int = 0
    """0 leaves torch's own default."""
    max_audio_s_per_char: float = 0.2
    """Token budget: at most this much audio per input character (plus 2 s), which stops
    runaway generation on long or repetitive text."""
    freeze_gc_heap: bool = True
    """Once started, freeze the start-up heap so full garbage collections stop pausing the
    event loop (``gc_heap``)."""
    queued_output_steps: int = 1
    """A text chunk that starts while an earlier chunk of its turn still generates (its audio
    waits behind that one's) has vLLM hand its tokens over once per this many codec steps
    (vLLM's ``stream_interval``; SNAC: 7 tokens a step) instead of per token: a seventh of
    the outputs for vLLM's front end to build and fewer wakes, each delivery at most one
    engine step later, which its listener, still hearing the earlier chunk, does not hear.
    0: every token. A first chunk always takes every token (its first audio waits on it)."""
    gc_full_interval_s: float = 300.0
    """Once started, full garbage collections wait until no stream plays, or at most this
    long (checked as a stream starts); 0: Python's own schedule (``gc_heap``)."""

    def streams_snac(self) -> bool:
        """Whether ``from_model`` builds a streaming SNAC codec (``auto`` resolved)."""
        if self.snac_streaming is not None:
            return self.snac_streaming
        return not self.codec_device.startswith("cuda")

    @classmethod
    def from_env(cls) -> "PipelineOptions":
        def window(prefix: str, d: WindowOptions) -> WindowOptions:
            return WindowOptions(
                first=env_int(f"{prefix}_FIRST", d.first),
                new=env_int(f"{prefix}_NEW", d.new),
                left=env_int(f"{prefix}_LEFT", d.left),
                right=env_int(f"{prefix}_RIGHT", d.right),
            ).validate()

        def pacing(prefix: str, d: PacingOptions) -> PacingOptions:
            return PacingOptions(
                max_new=env_int(f"{prefix}_MAX", d.max_new),
                rebuffer_ms=env_float("VEENA_REBUFFER_MS", d.rebuffer_ms),
                margin=env_float("VEENA_WINDOW_MARGIN", d.margin),
                pull_tick_ms=env_float("VEENA_PULL_TICK_MS", d.pull_tick_ms),
            ).validate()

        return cls(
            snac_window=window("VEENA_SNAC_WINDOW", cls.snac_window),
            bicodec_window=window("VEENA_BICODEC_WINDOW", cls.bicodec_window),
            adaptive_windows=env_bool("VEENA_ADAPTIVE_WINDOWS", cls.adaptive_windows),
            snac_pacing=pacing("VEENA_SNAC_WINDOW", cls.snac_pacing),
            bicodec_pacing=pacing("VEENA_BICODEC_WINDOW", cls.bicodec_pacing),
            crossfade_ms=env_float("VEENA_CROSSFADE_MS", cls.crossfade_ms),
            scheduler=SchedulerOptions(
                max_batch=env_int("VEENA_DECODE_MAX_BATCH", SchedulerOptions.max_batch),
                max_wait_ms=env_float("VEENA_DECODE_MAX_WAIT_MS", SchedulerOptions.max_wait_ms),
                adaptive_batch=env_bool("VEENA_DECODE_ADAPTIVE_BATCH", SchedulerOptions.adaptive_batch),
            ),
            codec_device=env_str("VEENA_CODEC_DEVICE", cls.codec_device),
            codec_cuda_graphs=env_bool("VEENA_CODEC_CUDA_GRAPHS", cls.codec_cuda_graphs),
            snac_streaming=env_bool_or_auto("VEENA_SNAC_STREAMING", cls.snac_streaming),
            torch_threads=env_int("VEENA_TORCH_THREADS", cls.torch_threads),
            max_audio_s_per_char=env_float("VEENA_MAX_AUDIO_S_PER_CHAR", cls.max_audio_s_per_char),
            freeze_gc_heap=env_bool("VEENA_FREEZE_GC_HEAP", cls.freeze_gc_heap),
            queued_output_steps=check_int(
                "VEENA_QUEUED_OUTPUT_STEPS",
                env_int("VEENA_QUEUED_OUTPUT_STEPS", cls.queued_output_steps), 0,
                MAX_QUEUED_OUTPUT_STEPS),
            gc_full_interval_s=_non_negative(
                "VEENA_GC_FULL_INTERVAL_S",
                env_float("VEENA_GC_FULL_INTERVAL_S", cls.gc_full_interval_s)),
        )


def engine_options_of(model: str, profile: str | ModelProfile | None = None) -> EngineOptions:
    """What ``Pipeline.from_model`` starts vLLM with for ``model`` (a shared engine core,
    ``server/shared_engine``, must be started with the same)."""
    prof = resolve_profile(model, profile)
    return EngineOptions.from_env(llm_location(local_checkpoint(model, prof), prof))


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    return value


def streamed_window(window: WindowOptions, lookahead: int | None) -> WindowOptions:
    """A streaming codec's windows: no left context (its state carries the past), the
    decoder's reach as right context, and first audio after as many steps as the
    windowed shape waits for (``first + right``), or one more where the reach is longer."""
    if not lookahead:
        return window
    first = max(1, window.first + window.right - lookahead)
    return replace(window, first=first, left=0, right=lookahead).validate()


def codec_location(model: str, profile: ModelProfile, codec_model: str | None = None) -> str:
    """Where a model's codec is: the one given, else ``VEENA_CODEC_MODEL``, else the folder its
    manifest names, else the profile's codec folder inside a local model (a Spark-TTS
    checkpoint carries ``BiCodec/``), else the profile's codec (a hub id)."""
    codec_model = codec_model or env_str("VEENA_CODEC_MODEL", "") or None
    if codec_model:
        return codec_model
    manifest = read_manifest(model)
    if manifest.get("codec_model"):
        return str(Path(model) / manifest["codec_model"])
    inside = Path(model) / profile.codec_model
    return str(inside) if inside.is_dir() else profile.codec_model


class Pipeline:
    """Owns one engine, one codec and the decode scheduler that serves them.

    One pipeline per model per process is the intended use (``plugin.tts.shared_pipeline`` and the
    server each build one); two pipelines on one machine would mean two engines and two
    schedulers competing for the same device."""

    def __init__(self, engine: VllmEngine, codec: Codec, profile: ModelProfile,
                 options: PipelineOptions = PipelineOptions()) -> None:
        if codec.sample_rate != profile.sample_rate:
            raise ValueError(
                f"codec sample rate {codec.sample_rate} != profile {profile.name} "
                f"sample rate {profile.sample_rate}"
            )
        check_int("queued_output_steps", options.queued_output_steps, 0,
                  MAX_QUEUED_OUTPUT_STEPS)
        self.engine = engine
        self.codec = codec
        self.profile = profile
        self.options = options
        self.scheduler = DecodeScheduler(codec, options.scheduler)
        self.family: ModelFamily = family_for(profile)
        lookahead = getattr(codec, "lookahead_steps", None)
        self.window = streamed_window(self.family.default_window(options), lookahead)
        logger.info("codec decode", extra={
            "codec": codec.name, "decode": "streamed" if lookahead else "windowed",
            "window_first": self.window.first, "window_left": self.window.left,
            "window_right": self.window.right})
        self.pacing = self.family.default_pacing(options)
        self.alarm = (SharedAlarm(self.pacing.pull_tick_ms / 1000.0)
                      if options.adaptive_windows and self.pacing.pull_tick_ms > 0 else None)
        self._table: TokenTable | None = None
        self.codec_model: str | None = None
        """Where the codec was loaded from (``from_model``): its speaker encoder lives there."""
        self._speaker_encoder = None
        self._speaker_lock = threading.Lock()
        self._ready = False
        self._warm: asyncio.Future | None = None
        self._graphs: asyncio.Future | None = None

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

    @classmethod
    def from_model(cls, model: str, *, profile: str | ModelProfile | None = None,
                   codec_model: str | None = None, engine_options: EngineOptions | None = None,
                   options: PipelineOptions | None = None,
                   engine_core: dict | None = None) -> "Pipeline":
        """Build from a model path or hub id; a ``veena_tts.json`` beside it names the profile.
        ``engine_core``: attach to that shared engine core (``VllmEngine``'s ``core``)."""
        require_local_engine()
        options = options or PipelineOptions.from_env()
        prof = resolve_profile(model, profile)
        model = local_checkpoint(model, prof)  # a Spark-TTS hub id: its snapshot
        manifest = read_manifest(model)
        codec_model = codec_location(model, prof, codec_model)
        if manifest.get("random_weights"):
            logger.warning(
                "this model has random weights: it produces noise, not speech",
                extra={"model": model},
            )
        if options.torch_threads > 0:
            import torch

            torch.set_num_threads(options.torch_threads)
        with single_threaded_torch(options.codec_device):
            codec = family_for(prof).load_codec(codec_model, options.codec_device,
                                                cuda_graphs=options.codec_cuda_graphs,
                                                streaming=options.streams_snac())
        engine = VllmEngine(engine_options or EngineOptions.from_env(llm_location(model, prof)),
                            core=engine_core)
        pipeline = cls(engine, codec, prof, options)
        pipeline.codec_model = codec_model
        return pipeline

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
            if self.options.freeze_gc_heap:
                freeze_startup_heap()
            full_collections.defer(self.options.gc_full_interval_s)
        self._ready = True

    @property
    def table(self) -> TokenTable:
        """The token table, built once (from the tokenizer's vocabulary where needed)."""
        if self._table is None:
            self._table = self.family.token_table(self.engine.tokenizer)
        return self._table

    def max_chars_per_request(self) -> int:
        """The longest text whose prompt plus token budget fits the model context."""
        per_char = self.options.max_audio_s_per_char * self.profile.tokens_per_second + 1.5
        fixed = 2.0 * self.profile.tokens_per_second + 96
        return max(16, int((self.engine.options.max_model_len - fixed) / per_char))

    def _token_budget(self, text: str, prompt_len: int) -> int:
        seconds = 2.0 + self.options.max_audio_s_per_char * len(text)
        budget = self.family.round_budget(int(math.ceil(seconds * self.profile.tokens_per_second)))
        return max(1, min(budget, self.engine.options.max_model_len - prompt_len))

    def synthesize(self, text: str, *, voice: str | None = None,
                   sampling: SamplingOptions | None = None, seed: int | None = None,
                   request_id: str | None = None,
                   speaker_globals: Sequence[int] | None = None) -> Synthesis:
        """Validate everything, then return the (lazy) audio stream of ``text``.

        ``speaker_globals`` (families with speaker tokens: BiCodec) makes this a
        continuation: the prompt pre-fills those 32 globals and the model generates semantic
        tokens only.
        """
        if not text or not text.strip():
            raise EmptyTextError("text to synthesize is empty")
        voice = self.profile.check_voice(self.profile.default_voice if voice is None else voice)
        sampling = (sampling or self.default_sampling()).validate()
        if seed is None:
            seed = sampling.seed if sampling.seed is not None else draw_seed()
        sampling = replace(sampling, seed=seed).validate()
        globals_ = None
        if speaker_globals is not None:
            globals_ = self.family.check_globals(speaker_globals)
        check_cloned_voice(voice, globals_)
        text = " ".join(text.split())
        limit = self.max_chars_per_request()
        pieces = [text] if len(text) <= limit else chunk_text(
            text, ChunkerOptions(first_min_chars=min(12, limit), first_max_chars=limit,
                                 min_chars=min(40, limit), max_chars=limit))
        rid = request_id or self.engine.new_request_id()
        return Synthesis(self, pieces, voice, sampling, seed, rid, globals_)

    def speaker_encoder(self):
        """The family's speaker encoder from the codec's checkpoint (voice cloning), loaded
        once on first use; ValueError where the family or this pipeline has none."""
        with self._speaker_lock:
            if self._speaker_encoder is None:
                if self.codec_model is None:
                    raise ValueError("this pipeline was built without a codec checkpoint path, "
                                     "so it has no speaker encoder (build it with from_model)")
                self._speaker_encoder = self.family.load_speaker_encoder(
                    self.codec_model, self.options.codec_device)
            return self._speaker_encoder

    def default_sampling(self) -> SamplingOptions:
        return self.family.default_sampling()

    def queued_sampling(self, sampling: SamplingOptions) -> SamplingOptions:
        """``sampling`` for a chunk whose audio waits behind a chunk still generating: its
        tokens handed over once per ``queued_output_steps`` codec steps."""
        steps = self.options.queued_output_steps
        if steps == 0:
            return sampling
        interval = steps * self.family.tokens_per_step()
        return replace(sampling, stream_interval=max(sampling.stream_interval, interval))

    def main_sampling(self, sampling: SamplingOptions, text: str, prompt_len: int
                      ) -> SamplingOptions:
        """The main request's sampling: the token budget for ``text`` and the family's
        constraints."""
        budget = self._token_budget(text, prompt_len)
        max_tokens = budget if sampling.max_tokens is None else min(sampling.max_tokens, budget)
        s = replace(sampling, max_tokens=max_tokens, min_tokens=min(sampling.min_tokens, max_tokens))
        return self.family.constrain(s, self.table)

    async def aclose(self) -> None:
        await self.scheduler.aclose()
        await self.engine.aclose()
