"""``/health``, ``/ready`` and ``/metrics``: what probes and Prometheus read.

They need no API key: probes (Kubernetes, Docker ``HEALTHCHECK``, a load balancer) and
scrapers rarely send one, and they say nothing a client could misuse. So they say nothing
private either: ``/ready`` names the model, never the folder it was loaded from.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from aiohttp import web

from .state import ServerState, server_state


def _engine_status(state: ServerState) -> dict[str, Any]:
    health = state.pipeline.engine.health
    return {"engine": health.state, **({"reason": health.reason} if health.reason else {})}


def public_model_name(model: str) -> str:
    """A hub id as it is; a local path by its last component only (the rest is this
    machine's layout, nobody else's business)."""
    local = model.startswith(("/", "./", "../", "~")) or os.path.isabs(model) or (
        "\\" in model) or os.path.exists(model)
    return Path(model.replace("\\", "/")).name if local else model


def profile_tags(profile: Any) -> list[str]:
    """The expressive tags the model performs (names without brackets; [] for none)."""
    return list(getattr(profile, "tags", ()))


async def health(request: web.Request) -> web.Response:
    """Alive: 200 while the engine is starting or serving; 503 once it is dead or failed.
    It names the model and whether its weights are random (a test model speaks noise)."""
    state = server_state(request)
    pipeline = state.pipeline
    ok = pipeline.engine.health.ok
    return web.json_response({"status": "ok" if ok else "unhealthy", **_engine_status(state),
                              "model": public_model_name(pipeline.engine.options.model),
                              "profile": pipeline.profile.name,
                              "random_weights": pipeline.random_weights},
                             status=200 if ok else 503)


async def ready(request: web.Request) -> web.Response:
    """Ready: 200 once the engine is started and the codec warm; 503 otherwise. Both name
    the sample rate and the model's tags, so a client knows them before the first stream."""
    state = server_state(request)
    pipeline = state.pipeline
    if pipeline.ready:
        return web.json_response({"status": "ready",
                                  "model": public_model_name(pipeline.engine.options.model),
                                  "profile": pipeline.profile.name,
                                  "sample_rate": pipeline.sample_rate,
                                  "tags": profile_tags(pipeline.profile),
                                  "active_streams": state.admission.active,
                                  "queued_streams": state.admission.queued})
    return web.json_response({"status": pipeline.engine.health.state, **_engine_status(state),
                              "sample_rate": pipeline.sample_rate,
                              "tags": profile_tags(pipeline.profile)}, status=503)


async def metrics(request: web.Request) -> web.Response:
    state = server_state(request)
    # read as scraped: an app over a pipeline it does not own never sees that start
    state.metrics.engine_up.set(1 if state.pipeline.ready else 0)
    return web.Response(body=state.metrics.render(),
                        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
