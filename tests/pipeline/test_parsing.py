"""Token table and SNAC framer: O(1) lookups; an out-of-band code handled as the profile's
reference does (one bad frame skipped on its own, by default)."""

from dataclasses import replace

import numpy as np
import pytest

from livekit.plugins.veena.models.profiles import MAYA1, ORPHEUS, VEENA
from livekit.plugins.veena.pipeline.parsing import (
    KIND_AUDIO,
    KIND_STOP,
    SnacFramer,
    TokenTable,
)

BASE = VEENA.audio_token_base
DROPPING = replace(VEENA, out_of_range_codes="drop_frame")
"""The default policy (a profile whose reference says nothing)."""


def _frame_ids(codes):
    return [BASE + p * 4096 + c for p, c in enumerate(codes)]


def test_table_kinds():
    t = TokenTable.for_snac(VEENA)
    assert t.kind[BASE] == KIND_AUDIO and t.value[BASE + 4096 + 5] == 4096 + 5
    assert all(t.kind[s] == KIND_STOP for s in VEENA.stop_token_ids)
    assert t.kind[100] == 0


def test_frames_deinterleaved_and_bad_frame_skipped(caplog):
    framer = SnacFramer(DROPPING, TokenTable.for_snac(VEENA), "req-1")
    good1 = [1, 2, 3, 4, 5, 6, 7]
    good2 = [4095, 0, 10, 20, 30, 40, 50]
    bad = _frame_ids([1, 2, 3, 4, 5, 6, 7])
    bad[3] = BASE + 5 * 4096  # a band-5 token at position 3
    ids = _frame_ids(good1) + [128000] + bad + _frame_ids(good2)
    frames = framer.feed(ids[:5]) + framer.feed(ids[5:])
    assert [list(f) for f in frames] == [good1, good2]
    assert framer.stats.invalid_frames == 1
    assert framer.stats.other_tokens == 1
    assert "req-1" in [getattr(r, "request_id", None) for r in caplog.records]


def test_stop_token_ends_parsing():
    framer = SnacFramer(VEENA, TokenTable.for_snac(VEENA))
    frames = framer.feed(_frame_ids(range(7)) + [VEENA.stop_token_ids[0]] + _frame_ids(range(7)))
    assert len(frames) == 1 and framer.stats.stopped


def _stream(seed: int, frames: int = 60):
    """Random frames with a foreign token, a bad-band frame and out-of-vocabulary ids mixed
    in, then a stop token and frames after it."""
    rng = np.random.default_rng(seed)
    ids = []
    for k in range(frames):
        frame = _frame_ids(rng.integers(0, 4096, 7).tolist())
        if k % 11 == 3:
            frame[rng.integers(0, 7)] = BASE + 6 * 4096 + 1  # a band-6 code out of place
        if k % 7 == 5:
            frame.insert(int(rng.integers(0, 7)), int(rng.choice([128000, -1, 10**7])))
        ids += frame
    return ids + [VEENA.stop_token_ids[0]] + _frame_ids(range(7))


@pytest.mark.parametrize("policy", ["drop_frame", "wrap", "skip_token", "end_chunk"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_delta_whole_or_token_by_token_gives_the_same_frames_and_stats(seed, policy):
    """The numpy path (long deltas) and the token-by-token path (short ones) agree, wherever
    the deltas cut the frames, under every out-of-range policy."""
    table = TokenTable.for_snac(VEENA)
    profile = replace(VEENA, out_of_range_codes=policy)
    ids = _stream(seed)
    whole = SnacFramer(profile, table, "whole")
    one = SnacFramer(profile, table, "one")
    mixed = SnacFramer(profile, table, "mixed")
    got_whole = whole.feed(ids)
    cuts = np.cumsum(np.random.default_rng(seed).integers(1, 80, len(ids)))
    cuts = [0] + [int(c) for c in cuts if c < len(ids)] + [len(ids)]
    got_one, got_mixed = [], []
    pieces = [iter(ids[a:b]) for a, b in zip(cuts, cuts[1:])]
    for framer, got, deltas in ((one, got_one, [[t] for t in ids]), (mixed, got_mixed, pieces)):
        for delta in deltas:  # as a run reads them: until the stop token
            got += framer.feed(delta)
            if framer.stats.stopped:
                break
    assert whole.stats.invalid_codes > 0 and whole.stats.stopped
    if policy != "end_chunk":
        assert len(got_whole) > 40
    assert (whole.stats.invalid_frames > 0) == (policy == "drop_frame")
    for got, framer in ((got_one, one), (got_mixed, mixed)):
        assert [f.tolist() for f in got] == [f.tolist() for f in got_whole]
        assert framer.stats == whole.stats


def _with_a_bad_code():
    """Frame A, then frame B whose position 3 holds a band-5 token, then frame C."""
    a, b, c = [1, 2, 3, 4, 5, 6, 7], [11, 12, 13, 14, 15, 16, 17], [21, 22, 23, 24, 25, 26, 27]
    ids = _frame_ids(a) + _frame_ids(b) + _frame_ids(c)
    ids[7 + 3] = BASE + 5 * 4096 + 99
    return a, b, c, ids


@pytest.mark.parametrize("whole", [True, False], ids=["one delta", "token by token"])
def test_each_profile_handles_an_out_of_band_code_as_its_reference(whole):
    a, b, c, ids = _with_a_bad_code()
    table = TokenTable.for_snac(VEENA)

    def frames(profile):
        framer = SnacFramer(profile, table, profile.name)
        deltas = [ids * 3] if whole else [[t] for t in ids]  # x3: past the numpy threshold
        got = []
        for delta in deltas:
            got += [f.tolist() for f in framer.feed(delta)]
            if framer.stats.stopped:
                break
        assert framer.stats.invalid_codes >= 1
        return got

    # Maya1: (id - base) % 4096 for every slot, decoded as it is
    assert frames(MAYA1)[:3] == [a, [11, 12, 13, 99, 15, 16, 17], c]  # (5 * 4096 + 99) % 4096
    # Orpheus: the token dropped, the position kept; the tokens after it are of the wrong
    # band for position 3 too, until C's position-3 token: the frame resynchronises there
    assert frames(ORPHEUS)[:2] == [a, [11, 12, 13, 24, 25, 26, 27]]
    # Veena: its card raises, so nothing past the bad code: the chunk ends after frame A
    assert frames(VEENA) == [a]
    # the default: frame B skipped on its own
    assert frames(DROPPING)[:2] == [a, c]


# --- BiCodec side (the continuation interface; the decoder lands with its own issue) ---

from livekit.plugins.veena.models.profiles import VEENA3  # noqa: E402
from livekit.plugins.veena.pipeline.parsing import (  # noqa: E402
    KIND_GLOBAL,
    KIND_SEMANTIC,
    BiCodecFramer,
)


def _spark_vocab():
    vocab = {"<|end_semantic_token|>": 0, "hello": 1}
    vocab.update({f"<|bicodec_global_{i}|>": 10 + i for i in range(4096)})
    vocab.update({f"<|bicodec_semantic_{i}|>": 5000 + i for i in range(8192)})
    return vocab


def test_bicodec_table_from_vocabulary():
    t = TokenTable.for_bicodec(VEENA3, _spark_vocab())
    assert t.kind[10 + 7] == KIND_GLOBAL and t.value[10 + 7] == 7
    assert t.kind[5000 + 8191] == KIND_SEMANTIC and t.value[5000 + 8191] == 8191
    assert t.kind[0] == KIND_STOP and t.kind[1] == 0
    with pytest.raises(ValueError, match="bicodec"):
        TokenTable.for_bicodec(VEENA3, {"hello": 0})


def test_bicodec_framer_captures_exactly_32_globals_then_semantics():
    t = TokenTable.for_bicodec(VEENA3, _spark_vocab())
    f = BiCodecFramer(VEENA3, t, "turn-1")
    ids = [10 + g for g in range(40)] + [5000 + s for s in (3, 4, 5)] + [0, 5000 + 9]
    assert f.feed(ids[:20]) == [] and not f.has_globals
    assert f.feed(ids[20:]) == [3, 4, 5]
    assert f.globals_ == list(range(32)) and f.extra_globals == 8 and f.stats.stopped


def test_bicodec_continuation_reuses_given_globals():
    t = TokenTable.for_bicodec(VEENA3, _spark_vocab())
    f = BiCodecFramer(VEENA3, t, captured_globals=range(100, 132))
    assert f.has_globals and f.feed([5000 + 1, 5000 + 2]) == [1, 2]


@pytest.mark.parametrize("bad", [list(range(31)), list(range(33)), [4096] * 32, [-1] * 32])
def test_continuation_globals_validated(bad):
    with pytest.raises(ValueError):
        VEENA3.check_globals(bad)


def test_continuation_prompt_prefills_the_globals():
    class Tok:
        def encode(self, text, add_special_tokens=False):
            self.text = text
            return [len(text)]

    tok = Tok()
    VEENA3.build_prompt(tok, "नमस्ते।", "kavya", list(range(32)))
    assert tok.text.count("<|bicodec_global_") == 32
    assert tok.text.endswith("<|end_global_token|><|start_semantic_token|>")
