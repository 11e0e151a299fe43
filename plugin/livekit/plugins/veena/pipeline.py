"""The streaming pipeline: text -> vLLM token ids -> codec steps -> windows -> crossfaded PCM.

Generation and decoding overlap: a producer task reads tokens, frames them and submits each
window to the shared decode scheduler as soon as it is decodable; the consumer awaits the
windows in order, stitches them and yields int16 chunks. Closing the stream aborts the vLLM
request and drops the request's pending windows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import AsyncIterator, Sequence

import numpy as np

from .chunking import ChunkerOptions, chunk_text
from .codecs.base import Codec, CodecInput
from .engine import EngineError, EngineOptions, SamplingOptions, VllmEngine
from .parsing import KIND_GLOBAL, KIND_SEMANTIC, KIND_STOP, BiCodecFramer, SnacFramer, TokenTable
from .profiles import BiCodecProfile, ModelProfile, SnacProfile, get_profile
from .scheduler import DecodeScheduler, SchedulerOptions
from .settings import env_float, env_int, env_str
from .stitching import Stitcher, to_int16
from .tiny_model import MANIFEST
from .windowing import Window, WindowOptions, WindowPlanner

logger = logging.getLogger(__name__)


class EmptyTextError(ValueError):
    """Nothing to speak: empty or whitespace-only text."""



@dataclass(frozen=True)
class PipelineOptions:
    """Decode-side tunables; ``from_env`` reads each from its ``VEENA_*`` variable."""

    snac_window: WindowOptions = WindowOptions(first=2, new=8, left=2, right=2)
    bicodec_window: WindowOptions = WindowOptions(first=10, new=50, left=40, right=20)
    crossfade_ms: float = 10.0
    scheduler: SchedulerOptions = SchedulerOptions()
    codec_device: str = "cpu"
    torch_threads: int = 0
    """0 leaves torch's own default."""
    max_audio_s_per_char: float = 0.2
    """Token budget: at most this much audio per input character (plus 2 s), which stops
    runaway generation on long or repetitive text."""

    @classmethod
    def from_env(cls) -> "PipelineOptions":
        def window(prefix: str, d: WindowOptions) -> WindowOptions:
            return WindowOptions(
                first=env_int(f"{prefix}_FIRST", d.first),
                new=env_int(f"{prefix}_NEW", d.new),
                left=env_int(f"{prefix}_LEFT", d.left),
                right=env_int(f"{prefix}_RIGHT", d.right),
            ).validate()

        return cls(
            snac_window=window("VEENA_SNAC_WINDOW", cls.snac_window),
            bicodec_window=window("VEENA_BICODEC_WINDOW", cls.bicodec_window),
            crossfade_ms=env_float("VEENA_CROSSFADE_MS", cls.crossfade_ms),
            scheduler=SchedulerOptions(
                max_batch=env_int("VEENA_DECODE_MAX_BATCH", SchedulerOptions.max_batch),
                max_wait_ms=env_float("VEENA_DECODE_MAX_WAIT_MS", SchedulerOptions.max_wait_ms),
            ),
            codec_device=env_str("VEENA_CODEC_DEVICE", cls.codec_device),
            torch_threads=env_int("VEENA_TORCH_THREADS", cls.torch_threads),
            max_audio_s_per_char=env_float("VEENA_MAX_AUDIO_S_PER_CHAR", cls.max_audio_s_per_char),
        )


@dataclass(frozen=True)
class AudioChunk:
    pcm: np.ndarray
    """int16 mono samples."""
    sample_rate: int
    sequence: int
    final: bool

    @property
    def duration(self) -> float:
        return len(self.pcm) / self.sample_rate


@dataclass
class Timings:
    """Per-request timings, seconds since ``created`` (perf_counter based)."""

    created: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    first_window_ready: float | None = None
    first_decode_done: float | None = None
    first_audio: float | None = None
    finished: float | None = None
    audio_seconds: float = 0.0
    tokens: int = 0
    invalid_frames: int = 0

    def _since(self, t: float | None) -> float | None:
        return None if t is None else t - self.created

    @property
    def first_token_ms(self) -> float | None:
        t = self._since(self.first_token)
        return None if t is None else t * 1000

    @property
    def first_audio_ms(self) -> float | None:
        t = self._since(self.first_audio)
        return None if t is None else t * 1000

    @property
    def wall_seconds(self) -> float:
        return (self.finished or time.perf_counter()) - self.created

    @property
    def real_time_factor(self) -> float | None:
        """Wall time per second of audio: below 1 is faster than real time."""
        return self.wall_seconds / self.audio_seconds if self.audio_seconds > 0 else None

    def breakdown_ms(self) -> dict[str, float | None]:
        def gap(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else (b - a) * 1000

        return {
            "queue_and_prefill": gap(self.created, self.first_token),
            "first_window_fill": gap(self.first_token, self.first_window_ready),
            "first_decode": gap(self.first_window_ready, self.first_decode_done),
            "emit": gap(self.first_decode_done, self.first_audio),
            "first_audio": self.first_audio_ms,
        }


class _SnacTrack:
    """SNAC side of one request: frames as steps, no speaker state."""

    def __init__(self, profile: SnacProfile, table: TokenTable, request_id: str) -> None:
        self.framer = SnacFramer(profile, table, request_id)
        self.steps: list[np.ndarray] = []

    def feed(self, ids: Sequence[int]) -> int:
        frames = self.framer.feed(ids)
        self.steps.extend(frames)
        return len(frames)

    def window_input(self, w: Window, seed: int) -> CodecInput:
        return CodecInput(codes=np.stack(self.steps[w.start : w.end]), start_step=w.start, seed=seed)

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        return None


class _BiCodecTrack:
    """BiCodec side of one request: the utterance's 32 globals, then semantic steps."""

    def __init__(self, profile: BiCodecProfile, table: TokenTable, request_id: str,
                 captured: Sequence[int] | None) -> None:
        self.framer = BiCodecFramer(profile, table, request_id, captured)
        self.steps: list[int] = []

    def feed(self, ids: Sequence[int]) -> int:
        new = self.framer.feed(ids)
        self.steps.extend(new)
        return len(new)

    def window_input(self, w: Window, seed: int) -> CodecInput:
        return CodecInput(
            codes=np.asarray(self.steps[w.start : w.end], dtype=np.int64),
            start_step=w.start,
            seed=seed,
            speaker=np.asarray(self.framer.globals_, dtype=np.int64),
        )

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        return tuple(self.framer.globals_) if self.framer.has_globals else None


class Synthesis:
    """One request's audio stream: iterate for chunks; ``timings`` fill in as it runs."""

    def __init__(self, pipeline: "Pipeline", pieces: list[str], voice: str,
                 sampling: SamplingOptions, seed: int, request_id: str,
                 speaker_globals: tuple[int, ...] | None) -> None:
        self._p = pipeline
        self._pieces = pieces
        self.voice = voice
        self.sampling = sampling
        self.seed = seed
        self.request_id = request_id
        self.speaker_globals = speaker_globals
        """BiCodec: the globals this request used (captured from its first piece, or given)."""
        self.globals_captured = asyncio.Event()
        """Set as soon as ``speaker_globals`` is known (at once for SNAC and continuations)."""
        if speaker_globals is not None or not isinstance(pipeline.profile, BiCodecProfile):
            self.globals_captured.set()
        self.timings = Timings()
        self._progress = time.monotonic()
        self._awaiting_tokens = True
        self._pending_windows = 0
        self.vllm_request_ids: list[str] = []
        self.tracks: list = []
        """Per piece: the codec steps parsed from the engine (kept for inspection)."""
        self._iter: AsyncIterator[AudioChunk] | None = None

    def progress_at(self) -> float:
        """When this request last moved forward (monotonic clock).

        Its own tokens and decoded windows count; so does the engine serving others while
        this request still waits for its first token (queued in vLLM behind running
        requests), and the decode scheduler finishing batches while this request's windows
        wait their turn. A stall is therefore "nothing moves", never "busy elsewhere"."""
        t = self._progress
        if self._awaiting_tokens:
            t = max(t, self._p.engine.last_output)
        if self._pending_windows:
            t = max(t, self._p.scheduler.last_done)
        return t

    def _moved(self) -> None:
        self._progress = time.monotonic()

    @property
    def pieces(self) -> list[str]:
        """The text, split where it would not fit the model context in one request."""
        return list(self._pieces)

    def __aiter__(self) -> AsyncIterator[AudioChunk]:
        if self._iter is None:
            self._iter = self._run()
        return self._iter

    async def aclose(self) -> None:
        if self._iter is not None:
            await self._iter.aclose()  # type: ignore[attr-defined]

    async def collect(self) -> np.ndarray:
        parts = [c.pcm async for c in self]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    async def _run(self) -> AsyncIterator[AudioChunk]:
        seq = 0
        for i, piece in enumerate(self._pieces):
            last_piece = i == len(self._pieces) - 1
            async with contextlib.aclosing(self._p._stream_piece(self, piece, i)) as piece_audio:
                async for pcm, done in piece_audio:
                    final = done and last_piece
                    if len(pcm) or final:
                        if len(pcm) and self.timings.first_audio is None:
                            self.timings.first_audio = time.perf_counter()
                        self.timings.audio_seconds += len(pcm) / self._p.sample_rate
                        yield AudioChunk(to_int16(pcm), self._p.sample_rate, seq, final)
                        seq += 1
        self.timings.finished = time.perf_counter()
        logger.info(
            "synthesis done",
            extra={"request_id": self.request_id, "first_audio_ms": self.timings.first_audio_ms,
                   "audio_s": round(self.timings.audio_seconds, 3),
                   "rtf": self.timings.real_time_factor, "tokens": self.timings.tokens},
        )


class Pipeline:
    """Owns one engine, one codec and the process's decode scheduler."""

    def __init__(self, engine: VllmEngine, codec: Codec, profile: ModelProfile,
                 options: PipelineOptions = PipelineOptions()) -> None:
        if codec.sample_rate != profile.sample_rate:
            raise ValueError(
                f"codec sample rate {codec.sample_rate} != profile {profile.name} "
                f"sample rate {profile.sample_rate}"
            )
        self.engine = engine
        self.codec = codec
        self.profile = profile
        self.options = options
        self.scheduler = DecodeScheduler(codec, options.scheduler)
        self.window = options.bicodec_window if isinstance(profile, BiCodecProfile) else options.snac_window
        self._table: TokenTable | None = None
        self._ready = False
        self._warm: asyncio.Future | None = None

    @property
    def sample_rate(self) -> int:
        return self.profile.sample_rate

    @property
    def ready(self) -> bool:
        """Started, codec warm, and the engine alive."""
        return self._ready and self.engine.health.state == "ready"

    @classmethod
    def from_model(cls, model: str, *, profile: str | ModelProfile | None = None,
                   codec_model: str | None = None, engine_options: EngineOptions | None = None,
                   options: PipelineOptions | None = None) -> "Pipeline":
        """Build from a model path or hub id; a ``veena_tts.json`` beside it names the profile."""
        options = options or PipelineOptions.from_env()
        manifest = _read_manifest(model)
        prof = profile or manifest.get("profile") or env_str("VEENA_PROFILE", "veena")
        prof = get_profile(prof) if isinstance(prof, str) else prof
        codec_model = codec_model or env_str("VEENA_CODEC_MODEL", "") or None
        if codec_model is None and manifest.get("codec_model"):
            codec_model = str(Path(model) / manifest["codec_model"])
        if manifest.get("random_weights"):
            logger.warning(
                "this model has random weights: it produces noise, not speech",
                extra={"model": model},
            )
        if options.torch_threads > 0:
            import torch

            torch.set_num_threads(options.torch_threads)
        codec = load_codec(prof, codec_model or prof.codec_model, options.codec_device)
        engine = VllmEngine(engine_options or EngineOptions.from_env(model))
        return cls(engine, codec, prof, options)

    async def start(self, timeout: float | None = None) -> None:
        """Start vLLM and warm the codec; safe to call many times and from many callers.

        ``timeout`` (default ``EngineOptions.startup_timeout_s``) bounds only this caller's
        wait (``EngineStartingError``); the start itself is never cancelled by a waiter, so
        a timed-out or retried request can never start a second engine."""
        if self._ready and self.engine.started:
            return
        if timeout is None:
            timeout = self.engine.options.startup_timeout_s
        if self._warm is None:
            self._warm = asyncio.get_running_loop().run_in_executor(None, self.codec.warmup)
        await self.engine.start(timeout)
        await asyncio.shield(self._warm)
        self._ready = True

    @property
    def table(self) -> TokenTable:
        if self._table is None:
            if isinstance(self.profile, SnacProfile):
                self._table = TokenTable.for_snac(self.profile)
            else:
                self._table = TokenTable.for_bicodec(self.profile, self.engine.tokenizer.get_vocab())
        return self._table

    def max_chars_per_request(self) -> int:
        """The longest text whose prompt plus token budget fits the model context."""
        per_char = self.options.max_audio_s_per_char * self.profile.tokens_per_second + 1.5
        fixed = 2.0 * self.profile.tokens_per_second + 96
        return max(16, int((self.engine.options.max_model_len - fixed) / per_char))

    def _token_budget(self, text: str, prompt_len: int) -> int:
        seconds = 2.0 + self.options.max_audio_s_per_char * len(text)
        budget = int(math.ceil(seconds * self.profile.tokens_per_second))
        if isinstance(self.profile, SnacProfile):
            budget += -budget % self.profile.tokens_per_frame
        return max(1, min(budget, self.engine.options.max_model_len - prompt_len))

    def synthesize(self, text: str, *, voice: str | None = None,
                   sampling: SamplingOptions | None = None, seed: int | None = None,
                   request_id: str | None = None,
                   speaker_globals: Sequence[int] | None = None) -> Synthesis:
        """Validate everything, then return the (lazy) audio stream of ``text``.

        ``speaker_globals`` (BiCodec only) makes this a continuation: the prompt pre-fills
        those 32 globals and the model generates semantic tokens only.
        """
        if not text or not text.strip():
            raise EmptyTextError("text to synthesize is empty")
        voice = self.profile.check_voice(voice or self.profile.default_voice)
        sampling = (sampling or self.default_sampling()).validate()
        if seed is None:
            seed = sampling.seed if sampling.seed is not None else random.getrandbits(31)
        sampling = replace(sampling, seed=seed)
        globals_ = None
        if speaker_globals is not None:
            if not isinstance(self.profile, BiCodecProfile):
                raise ValueError(f"model profile {self.profile.name} has no global tokens")
            globals_ = self.profile.check_globals(speaker_globals)
        text = " ".join(text.split())
        limit = self.max_chars_per_request()
        pieces = [text] if len(text) <= limit else chunk_text(
            text, ChunkerOptions(first_min_chars=min(12, limit), first_max_chars=limit,
                                 min_chars=min(40, limit), max_chars=limit))
        rid = request_id or self.engine.new_request_id()
        return Synthesis(self, pieces, voice, sampling, seed, rid, globals_)

    def default_sampling(self) -> SamplingOptions:
        return profile_sampling(self.profile)

    def _new_track(self, syn: Synthesis, rid: str):
        if isinstance(self.profile, SnacProfile):
            return _SnacTrack(self.profile, self.table, rid)
        return _BiCodecTrack(self.profile, self.table, rid, syn.speaker_globals)

    def _prompt(self, syn: Synthesis, text: str) -> list[int]:
        tok = self.engine.tokenizer
        if isinstance(self.profile, BiCodecProfile):
            return self.profile.build_prompt(tok, text, syn.voice, syn.speaker_globals)
        return self.profile.build_prompt(tok, text, syn.voice)

    def _sampling_for(self, syn: Synthesis, text: str, prompt_len: int) -> SamplingOptions:
        s = syn.sampling
        budget = self._token_budget(text, prompt_len)
        max_tokens = budget if s.max_tokens is None else min(s.max_tokens, budget)
        s = replace(s, max_tokens=max_tokens, min_tokens=min(s.min_tokens, max_tokens))
        if isinstance(self.profile, BiCodecProfile):
            s = replace(s, stop_token_ids=s.stop_token_ids or self.table.ids(KIND_STOP),
                        allowed_token_ids=self.table.ids(KIND_SEMANTIC, KIND_STOP))
        return s

    def _globals_sampling(self, syn: Synthesis) -> SamplingOptions:
        """A first BiCodec request: exactly the 32 global tokens, nothing else."""
        assert isinstance(self.profile, BiCodecProfile)
        n = self.profile.num_global_tokens
        return replace(syn.sampling, max_tokens=n, min_tokens=n, stop_token_ids=(),
                       allowed_token_ids=self.table.ids(KIND_GLOBAL))

    async def _stream_piece(self, syn: Synthesis, text: str, index: int
                            ) -> AsyncIterator[tuple[np.ndarray, bool]]:
        """Yield (float samples, done) for one engine request over ``text``."""
        await self.start()
        rid = syn.request_id if index == 0 else f"{syn.request_id}.{index}"
        track = self._new_track(syn, rid)
        syn.tracks.append(track)
        planner = WindowPlanner(self.window)
        stitcher = Stitcher(self.codec.samples_per_step,
                            int(self.options.crossfade_ms * self.sample_rate / 1000))
        queue: asyncio.Queue[tuple[Window, asyncio.Future] | None] = asyncio.Queue()
        timings = syn.timings
        seed = piece_seed(syn.seed, index)

        def submit(windows: list[Window]) -> None:
            for w in windows:
                if timings.first_window_ready is None:
                    timings.first_window_ready = time.perf_counter()
                syn._pending_windows += 1
                queue.put_nowait((w, self.scheduler.submit(rid, track.window_input(w, seed))))

        async def generate(prompt: list[int], sampling: SamplingOptions, request_id: str) -> None:
            syn.vllm_request_ids.append(request_id)
            syn._awaiting_tokens = True
            gen = self.engine.generate(prompt, sampling, request_id)
            async with contextlib.aclosing(gen):
                async for ids in gen:
                    syn._awaiting_tokens = False
                    syn._moved()
                    if timings.first_token is None:
                        timings.first_token = time.perf_counter()
                    timings.tokens += len(ids)
                    timings.last_token = time.perf_counter()
                    new = track.feed(ids)
                    if syn.speaker_globals is None and track.speaker_globals is not None:
                        syn.speaker_globals = track.speaker_globals
                        syn.globals_captured.set()
                    if new:
                        submit(planner.add(new))
                    if track.framer.stats.stopped:
                        break

        async def produce() -> None:
            try:
                if isinstance(self.profile, BiCodecProfile) and syn.speaker_globals is None:
                    # capture exactly 32 globals, then continue as a continuation request
                    await generate(self._prompt(syn, text), self._globals_sampling(syn), f"{rid}.globals")
                    if syn.speaker_globals is None:
                        raise EngineError(f"request {rid} produced no complete set of global tokens")
                prompt = self._prompt(syn, text)
                await generate(prompt, self._sampling_for(syn, text, len(prompt)), rid)
                submit(planner.finish())
            finally:
                timings.invalid_frames += track.framer.stats.invalid_frames
                queue.put_nowait(None)

        producer = asyncio.create_task(produce(), name=f"veena-produce-{rid}")
        try:
            while True:
                item = await queue.get()
                if item is None:
                    break
                window, fut = item
                audio = await fut
                syn._pending_windows -= 1
                syn._moved()
                if timings.first_decode_done is None:
                    timings.first_decode_done = time.perf_counter()
                yield stitcher.push(window, audio), False
            await producer  # re-raise an engine failure
            yield stitcher.finish(), True
        finally:
            syn._pending_windows = 0
            if not producer.done():
                producer.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await producer
            dropped = self.scheduler.cancel_request(rid)
            while not queue.empty():
                item = queue.get_nowait()
                if item is not None:
                    item[1].cancel()
                    dropped += 1
            if dropped:
                logger.info("dropped pending decode windows",
                            extra={"request_id": rid, "windows": dropped})

    async def aclose(self) -> None:
        await self.scheduler.aclose()
        await self.engine.aclose()


def profile_sampling(profile: ModelProfile) -> SamplingOptions:
    """The model card's sampling defaults; the token budget is derived per text."""
    d = profile.sampling
    stop = getattr(profile, "stop_token_ids", ())
    return SamplingOptions(temperature=d.temperature, top_p=d.top_p, top_k=d.top_k,
                           repetition_penalty=d.repetition_penalty, max_tokens=None,
                           stop_token_ids=tuple(stop))


def piece_seed(seed: int, index: int) -> int:
    """Codec noise seed of one piece: a piece decodes the same in any batch."""
    return (seed * 1000003 + index) & 0x7FFFFFFF


def _read_manifest(model: str) -> dict:
    path = Path(model) / MANIFEST
    if path.is_file():
        return json.loads(path.read_text())
    return {}


def load_codec(profile: ModelProfile, codec_model: str, device: str) -> Codec:
    if isinstance(profile, SnacProfile):
        from .codecs.snac import SnacCodec

        return SnacCodec.load(codec_model, device=device, position_levels=profile.position_levels)
    from .codecs.bicodec import BiCodecCodec

    return BiCodecCodec.load(codec_model, device=device)
