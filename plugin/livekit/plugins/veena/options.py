"""The TTS's options, snapshotted per stream as the first-party plugins do, and how each
becomes an in-process turn or a server context's first message."""

from __future__ import annotations

from dataclasses import dataclass, replace

from livekit.agents import tokenize, tts

from .models.profiles import ModelProfile, check_cloned_voice
from .pipeline.engine_options import SamplingOptions
from .pipeline.pipeline import Pipeline
from .pipeline.sentences import SentenceTokenizer
from .pipeline.turn import TurnOptions
from .voices.files import VoiceFile


@dataclass
class TTSOptions:
    voice: str
    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    max_tokens_per_chunk: int | None
    seed: int | None
    """None: the voice's seed (a voice file's; ``voice_scope="call"`` on a SNAC model: one
    drawn for the whole call), else each turn draws its own and keeps it for all its chunks."""
    tokenizer: tokenize.SentenceTokenizer
    text_pacing: tts.SentenceStreamPacer | None
    """Hold pieces back while enough audio is buffered (less generation wasted on an
    interruption)."""
    chunk_crossfade_ms: float
    max_chunks_in_flight: int
    startup_timeout: float
    voice_scope: str
    """``call``: every stream of the TTS speaks with the speaker globals its first stream
    captured (BiCodec), or with one seed drawn for the whole call (SNAC); ``turn``: each
    stream captures its own globals, or draws its own seed."""

    @property
    def server_chunks(self) -> bool:
        """A server chunks raw text exactly as our default tokenizer would: send it as is."""
        return type(self.tokenizer) is SentenceTokenizer and self.text_pacing is None

    def sampling(self, base: SamplingOptions) -> SamplingOptions:
        return replace(base, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                       repetition_penalty=self.repetition_penalty,
                       max_tokens=self.max_tokens_per_chunk).validate()

    def remote_message(self, speaker_globals: tuple[int, ...] | None,
                       seed: int | None) -> dict:
        """Voice, the stream's ``seed``, sampling (and a call's speaker globals) as the first
        message of a server context carries them."""
        sampling = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                    "repetition_penalty": self.repetition_penalty}
        if self.max_tokens_per_chunk is not None:
            sampling["max_tokens"] = self.max_tokens_per_chunk
        message = {"voice": self.voice, "seed": seed, "sampling": sampling}
        if speaker_globals is not None:
            message["speaker_globals"] = list(speaker_globals)
        return message

    def turn(self, pipeline: Pipeline, timeout: float,
             speaker_globals: tuple[int, ...] | None, seed: int | None) -> TurnOptions:
        return TurnOptions(voice=self.voice, sampling=self.sampling(pipeline.default_sampling()),
                           seed=seed, speaker_globals=speaker_globals,
                           chunk_crossfade_ms=self.chunk_crossfade_ms,
                           max_chunks_in_flight=self.max_chunks_in_flight, timeout=timeout,
                           startup_timeout=self.startup_timeout)


def check_voice(profile: ModelProfile, voice: str, voice_file: VoiceFile | None) -> str:
    """A profile voice, or a cloned voice's "" together with its voice file."""
    voice = profile.check_voice(voice)
    check_cloned_voice(voice, voice_file.speaker_globals if voice_file else None)
    return voice
