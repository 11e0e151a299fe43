"""Several server processes on one port (``veena-tts serve --workers N``).

One Python process carries what one core can: at 256 real-time streams our event loop,
vLLM's front end (which lives in the serving process) and the codec's kernel launches need
about a whole core (bench/README.md, "The control plane"). So a GPU's worth of streams is
served by N server processes on that GPU, all listening on one port (``SO_REUSEPORT``: the kernel
spreads new connections between them). One pod, one Service port, one set of probes. Each
worker has its own engine on 1/N of ``VEENA_GPU_MEMORY_UTILIZATION``, or, with
``--shared-engine``, is one of N front ends of a single engine core the launcher starts
(``shared_engine.py``).

- Workers with their own engines start one after another, each once the previous one is
  ready, since vLLM sizes its KV cache from the GPU memory it finds free at start; front ends
  of a shared core start together while it starts. A worker opens the port only once its
  engine is up, so no client waits on one that is still loading.
- ``/metrics`` from any worker reports all of them (``PROMETHEUS_MULTIPROC_DIR``: a fresh
  folder unless one is given, whose stale files are removed at start).
- Any worker that ends ends the server, with that worker's exit code (3 when its engine
  died; 3 too when the shared engine core ends or fails to start): the supervisor
  (Kubernetes, systemd) replaces the whole pod, as it would the single process. SIGTERM or
  SIGINT to the launcher stops every serving worker gracefully and kills any still starting.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from multiprocessing.connection import wait
from pathlib import Path

from ..settings import env_float
from ..validation import MAX_DURATION_S, check_float, check_int
from .app import ENGINE_DEAD_EXIT_CODE
from .metrics import MULTIPROC_DIR_ENV, multiprocess_dir
from .shared_engine import SharedEngineCore

logger = logging.getLogger(__name__)

MAX_WORKERS = 32
WORKER_STOP_S = 30.0
"""How long the serving workers may take to stop (their streams end, their engines shut
down), all together, before one is killed (``VEENA_WORKER_STOP_S``)."""
_FAILED_EXIT_CODE = 1
"""A worker that ended without a code of its own (killed by a signal, or exited 0 while the
server was meant to run)."""


def run_workers(model: str, *, profile: str | None, host: str, port: int, workers: int,
                verbose: bool = False, shared_engine: bool = False) -> int:
    """Serve with ``workers`` processes until stopped; the exit code as ``run_server``'s.
    ``shared_engine``: the workers are front ends of one engine core (``shared_engine.py``)."""
    check_int("workers", workers, 1, MAX_WORKERS)
    stop_s = check_float("VEENA_WORKER_STOP_S", env_float("VEENA_WORKER_STOP_S", WORKER_STOP_S),
                         0.0, MAX_DURATION_S, lo_open=True)
    if not hasattr(socket, "SO_REUSEPORT"):
        raise ValueError("several workers need SO_REUSEPORT (Linux); run with --workers 1")
    guard = _reserve_port(host, port)
    port = guard.getsockname()[1]
    metrics, owned = _metrics_folder()
    stopping = threading.Event()
    launching = threading.Event()
    workers_started: list[mp.process.BaseProcess] = []
    readiness: dict[int, object] = {}
    """Worker pid -> the event it sets once it serves."""
    core: list[SharedEngineCore] = []

    def on_signal(signum: int, _frame) -> None:
        logger.info("stopping the workers", extra={"signal": signal.Signals(signum).name})
        stopping.set()
        if launching.is_set():  # vLLM waits for the core's start: leave that wait now
            launching.clear()
            raise _Stopped

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        if shared_engine:
            try:
                return _supervise_shared(model, profile, host, port, workers, verbose,
                                         stopping, launching, workers_started, readiness,
                                         core)
            except _Stopped:  # while the core started: what it started is stopped below
                return 0
        return _supervise(model, profile, host, port, workers, verbose, stopping,
                          workers_started, readiness)
    finally:
        def again(signum: int, _frame) -> None:  # a second Ctrl-C must not skip the cleanup
            logger.info("already stopping: the workers have up to %g s", stop_s,
                        extra={"signal": signal.Signals(signum).name})

        for s in previous:
            signal.signal(s, again)
        try:
            _stop_all(workers_started, readiness, stop_s)
            for c in core:  # after its front ends, as vllm serve stops them
                c.shutdown()
        finally:
            guard.close()
            if owned:
                shutil.rmtree(metrics, ignore_errors=True)
            for s, handler in previous.items():
                signal.signal(s, handler)


def _supervise(model: str, profile: str | None, host: str, port: int, count: int,
               verbose: bool, stopping: threading.Event,
               started: list[mp.process.BaseProcess], readiness: dict) -> int:
    for index in range(count):
        worker, ready = _start_worker(index, count, model, profile, host, port, verbose,
                                      started, readiness)
        if (code := _until_ready([ready], started, [], stopping)) is not None:
            return code
        logger.info("worker %d ready", index, extra={"worker": index, "pid": worker.pid})
    return _serve(count, host, port, started, [], stopping)


class _Stopped(BaseException):
    """SIGTERM or SIGINT while the shared core starts (raised from the signal handler; not
    an ``Exception``, so no start-failure handler takes it for one)."""


def _supervise_shared(model: str, profile: str | None, host: str, port: int, count: int,
                      verbose: bool, stopping: threading.Event, launching: threading.Event,
                      started: list[mp.process.BaseProcess], readiness: dict,
                      core: list[SharedEngineCore]) -> int:
    """The core first, every worker attaching while it starts (no worker sizes a KV cache,
    so they need not wait for each other); any of them ending ends the server. Stopped
    while the core starts, the start is abandoned (its processes stopped) at once."""
    def start(index: int, engine_core: dict) -> mp.process.BaseProcess:
        worker, _ = _start_worker(index, count, model, profile, host, port, verbose, started,
                                  readiness, engine_core)
        return worker

    launching.set()
    try:
        core.append(SharedEngineCore.launch(model, profile, count, start))
    except Exception as e:  # vLLM's own start error, or a worker that ended meanwhile
        logger.error("the shared vLLM engine core did not start: %s", e)
        return ENGINE_DEAD_EXIT_CODE
    finally:
        launching.clear()
    engines = core[0].processes
    if (code := _until_ready(list(readiness.values()), started, engines,
                             stopping)) is not None:
        return code
    return _serve(count, host, port, started, engines, stopping)


def _start_worker(index: int, count: int, model: str, profile: str | None, host: str,
                  port: int, verbose: bool, started: list[mp.process.BaseProcess],
                  readiness: dict, engine_core: dict | None = None):
    ctx = mp.get_context("spawn")  # CUDA and vLLM cannot live in a forked child
    ready = ctx.Event()
    worker = ctx.Process(target=_worker_main, name=f"veena-worker-{index}",
                         args=(index, count, model, profile, host, port, ready,
                               os.getpid(), verbose, engine_core))
    worker.start()
    started.append(worker)
    readiness[worker.pid] = ready
    logger.info("worker %d starting on port %d", index, port,
                extra={"worker": index, "pid": worker.pid, "port": port})
    return worker, ready


def _until_ready(readies: list, workers: list[mp.process.BaseProcess],
                 engines: list[mp.process.BaseProcess], stopping: threading.Event) -> int | None:
    """Wait until every worker in ``readies`` serves; an exit code if the server ends first
    (stopped: 0)."""
    while not all(ready.wait(0.2 / len(readies)) for ready in readies):
        if stopping.is_set():
            return 0
        if (code := _any_ended(workers, engines, 0)) is not None:
            return code
    return None


def _serve(count: int, host: str, port: int, workers: list[mp.process.BaseProcess],
           engines: list[mp.process.BaseProcess], stopping: threading.Event) -> int:
    logger.info("serving with %d workers on %s:%d", count, host, port,
                extra={"host": host, "port": port, "shared_engine": bool(engines)})
    while not stopping.is_set():
        if (code := _any_ended(workers, engines, 0.5)) is not None:
            return code
    return 0


def _any_ended(workers: list[mp.process.BaseProcess], engines: list[mp.process.BaseProcess],
               timeout: float) -> int | None:
    """The exit code the server ends with if a worker or the shared engine core has ended
    (waiting up to ``timeout``), else None."""
    if (ended := _first_ended([*workers, *engines], timeout)) is None:
        return None
    if ended in engines:
        ended.join()
        logger.error("the shared vLLM engine core ended: stopping the server so its "
                     "supervisor can replace it", extra={"pid": ended.pid,
                                                         "exitcode": ended.exitcode})
        return ENGINE_DEAD_EXIT_CODE
    return _ended(ended)


def _first_ended(workers: list[mp.process.BaseProcess],
                 timeout: float) -> mp.process.BaseProcess | None:
    """A worker that has exited (its sentinel closes as it exits), waiting up to
    ``timeout``; ``_ended`` joins it."""
    by_sentinel = {w.sentinel: w for w in workers}
    ended = wait(list(by_sentinel), timeout=timeout)
    return by_sentinel[ended[0]] if ended else None


def _ended(worker: mp.process.BaseProcess) -> int:
    worker.join()
    code = worker.exitcode if worker.exitcode and worker.exitcode > 0 else _FAILED_EXIT_CODE
    logger.error("a worker ended: stopping the server so its supervisor can replace it",
                 extra={"worker": worker.name, "pid": worker.pid, "exitcode": worker.exitcode})
    return code


def _stop_all(workers: list[mp.process.BaseProcess], readiness: dict, stop_s: float) -> None:
    """A serving worker stops gracefully (its streams end), all of them within ``stop_s``;
    one still starting has nothing to drain and may wait on a start that never ends (a
    front end of a core stopping too), so it is killed at once, with its process group (its
    own engine's processes)."""
    deadline = time.monotonic() + stop_s
    for w in workers:
        if w.is_alive():
            ready = readiness.get(w.pid)
            if ready is not None and ready.is_set():
                os.kill(w.pid, signal.SIGTERM)
            else:
                _kill_group(w)
    for w in workers:
        w.join(max(0.0, deadline - time.monotonic()))
        if w.is_alive():
            logger.warning("a worker did not stop in time: killed",
                           extra={"worker": w.name, "pid": w.pid})
            _kill_group(w)
            w.join()


def _kill_group(worker: mp.process.BaseProcess) -> None:
    """The worker and its process group (it leads one from its first line on)."""
    try:
        os.killpg(worker.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):  # killed before it made its group
        worker.kill()


def _reserve_port(host: str, port: int) -> socket.socket:
    """A bound, never-listening socket in the port's SO_REUSEPORT group: it fixes the port
    (``0`` picks a free one) for every worker and keeps other programs off it while workers
    restart; the kernel hands connections only to listening sockets."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    guard = socket.socket(family, kind, proto)
    try:
        guard.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        guard.bind(address)
    except OSError:
        guard.close()
        raise
    return guard


def _metrics_folder() -> tuple[Path, bool]:
    """The folder the workers share metrics through, and whether it is ours to remove."""
    given = multiprocess_dir()
    if given:
        folder = Path(given)
        folder.mkdir(parents=True, exist_ok=True)
        for stale in folder.glob("*.db"):  # a previous run's values would be summed in
            stale.unlink()
        return folder, False
    folder = Path(tempfile.mkdtemp(prefix="veena-metrics-"))
    os.environ[MULTIPROC_DIR_ENV] = str(folder)  # inherited by every worker
    return folder, True


def _worker_main(index: int, count: int, model: str, profile: str | None, host: str,
                 port: int, ready, launcher_pid: int, verbose: bool,
                 engine_core: dict | None = None) -> None:
    from ..log import configure_logging
    from ..pipeline.engine_options import EngineOptions
    from .app import run_server

    os.setpgrp()  # a terminal's Ctrl-C reaches the launcher, which stops each worker once
    configure_logging(verbose, process=f"worker {index}")
    if engine_core is None:  # its own engine, on its share of the GPU
        share = EngineOptions.from_env().gpu_memory_utilization / count
        os.environ["VEENA_GPU_MEMORY_UTILIZATION"] = repr(share)
    _watch_launcher(launcher_pid)
    raise SystemExit(run_server(model, profile=profile, host=host, port=port,
                                reuse_port=True, on_ready=ready.set, engine_core=engine_core))


def _watch_launcher(launcher_pid: int) -> None:
    """A worker whose launcher is gone (killed without stopping it) stops itself."""
    def watch() -> None:
        while os.getppid() == launcher_pid:
            threading.Event().wait(1.0)
        logger.error("the launcher is gone: stopping", extra={"launcher_pid": launcher_pid})
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="veena-launcher-watch", daemon=True).start()
