"""The aiohttp server: WebSocket streaming, OpenAI-compatible ``/v1/audio/speech``, voices,
health and Prometheus metrics, all over one pipeline (one engine, one decode scheduler).

Production runs every agent job's TTS through this server, so its edges are strict: every
client value is checked by type and range before it can reach vLLM, past capacity a new
stream is refused at once (``overloaded``, retryable) instead of slowing everyone down, a
client that stops reading or leaves loses its streams instead of holding server work, and
when the engine dies the server says so (``/health`` and ``/ready`` 503, ``engine_dead``)
and exits so that its supervisor replaces it.

This module only assembles the routes; each concern has its own module: ``options``,
``state`` (what every route shares), ``registry`` (the work running now), ``lifecycle``
(keepalive, refusal, drain), ``saved_voices``, ``errors`` (JSON errors, failure codes),
``turn_request`` (a turn's options, validated), ``middleware`` (API key, JSON errors),
``websocket``, ``speech``, ``voice_routes``, ``served_adapters`` and ``adapter_routes``
(LoRA voices), ``health``, ``admission``, ``metrics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Callable

from aiohttp import web

from ..models import loading
from ..models.adapters import AdapterError
from ..pipeline.engine import EngineClosedError
from ..pipeline.pipeline import Pipeline
from . import adapter_routes, health, speech, voice_routes, websocket
from .middleware import json_errors, require_api_key
from .options import MAX_HTTP_BODY_BYTES, ServerOptions
from .served_adapters import load_folder
from .state import STATE_KEY, ServerState

__all__ = ["ENGINE_DEAD_EXIT_CODE", "ServerOptions", "create_app", "run_server"]

logger = logging.getLogger(__name__)

WARM_KEY = web.AppKey("veena_warm", asyncio.Task)

ENGINE_DEAD_EXIT_CODE = 3
CONFIG_ERROR_EXIT_CODE = 2
"""A setting the server cannot serve with (as the command line's usage errors)."""


def create_app(pipeline: Pipeline, options: ServerOptions | None = None,
               own_pipeline: bool = True) -> web.Application:
    """The server app. With ``own_pipeline`` it starts the pipeline, closes it at exit, and
    stops the process (``ENGINE_DEAD_EXIT_CODE``) when the engine dies or fails to start."""
    app = web.Application(client_max_size=MAX_HTTP_BODY_BYTES,
                          middlewares=[json_errors, require_api_key])
    state = ServerState(pipeline, (options or ServerOptions.from_env()).validate())
    app[STATE_KEY] = state
    pipeline.scheduler.add_batch_listener(state.metrics.on_batch)
    pipeline.engine.add_dead_listener(state.lifecycle.on_engine_dead)
    app.router.add_get("/v1/stream", websocket.stream)
    app.router.add_post("/v1/audio/speech", speech.speech)
    app.router.add_get("/v1/voices", voice_routes.voices)
    app.router.add_post("/v1/voices", voice_routes.clone)
    app.router.add_post("/v1/adapters", adapter_routes.add)
    app.router.add_delete("/v1/adapters/{name}", adapter_routes.remove)
    if state.adapters.root is not None:
        app.cleanup_ctx.append(_keep_adapters_in_step)
    app.router.add_get("/health", health.health)
    app.router.add_get("/ready", health.ready)
    app.router.add_get("/metrics", health.metrics)

    async def detach(_app: web.Application) -> None:
        # the pipeline may be the caller's and outlive this app: leave it as it was found
        pipeline.scheduler.remove_batch_listener(state.metrics.on_batch)
        pipeline.engine.remove_dead_listener(state.lifecycle.on_engine_dead)
        state.metrics.close()
        state.lifecycle.close()

    async def drain(_app: web.Application) -> None:
        await state.lifecycle.drain()

    app.on_shutdown.append(drain)
    app.on_cleanup.append(detach)

    stopping = False

    def stop_later(reason: str) -> None:
        nonlocal stopping
        if stopping:
            return
        stopping = True
        delay = state.options.engine_dead_exit_s
        logger.error("stopping the server in %.1f s so its supervisor can replace it", delay,
                     extra={"reason": reason})
        asyncio.get_running_loop().call_later(delay, _raise_exit)

    async def warm(_app: web.Application) -> None:
        async def start() -> None:
            try:
                await pipeline.start()
                state.metrics.engine_up.set(1)
            except EngineClosedError:  # the server is stopping: its start was abandoned
                logger.info("stopped while the engine was starting")
            except Exception as e:
                logger.error("the engine failed to start: %s", e)
                # for good: a request meanwhile must not start a second load on the GPU
                # that just failed, nor leave the exit looking clean (dead: exit code 3)
                pipeline.engine.mark_dead(f"start failed: {e}")
                stop_later(f"start failed: {e}")

        _app[WARM_KEY] = asyncio.create_task(start())

    async def close(_app: web.Application) -> None:
        pipeline.engine.remove_dead_listener(stop_later)
        await pipeline.aclose()

    if own_pipeline:
        pipeline.engine.add_dead_listener(stop_later)
        app.on_startup.append(warm)
        app.on_cleanup.append(close)
    elif pipeline.ready:
        state.metrics.engine_up.set(1)
    return app


async def _keep_adapters_in_step(app: web.Application):
    task = asyncio.create_task(adapter_routes.refresh_forever(app[STATE_KEY]))
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def _raise_exit() -> None:
    raise web.GracefulExit()


class _StartFailed(Exception):
    """A worker's engine failed to start: it leaves before it opens the shared port."""


def run_server(model: str, *, profile: str | None, host: str, port: int,
               reuse_port: bool = False, on_ready: Callable[[], None] | None = None,
               engine_core: dict | None = None) -> int:
    """Serve until stopped; exit code ``ENGINE_DEAD_EXIT_CODE`` when the engine died or the
    server could not start (model or codec not loadable, engine start failed).

    One of several workers on a port (``workers.py``) passes ``reuse_port`` and ``on_ready``:
    its socket then opens only once its engine has started, and ``on_ready`` is called then,
    so that no client ever waits on a worker that is still loading, and ``engine_core``
    where the workers share one engine core (``shared_engine.py``)."""
    try:
        pipeline = loading.load_pipeline(model, profile=profile, engine_core=engine_core)
        adapters_dir = ServerOptions.from_env().adapters_dir
        if adapters_dir:  # served before the engine starts, which sizes LoRA for them
            load_folder(pipeline, adapters_dir)
    except AdapterError as e:  # a setting (VEENA_LORA, VEENA_ADAPTERS_DIR), not the engine
        logger.error("cannot serve the adapters: %s", e, extra={"model": model})
        return CONFIG_ERROR_EXIT_CODE
    except Exception as e:  # a model or codec that cannot be loaded is a failed start too
        logger.error("cannot load the model: %s", e, extra={"model": model})
        return ENGINE_DEAD_EXIT_CODE
    app = create_app(pipeline)
    if on_ready is not None:
        async def listen_when_ready(_app: web.Application) -> None:
            await _app[WARM_KEY]  # the start: it ends with the engine up or failed
            if not pipeline.ready:  # the port is shared: the healthy workers answer there
                await pipeline.aclose()  # (no cleanup runs after a failed startup)
                raise _StartFailed
            on_ready()

        app.on_startup.append(listen_when_ready)
    logger.info("serving", extra={"model": model, "host": host, "port": port})
    try:
        # aiohttp then waits for the HTTP requests still running as long as the drain may take
        web.run_app(app, host=host, port=port, print=None, reuse_port=reuse_port or None,
                    shutdown_timeout=app[STATE_KEY].options.drain_s + 2.0)
    except _StartFailed:
        logger.error("the engine did not start: this worker never opened the port")
        return ENGINE_DEAD_EXIT_CODE
    if pipeline.engine.health.state in ("dead", "failed"):
        return ENGINE_DEAD_EXIT_CODE
    return 0
