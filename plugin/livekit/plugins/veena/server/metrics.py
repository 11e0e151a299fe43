"""Prometheus metrics of one server process (its own registry, served at /metrics)."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily

from ..pipeline.turn import unknown_tags_removed


class _UnknownTags:
    """``veena_unknown_tags_removed_total``, read at each scrape from the process-wide count
    the turns keep (the pipeline knows nothing of Prometheus)."""

    def collect(self):
        metric = CounterMetricFamily(
            "veena_unknown_tags_removed",
            "Tags removed from text because the model does not perform them (e.g. <happy>, "
            "special tokens)")
        metric.add_metric([], unknown_tags_removed())
        yield metric


_LATENCY = (0.025, 0.05, 0.1, 0.15, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class ServerMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.first_audio = Histogram("veena_first_audio_seconds",
                                     "Time from a context's first text to its first audio",
                                     buckets=_LATENCY, registry=r)
        self.rtf = Histogram("veena_real_time_factor", "Wall time per second of audio",
                             buckets=(0.1, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0), registry=r)
        self.active_streams = Gauge("veena_active_streams",
                                    "Streams synthesizing (holding a stream slot)",
                                    registry=r)
        self.batch_size = Histogram("veena_decode_batch_size", "Windows per codec call",
                                    buckets=(1, 2, 4, 8, 16, 32, 64), registry=r)
        self.queue_wait = Histogram("veena_decode_queue_wait_seconds",
                                    "Time a window waited for the codec",
                                    buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
                                    registry=r)
        self.aborted = Counter("veena_aborted_requests_total",
                               "Streams (WebSocket contexts, speech requests) cancelled or "
                               "abandoned by their client", registry=r)
        self.finished = Counter("veena_requests_total", "Finished contexts by outcome",
                                ["outcome"], registry=r)
        self.queued_streams = Gauge("veena_queued_streams", "Streams waiting for a slot",
                                    registry=r)
        self.admitted_streams = Gauge("veena_admitted_streams", "Streams holding a slot",
                                      registry=r)
        self.stream_queue_wait = Histogram("veena_stream_queue_wait_seconds",
                                           "Time a stream waited for a slot",
                                           buckets=(0.0, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                                                    10.0), registry=r)
        self.rejected = Counter("veena_rejected_streams_total",
                                "Streams or connections refused for capacity", ["reason"],
                                registry=r)
        self.slow_clients = Counter("veena_slow_clients_total",
                                    "Connections closed because the client stopped reading",
                                    registry=r)
        self.buffered_bytes = Gauge("veena_buffered_bytes",
                                    "Audio bytes waiting to be sent, all connections", registry=r)
        self.connections = Gauge("veena_connections", "Open WebSocket connections", registry=r)
        self.engine_up = Gauge("veena_engine_up", "1 while the engine serves, 0 otherwise",
                               registry=r)
        r.register(_UnknownTags())

    def on_admission(self, admitted: int, queued: int) -> None:
        self.admitted_streams.set(admitted)
        self.queued_streams.set(queued)

    def on_batch(self, size: int, wait_s: float, _decode_s: float) -> None:
        self.batch_size.observe(size)
        self.queue_wait.observe(wait_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
