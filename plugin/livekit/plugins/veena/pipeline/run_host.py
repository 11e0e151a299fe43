"""What a request's run needs from the two objects around it: the synthesis it belongs to
(where it reports) and the pipeline that hosts it (what it runs on). Protocols, so that a
run never imports either."""

from __future__ import annotations

from typing import Protocol

from ..codecs.base import Codec
from .alarm import SharedAlarm
from .engine import VllmEngine
from .family import ModelFamily
from .guards import GuardLog
from .options import PipelineOptions
from .pacing import PacingOptions
from .parsing import TokenTable
from .sampling_policy import SamplingPolicy
from .scheduler import DecodeScheduler
from .timings import Timings
from .windowing import WindowOptions
from ..watermark import PerthWatermarker


class RunOwner(Protocol):
    """What a run reports to the text's synthesis it belongs to."""

    request_id: str
    seed: int
    speaker_globals: tuple[int, ...] | None
    timings: Timings
    vllm_request_ids: list[str]
    guard_log: GuardLog
    held_back_samples: int
    """Samples held back after the run's sink (the watermark's) that the listener has not
    heard yet."""

    def captured(self, speaker_globals: tuple[int, ...]) -> None: ...


class RunHost(Protocol):
    """What a run needs from its caller (the pipeline): the run never imports it."""

    engine: VllmEngine
    codec: Codec
    scheduler: DecodeScheduler
    family: ModelFamily
    options: PipelineOptions
    window: WindowOptions
    pacing: PacingOptions
    alarm: SharedAlarm | None
    """Where producers park between the tokens they need (None: they take every token)."""
    sampling: SamplingPolicy
    watermarker: PerthWatermarker | None
    """Applied to every synthesis's audio as it is emitted (None: none)."""

    @property
    def table(self) -> TokenTable: ...

    async def start(self) -> None: ...
