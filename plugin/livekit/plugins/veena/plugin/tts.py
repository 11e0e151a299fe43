"""The LiveKit Agents TTS: ``tts=veena.TTS(model=...)`` in any agent, self-hosted.

A stream is one LiveKit segment. Its text is chunked (a short first chunk, then sentences)
and spoken as one ``turn.Turn``: continuation requests that keep the voice, pipelined and
crossfaded. This module only maps that onto livekit-agents' TTS contract.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Collection, Mapping
from typing import Any
from urllib.parse import urlsplit

from livekit.agents import (
    APIConnectOptions,
    tokenize,
    tts,
)
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr
from livekit.agents.utils import is_given

from ..models import loading
from ..models.profiles import ModelProfile, as_profile
from ..pipeline.adapters import ADAPTER_NAME
from ..pipeline.chunking import ChunkerOptions
from ..pipeline.family import family_for
from ..pipeline.pipeline import Pipeline
from ..pipeline.sentences import SentenceTokenizer
from ..settings import env_float, env_int
from ..validation import check_float, check_str
from ..voices.call_voice import CallVoice, Voice, resolve_voice, voice_file_at
from .options import TTSOptions
from .remote import RemoteClient
from .speakers import LocalSpeaker, RemoteSpeaker, Speaker
from .streams import ChunkedStream, SynthesizeStream

_PIPELINES: dict[tuple[str, object], Pipeline] = {}
"""One pipeline (engine + decode scheduler) per (model, profile) per process, shared by
every TTS."""


def shared_pipeline(model: str, profile: str | ModelProfile | None = None) -> Pipeline:
    """The process's pipeline for ``model`` read with ``profile`` (None: the model folder's
    manifest or ``VEENA_PROFILE`` decides)."""
    key = (model, profile)
    if key not in _PIPELINES:
        _PIPELINES[key] = loading.load_pipeline(model, profile=profile)
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
        lora: Mapping[str, str] | None = None,
        text_normalization: NotGivenOr[str] = NOT_GIVEN,
        pronunciations: Mapping[str, str] | None = None,
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

        ``lora`` ({name: adapter folder or hub id}, beside ``VEENA_LORA``'s) serves a
        user's fine-tuned voices on the in-process engine, each checked against the model
        first (ValueError). ``voice="acme"`` then speaks with adapter ``acme``: for a
        named-speaker model, with ``acme`` as the speaker name (``<spk_acme>``,
        ``acme: text``); for Maya1 and BiCodec models, with the default voice, or through a
        voice file that names the adapter.

        ``tags`` are the expressive tags the model performs (``<laugh>``); any other tag in
        the text is removed before the prompt. ``veena.tag_instructions(tts.tags)`` tells an
        agent's LLM which ones exist.

        ``tokenizer`` (any ``tokenize.SentenceTokenizer``; default ``veena.SentenceTokenizer``
        with ``chunker``'s options: a short first piece, then sentences, Latin and Indic
        punctuation) cuts the text into the pieces each engine request speaks.
        ``text_pacing`` (a ``tts.SentenceStreamPacer``, or True for its defaults) holds
        pieces back while enough audio is buffered, as the first-party plugins do.

        ``text_normalization`` (``auto``, the default where nothing else is set, or ``off``;
        default ``VEENA_TEXT_NORMALIZATION``, through a server the server's) spells out
        numbers, money, dates, times and abbreviations in the profile's languages before the
        prompt; transcripts keep the text as written. ``pronunciations`` ({word: spoken
        form}) replaces whole words first: a key matches as written, an all-lowercase key in
        any case."""
        import os

        base_url = base_url or (None if model or pipeline else os.environ.get("VEENA_TTS_URL"))
        if base_url:
            check_str("base_url", base_url)
            if urlsplit(base_url).scheme not in ("ws", "wss", "http", "https"):
                raise ValueError(f"base_url must be a ws:// or wss:// URL, got {base_url!r}")
            if api_key is not None:
                check_str("api_key", api_key)
            if lora:
                raise ValueError("lora= serves adapters on an in-process engine; a server "
                                 "serves its own (veena-tts serve --lora, VEENA_LORA)")
            prof = as_profile(profile or os.environ.get("VEENA_PROFILE") or "veena")
            self._remote = RemoteClient(base_url, api_key or os.environ.get("VEENA_API_KEY"))
            speaker: Speaker = RemoteSpeaker(self._remote, prof.sample_rate)
            self._pipeline: Pipeline | None = None
            self._model_name = base_url
        else:
            if pipeline is None:
                model = model or os.environ.get("VEENA_MODEL")
                if not model:
                    raise ValueError(
                        "veena.TTS needs a model path/id (or VEENA_MODEL), a pipeline, "
                        "or a server base_url (or VEENA_TTS_URL)")
                pipeline = shared_pipeline(model, profile)
            if lora:
                loading.serve_adapters(pipeline, lora)
            prof = pipeline.profile
            speaker = LocalSpeaker(pipeline)
            self._remote = None
            self._pipeline = pipeline
            self._model_name = pipeline.engine.options.model
        self._profile = prof
        self._speaker = speaker
        super().__init__(
            capabilities=tts.TTSCapabilities(streaming=True, aligned_transcript=True),
            sample_rate=prof.sample_rate,
            num_channels=1,
        )
        self._call = CallVoice(
            prof, self._resolve(voice if is_given(voice) else prof.default_voice),
            voice_scope if is_given(voice_scope) else "call")
        base = family_for(prof).default_sampling()
        self._opts = TTSOptions(
            sampling=base.overridden(_given(
                temperature=temperature, top_p=top_p, top_k=top_k,
                repetition_penalty=repetition_penalty, max_tokens=max_tokens_per_chunk)),
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
            text_normalization=text_normalization if is_given(text_normalization) else None,
            pronunciations=pronunciations or {},
        )
        self._streams: "weakref.WeakSet[SynthesizeStream]" = weakref.WeakSet()

    @property
    def model(self) -> str:
        return self._model_name

    def _adapters(self) -> Collection[str]:
        """The LoRA adapters a voice may name: the in-process engine's; through a server,
        any name that could be one (the server says if it is not)."""
        if self._pipeline is not None:
            return self._pipeline.engine.adapters.names
        return _ServerAdapterNames(self._profile)

    def _resolve(self, voice: Any) -> Voice:
        resolved = resolve_voice(self._profile, voice, lookup=voice_file_at(self._profile),
                                 adapters=self._adapters())
        if self._pipeline is None and resolved.file is not None and resolved.file.adapter:
            raise ValueError("a voice file that names an adapter speaks in-process; through a "
                             "server, save it there (VEENA_VOICES_DIR) and name it")
        return resolved

    @property
    def provider(self) -> str:
        return "veena"

    @property
    def sample_rate(self) -> int:
        """The profile's rate; in remote mode the server's once its ``/ready`` was read."""
        return self._speaker.sample_rate

    @property
    def pipeline(self) -> Pipeline:
        if self._pipeline is None:
            raise RuntimeError("this TTS speaks through a remote server; it has no pipeline")
        return self._pipeline

    @property
    def remote(self) -> "RemoteClient | None":
        return self._remote

    @property
    def voice(self) -> str:
        """The voice new streams speak: a profile voice, a description, or "" (cloned)."""
        return self._call.voice.voice

    @property
    def voice_scope(self) -> str:
        """``call`` (one voice for every stream of this TTS) or ``turn``."""
        return self._call.scope

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
            await self._speaker.learn_sample_rate(timeout)
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
        text_normalization: NotGivenOr[str] = NOT_GIVEN,
        pronunciations: NotGivenOr[Mapping[str, str]] = NOT_GIVEN,
    ) -> None:
        """Change options for streams created from now on (running streams keep theirs).
        A new ``voice`` starts the call's voice over (``reset_voice``)."""
        new_voice = self._resolve(voice) if is_given(voice) else None
        sampling = self._opts.sampling.overridden(_given(
            temperature=temperature, top_p=top_p, top_k=top_k,
            repetition_penalty=repetition_penalty, max_tokens=max_tokens_per_chunk))
        self._opts = dataclasses.replace(
            self._opts, sampling=sampling, seed=seed if is_given(seed) else self._opts.seed,
            text_normalization=(text_normalization if is_given(text_normalization)
                                else self._opts.text_normalization),
            pronunciations=(pronunciations if is_given(pronunciations)
                            else self._opts.pronunciations))
        if new_voice is not None:
            self._call.change(new_voice)

    @property
    def speaker_globals(self) -> tuple[int, ...] | None:
        """The speaker globals every stream uses: a voice file's, or (``voice_scope="call"``)
        the ones the first stream captured."""
        return self._call.speaker_globals

    @property
    def voice_seed(self) -> int | None:
        """The seed every stream speaks with: the ``seed`` option, else a voice file's, else
        (``voice_scope="call"``, SNAC) the call's once drawn; None: each stream draws its own."""
        return self._call.seed(self._opts.seed, draw=False)

    def reset_voice(self) -> None:
        """Forget the call's voice: the next stream captures new speaker globals (BiCodec)
        or draws a new seed (SNAC). A voice file's globals and seed stay until
        ``update_options(voice=...)``."""
        self._call.reset()

    def prewarm(self) -> None:
        """Start the engine and warm the codec (or open a server connection) in the
        background; never blocks."""
        self._speaker.prewarm()

    def synthesize(
        self, text: str, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> "ChunkedStream":
        return ChunkedStream(tts=self, speaker=self._speaker, options=self._opts,
                             voice=self._call.for_stream(self._opts.seed), input_text=text,
                             conn_options=conn_options)

    def stream(
        self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS
    ) -> "SynthesizeStream":
        stream = SynthesizeStream(tts=self, speaker=self._speaker, options=self._opts,
                                  voice=self._call.for_stream(self._opts.seed),
                                  conn_options=conn_options)
        self._streams.add(stream)  # weakly: a stream its owner dropped is not kept alive
        return stream

    async def aclose(self) -> None:
        for stream in list(self._streams):
            await stream.aclose()
        self._streams.clear()
        await self._speaker.aclose()


def _given(**values) -> dict:
    """The options a caller gave (livekit's NOT_GIVEN left out)."""
    return {k: v for k, v in values.items() if is_given(v)}


class _ServerAdapterNames:
    """Through a server, the adapters are the server's: a name shaped like one that is not
    a voice of the profile may be one, and goes to the server by its name."""

    def __init__(self, profile: ModelProfile) -> None:
        self._voices = set(profile.voices)

    def __contains__(self, name: object) -> bool:
        return (isinstance(name, str) and name not in self._voices
                and ADAPTER_NAME.fullmatch(name) is not None)

    def __iter__(self):
        return iter(())

    def __len__(self) -> int:
        return 0
