"""The server's limits and tunables: one typed dataclass, its defaults in one place, read from
the environment (``VEENA_*``) and checked by type and range before the server starts."""

from __future__ import annotations

from dataclasses import dataclass

from ..pipeline.chunking import ChunkerOptions
from ..settings import env_float, env_int, env_str
from ..sizing.fit import STREAMS_PER_PROCESS
from ..validation import MAX_C_INT, MAX_DURATION_S, check_float, check_int
from .admission import AdmissionOptions

MAX_HTTP_BODY_BYTES = 1 << 20
"""JSON bodies (``/v1/audio/speech``): larger ones are refused with 413 ``body_too_large``."""


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    """When set, every ``/v1/`` request needs ``Authorization: Bearer <key>``."""
    max_message_bytes: int = 65536
    """A WebSocket message past this (up to ``max_frame_bytes``) is answered with
    ``message_too_large`` and the socket stays open."""
    max_text_chars: int = 20000
    """Per WebSocket context and per /v1/audio/speech request."""
    max_contexts_per_connection: int = 16
    max_connections: int = 1024
    """Open WebSocket connections; one more is answered 503."""
    max_active_streams: int | None = None
    """Streams synthesizing at once (None: half the engine sequences this process may fill,
    ``VllmEngine.seq_slots``, since a turn keeps up to two engine requests in flight, and at
    most what one process's CPU carries, ``sizing.fit.STREAMS_PER_PROCESS``)."""
    max_queued_streams: int | None = None
    """Streams waiting for a slot (None: as many as ``max_active_streams``)."""
    max_queue_wait_s: float = 5.0
    turn_timeout_s: float = 30.0
    """A running stream that makes no progress for this long fails with ``timeout``."""
    context_idle_s: float = 60.0
    """A WebSocket context that receives no text and has nothing to speak for this long ends
    with ``idle_timeout`` (an idle context holds no stream slot, but a context slot and
    memory)."""
    slow_client_s: float = 10.0
    """A client that reads nothing for this long loses its contexts and its socket."""
    max_connection_buffer_bytes: int = 4 << 20
    """Audio waiting to be sent on one connection; past it the client counts as slow."""
    socket_send_buffer_bytes: int = 256 << 10
    """Kernel send buffer per WebSocket (bounds memory a non-reading client can hold)."""
    heartbeat_s: float = 30.0
    """Each WebSocket is pinged this often; a client that answers no ping for half as long
    again is gone: its socket closes and its contexts are cancelled."""
    keepalive_s: float = 1.0
    """A waiting context hears ``waiting`` this often, so clients can tell busy from dead."""
    engine_dead_exit_s: float = 5.0
    """After the engine dies, answer 503 this long, then exit non-zero."""
    voices_dir: str | None = None
    """Every ``*.json`` voice file here is a voice clients can name (by its file name)."""
    adapters_dir: str | None = None
    """Every folder here holding a PEFT LoRA adapter is a voice clients can name (by its
    folder name); ``POST /v1/adapters`` adds one (a hub id is downloaded into it)."""
    adapters_refresh_s: float = 10.0
    """How often the server looks at ``adapters_dir`` again: adapters another replica added
    or removed there are served or dropped here within this long."""
    max_voice_upload_bytes: int = 12 << 20
    """POST /v1/voices: the largest reference clip accepted (30 s of 48 kHz stereo float
    is 11.5 MB)."""
    drain_s: float = 20.0
    """On SIGTERM: how long contexts and requests that have all their text may go on
    speaking before they are cut (within ``VEENA_WORKER_STOP_S`` and Kubernetes' default 30 s
    grace period)."""
    chunk_crossfade_ms: float = 15.0
    """Crossfade between the audio of a turn's consecutive text chunks (as the plugin's)."""
    max_chunks_in_flight: int = 2
    """Chunks of one turn generating at once (2: the next generates while this one plays)."""
    chunker: ChunkerOptions = ChunkerOptions()

    @property
    def max_frame_bytes(self) -> int:
        """The largest WebSocket message read at all: a larger one closes the socket (1009),
        since answering it would mean buffering it whole. Between ``max_message_bytes`` and
        this, the client hears ``message_too_large`` and keeps its socket."""
        return max(4 * self.max_message_bytes, 4 << 20)

    @classmethod
    def from_env(cls) -> "ServerOptions":
        return cls(
            api_key=env_str("VEENA_API_KEY", "") or None,
            max_message_bytes=env_int("VEENA_MAX_MESSAGE_BYTES", cls.max_message_bytes),
            max_text_chars=env_int("VEENA_MAX_TEXT_CHARS", cls.max_text_chars),
            max_contexts_per_connection=env_int("VEENA_MAX_CONTEXTS_PER_CONNECTION",
                                                cls.max_contexts_per_connection),
            max_connections=env_int("VEENA_MAX_CONNECTIONS", cls.max_connections),
            max_active_streams=env_int("VEENA_MAX_ACTIVE_STREAMS", None),  # empty: derived
            max_queued_streams=env_int("VEENA_MAX_QUEUED_STREAMS", None),  # 0: no queue
            max_queue_wait_s=env_float("VEENA_MAX_QUEUE_WAIT_S", cls.max_queue_wait_s),
            turn_timeout_s=env_float("VEENA_TURN_TIMEOUT_S", cls.turn_timeout_s),
            context_idle_s=env_float("VEENA_CONTEXT_IDLE_S", cls.context_idle_s),
            slow_client_s=env_float("VEENA_SLOW_CLIENT_S", cls.slow_client_s),
            max_connection_buffer_bytes=env_int("VEENA_MAX_CONNECTION_BUFFER_BYTES",
                                                cls.max_connection_buffer_bytes),
            socket_send_buffer_bytes=env_int("VEENA_SOCKET_SEND_BUFFER_BYTES",
                                             cls.socket_send_buffer_bytes),
            heartbeat_s=env_float("VEENA_WS_HEARTBEAT_S", cls.heartbeat_s),
            keepalive_s=env_float("VEENA_KEEPALIVE_S", cls.keepalive_s),
            engine_dead_exit_s=env_float("VEENA_ENGINE_DEAD_EXIT_S", cls.engine_dead_exit_s),
            drain_s=env_float("VEENA_DRAIN_S", cls.drain_s),
            voices_dir=env_str("VEENA_VOICES_DIR", "") or None,
            adapters_dir=env_str("VEENA_ADAPTERS_DIR", "") or None,
            adapters_refresh_s=env_float("VEENA_ADAPTERS_REFRESH_S", cls.adapters_refresh_s),
            max_voice_upload_bytes=env_int("VEENA_MAX_VOICE_UPLOAD_BYTES",
                                           cls.max_voice_upload_bytes),
            chunker=ChunkerOptions.from_env(),
            chunk_crossfade_ms=env_float("VEENA_CHUNK_CROSSFADE_MS", cls.chunk_crossfade_ms),
            max_chunks_in_flight=env_int("VEENA_MAX_CHUNKS_IN_FLIGHT", cls.max_chunks_in_flight),
        ).validate()

    def validate(self) -> "ServerOptions":
        """Every setting by type and range, upper bounds included: a value the socket layer or
        a timer cannot take (``SO_SNDBUF`` past a C int made every WebSocket upgrade a 500)
        fails here, at start."""
        for name in ("max_message_bytes", "max_text_chars", "max_contexts_per_connection",
                     "max_connections", "max_connection_buffer_bytes",
                     "socket_send_buffer_bytes", "max_voice_upload_bytes"):
            check_int(name, getattr(self, name), 1, MAX_C_INT)
        for name in ("max_active_streams", "max_queued_streams"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 0 if name == "max_queued_streams" else 1,
                          MAX_C_INT)
        for name in ("max_queue_wait_s", "turn_timeout_s", "context_idle_s", "slow_client_s",
                     "heartbeat_s", "keepalive_s", "adapters_refresh_s"):
            check_float(name, getattr(self, name), 0.0, MAX_DURATION_S, lo_open=True)
        check_float("engine_dead_exit_s", self.engine_dead_exit_s, 0.0, MAX_DURATION_S)
        check_float("drain_s", self.drain_s, 0.0, MAX_DURATION_S)
        check_float("chunk_crossfade_ms", self.chunk_crossfade_ms, 0.0, 1000.0)
        check_int("max_chunks_in_flight", self.max_chunks_in_flight, 1, 64)
        return self

    def admission(self, max_num_seqs: int) -> AdmissionOptions:
        active = self.max_active_streams or max(1, min(max_num_seqs // 2, STREAMS_PER_PROCESS))
        queued = active if self.max_queued_streams is None else self.max_queued_streams
        return AdmissionOptions(active, queued, self.max_queue_wait_s)
