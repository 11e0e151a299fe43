"""Per-request timings: where the time to first audio goes, and the real-time factor."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Timings:
    """Per-request timings, seconds since ``created`` (perf_counter based)."""

    created: float = field(default_factory=time.perf_counter)
    first_token: float | None = None
    last_token: float | None = None
    first_window_ready: float | None = None
    first_decode_done: float | None = None
    first_audio: float | None = None
    finished: float | None = None
    audio_seconds: float = 0.0
    tokens: int = 0
    invalid_frames: int = 0

    def _since(self, t: float | None) -> float | None:
        return None if t is None else t - self.created

    @property
    def first_token_ms(self) -> float | None:
        t = self._since(self.first_token)
        return None if t is None else t * 1000

    @property
    def first_audio_ms(self) -> float | None:
        t = self._since(self.first_audio)
        return None if t is None else t * 1000

    @property
    def wall_seconds(self) -> float:
        return (self.finished or time.perf_counter()) - self.created

    @property
    def real_time_factor(self) -> float | None:
        """Wall time per second of audio: below 1 is faster than real time."""
        return self.wall_seconds / self.audio_seconds if self.audio_seconds > 0 else None

    def breakdown_ms(self) -> dict[str, float | None]:
        def gap(a: float | None, b: float | None) -> float | None:
            return None if a is None or b is None else (b - a) * 1000

        return {
            "queue_and_prefill": gap(self.created, self.first_token),
            "first_window_fill": gap(self.first_token, self.first_window_ready),
            "first_decode": gap(self.first_window_ready, self.first_decode_done),
            "emit": gap(self.first_decode_done, self.first_audio),
            "first_audio": self.first_audio_ms,
        }
