"""Which codec steps to decode when: bounded windows, so total work grows linearly.

``WindowPlanner`` is the fixed ramp (``VEENA_ADAPTIVE_WINDOWS=0``); the default planner,
``pacing.AdaptivePlanner``, makes windows of the same shape but sizes them from the
listener's buffer.

Each window decodes ``new`` steps plus ``left`` steps of context before and ``right`` after,
and keeps only the new steps' samples. The first window fires as soon as ``first`` new steps
and their right context exist (first audio fast). Window sizes then double (never more than
the audio already delivered, so the listener's buffer covers the wait for the next window
when tokens come at least twice real time) up to the steady ``new``; steady windows share
one shape and batch together. At the end of the stream the last window runs with
whatever right context there is, which matches a one-pass decode there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable


@dataclass(frozen=True)
class WindowOptions:
    first: int = 2
    new: int = 8
    left: int = 2
    right: int = 2

    def validate(self) -> "WindowOptions":
        if self.first < 1 or self.new < 1:
            raise ValueError("window sizes 'first' and 'new' must be >= 1")
        if self.left < 0 or self.right < 0:
            raise ValueError("window context 'left' and 'right' must be >= 0")
        return self


@dataclass(frozen=True)
class Window:
    """Decode steps [start, end); keep the samples of steps [keep_start, keep_end)."""

    start: int
    end: int
    keep_start: int
    keep_end: int

    @property
    def steps(self) -> int:
        return self.end - self.start

    @property
    def is_last(self) -> bool:
        return self.keep_end == self.end


def ramp_sizes(window: WindowOptions) -> list[int]:
    """The new-step sizes of the fixed ramp (``WindowPlanner``): ``first``, then the steps
    kept so far (doubling) up to ``new``."""
    sizes, kept = {window.first}, window.first
    while (size := min(window.new, max(window.first, kept))) != window.new:
        sizes.add(size)
        kept += size
    return sorted(sizes | {window.new})


def steady_window_steps(window: WindowOptions, sizes: Iterable[int]) -> list[int]:
    """Codec steps of the first window and of a window of each of ``sizes`` new steps with
    its left context full: the shapes a stream's windows take, bar its last one and, where
    ``first`` is below ``left``, its first few."""
    return sorted({window.first + window.right}
                  | {window.left + s + window.right for s in sizes})


class WindowPlanner:
    """Pure planner: tell it how many steps exist; it returns the windows now decodable."""

    def __init__(self, options: WindowOptions) -> None:
        self.options = options.validate()
        self.kept = 0  # steps whose samples a window has been planned for
        self.available = 0

    def add(self, count: int) -> list[Window]:
        self.available += count
        return self._plan(final=False)

    def cut(self, steps: int) -> None:
        """Only the first ``steps`` are played (a guard's cut; no window was planned past
        them)."""
        self.available = min(self.available, steps)

    def finish(self) -> list[Window]:
        return self._plan(final=True)

    def _plan(self, *, final: bool) -> list[Window]:
        o, out = self.options, []
        while True:
            size = o.first if self.kept == 0 else min(o.new, max(o.first, self.kept))
            if self.available >= self.kept + size + o.right:
                end = self.kept + size + o.right
                keep_end = self.kept + size
            elif final and self.available > self.kept:
                end = keep_end = self.available
            else:
                return out
            out.append(Window(max(0, self.kept - o.left), end, self.kept, keep_end))
            self.kept = keep_end
