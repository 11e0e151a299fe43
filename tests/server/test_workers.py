"""``veena-tts serve --workers 2``: two server processes, each with its own vLLM engine,
share one port; the kernel spreads connections between them, every stream is served,
``/metrics`` from either reports both, a worker that dies ends the server (with every other
worker and the shared metrics folder), SIGTERM stops them all (one server process too,
abandoning its engine's start), and a bad count or a port in use is one clear line.
``--shared-engine`` (both front ends of one core, and the core's end ending them) is shown
in ``tests/models/test_lora_golden.py``, with an adapter registered through each."""

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import psutil
import pytest

from ..servers import free_port, hear_context, poll_until

pytestmark = pytest.mark.slow  # launches veena-tts serve processes

HANG_GUARD_POLLS = 2400  # 20 min of 0.5 s polls: only against a hang (two engine starts)
TEST_HANG_GUARD_S = 2700  # the whole test, past pytest's 900 s per test: two engine starts
STREAMS = 16


def _launch(model_dir: str, port: int, log: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "livekit.plugins.veena.cli", "serve", "--model", model_dir,
         "--port", str(port), *args],
        env={**os.environ, "VEENA_MAX_MODEL_LEN": "2048", "VEENA_MAX_NUM_SEQS": "4", **env},
        stdout=subprocess.DEVNULL, stderr=log.open("wb"), start_new_session=True)


def _tcp(worker: psutil.Process, port: int, status: str) -> int:
    try:
        return sum(1 for c in worker.net_connections("tcp")
                   if c.laddr and c.laddr.port == port and c.status == status)
    except psutil.NoSuchProcess:
        return 0


def _children(process: psutil.Process, marker: str) -> list[psutil.Process]:
    """``process``'s children whose command line holds ``marker``."""
    found = []
    for child in process.children():
        try:
            if marker in " ".join(child.cmdline()):
                found.append(child)
        except psutil.NoSuchProcess:
            pass
    return found


def _workers(launcher: psutil.Process) -> list[psutil.Process]:
    """The launcher's worker processes (not multiprocessing's resource tracker, nor a
    shared engine core once it has titled itself)."""
    return _children(launcher, "spawn_main")


async def _both_listen(proc: subprocess.Popen, launcher: psutil.Process,
                       workers: list[psutil.Process], port: int, log: Path) -> None:
    """Until both workers listen on ``port`` (``workers`` is filled as they appear, for the
    test's clean-up)."""
    async def both_listen() -> bool:
        assert proc.poll() is None, log.read_text()[-3000:]
        workers[:] = _workers(launcher)
        return len(workers) == 2 and all(_tcp(w, port, "LISTEN") for w in workers)

    await poll_until(both_listen, "both workers listen", every_s=0.5, polls=HANG_GUARD_POLLS)


def _in_session(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid`` (a launched server and all it started, its
    engine's orphans too)."""
    found = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                found.append(p)
        except (OSError, psutil.Error):
            continue
    return found


def _reap(proc: subprocess.Popen, workers: list[psutil.Process]) -> None:
    """Whatever a failed test left running: the launcher and each worker's process group
    (its engine's processes)."""
    for w in workers:
        try:
            os.killpg(w.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(60)


async def _exit_code(proc: subprocess.Popen) -> int:
    async def ended() -> bool:
        return proc.poll() is not None

    await poll_until(ended, "the launcher exits", every_s=0.5, polls=HANG_GUARD_POLLS)
    return proc.returncode


async def _speak(session: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse) -> int:
    """One context to its end; the audio bytes it heard."""
    await ws.send_json({"type": "speak", "context_id": "c", "text": "Hello there.",
                        "continue": False, "sampling": {"max_tokens": 56}})
    event, heard = await hear_context(ws)
    assert event["type"] == "done", event
    return heard


async def _speak_on_both(s: aiohttp.ClientSession, port: int,
                         workers: list[psutil.Process]) -> None:
    """``STREAMS`` sockets, spread by the kernel over both workers (all on one: a 1 in 2**15
    chance), every stream heard to its end."""
    sockets = [await s.ws_connect(f"ws://127.0.0.1:{port}/v1/stream") for _ in range(STREAMS)]
    per_worker = {w.pid: _tcp(w, port, "ESTABLISHED") for w in workers}
    assert sum(per_worker.values()) == STREAMS and all(per_worker.values()), per_worker
    heard = await asyncio.gather(*(_speak(s, ws) for ws in sockets))
    assert all(h > 0 for h in heard), heard
    for ws in sockets:
        await ws.close()


@pytest.mark.engine
@pytest.mark.timeout(TEST_HANG_GUARD_S)
async def test_two_workers_share_a_port_and_report_together(tiny_model_dir, tmp_path):
    port = free_port()
    # every stream runs at once on whichever worker takes it (no admission refusal)
    proc = _launch(tiny_model_dir, port, tmp_path / "serve.log", "--workers", "2",
                   VEENA_MAX_NUM_SEQS=str(2 * STREAMS))
    launcher = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    try:
        await _both_listen(proc, launcher, workers, port, tmp_path / "serve.log")
        metrics_dir = Path(workers[0].environ()["PROMETHEUS_MULTIPROC_DIR"])
        assert metrics_dir.is_dir()
        url = f"http://127.0.0.1:{port}"
        async with aiohttp.ClientSession() as s:
            await _speak_on_both(s, port, workers)
            for _ in range(8):  # each scrape lands on either worker and reports both
                async with s.get(url + "/metrics") as r:
                    text = await r.text()
                assert 'veena_requests_total{outcome="done"} 16.0' in text, text
                assert "veena_engine_up 1.0" in text
        # one worker dies (with its engine): the server ends, and takes the other one along
        os.killpg(workers[1].pid, signal.SIGKILL)
        assert await _exit_code(proc) == 1
        gone, alive = psutil.wait_procs([workers[0]], timeout=60)
        assert not alive, "the other worker outlived the server"
        assert not metrics_dir.exists()
        log = (tmp_path / "serve.log").read_text()
        assert "a worker ended: stopping the server" in log
        assert "nanobind" not in log  # the stopped worker's exit reported nothing leaked
    finally:
        _reap(proc, workers)


def _engine_cores(process: psutil.Process) -> list[psutil.Process]:
    """vLLM's engine-core processes among ``process``'s children (vLLM titles them)."""
    return _children(process, "EngineCore")


@pytest.mark.engine
@pytest.mark.timeout(TEST_HANG_GUARD_S)
async def test_sigterm_while_the_engine_starts_abandons_the_start(tiny_model_dir, tmp_path):
    """One server process stopped while its vLLM engine core loads: the start is abandoned
    (the core terminated, not waited for), exit 0, nothing left running."""
    proc = _launch(tiny_model_dir, free_port(), tmp_path / "serve.log")
    server = psutil.Process(proc.pid)
    cores: list[psutil.Process] = []
    try:
        async def core_started() -> bool:  # the core titles itself once it runs
            assert proc.poll() is None
            cores[:] = _engine_cores(server)
            return bool(cores)

        await poll_until(core_started, "the engine core starts", every_s=0.1, polls=3000)
        proc.send_signal(signal.SIGTERM)
        assert await _exit_code(proc) == 0
        gone, alive = psutil.wait_procs(_in_session(proc.pid), timeout=60)
        assert not alive
        log = (tmp_path / "serve.log").read_text()
        assert "stopped while the engine was starting" in log
        # stopped within 0.1 s of the core titling itself, seconds of imports and loading
        # before it could be up: the start was abandoned, not waited out
        assert "vLLM engine ready" not in log
        # and the core's own workers with it (orphaned, they would load on, then fail)
        assert "Traceback" not in log
    finally:
        _reap(proc, [])


@pytest.mark.engine  # its workers (or the shared core) start loading their engines
@pytest.mark.parametrize("shared", [[], ["--shared-engine"]], ids=["own", "shared"])
async def test_sigterm_stops_every_worker(tiny_model_dir, tmp_path, shared):
    """Stopped while its first worker is still loading (or, shared, while the core starts):
    exit 0, nothing left running."""
    proc = _launch(tiny_model_dir, free_port(), tmp_path / "serve.log", "--workers", "2",
                   *shared)
    launcher = psutil.Process(proc.pid)
    workers: list[psutil.Process] = []
    try:
        cores: list[psutil.Process] = []

        async def started() -> bool:  # the core titles itself once it runs
            assert proc.poll() is None
            workers[:], cores[:] = _workers(launcher), _engine_cores(launcher)
            return bool(workers) and len(cores) == len(shared)

        await poll_until(started, "a worker starts", every_s=0.1, polls=3000)
        proc.send_signal(signal.SIGTERM)
        assert await _exit_code(proc) == 0
        gone, alive = psutil.wait_procs([*workers, *cores], timeout=60)
        assert not alive
        log = (tmp_path / "serve.log").read_text()
        assert "stopping the workers" in log
        # stopped within 0.1 s of the core titling itself, seconds of imports and loading
        # before it could be up: the launcher left vLLM's wait for it, not waited it out
        assert "the shared vLLM engine core is up" not in log
    finally:
        _reap(proc, workers)


@pytest.mark.parametrize("args, env, says", [
    (["--workers", "0"], {}, "workers must be in [1, 32], got 0"),
    (["--workers", "33"], {}, "workers must be in [1, 32], got 33"),
    ([], {"VEENA_SERVER_WORKERS": "two"}, "VEENA_SERVER_WORKERS='two' is not a valid int"),
    ([], {"VEENA_SERVER_WORKERS": "2", "VEENA_WORKER_STOP_S": "nan"},
     "VEENA_WORKER_STOP_S must be a finite number"),
    ([], {"VEENA_SERVER_WORKERS": "2", "VEENA_WORKER_STOP_S": "1e9"},  # Process.join overflowed
     "VEENA_WORKER_STOP_S must be in (0.0, 86400.0], got 1000000000.0"),
    (["--workers", "2"], {"VEENA_SHARED_ENGINE": "maybe"},
     "VEENA_SHARED_ENGINE='maybe' is not a boolean"),
])
def test_a_bad_worker_setting_is_one_clear_line(tiny_model_dir, tmp_path, args, env, says):
    proc = _launch(tiny_model_dir, free_port(), tmp_path / "serve.log", *args, **env)
    assert proc.wait(300) == 2
    log = (tmp_path / "serve.log").read_text()
    assert says in log and "Traceback" not in log, log


@pytest.mark.parametrize("args, env, says", [
    ([], {"VEENA_PORT": "http"}, "VEENA_PORT='http' is not a valid int"),
    ([], {"VEENA_PORT": "70000"}, "port must be in [0, 65535], got 70000"),
    (["--port", "-1"], {}, "port must be in [0, 65535], got -1"),
])
def test_a_bad_port_is_one_clear_line(tiny_model_dir, tmp_path, args, env, says):
    with (tmp_path / "serve.log").open("wb") as log:
        code = subprocess.run(
            [sys.executable, "-m", "livekit.plugins.veena.cli", "serve", "--model",
             tiny_model_dir, *args], env={**os.environ, **env}, stdout=subprocess.DEVNULL,
            stderr=log, timeout=300).returncode
    text = (tmp_path / "serve.log").read_text()
    assert code == 2 and says in text and "Traceback" not in text, text


def test_a_port_in_use_is_one_clear_line(tiny_model_dir, tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        proc = _launch(tiny_model_dir, taken.getsockname()[1], tmp_path / "serve.log",
                       "--workers", "2")
        assert proc.wait(300) == 2
    log = (tmp_path / "serve.log").read_text()
    assert "Address already in use" in log and "Traceback" not in log, log


_SECOND_SIGNAL = """
import logging, os, signal, sys, time
from pathlib import Path
from livekit.plugins.veena.server import workers

logging.basicConfig(level=logging.INFO)

folders = []
real_folder = workers._metrics_folder

def metrics_folder():
    folder, owned = real_folder()
    folders.append(folder)
    return folder, owned

def stop_all(started, readiness, stop_s):  # the workers take a while to drain: signals land
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # (a handler runs between two bytecodes; any raise would end this)
    print("stopped the workers", flush=True)

workers._metrics_folder = metrics_folder
workers._supervise = lambda *args: 0
workers._stop_all = stop_all
code = workers.run_workers("unused", profile=None, host="127.0.0.1", port=0, workers=2)
print("exit", code, "metrics folder left:", Path(folders[0]).exists(), flush=True)
"""


def test_a_second_signal_while_the_workers_stop_skips_no_cleanup():
    """Ctrl-C twice, or SIGTERM then the supervisor's SIGINT: the launcher's old handlers
    came back before it waited for its workers, so a second signal killed it there (or
    raised ``KeyboardInterrupt``), leaving the shared core, the port guard and the metrics
    folder behind."""
    out = subprocess.run([sys.executable, "-c", _SECOND_SIGNAL], capture_output=True,
                         text=True, timeout=300)  # a hang guard
    assert out.returncode == 0, out.stderr
    assert "stopped the workers" in out.stdout
    assert "exit 0 metrics folder left: False" in out.stdout
    assert "already stopping" in out.stderr and "Traceback" not in out.stderr
