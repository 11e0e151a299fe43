"""Prometheus metrics of the server, served at /metrics: one process's own registry, or,
with several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set, as ``serve --workers``
does), every live worker's values summed from the files they share, so that whichever
worker answers a scrape reports the whole server."""

from __future__ import annotations

import os

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from ..normalization.normalizer import add_failure_listener, failures
from ..pipeline.guards import add_guard_listener, guard_counts
from ..pipeline.turn import add_removed_tags_listener, unknown_tags_removed

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
"""prometheus_client reads it when first imported: set before a worker process starts."""


def multiprocess_dir() -> str | None:
    return os.environ.get(MULTIPROC_DIR_ENV) or None


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
                                    registry=r, multiprocess_mode="livesum")
        self.adapter_streams = Gauge("veena_adapter_streams",
                                     "Streams synthesizing with each LoRA adapter",
                                     ["adapter"], registry=r, multiprocess_mode="livesum")
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
                                    registry=r, multiprocess_mode="livesum")
        self.admitted_streams = Gauge("veena_admitted_streams", "Streams holding a slot",
                                      registry=r, multiprocess_mode="livesum")
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
                                    "Audio bytes waiting to be sent, all connections", registry=r,
                                    multiprocess_mode="livesum")
        self.connections = Gauge("veena_connections", "Open WebSocket connections", registry=r,
                                 multiprocess_mode="livesum")
        self.engine_up = Gauge("veena_engine_up", "1 while the engine serves, 0 otherwise "
                               "(several workers: 1 while every live one serves)",
                               registry=r, multiprocess_mode="livemin")
        self.unknown_tags = Counter(
            "veena_unknown_tags_removed",
            "Tags removed from text because the model does not perform them (e.g. <happy>, "
            "special tokens)", registry=r)
        self.unknown_tags.inc(unknown_tags_removed())  # the process's count so far
        self.guards = Counter(
            "veena_guard_fired", "Chunks a guard acted on: empty (asked again, or ended), "
            "loop (cut), runaway (cut), silence (cut)", ["guard"], registry=r)
        for guard, count in guard_counts().items():  # the process's counts so far
            self.guards.labels(guard).inc(count)
        self.normalization_failures = Counter(
            "veena_normalization_failures", "Chunks spoken as written because normalising "
            "their text failed", registry=r)
        self.normalization_failures.inc(failures())
        self._stop_listening = [add_removed_tags_listener(self.unknown_tags.inc),
                                add_guard_listener(lambda g: self.guards.labels(g).inc()),
                                add_failure_listener(self.normalization_failures.inc)]

    def close(self) -> None:
        """Stop counting this process's removed tags and guard firings (the app is done)."""
        for stop in self._stop_listening:
            stop()

    def streaming(self, adapter: str | None, on: bool) -> None:
        """A stream starts (``on``) or stops synthesizing, with its adapter if any."""
        (self.active_streams.inc if on else self.active_streams.dec)()
        if adapter is not None:
            gauge = self.adapter_streams.labels(adapter)
            (gauge.inc if on else gauge.dec)()

    def on_admission(self, admitted: int, queued: int) -> None:
        self.admitted_streams.set(admitted)
        self.queued_streams.set(queued)

    def on_batch(self, size: int, wait_s: float, _decode_s: float) -> None:
        self.batch_size.observe(size)
        self.queue_wait.observe(wait_s)

    def render(self) -> bytes:
        shared = multiprocess_dir()
        if shared is None:
            return generate_latest(self.registry)
        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=shared)
        return generate_latest(registry)
