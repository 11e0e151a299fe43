"""Turns an LLM's text deltas into speakable chunks, as soon as each is safe to speak.

The first chunk is short (a clause) so first audio comes fast; later chunks are sentences,
merged up to a minimum length so each request carries enough prosody. Sentence ends are
Latin ``. ! ?`` and Indic ``। ॥``; decimals (3.14), abbreviations (Dr.), URLs and e-mail
addresses (example.com) never end a sentence. No chunk exceeds ``max_chars``: an overlong
sentence breaks at a clause mark or a space. Pure and synchronous.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..settings import env_int

SENTENCE_ENDS = ".!?।॥"
CLAUSE_ENDS = ",;:—–"
_CLOSERS = "\"'”’)]}»"
_ABBREVIATIONS = frozenset(
    "mr mrs ms dr prof sr jr st vs etc e.g i.e no inc ltd co mt fig approx dept est govt".split()
)


@dataclass(frozen=True)
class ChunkerOptions:
    first_min_chars: int = 12
    """The first chunk ends at the first clause or sentence mark after this many characters."""
    first_max_chars: int = 60
    min_chars: int = 40
    """Later chunks: sentences are merged until a chunk has at least this many characters."""
    max_chars: int = 250

    @classmethod
    def from_env(cls) -> "ChunkerOptions":
        return cls(
            first_min_chars=env_int("VEENA_CHUNK_FIRST_MIN_CHARS", cls.first_min_chars),
            first_max_chars=env_int("VEENA_CHUNK_FIRST_MAX_CHARS", cls.first_max_chars),
            min_chars=env_int("VEENA_CHUNK_MIN_CHARS", cls.min_chars),
            max_chars=env_int("VEENA_CHUNK_MAX_CHARS", cls.max_chars),
        ).validate()

    def validate(self) -> "ChunkerOptions":
        if not 1 <= self.first_min_chars <= self.first_max_chars <= self.max_chars:
            raise ValueError("chunker sizes must satisfy 1 <= first_min <= first_max <= max_chars")
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError("chunker min_chars must be in [1, max_chars]")
        return self


def _is_sentence_end(text: str, i: int, final: bool) -> bool | None:
    """Whether ``text[i]`` ends a sentence; None when the next character is not known yet."""
    ch = text[i]
    if ch in "।॥":
        return True
    if ch not in SENTENCE_ENDS:
        return False
    j = i + 1
    while j < len(text) and text[j] in _CLOSERS + SENTENCE_ENDS:
        j += 1
    if j == len(text):
        return True if final else None
    if not text[j].isspace():
        return False  # 3.14, example.com, a.b@c.d, "?!" inside a word
    if ch == ".":
        k = i
        while k > 0 and not text[k - 1].isspace():
            k -= 1
        word = text[k:i].lower().strip("\"'(")
        if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
            return False  # "Dr. Rao", "J. Smith"
    return True


def _end_after_closers(text: str, i: int) -> int:
    j = i + 1
    while j < len(text) and text[j] in _CLOSERS + SENTENCE_ENDS:
        j += 1
    return j


class TextChunker:
    def __init__(self, options: ChunkerOptions = ChunkerOptions()) -> None:
        self.options = options.validate()
        self._buf = ""
        self._chunks_out = 0

    def push(self, delta: str) -> list[str]:
        self._buf += delta
        return self._drain(final=False)

    def flush(self) -> list[str]:
        """End of input: everything left comes out (still bounded by ``max_chars``)."""
        out = self._drain(final=True)
        rest = self._buf.strip()
        self._buf = ""
        if rest:
            out.append(rest)
            self._chunks_out += 1
        return out

    def _drain(self, *, final: bool) -> list[str]:
        out = []
        while True:
            cut = self._find_cut(final)
            if cut is None:
                return out
            chunk, self._buf = self._buf[:cut].strip(), self._buf[cut:].lstrip()
            if chunk:
                out.append(chunk)
                self._chunks_out += 1

    def _find_cut(self, final: bool) -> int | None:
        o = self.options
        first = self._chunks_out == 0
        min_len = o.first_min_chars if first else o.min_chars
        max_len = o.first_max_chars if first else o.max_chars
        buf = self._buf
        last_clause = last_space = None
        i = 0
        while i < len(buf):
            ch = buf[i]
            if ch.isspace():
                last_space = i
            elif ch in CLAUSE_ENDS and i + 1 < len(buf) and buf[i + 1].isspace():
                last_clause = i + 1
            end = _is_sentence_end(buf, i, final)
            if end is None:
                return None  # wait for the next character
            if end:
                cut = _end_after_closers(buf, i)
                if len(buf[:cut].strip()) >= min_len:
                    return cut
                i = cut
                continue
            if first and last_clause is not None and last_clause >= min_len:
                return last_clause
            if i + 1 >= max_len:
                for cut in (last_clause, last_space):
                    if cut is not None and cut > 0:
                        return cut
                return i + 1  # one unbroken run of max_len characters
            i += 1
        return None


def chunk_text(text: str, options: ChunkerOptions = ChunkerOptions()) -> list[str]:
    """Chunk a complete text (e.g. to split what would overflow the model context)."""
    chunker = TextChunker(options)
    return chunker.push(text) + chunker.flush()
