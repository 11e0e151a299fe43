"""Token table and SNAC framer: O(1) lookups, one bad frame skipped on its own."""

from livekit.plugins.veena.parsing import KIND_AUDIO, KIND_STOP, SnacFramer, TokenTable
from livekit.plugins.veena.profiles import VEENA

BASE = VEENA.audio_token_base


def _frame_ids(codes):
    return [BASE + p * 4096 + c for p, c in enumerate(codes)]


def test_table_kinds():
    t = TokenTable.for_snac(VEENA)
    assert t.kind[BASE] == KIND_AUDIO and t.value[BASE + 4096 + 5] == 4096 + 5
    assert all(t.kind[s] == KIND_STOP for s in VEENA.stop_token_ids)
    assert t.kind[100] == 0


def test_frames_deinterleaved_and_bad_frame_skipped(caplog):
    framer = SnacFramer(VEENA, TokenTable.for_snac(VEENA), "req-1")
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
