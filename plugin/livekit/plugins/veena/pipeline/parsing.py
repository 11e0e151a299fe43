"""Token parsing: generated ids to codec frames, O(1) per token.

A lookup table maps every token id to (kind, value) once per tokenizer/profile, so the hot
loop never decodes text or runs a regex. Framers are pure and synchronous: feed ids, take
complete codec steps.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Protocol, Sequence

import numpy as np

logger = logging.getLogger(__name__)

KIND_OTHER = 0
KIND_AUDIO = 1  # SNAC: value = id - audio_token_base (band p = value // 4096)
KIND_GLOBAL = 2  # BiCodec global speaker token: value = global index
KIND_SEMANTIC = 3  # BiCodec semantic token: value = semantic index
KIND_STOP = 4


class SnacLayout(Protocol):
    """A SNAC profile's token layout, as the parser reads it."""

    name: str
    audio_token_base: int
    tokens_per_frame: int
    codebook_size: int
    stop_token_ids: Sequence[int]
    out_of_range_codes: str

    @property
    def vocab_end(self) -> int: ...


OUT_OF_RANGE_POLICIES = ("drop_frame", "wrap", "skip_token", "end_chunk")
"""What a SNAC parser does with an audio token outside its position's band, as each model's
reference does: ``drop_frame`` (skip the frame it is in; the frames around it still play),
``wrap`` (Maya1: ``(id - base) % 4096``, decoded as it is), ``skip_token`` (Orpheus's
``decoder.py``: the token is dropped without advancing the position, so the next token may
resynchronise), ``end_chunk`` (Veena's card raises: nothing after it is decoded, so the
chunk ends there, with the audio before it)."""


class BiCodecLayout(Protocol):
    """A BiCodec profile's token layout, as the parser reads it."""

    name: str
    semantic_token_format: str
    global_token_format: str
    stop_tokens: Sequence[str]
    num_global_tokens: int


@dataclass(frozen=True)
class TokenTable:
    """``kind[id]`` and ``value[id]`` for every id in the vocabulary."""

    kind: np.ndarray
    value: np.ndarray
    _ids: dict = field(default_factory=dict, compare=False, repr=False)
    _lists: list = field(default_factory=list, compare=False, repr=False)

    def as_lists(self) -> tuple[list[int], list[int]]:
        """``kind`` and ``value`` as Python lists (built once per table): a short delta reads
        them faster than numpy scalars."""
        if not self._lists:
            self._lists.append((self.kind.tolist(), self.value.tolist()))
        return self._lists[0]

    def ids(self, *kinds: int) -> tuple[int, ...]:
        """Every id of the given kinds, in order (computed once per table)."""
        if kinds not in self._ids:
            self._ids[kinds] = tuple(int(i) for i in np.flatnonzero(np.isin(self.kind, kinds)))
        return self._ids[kinds]

    @classmethod
    def for_snac(cls, profile: SnacLayout, vocab_size: int | None = None) -> "TokenTable":
        size = max(vocab_size or 0, profile.vocab_end, *(t + 1 for t in profile.stop_token_ids))
        kind = np.zeros(size, dtype=np.int8)
        value = np.full(size, -1, dtype=np.int64)
        ids = np.arange(profile.audio_token_base, profile.vocab_end)
        kind[ids] = KIND_AUDIO
        value[ids] = ids - profile.audio_token_base
        kind[list(profile.stop_token_ids)] = KIND_STOP
        return cls(kind, value)

    @classmethod
    def for_bicodec(cls, profile: BiCodecLayout, vocab: Mapping[str, int]) -> "TokenTable":
        """Built by scanning the vocabulary's token strings once."""
        size = max(vocab.values()) + 1
        kind = np.zeros(size, dtype=np.int8)
        value = np.full(size, -1, dtype=np.int64)
        patterns = (
            (KIND_SEMANTIC, _format_regex(profile.semantic_token_format)),
            (KIND_GLOBAL, _format_regex(profile.global_token_format)),
        )
        for token, tid in vocab.items():
            for k, rx in patterns:
                m = rx.fullmatch(token)
                if m:
                    kind[tid], value[tid] = k, int(m.group(1))
                    break
        for stop in profile.stop_tokens:
            if stop in vocab:
                kind[vocab[stop]] = KIND_STOP
        if not (kind == KIND_SEMANTIC).any() or not (kind == KIND_GLOBAL).any():
            raise ValueError(
                f"the tokenizer has no {profile.semantic_token_format!r} / "
                f"{profile.global_token_format!r} tokens: is it a {profile.name} tokenizer?"
            )
        return cls(kind, value)


def _format_regex(fmt: str) -> re.Pattern[str]:
    head, tail = fmt.split("{}")
    return re.compile(re.escape(head) + r"(\d+)" + re.escape(tail))


@dataclass
class ParseStats:
    tokens: int = 0
    frames: int = 0
    invalid_frames: int = 0
    invalid_codes: int = 0
    """Out-of-band audio tokens (every policy counts them; ``drop_frame`` also counts the
    frames it skipped in ``invalid_frames``)."""
    other_tokens: int = 0
    global_tokens: int = 0
    """Speaker globals read (BiCodec): not audio, but not a sign of an empty one either."""
    stopped: bool = False


@dataclass(frozen=True)
class _Delta:
    """What ``SnacFramer._read`` found in one delta."""

    tokens: int
    """Tokens read: up to and with a stop token."""
    stopped: bool
    other_tokens: int
    codes: np.ndarray
    valid: np.ndarray
    """Per code: in its position's band."""


class SnacFramer:
    """Collects 7-token SNAC frames. A token of the wrong band is counted, logged once per
    request, and handled by the profile's ``out_of_range_codes`` policy."""

    VECTOR_MIN = 32
    """Deltas this long or longer are parsed in numpy; shorter ones (vLLM streams one token
    per request per step) token by token through the table's lists."""

    def __init__(self, profile: SnacLayout, table: TokenTable, request_id: str = "") -> None:
        self._kind = table.kind
        self._value = table.value
        self._kind_list, self._value_list = table.as_lists()
        self._n = profile.tokens_per_frame
        self._width = profile.codebook_size
        self._request_id = request_id
        self._policy = getattr(profile, "out_of_range_codes", "drop_frame")
        if self._policy not in OUT_OF_RANGE_POLICIES:
            raise ValueError(f"out_of_range_codes must be one of {OUT_OF_RANGE_POLICIES}, "
                             f"got {self._policy!r}")
        self._current = np.zeros(self._n, dtype=np.int64)
        self._pos = 0
        self._bad = False
        self.stats = ParseStats()

    def feed(self, token_ids: Iterable[int]) -> list[np.ndarray]:
        """Consume ids; return the complete, valid frames (each an int array of 7 codes)."""
        if not isinstance(token_ids, (list, tuple)):
            token_ids = list(token_ids)
        if len(token_ids) < self.VECTOR_MIN:
            return self._feed_short(token_ids)
        delta = self._read(np.asarray(token_ids, dtype=np.int64))
        if self._policy != "drop_frame" and not delta.valid.all():
            return self._feed_short(token_ids)  # the rare delta the policy must walk
        return self._feed_vector(delta)

    def _read(self, ids: np.ndarray) -> _Delta:
        """A delta's audio codes (up to a stop), each against its band position from where
        the last delta left off, through the table in numpy; no state changes."""
        kind = self._kind
        known = (ids >= 0) & (ids < len(kind))
        kinds = np.where(known, kind[np.where(known, ids, 0)], KIND_OTHER)
        stops = np.flatnonzero(kinds == KIND_STOP)
        if stops.size:  # the stop token counts as read; nothing after it does
            ids, kinds = ids[:stops[0]], kinds[:stops[0]]
        values = self._value[ids[kinds == KIND_AUDIO]]
        codes = values - ((self._pos + np.arange(values.size)) % self._n) * self._width
        return _Delta(int(stops[0]) + 1 if stops.size else int(ids.size), bool(stops.size),
                      int(ids.size - values.size), codes, (codes >= 0) & (codes < self._width))

    def _feed_short(self, token_ids) -> list[np.ndarray]:
        frames: list[np.ndarray] = []
        kind, value = self._kind_list, self._value_list
        n, width, size, stats = self._n, self._width, len(kind), self.stats
        for tid in token_ids:
            stats.tokens += 1
            k = kind[tid] if 0 <= tid < size else KIND_OTHER
            if k == KIND_STOP:
                stats.stopped = True
                break
            if k != KIND_AUDIO:
                stats.other_tokens += 1
                continue
            code = value[tid] - self._pos * width
            if 0 <= code < width:
                self._current[self._pos] = code
            else:
                self._out_of_band()
                if self._policy == "wrap":
                    self._current[self._pos] = value[tid] % width
                elif self._policy == "skip_token":
                    continue
                elif self._policy == "end_chunk":
                    self._pos = 0
                    stats.stopped = True
                    break
                else:
                    self._bad = True
            self._pos += 1
            if self._pos == n:
                self._pos = 0
                if self._bad:
                    self._bad = False
                    self._invalid_frame()
                else:
                    frames.append(self._current.copy())
                    stats.frames += 1
        return frames

    def _out_of_band(self, count: int = 1) -> None:
        if count <= 0:
            return
        first = self.stats.invalid_codes == 0
        self.stats.invalid_codes += count
        if first:
            logger.warning("an audio token outside its band", extra={
                "request_id": self._request_id, "policy": self._policy})

    def _invalid_frame(self) -> None:
        self.stats.invalid_frames += 1
        logger.warning("skipping SNAC frame with an out-of-band code",
                       extra={"request_id": self._request_id,
                              "invalid_frames": self.stats.invalid_frames})

    def _feed_vector(self, delta: _Delta) -> list[np.ndarray]:
        """The whole delta at once (``_read``): every frame it completes checked in one
        comparison."""
        self.stats.tokens += delta.tokens
        self.stats.stopped = self.stats.stopped or delta.stopped
        self.stats.other_tokens += delta.other_tokens
        codes, valid = delta.codes, delta.valid
        if codes.size == 0:
            return []
        self._out_of_band(int(valid.size - np.count_nonzero(valid)))
        n, pos = self._n, self._pos
        if pos:  # the frame the last delta began
            codes = np.concatenate((self._current[:pos], codes))
            valid = np.concatenate((np.full(pos, not self._bad), valid))
        whole = codes.size - codes.size % n
        rest = codes.size - whole
        self._current[:rest] = codes[whole:]
        self._bad = not valid[whole:].all()
        self._pos = rest
        if not whole:
            return []
        ok = valid[:whole].reshape(-1, n).all(axis=1)
        for _ in range(int(ok.size - np.count_nonzero(ok))):
            self._invalid_frame()
        frames = codes[:whole].reshape(-1, n)[ok]
        self.stats.frames += len(frames)
        return list(frames)


class BiCodecFramer:
    """Splits a Spark-style stream into its first 32 globals and the semantic tokens after."""

    def __init__(
        self,
        profile: BiCodecLayout,
        table: TokenTable,
        request_id: str = "",
        captured_globals: Iterable[int] | None = None,
    ) -> None:
        self._kind = table.kind
        self._value = table.value
        self._need = profile.num_global_tokens
        self._request_id = request_id
        self.globals_: list[int] = list(captured_globals or [])
        self.stats = ParseStats()
        self.extra_globals = 0

    @property
    def has_globals(self) -> bool:
        return len(self.globals_) >= self._need

    def feed(self, token_ids: Iterable[int]) -> list[int]:
        """Consume ids; return new semantic values. Globals are kept in ``globals_``."""
        semantic: list[int] = []
        kind, value = self._kind, self._value
        for tid in token_ids:
            self.stats.tokens += 1
            k = kind[tid] if 0 <= tid < len(kind) else KIND_OTHER
            if k == KIND_STOP:
                self.stats.stopped = True
                break
            if k == KIND_GLOBAL:
                self.stats.global_tokens += 1
                if len(self.globals_) < self._need:
                    self.globals_.append(int(value[tid]))
                else:
                    self.extra_globals += 1
            elif k == KIND_SEMANTIC:
                if self.has_globals:
                    semantic.append(int(value[tid]))
                    self.stats.frames += 1
                else:
                    self.stats.invalid_frames += 1
            else:
                self.stats.other_tokens += 1
        return semantic
