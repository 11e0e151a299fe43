"""Turns an LLM's text deltas into speakable chunks, as soon as each is safe to speak.

The first chunk is short (a clause) so first audio comes fast; later chunks are sentences,
merged up to a minimum length so each request carries enough prosody. Sentence ends are
Latin ``. ! ?``, Indic ``। ॥`` and Chinese/Japanese ``。！？`` (clause marks ``，；：、``
too: that text has no spaces to break at); decimals (3.14), abbreviations (Dr.), URLs and
e-mail addresses (example.com) never end a sentence. No chunk exceeds ``max_chars``: an
overlong sentence breaks at a clause mark or a space, else between two characters as read
(the one exception: a tag longer than ``max_chars`` is a chunk of its own, whole). Pure and
synchronous.

Expressive tags (``<laugh>``, see ``tags``) are atomic: no cut falls inside one, even when
it arrives split across deltas. A tag belongs to the words after it, so a tag right after a
sentence end starts the next chunk; tags with nothing spoken after them at the end of the
text stay with the last words (never a chunk of only a tag). So after a sentence end the
chunker waits for the next character that is neither whitespace nor a tag, as it already
waits for the character after a ``.``. A sentence end followed directly by a tag
(``Hi!<laugh>``) is a sentence end too.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from ..settings import env_int
from ..validation import check_int
from .tags import TAG_PATTERN, is_partial_tag_at

_ALWAYS_ENDS = "।॥。！？"
"""Sentence ends whatever follows them (no space comes after them in their scripts)."""
SENTENCE_ENDS = ".!?" + _ALWAYS_ENDS
CLAUSE_ENDS = ",;:—–"
_WIDE_CLAUSE_ENDS = "，；：、"
"""Clause marks of unspaced scripts: a clause ends right after them."""
_CLOSERS = "\"'”’)]}»」』）】》〉"
_TAG = re.compile(TAG_PATTERN)
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
        for name in ("first_min_chars", "first_max_chars", "min_chars", "max_chars"):
            check_int(f"chunker {name}", getattr(self, name), 1, 1 << 20)
        if not 1 <= self.first_min_chars <= self.first_max_chars <= self.max_chars:
            raise ValueError("chunker sizes must satisfy 1 <= first_min <= first_max <= max_chars")
        if not 1 <= self.min_chars <= self.max_chars:
            raise ValueError("chunker min_chars must be in [1, max_chars]")
        return self


def _is_sentence_end(text: str, i: int, final: bool, bound: int) -> bool | None:
    """Whether ``text[i]`` ends a sentence; None when the next character is not known yet.
    A run of closers and marks reaching past ``bound`` ends one whatever follows (the chunk
    breaks within the run), so no reader waits on or rescans an endless ``!!!!``."""
    ch = text[i]
    if ch in _ALWAYS_ENDS:
        return True
    if ch not in SENTENCE_ENDS:
        return False
    j = _end_after_closers(text, i, bound)
    if j > bound:
        return True
    if j == len(text):
        return True if final else None
    if text[j] == "<" and not _TAG.match(text, j):
        if not final and is_partial_tag_at(text, j):
            return None  # "Hi!<lau": a tag may follow
        return False
    if not text[j].isspace() and text[j] != "<":
        return False  # 3.14, example.com, a.b@c.d, "?!" inside a word
    if ch == ".":
        k = i
        while k > 0 and not text[k - 1].isspace():
            k -= 1
        word = _TAG.sub("", text[k:i]).lower().strip("\"'(")
        if word in _ABBREVIATIONS or (len(word) == 1 and word.isalpha()):
            return False  # "Dr. Rao", "J. Smith"
    return True


def _settle(text: str, cut: int, j: int, final: bool, max_len: int) -> tuple[int | None, int]:
    """A cut before whitespace and tags: they go with the next words (``cut``), or, when
    nothing spoken follows them at the end of the text, with this chunk (``len(text)``,
    within ``max_len``). None while the next spoken character is not known yet, with where
    to go on reading (``j``: what lies between ``cut`` and it is whitespace and tags)."""
    while j < len(text):
        if text[j].isspace():
            j += 1
        elif m := _TAG.match(text, j):
            j = m.end()
        elif not final and text[j] == "<" and is_partial_tag_at(text, j):
            return None, j
        else:
            return cut, j
    if not final:
        return None, j
    return (len(text) if len(text.strip()) <= max_len else cut), j


_RUN_CHARS = _CLOSERS + SENTENCE_ENDS


def _end_after_closers(text: str, i: int, bound: int) -> int:
    """The end of the closers and marks after ``text[i]``, read no further than ``bound + 1``."""
    j, stop = i + 1, min(len(text), bound + 1)
    while j < stop and text[j] in _RUN_CHARS:
        j += 1
    return j


class TextChunker:
    def __init__(self, options: ChunkerOptions = ChunkerOptions()) -> None:
        self.options = options.validate()
        self._buf = ""
        self._chunks_out = 0
        self._settling: tuple[int, int] | None = None
        """(cut, read to) while a found cut waits for its next spoken character: later text
        cannot move the cut, so a push reads on from there, never the whole buffer again."""

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
        self._buf = self._buf.lstrip()  # positions count from the chunk's first character
        while True:
            cut = self._find_cut(final)
            if cut is None:
                return out
            self._settling = None
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
        if self._settling is not None:
            return self._settle(*self._settling, final, max_len)
        last_clause = last_space = space_after_tag = None
        tag_end = -1
        i = 0
        while i < len(buf):
            ch = buf[i]
            if ch == "<":
                m = _TAG.match(buf, i)
                if m is None and not final and is_partial_tag_at(buf, i):
                    return None  # "<lau": wait until it is a tag or not
                if m is not None:  # a tag is one unit: nothing inside it ends anything
                    i = tag_end = m.end()
                    if i > max_len:  # break before it; a tag longer than max_len is whole
                        return _forced_cut(buf, final, last_clause, last_space, space_after_tag,
                                           m.start() or i)
                    if i == max_len:
                        return _forced_cut(buf, final, last_clause, last_space, space_after_tag, i)
                    continue
            if ch.isspace():
                if i == tag_end:
                    space_after_tag = i  # cutting here would part a tag from its word
                else:
                    last_space = i
            elif ch in CLAUSE_ENDS and i + 1 < len(buf) and buf[i + 1].isspace():
                last_clause = i + 1
            elif ch in _WIDE_CLAUSE_ENDS:
                last_clause = i + 1
            elif ch in CLAUSE_ENDS and i + 1 == len(buf) and not final:
                return None  # a clause ends here if a space follows: wait to know
            end = _is_sentence_end(buf, i, final, max_len)
            if end is None:
                return None  # wait for the next character
            if end:
                cut = _end_after_closers(buf, i, max_len)
                if cut > max_len:  # "...end.।।" past the bound: break within it
                    return _forced_cut(buf, final, last_clause, last_space, space_after_tag, max_len)
                if len(buf[:cut].strip()) >= min_len:
                    return self._settle(cut, cut, final, max_len)
                i = cut
                continue
            if first and last_clause is not None and last_clause >= min_len:
                return self._settle(last_clause, last_clause, final, max_len)
            if i + 1 >= max_len:
                return _forced_cut(buf, final, last_clause, last_space, space_after_tag, i + 1)
            i += 1
        return None

    def _settle(self, cut: int, j: int, final: bool, max_len: int) -> int | None:
        if not final and cut >= len(self._buf):
            return None  # a run of marks may go on ("।" then "।"): the cut is not known yet
        found, j = _settle(self._buf, cut, j, final, max_len)
        self._settling = (cut, j) if found is None else None
        return found


def _forced_cut(text: str, final: bool, last_clause: int | None, last_space: int | None,
                space_after_tag: int | None, fallback: int) -> int | None:
    """Where an overlong chunk breaks: a clause mark, else a space (one that parts a tag
    from its word last), else ``fallback`` (one unbroken run of max_len characters), moved
    back to the start of its character as read (a vowel sign or accent stays on its letter,
    a joined emoji whole); None while what follows ``fallback`` is not known yet."""
    for cut in (last_clause, last_space, space_after_tag):
        if cut is not None and cut > 0:
            return cut
    if fallback >= len(text) and not final:
        return None  # the next character may belong to the last one
    cut = fallback
    while 0 < cut < len(text) and _joins_previous(text, cut):
        cut -= 1
    return cut or fallback


def _joins_previous(text: str, i: int) -> bool:
    """``text[i]`` belongs to the character before it: a combining mark (category M), a
    zero-width joiner, a variation selector, what follows a joiner, or the letter after a
    virama (an Indic conjunct: स्त). Never across a tag's edge or before a space."""
    ch, before = text[i], text[i - 1]
    if ch.isspace() or ch == "<" or before == ">":
        return False
    return (unicodedata.category(ch)[0] == "M" or ch in "\u200d\ufe0e\ufe0f"
            or before == "\u200d"
            or (unicodedata.combining(before) == 9 and unicodedata.category(ch)[0] == "L"))


def chunk_text(text: str, options: ChunkerOptions = ChunkerOptions()) -> list[str]:
    """Chunk a complete text (e.g. to split what would overflow the model context)."""
    chunker = TextChunker(options)
    return chunker.push(text) + chunker.flush()
