"""What every route shares (the pipeline, limits, metrics, live contexts, saved voices) and
the helpers every route answers with: one JSON error shape, one mapping from failures to
protocol codes, one validation of what a client asks a turn to do."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable

from aiohttp import web

from ..models.families import InvalidGlobalsError
from ..models.profiles import check_cloned_voice
from ..pipeline.engine import (
    EngineDeadError,
    EngineError,
    EngineStartingError,
    SamplingOptions,
)
from ..pipeline.pipeline import Pipeline
from ..pipeline.turn import TurnOptions, TurnTimeout
from ..protocol import ERROR_CODES, SAMPLING_FIELDS
from ..validation import check_int
from ..voices.files import VOICE_NAME, VoiceFile, VoiceFileError, load_voice, voices_in
from .admission import Admission, Overloaded
from .metrics import ServerMetrics
from .options import ServerOptions

STATE_KEY = web.AppKey("veena_state", object)
logger = logging.getLogger(__name__)


class ServerState:
    """What every route shares: the pipeline, limits, metrics and the live contexts."""

    def __init__(self, pipeline: Pipeline, options: ServerOptions) -> None:
        self.pipeline = pipeline
        self.options = options
        self.metrics = ServerMetrics()
        self.admission = Admission(
            options.admission(pipeline.engine.seq_slots),
            on_change=self.metrics.on_admission, on_wait=self.metrics.stream_queue_wait.observe,
            on_reject=lambda reason: self.metrics.rejected.labels(reason).inc())
        self.contexts: set = set()
        """Every WebSocket context (``contexts.Context``) whose task has not ended, over all
        connections (kept here, not typed by it: contexts depend on this state, not back)."""
        self.speeches: set[asyncio.Task] = set()
        """The work of every ``/v1/audio/speech`` request running: drained as contexts are."""
        self.cut_speeches: set[asyncio.Task] = set()
        """Speech work the drain cancelled at ``drain_s``: it answers ``shutting_down``."""
        self.connections = 0
        self.stopping = False
        """The server is stopping (SIGTERM): no new stream or context is taken."""
        self.goodbyes: set[Callable[[], Awaitable[None]]] = set()
        """Per open WebSocket: send what is queued, then close it (1001), as the server stops."""
        self._keepalive: asyncio.TimerHandle | None = None
        self.voices: dict[str, VoiceFile] = (
            voices_in(options.voices_dir, pipeline.profile) if options.voices_dir else {})
        """Saved voices by name; a bad file stops the server at start-up with its reason. A
        file the operator put there may carry a profile voice's name (``arjun.json``: that
        voice with pinned globals, tests/test_voices.py); an upload may not."""
        self._unreadable_voices: set[tuple[str, int]] = set()
        """(name, mtime) of voice files found bad: not parsed, nor warned about, again."""
        self.voice_names_taken: set[str] = set()
        """Names being saved right now (POST /v1/voices): a second upload is refused at once."""
        self.clone_lock = asyncio.Lock()

    def add_context(self, ctx: Any) -> None:
        """A context has started: it is failed with the others if the engine dies, and
        hears keepalives while it is silent."""
        self.contexts.add(ctx)
        if self._keepalive is None:
            self._arm_keepalive()

    def remove_context(self, ctx: Any) -> None:
        """A context has ended; the keepalive timer stops with the last one."""
        self.contexts.discard(ctx)
        if not self.contexts:
            self.close()

    def speech_ended(self, work: asyncio.Task) -> None:
        self.speeches.discard(work)
        self.cut_speeches.discard(work)

    @property
    def keepalive_running(self) -> bool:
        return self._keepalive is not None

    def _keep_alive(self) -> None:
        """One timer for every context of every connection (not a task per connection):
        each live context silent for ``keepalive_s`` gets a ``waiting`` event. It runs while
        there are contexts and stops with the last one."""
        self._keepalive = None
        for ctx in list(self.contexts):
            ctx.keepalive(self.options.keepalive_s)
        if self.contexts:
            self._arm_keepalive()

    def _arm_keepalive(self) -> None:
        self._keepalive = asyncio.get_running_loop().call_later(
            self.options.keepalive_s / 2, self._keep_alive)

    def close(self) -> None:
        """Stop the keepalive timer (the app is shutting down, or no context is left)."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None

    def saved_voice(self, name: Any) -> VoiceFile | None:
        """A saved voice by name: one this server knows, or one another replica sharing
        ``VEENA_VOICES_DIR`` saved since (read from the folder on first use, then kept)."""
        if not isinstance(name, str):
            return None
        saved = self.voices.get(name)
        if (saved is not None or self.options.voices_dir is None
                or not VOICE_NAME.fullmatch(name) or self.is_profile_voice(name)):
            return saved  # a profile voice's name never touches the disk: the hot path
        path = Path(self.options.voices_dir) / f"{name}.json"
        try:
            version = (name, path.stat().st_mtime_ns)
        except OSError:
            return None
        if version in self._unreadable_voices:
            return None
        try:
            saved = load_voice(path, self.pipeline.profile)
        except VoiceFileError as e:  # half written, or put there by hand: not a voice now
            self._unreadable_voices.add(version)  # said once, read again once rewritten
            logger.warning("saved voice not loaded: %s", e, extra={"voice_name": name})
            return None
        self.voices[name] = saved
        return saved

    def refresh_voices(self) -> None:
        """Take in the voices other replicas saved in the shared folder since (listing)."""
        if self.options.voices_dir is None:
            return
        for path in sorted(Path(self.options.voices_dir).glob("*.json")):
            if path.stem not in self.voices:
                self.saved_voice(path.stem)

    def is_profile_voice(self, name: str) -> bool:
        """Names are compared case-insensitively: on a case-insensitive file system
        ``Kavya.json`` would otherwise stand beside the built-in ``kavya``."""
        return name.casefold() in {v.casefold() for v in self.pipeline.profile.voices}

    def refusal(self) -> tuple[str, str] | None:
        """Why no new stream can be accepted now (code, message), or None."""
        health = self.pipeline.engine.health
        if health.state == "dead":
            return "engine_dead", f"the TTS engine is dead: {health.reason}"
        if self.stopping:
            return "shutting_down", "the server is stopping: try another replica"
        return None

    async def drain(self) -> None:
        """The server stops. aiohttp reads nothing more from any socket from now on, so a
        context still open for text could never be finished: it ends at once with the
        retryable ``shutting_down`` (its client sends the turn elsewhere); a context with all
        its text speaks to its end, for up to ``drain_s``, and so does each HTTP speech
        request; then each socket sends what it has queued and closes with 1001 (going away),
        and a speech request still running answers ``shutting_down`` (or, streaming, is cut).
        aiohttp's own wait for running handlers then has nothing left to wait for."""
        self.stopping = True
        for ctx in list(self.contexts):
            if ctx.status == "open":
                ctx.fail("shutting_down", "the server is stopping before this context's "
                         "text ended: send the turn again elsewhere")
        tasks = [ctx.task for ctx in self.contexts] + list(self.speeches)
        if tasks:
            logger.info("draining: %d contexts and %d speech requests speak to their end",
                        len(self.contexts), len(self.speeches))
            await asyncio.wait(tasks, timeout=self.options.drain_s)
        for ctx in list(self.contexts):
            ctx.fail("shutting_down", f"the server stopped after {self.options.drain_s:g} s "
                     "of draining (VEENA_DRAIN_S)")
        for work in list(self.speeches):
            self.cut_speeches.add(work)
            work.cancel()
        tasks = [ctx.task for ctx in self.contexts] + list(self.speeches)
        if tasks:
            await asyncio.wait(tasks, timeout=1.0)
        await asyncio.gather(*(goodbye() for goodbye in list(self.goodbyes)))

    def on_engine_dead(self, reason: str) -> None:
        self.metrics.engine_up.set(0)
        for ctx in list(self.contexts):
            ctx.fail("engine_dead", f"the TTS engine died: {reason}")


def server_state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]  # type: ignore[return-value]


def json_error(code: str, message: str, retry_after_s: float | None = None) -> web.Response:
    """The one error body of every HTTP route: ``{"error": {code, message, retryable}}``."""
    spec = ERROR_CODES[code]
    headers = {"Retry-After": str(max(1, round(retry_after_s)))} if retry_after_s else None
    return web.json_response({"error": {"code": code, "message": message,
                                        "retryable": spec.retryable}},
                             status=spec.status, headers=headers)


_CODE_BY_TYPE: tuple[tuple[type[BaseException], str], ...] = (
    (EngineDeadError, "engine_dead"),  # before its base class EngineError
    (EngineStartingError, "starting"),
    (EngineError, "engine_error"),
    (Overloaded, "overloaded"),
    (TurnTimeout, "timeout"),
    (InvalidGlobalsError, "invalid_globals"),  # before its base class ValueError
    (ValueError, "bad_request"),
)


def error_code(e: BaseException) -> str:
    """The protocol code of a failure, by its type (most specific first)."""
    return next((code for kind, code in _CODE_BY_TYPE if isinstance(e, kind)), "internal_error")


def _sampling(pipeline: Pipeline, sampling: Any) -> SamplingOptions:
    if not isinstance(sampling, dict) or set(sampling) - set(SAMPLING_FIELDS):
        raise ValueError(f"sampling must be an object with only {', '.join(SAMPLING_FIELDS)}")
    return replace(pipeline.default_sampling(), **sampling).validate()


def turn_options(state: ServerState, voice: Any, sampling: Any, seed: Any,
                 speaker_globals: Any) -> TurnOptions:
    """Validate everything a client asked for, by type and range, before any engine work.
    A saved voice's name stands for its voice (a profile voice, or a description) with its
    speaker globals (BiCodec) or its seed (SNAC); globals or a seed the client gives win. A
    description (``described_voices``) is checked by ``check_description``: one that could
    end the prompt's attribute or inject a tag is a ValueError here, never a prompt."""
    pipeline = state.pipeline
    saved = state.saved_voice(voice)
    if saved is not None:
        voice = saved.voice
        if speaker_globals is None:
            speaker_globals = saved.speaker_globals
        if seed is None:
            seed = saved.seed
    voice = pipeline.profile.check_voice(
        pipeline.profile.default_voice if voice is None else voice)
    s = _sampling(pipeline, sampling)
    globals_ = None if speaker_globals is None else pipeline.family.check_globals(speaker_globals)
    check_cloned_voice(voice, globals_)
    if seed is not None:
        check_int("seed", seed, 0, 2**63 - 1)
    return TurnOptions(voice=voice, sampling=s, seed=seed, speaker_globals=globals_,
                       chunk_crossfade_ms=state.options.chunk_crossfade_ms,
                       max_chunks_in_flight=state.options.max_chunks_in_flight,
                       timeout=state.options.turn_timeout_s,
                       startup_timeout=pipeline.engine.options.startup_timeout_s)
