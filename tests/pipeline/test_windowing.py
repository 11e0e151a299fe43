"""Window planning: every step is kept exactly once, in order, with bounded context."""

import pytest

from livekit.plugins.veena.pipeline.windowing import WindowOptions, WindowPlanner


def _run(opts, arrivals):
    planner = WindowPlanner(opts)
    windows = []
    for n in arrivals:
        windows += planner.add(n)
    return windows + planner.finish()


@pytest.mark.parametrize("total", [1, 3, 4, 11, 12, 13, 40, 97])
def test_every_step_kept_once(total):
    opts = WindowOptions(first=2, new=8, left=2, right=2)
    windows = _run(opts, [1] * total)
    kept = [s for w in windows for s in range(w.keep_start, w.keep_end)]
    assert kept == list(range(total))
    for w in windows:
        assert 0 <= w.start <= w.keep_start < w.keep_end <= w.end <= total
        assert w.keep_start - w.start <= opts.left
    assert windows[-1].is_last


def test_first_window_fires_early_and_steady_windows_share_a_shape():
    opts = WindowOptions(first=2, new=8, left=2, right=2)
    planner = WindowPlanner(opts)
    assert planner.add(3) == []
    (first,) = planner.add(1)  # 2 new + 2 right context
    assert (first.start, first.end, first.keep_start, first.keep_end) == (0, 4, 0, 2)
    later = planner.add(40)
    # sizes double while little audio is buffered, then stay at the steady size
    assert [w.keep_end - w.keep_start for w in later[:4]] == [2, 4, 8, 8]
    steady = [w for w in later if w.keep_start >= opts.new]
    assert steady and all(w.steps == opts.left + opts.new + opts.right for w in steady)


def test_bad_options_rejected():
    with pytest.raises(ValueError):
        WindowOptions(first=0).validate()
    with pytest.raises(ValueError):
        WindowOptions(left=-1).validate()
