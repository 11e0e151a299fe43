"""The LiveKit Agents TTS: ``tts=veena.TTS(model=...)`` in any agent, self-hosted.

A stream is one LiveKit segment. Its text is chunked (a short first chunk, then sentences)
and spoken as one ``turn.Turn``: continuation requests that keep the voice, pipelined and
crossfaded. This module only maps that onto livekit-agents' TTS contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import weakref
from urllib.parse import urlsplit

from livekit.agents import (
    APIConnectOptions,
    tokenize,
    tts,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from .log import logger
from .models.families import family_for
from .models.profiles import ModelProfile, as_profile
from .options import TTSOptions, check_voice
from .pipeline.chunking import ChunkerOptions
from .pipeline.engine_options import draw_seed
from .pipeline.pipeline import Pipeline
from .pipeline.sentences import SentenceTokenizer
from .pipeline.transcripts import word_timings
from .pipeline.turn import Turn
from .remote import RemoteClient
from .settings import env_float, env_int
from .streams import ChunkedStream, SynthesizeStream, _push_words, _VoiceOfStream
from .validation import check_float, check_int, check_str
from .voices.files import VoiceFile, is_voice_path, load_voice

_PIPELINES: dict[tuple[str, object], Pipeline] = {}
"""One pipeline (engine + decode scheduler) per (model, profile) per process, shared by
every TTS."""


def shared_pipeline(model: str, profile: str | ModelProfile | None = None) -> Pipeline:
    """The process's pipeline for ``model`` read with ``profile`` (None: the model folder's
    manifest or ``VEENA_PROFILE`` decides)."""
    key = (model, profile)
    if key not in _PIPELINES:
        _PIPELINES[key] = Pipeline.from_model(model, profile=profile)
    return _PIPELINES[key]




class TTS(tts.TTS):
    def __init__(
        self,
        *,
        model: str | None = None,
        pipeline: Pipeline | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
        profile: str | ModelProfile | None = None,
        voice: NotGivenOr[str] = NOT_GIVEN,
        temperature: NotGivenOr[float] = NOT_GIVEN,
        top_p: NotGivenOr[float] = NOT_GIVEN,
        top_k: NotGivenOr[int] = NOT_GIVEN,
        repetition_penalty: NotGivenOr[float] = NOT_GIVEN,
        max_tokens_per_chunk: NotGivenOr[int | None] = NOT_GIVEN,
        seed: NotGivenOr[int | None] = NOT_GIVEN,
        chunker: ChunkerOptions | None = None,
        tokenizer: NotGivenOr[tokenize.SentenceTokenizer] = NOT_GIVEN,
        text_pacing: tts.SentenceStreamPacer | bool = False,
        chunk_crossfade_ms: NotGivenOr[float] = NOT_GIVEN,
        max_chunks_in_flight: NotGivenOr[int] = NOT_GIVEN,
        startup_timeout: NotGivenOr[float] = NOT_GIVEN,
        voice_scope: NotGivenOr[str] = NOT_GIVEN,
    ) -> None:
        """Speak through an in-process ``pipeline``; or build the shared one for ``model``
        (a local path or hub id; default ``VEENA_MODEL``); or, with ``base_url``
        (``ws://host:8700``, default ``VEENA_TTS_URL``), through a ``veena-tts serve`` server
        of model ``profile`` (default ``VEENA_PROFILE``, else ``veena``: the guess that checks
        the voice; the server's ``/ready`` then says the sample rate and tags). Invalid
        options raise ValueError.

        A stream that starts while the in-process engine is still starting waits for it, up
        to ``startup_timeout`` (default ``VEENA_STARTUP_TIMEOUT_S``, 600 s); the stream's
        ``conn_options.timeout`` then bounds only a running request's lack of progress.

        ``voice`` is a profile voice name; for a model whose voices are described in words
        (``maya1``), a preset name or a description (``"Warm female voice in her 30s, calm
        pacing"``, checked by ``profiles.check_description``); or the path of a saved voice
        file (``*.json``): its speaker globals (``veena-tts voice capture`` / ``clone``,
        BiCodec) or its words and seed (``veena-tts voice design``, SNAC) are then the voice
        of every stream (a ``seed`` given here still wins over the file's).

        ``voice_scope`` (default ``call``): one voice for the whole call. BiCodec: the first
        stream captures 32 global tokens and every later stream of this TTS reuses them.
        SNAC (no speaker tokens): the voice is its words and its sampling seed, so without a
        ``seed`` one is drawn on first use and every later stream of this TTS speaks with it,
        in-process and through a server (a fixed seed keeps the sampling, not the codes:
        different text still gives different tokens, so timbre is steadier, not pinned as
        BiCodec's globals pin it). ``reset_voice()`` (or ``update_options(voice=...)``)
        starts over: new globals, or a new seed drawn next time. ``turn``: each stream
        captures its own globals, or draws its own seed.

        ``tags`` are the expressive tags the model performs (``<laugh>``); any other tag in
        the text is removed before the prompt. ``veena.tag_instructions(tts.tags)`` tells an
        agent's LLM which ones exist.

        ``tokenizer`` (any ``tokenize.SentenceTokenizer``; default ``veena.SentenceTokenizer``
        with ``chunker``'s options: a short first piece, then sentences, Latin and Indic
        punctuation) cuts the text into the pieces each engine request speaks.
        ``text_pacing`` (a ``tts.SentenceStreamPacer``, or True for its defaults) holds
        pieces back while enough audio is buffered, as the first-party plugins do."""
        import os

        base_url = base_url or (None if model or pipeline else os.environ.get("VEENA_TTS_URL"))
        self._remote: RemoteClient | None = None
        self._pipeline: Pipeline | None = None
        if base_url:
            check_str("base_url", base_url)
            if urlsplit(base_url).scheme not in ("ws", "wss", "http", "https"):
                raise ValueError(f"base_url must be a ws:// or wss:// URL, got {base_url!r}")
            if api_key is not None:
                check_str("api_key", api_key)
            prof = as_profile(profile or os.environ.get("VEENA_PROFILE") or "veena")
            self._remote = RemoteClient(base_url, api_key or os.environ.get("VEENA_API_KEY"))
            self._model_name = base_url
        else:
            if pipeline is None:
                model = model or os.environ.get("VEENA_MODEL")
                if not model:
                    raise ValueError(
                        "veena.TTS needs a model path/id (or VEENA_MODEL), a pipeline, "
                        "or a server base_url (or VEENA_TTS_URL)")
                pipeline = shared_pipeline(model, profile)
            self._pipeline = pipeline
            prof = pipeline.profile
            self._model_name = pipeline.engine.options.model
        self._profile = prof
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=prof.sample_rate,
            num_channels=1,
        )
        base = family_for(prof).default_sampling()
        self._voice_file: VoiceFile | None = None
        if is_given(voice) and isinstance(voice, str) and is_voice_path(voice):
            self._voice_file = load_voice(voice, prof)
            voice = self._voice_file.voice
        self._opts = TTSOptions(
            voice=check_voice(prof, voice if is_given(voice) else prof.default_voice,
                               self._voice_file),
            temperature=temperature if is_given(temperature) else base.temperature,
            top_p=top_p if is_given(top_p) else base.top_p,
            top_k=top_k if is_given(top_k) else base.top_k,
            repetition_penalty=(repetition_penalty if is_given(repetition_penalty)
                                else base.repetition_penalty),
            max_tokens_per_chunk=max_tokens_per_chunk if is_given(max_tokens_per_chunk) else None,
            seed=seed if is_given(seed) else None,
            tokenizer=tokenizer if is_given(tokenizer) else SentenceTokenizer(chunker),
            text_pacing=(tts.SentenceStreamPacer() if text_pacing is True
                         else text_pacing or None),
            chunk_crossfade_ms=(chunk_crossfade_ms if is_given(chunk_crossfade_ms)
                                else env_float("VEENA_CHUNK_CROSSFADE_MS", 15.0)),
            max_chunks_in_flight=(max_chunks_in_flight if is_given(max_chunks_in_flight)
                                  else env_int("VEENA_MAX_CHUNKS_IN_FLIGHT", 2)),
            startup_timeout=(startup_timeout if is_given(startup_timeout)
                             else env_float("VEENA_STARTUP_TIMEOUT_S", 600.0)),
            voice_scope=voice_scope if is_given(voice_scope) else "call",
        )
        self._opts = self._checked(self._opts)
        self._call_globals: tuple[int, ...] | None = None
        self._call_seed: int | None = None
        self._voice_epoch = 0
        """Counts ``reset_voice()``: a stream made before the last one speaks its own (old)
        voice and keeps nothing of it as the call's."""
        self._streams: "weakref.WeakSet[SynthesizeStream]" = weakref.WeakSet()
        self._prewarm_task: asyncio.Task | None = None

    def _checked(self, opts: TTSOptions) -> TTSOptions:
        """Every option by type and range (ValueError) before any engine work; numbers come
        back as plain Python ones (a numpy int passes, but JSON and vLLM's msgspec take only
        Python's own)."""
        sampling = opts.sampling(family_for(self._profile).default_sampling())
        opts = dataclasses.replace(
            opts, temperature=float(sampling.temperature), top_p=float(sampling.top_p),
            top_k=int(sampling.top_k), repetition_penalty=float(sampling.repetition_penalty),
            max_tokens_per_chunk=(None if opts.max_tokens_per_chunk is None
                                  else int(opts.max_tokens_per_chunk)),
            seed=None if opts.seed is None else check_int("seed", opts.seed, 0, 2**63 - 1),
            max_chunks_in_flight=check_int("max_chunks_in_flight", opts.max_chunks_in_flight,
                                           1, 64),
            chunk_crossfade_ms=check_float("chunk_crossfade_ms", opts.chunk_crossfade_ms,
                                           0.0, 1000.0),
            startup_timeout=check_float("startup_timeout", opts.startup_timeout, 0.0,
                                        lo_open=True))
        if not isinstance(opts.tokenizer, tokenize.SentenceTokenizer):
            raise ValueError("tokenizer must be a livekit.agents.tokenize.SentenceTokenizer, "
                             f"got {type(opts.tokenizer).__name__}")
        if opts.text_pacing is not None and not isinstance(opts.text_pacing,
                                                           tts.SentenceStreamPacer):
            raise ValueError("text_pacing must be a tts.SentenceStreamPacer or a bool, got "
                             f"{type(opts.text_pacing).__name__}")
        if opts.voice_scope not in ("call", "turn"):
            raise ValueError(f"voice_scope must be 'call' or 'turn', got {opts.voice_scope!r}")
        return opts

    @property
    def model(self) -> str:
        return self._model_name

    @property
    def provider(self) -> str:
        return "veena"

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("this TTS speaks through a remote server; it has no pipeline")
        return self._pipeline

    @property
    def remote(self) -> "RemoteClient | None":
        return self._remote

    @property
    def tags(self) -> tuple[str, ...]:
        """The expressive tags this TTS's model performs (``laugh``, without brackets):
        in-process the profile's; in remote mode the server's once its ``/ready`` has been
        read (the first stream, or ``fetch_tags()``), until then the given profile's."""
        if self._remote is not None and self._remote.tags is not None:
            return self._remote.tags
        return tuple(getattr(self._profile, "tags", ()))

    async def fetch_tags(self, timeout: float = 5.0) -> tuple[str, ...]:
        """``tags``, after asking a server's ``/ready`` for its own where it has not been
        asked yet (``APIError`` where the server cannot be reached)."""
        timeout = check_float("timeout", timeout, 0.0, lo_open=True)
        if self._remote is not None and self._remote.tags is None:
            await self._learn_sample_rate(timeout)
        return self.tags

    def update_options(
        self,
        *,
        voice: NotGivenOr[str] = NOT_GIVEN,
        temperature: NotGivenOr[float] = NOT_GIVEN,
        top_p: NotGivenOr[float] = NOT_GIVEN,
        top_k: NotGivenOr[int] = NOT_GIVEN,
        repetition_penalty: NotGivenOr[float] = NOT_GIVEN,
        max_tokens_per_chunk: NotGivenOr[int | None] = NOT_GIVEN,
        seed: NotGivenOr[int | None] = NOT_GIVEN,
    ) -> None:
        """Change options for streams created from now on (running streams keep theirs)."""
        changes = {k: v for k, v in dict(
            voice=voice, temperature=temperature, top_p=top_p, top_k=top_k,
            repetition_penalty=repetition_penalty, max_tokens_per_chunk=max_tokens_per_chunk,
            seed=seed).items() if is_given(v)}
        voice_file = self._voice_file
        if "voice" in changes:
            voice_file = None
            if isinstance(changes["voice"], str) and is_voice_path(changes["voice"]):
                voice_file = load_voice(changes["voice"], self._profile)
                changes["voice"] = voice_file.voice
            check_voice(self._profile, changes["voice"], voice_file)
        self._opts = self._checked(dataclasses.replace(self._opts, **changes))
        if "voice" in changes:
            self._voice_file = voice_file
            self.reset_voice()

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The speaker globals every stream uses: a voice file's, or (``voice_scope="call"``)
        the ones the first stream captured."""
        return self._voice_file.speaker_globals if self._voice_file else self._call_globals

    @property
    def voice_seed(self) -> int | None:
        """The seed every stream speaks with: the ``seed`` option, else a voice file's, else
        (``voice_scope="call"``, SNAC) the call's once drawn; None: each stream draws its own."""
        return self._seed_for(self._opts, draw=False)

    def reset_voice(self) -> None:
        """Forget the call's voice: the next stream captures new speaker globals (BiCodec)
        or draws a new seed (SNAC). A voice file's globals and seed stay until
        ``update_options(voice=...)``."""
        self._call_globals = None
        self._call_seed = None
        self._voice_epoch += 1

    def _call_voice(self, opts: TTSOptions, stream: "_VoiceOfStream"
                    ) -> tuple[int, ...] | None:
        """The globals ``stream`` speaks with: none for a stream made before the voice was
        reset (it speaks its own voice, and captures it)."""
        if stream.voice_epoch != self._voice_epoch:
            return None
        if self._voice_file is not None and self._voice_file.speaker_globals is not None:
            return self._voice_file.speaker_globals
        return self._call_globals if opts.voice_scope == "call" else None

    def _keeps_seed(self, opts: TTSOptions) -> bool:
        """A SNAC voice is its words and its seed: in call scope the seed is the call's."""
        return opts.voice_scope == "call" and not family_for(self._profile).has_speaker_globals

    def _seed_for(self, opts: TTSOptions, *, draw: bool = True) -> int | None:
        """The seed of a stream with ``opts``: given, a voice file's, or the call's (drawn on
        first use unless ``draw`` is False); None lets the turn draw one."""
        if opts.seed is not None:
            return opts.seed
        if self._voice_file is not None and self._voice_file.seed is not None:
            return self._voice_file.seed
        if not self._keeps_seed(opts):
            return None
        if self._call_seed is None and draw:
            self._call_seed = draw_seed()
            logger.debug("the call's voice seed drawn", extra={"seed": self._call_seed})
        return self._call_seed

    def _keep_voice(self, opts: TTSOptions, speaker_globals: tuple[int, ...]) -> None:
        if opts.voice_scope == "call" and self._call_globals is None:
            self._call_globals = tuple(speaker_globals)

    def _keeper(self, opts: TTSOptions, stream: "_VoiceOfStream"):
        """What to do with the speaker globals a stream captures: note them on the stream,
        and keep them as the call's voice (``voice_scope="call"``) unless the voice was reset
        since the stream was made (``update_options(voice=...)`` since: its options, and so
        its globals, are the old voice's)."""
        def captured(speaker_globals: tuple[int, ...]) -> None:
            stream.speaker_globals = speaker_globals
            if stream.voice_epoch == self._voice_epoch:
                self._keep_voice(opts, speaker_globals)

        return captured

    def _new_turn(self, opts: TTSOptions, timeout: float, stream: "_VoiceOfStream",
                  emitter: tts.AudioEmitter) -> Turn:
        """A turn with the call's voice (if any); the voice it captures is kept, and each
        chunk's words go out as timed transcripts."""
        turn = Turn(self.pipeline, opts.turn(self.pipeline, timeout,
                                             self._call_voice(opts, stream),
                                             self._seed_for(opts)))
        stream.speaker_globals = turn.speaker_globals
        stream.seed = turn.seed
        turn.on_speaker_globals = self._keeper(opts, stream)
        turn.on_chunk_spoken = lambda text, a, b: _push_words(
            emitter, [(w.text, w.start, w.end) for w in word_timings(text, a, b)])
        return turn

    async def _speak_remote(self, opts: TTSOptions, texts, emitter: tts.AudioEmitter,
                            timeout: float, stream: "_VoiceOfStream",
                            on_started=lambda: None) -> bool:
        """One server context with the call's voice (if any); the voice it captures is kept.
        Whether any audio came."""
        given = self._call_voice(opts, stream)
        stream.speaker_globals = given
        stream.seed = self._seed_for(opts)
        return await self._remote.speak(texts, opts.remote_message(given, stream.seed),
                                        emitter.push, timeout, on_started,
                                        self._keeper(opts, stream),
                                        lambda words: _push_words(emitter, words))

    async def _learn_sample_rate(self, timeout: float) -> int:
        """In remote mode the server's ``/ready`` says the rate (the profile given here is
        only the guess before the first connection); in-process the profile says it."""
        if self._remote is not None:
            rate = await self._remote.sample_rate(timeout)
            if rate is not None and rate != self._sample_rate:
                logger.info("the server's sample rate replaces the profile's",
                            extra={"sample_rate": rate, "profile_rate": self._sample_rate})
                self._sample_rate = rate
        return self._sample_rate

    def prewarm(self) -> None:
        """Start the engine and warm the codec (or open a server connection) in the
        background; never blocks."""
        if self._remote is not None:
            self._remote.prewarm()
            return
        if self._prewarm_task is None or self._prewarm_task.done():
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                logger.warning("prewarm() needs a running event loop; skipped")
                return
            self._prewarm_task = loop.create_task(self._pipeline.start(), name="veena-prewarm")

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> "ChunkedStream":
        return ChunkedStream(tts=self, input_text=text, conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> "SynthesizeStream":
        stream = SynthesizeStream(tts=self, conn_options=conn_options)
        self._streams.add(stream)  # weakly: a stream its owner dropped is not kept alive
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        if self._remote is not None:
            await self._remote.aclose()
        if self._prewarm_task is not None:
            self._prewarm_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._prewarm_task
