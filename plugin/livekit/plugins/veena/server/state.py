"""What every route shares: the pipeline, options, metrics and limits, and the parts that
hold the server's running state, each in its own module: ``registry`` (the work running
now), ``lifecycle`` (keepalive, refusal, drain, engine death), ``saved_voices`` and
``served_adapters``."""

from __future__ import annotations

from aiohttp import web

from ..pipeline.pipeline import Pipeline
from .admission import Admission
from .lifecycle import Lifecycle
from .metrics import ServerMetrics
from .options import ServerOptions
from .registry import LiveContext, LiveWork
from .saved_voices import SavedVoices
from .served_adapters import ServedAdapters


class ServerState:
    """What every route shares: the pipeline, limits, metrics, the running work, the
    server's lifecycle and the saved voices."""

    def __init__(self, pipeline: Pipeline, options: ServerOptions) -> None:
        self.pipeline = pipeline
        self.options = options
        self.metrics = ServerMetrics()
        self.admission = Admission(
            options.admission(pipeline.engine.seq_slots),
            on_change=self.metrics.on_admission, on_wait=self.metrics.stream_queue_wait.observe,
            on_reject=lambda reason: self.metrics.rejected.labels(reason).inc())
        self.connections = 0
        """Open WebSockets, against ``max_connections``."""
        self.live = LiveWork()
        self.lifecycle = Lifecycle(pipeline.engine, options, self.metrics, self.live)
        self.voices = SavedVoices(options.voices_dir, pipeline.profile)
        self.adapters = ServedAdapters(options.adapters_dir, pipeline)

    @property
    def contexts(self) -> set[LiveContext]:
        """Every running context, over all connections (``live.contexts``)."""
        return self.live.contexts

    @property
    def keepalive_running(self) -> bool:
        return self.lifecycle.keepalive_running


STATE_KEY = web.AppKey("veena_state", ServerState)


def server_state(request: web.Request) -> ServerState:
    return request.app[STATE_KEY]
