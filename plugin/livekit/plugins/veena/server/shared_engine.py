"""One vLLM engine core for every worker (``veena-tts serve --workers N --shared-engine``).

Without it each worker starts its own engine on 1/N of the GPU memory share: N engines take
turns on one GPU, each reading all the weights for a step of its own 1/N of the streams, each
with 1/N of the KV cache and its own CUDA graphs. Shared, the launcher starts one engine core
with the whole share (vLLM's own multi-front-end mode, as ``vllm serve --api-server-count N``)
and each worker's ``AsyncLLM`` is one of its N front ends: every worker keeps its own event
loop, vLLM output processing and codec (the CPU work one process cannot carry for a GPU's
worth of streams), and one engine step serves every stream of every worker.

Starting the core goes through vLLM 0.32's own launch path (``bind_engine_zmq_listeners``,
``launch_core_engines``), which is not a public API: the package pins vLLM exactly.
"""

from __future__ import annotations

import logging
from multiprocessing.process import BaseProcess
from typing import Callable

from ..models.loading import engine_options_of
from ..pipeline.engine_args import engine_args

logger = logging.getLogger(__name__)


class SharedEngineCore:
    """The launched core: its processes (watched by the launcher) and its shutdown."""

    def __init__(self, manager, listeners) -> None:
        self._manager = manager
        self._listeners = listeners

    @classmethod
    def launch(cls, model: str, profile: str | None, count: int,
               start_worker: Callable[[int, dict], BaseProcess]) -> "SharedEngineCore":
        """Start the core for ``count`` front ends; ``start_worker(index, core)`` starts the
        worker that attaches with ``core`` (``VllmEngine``'s). Returns once the core is up;
        raises if it failed to start or a worker ended while it started."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
        from vllm.v1.executor import Executor

        options = engine_options_of(model, profile)
        args = engine_args(options)
        args._api_process_count, args._api_process_rank = count, -1
        config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        logger.info("starting the shared vLLM engine core",
                    extra={"model": options.model, "front_ends": count})
        # only ``core`` holds the listeners: an import error vLLM caught and kept while this
        # ran keeps this frame alive, and vLLM's finalizer of the listeners fails at exit
        core = cls(None, bind_engine_zmq_listeners(config, count))
        try:
            with launch_core_engines(config, Executor.get_class(config), False,
                                     core._listeners.addresses) as launch:
                core._manager = launch.engine_manager  # a start that fails is shut down too
                workers = []
                for index, (inputs, outputs) in enumerate(zip(core._listeners.inputs,
                                                              core._listeners.outputs)):
                    workers.append(start_worker(index, {
                        "input_address": inputs.address, "output_address": outputs.address,
                        "input_listener": inputs.socket, "output_listener": outputs.socket,
                        "client_count": count, "client_index": index}))
                    inputs.close()  # the worker holds its own copy now
                    outputs.close()
                # a worker that ends while the core starts aborts the start
                launch.watched_frontend_processes = workers
        except BaseException:
            core.shutdown()
            raise
        logger.info("the shared vLLM engine core is up", extra={"front_ends": count})
        return core

    @property
    def processes(self) -> list[BaseProcess]:
        return list(self._manager.processes) if self._manager is not None else []

    def shutdown(self) -> None:
        """Stop the core (after its front ends) and free its listeners' addresses; once."""
        manager, listeners = self._manager, self._listeners
        self._manager = self._listeners = None  # vLLM's own finalizers find nothing left
        if manager is not None:
            manager.shutdown()
        if listeners is not None:
            listeners.cleanup()
