"""How many streams fit on a GPU: the weights, LoRA slots and vLLM's run-time reserve come
off its memory share, and each stream holds the KV cache of one text chunk at its largest.

A stream's engine request is one text chunk: its prompt (at most a token per character of
the longest chunk, the profile's fixed ids, a voice description or speaker tokens) and the
audio the runaway guard lets it generate (its base seconds plus the profile's seconds per
character times the chunker's longest chunk). vLLM frees a chunk's cache as it finishes, so a stream holds about
one chunk's; a turn may have two requests in flight, hence ``max_num_seqs`` = 2 x streams.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..models.profiles import MAX_DESCRIPTION_CHARS
from ..pipeline.chunking import ChunkerOptions
from ..pipeline.guards import GuardOptions
from .gpus import GIB
from .shape import ModelShape

KV_BLOCK_TOKENS = 16
"""vLLM's KV cache block on a GPU: a request's cache is whole blocks."""
PROMPT_FIXED_TOKENS = 64
"""A prompt's ids besides its text and voice (markers, speaker name, special tokens)."""
RUNTIME_RESERVE_BYTES = 2 * GIB
"""Inside vLLM's share, beside weights and cache: activations at its profiling batch and
its CUDA graphs. An estimate; vLLM measures it as it starts (``bench/gpu.sh`` shows it)."""
CODEC_RESERVE_BYTES = 3 * GIB // 2
"""Outside vLLM's share: the CUDA context, the codec's weights, activations at the largest
decode batch and its CUDA graph pool (SNAC 20 M, BiCodec 92 M parameters). An estimate."""
STREAMS_PER_PROCESS = 192
"""What one server process's CPU carries at real time (docs: the control plane);
more streams on one GPU take ``--workers``."""
MAX_NUM_SEQS = 1024
"""The largest ``max_num_seqs`` a default takes."""


@dataclass(frozen=True)
class StreamFootprint:
    """One stream's engine request at its largest."""

    prompt_tokens: int
    audio_tokens: int
    kv_bytes_per_token: int

    @property
    def tokens(self) -> int:
        """Prompt plus audio, in whole KV blocks."""
        raw = self.prompt_tokens + self.audio_tokens
        return math.ceil(raw / KV_BLOCK_TOKENS) * KV_BLOCK_TOKENS

    @property
    def kv_bytes(self) -> int:
        return self.tokens * self.kv_bytes_per_token


def stream_footprint(shape: ModelShape, profile: Any, chunker: ChunkerOptions = ChunkerOptions(),
                     dtype: str = "auto") -> StreamFootprint:
    """A stream's largest request for ``profile`` (``fit``'s module docstring says why)."""
    speaker = getattr(profile, "num_global_tokens", 0)  # BiCodec: 32 globals in and out
    described = MAX_DESCRIPTION_CHARS if getattr(profile, "described_voices", False) else 0
    prompt = chunker.max_chars + PROMPT_FIXED_TOKENS + described + speaker
    seconds = GuardOptions().runaway_base_s + chunker.max_chars * profile.runaway_s_per_char
    audio = math.ceil(seconds * profile.tokens_per_second) + speaker
    context = getattr(profile, "max_context", None)
    if context:  # a reference clip's codes fill the prompt: the whole context (NeuTTS)
        audio = min(audio, context)
        prompt = context - audio
    return StreamFootprint(prompt, audio, shape.kv_bytes_per_token(dtype))


@dataclass(frozen=True)
class Fit:
    """The memory arithmetic for one GPU (bytes), and the streams that fit."""

    memory_bytes: int
    utilization: float
    weight_bytes: int
    lora_bytes: int
    footprint: StreamFootprint

    @property
    def share_bytes(self) -> int:
        """vLLM's share of the GPU."""
        return int(self.memory_bytes * self.utilization)

    @property
    def kv_budget_bytes(self) -> int:
        return max(0, self.share_bytes - self.weight_bytes - self.lora_bytes
                   - RUNTIME_RESERVE_BYTES)

    @property
    def streams(self) -> int:
        """Streams whose KV cache fits at once."""
        return self.kv_budget_bytes // self.footprint.kv_bytes

    @property
    def codec_room_bytes(self) -> int:
        """What is left outside vLLM's share for the codec."""
        return self.memory_bytes - self.share_bytes

    @property
    def codec_fits(self) -> bool:
        return self.codec_room_bytes >= CODEC_RESERVE_BYTES


def fit_streams(shape: ModelShape, footprint: StreamFootprint, memory_bytes: int,
                utilization: float = 0.85, *, dtype: str = "auto", max_loras: int = 0,
                lora_rank: int = 16) -> Fit:
    lora = max_loras * shape.lora_slot_bytes(lora_rank, dtype) if max_loras else 0
    return Fit(memory_bytes, utilization, shape.weight_bytes(dtype), lora, footprint)


def max_num_seqs_for(streams: int) -> int:
    """Two engine requests per stream (a turn's next chunk generates while this one plays)."""
    return max(2, min(MAX_NUM_SEQS, 2 * streams))


def decode_batch_for(streams: int) -> int:
    """The decode scheduler's largest batch: a power of two near a quarter of a process's
    streams, 16 to 64 (CUDA graphs are captured up to 64)."""
    per_process = min(streams, STREAMS_PER_PROCESS)
    return min(64, max(16, 1 << max(0, math.ceil(per_process / 4) - 1).bit_length()))


def workers_for(streams: int) -> int:
    """Server processes that carry ``streams`` at real time."""
    return max(1, math.ceil(streams / STREAMS_PER_PROCESS))
