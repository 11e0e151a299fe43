"""A thin shell over vLLM's v1 ``AsyncLLM``: token ids in, new token ids out, always abortable.

Every request gets a unique id; leaving the iterator early (cancel, ``aclose``, an error)
aborts the request in vLLM so no KV cache or scheduler slot outlives its listener.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import multiprocessing
import os
import time
import uuid
from dataclasses import asdict, dataclass
from typing import AsyncIterator, Callable, Sequence

from ..validation import check_int_list
from .adapters import Adapter, AdapterSet
from .engine_args import check_fits_started, engine_args, with_adapters
from .engine_options import MAX_TOKEN_ID, EngineOptions, SamplingOptions

logger = logging.getLogger(__name__)

_ABANDON_POLL_S = 0.5
"""While a closed engine's start is under way: how often its new engine core is looked for
(the start may not have spawned it yet)."""


def _kill_tree(pid: int) -> None:
    """SIGKILL a process and its descendants (an engine core's executor workers, which would
    otherwise go on loading, orphaned, until they find their parent gone)."""
    import psutil  # a dependency of vLLM, and of the [server] extra

    try:
        root = psutil.Process(pid)
        tree = [*root.children(recursive=True), root]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


class EngineError(RuntimeError):
    """A request failed in the engine; transient (the plugin maps it onto a retryable
    ``APIConnectionError``)."""


class EngineDeadError(EngineError):
    """The engine is gone (its core process died or it errored): nothing will succeed on
    it again, so this is never retried against the same engine."""


class EngineStartingError(EngineError):
    """The engine did not finish starting within the start-up bound."""


class EngineClosedError(EngineError):
    """The engine was closed before its start finished (a server stopped while loading)."""


@dataclass(frozen=True)
class EngineHealth:
    state: str
    """``stopped`` (not asked to start), ``starting``, ``ready``, ``failed`` (the last start
    raised; the next request tries again) or ``dead``."""
    reason: str | None = None

    @property
    def ok(self) -> bool:
        return self.state in ("stopped", "starting", "ready")


@dataclass(eq=False)
class _LiveRequest:
    """A running request's consumer: ``mark_dead`` cancels it while it waits on vLLM."""

    task: asyncio.Task | None = None
    """The task iterating the generator (one task from start to end, as ``async for``
    guarantees): ``mark_dead`` cancels it."""
    waiting: bool = False
    """Awaiting vLLM's next output (not handling the last one in the caller's code)."""
    killed: bool = False
    """Cancelled by ``mark_dead``: that cancellation is an ``EngineDeadError``."""


def _model_missing(error: BaseException) -> bool:
    """A start failure caused by files that are not there (a local path, a hub repository or
    an offline cache entry: all OSErrors), as opposed to a network blip."""
    seen: set[int] = set()
    e: BaseException | None = error
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and not isinstance(e, (ConnectionError, TimeoutError)):
            return True
        e = e.__cause__ or e.__context__
    return False


class VllmEngine:
    """One vLLM ``AsyncLLM`` per process, shared by every stream.

    The start runs once, as its own task: a caller that stops waiting (a timeout, a
    cancelled stream) never cancels it, so retries never start a second engine. A watcher
    polls vLLM's own liveness (its engine-core monitor sets ``errored`` when the core
    process dies); from then on every running and new request fails with
    ``EngineDeadError`` at once instead of waiting on an engine that will never answer."""

    _ids = itertools.count()

    def __init__(self, options: EngineOptions, *, health_poll_s: float = 0.2,
                 core: dict | None = None) -> None:
        """``core``: the addresses of an engine core another process launched, with this
        front end's ``client_index`` and the ``client_count`` sharing it
        (``server/shared_engine``); None: this process starts its own engine."""
        self.options = options
        self._core = core
        self._llm = None
        self._tokenizer = None
        self._start_task: asyncio.Task | None = None
        self._start_error: BaseException | None = None
        self._closing = False
        self._children_before: set = set()
        """This process's other children when the start began: the start spawned the rest."""
        self._watch_task: asyncio.Task | None = None
        self._health_poll_s = health_poll_s
        self.dead_reason: str | None = None
        self._dead_listeners: list[Callable[[str], None]] = []
        self._live: dict[str, _LiveRequest] = {}
        self.last_output = time.monotonic()
        """When any request last received tokens: proof that the engine makes progress."""
        self.adapters = AdapterSet()
        """The LoRA adapters this engine serves (``add_adapter``)."""

    @property
    def started(self) -> bool:
        return self._llm is not None

    @property
    def seq_slots(self) -> int:
        """The engine's sequences this process may fill: ``max_num_seqs``, or its even share
        of them where it is one of a shared core's front ends."""
        count = self._core["client_count"] if self._core is not None else 1
        return max(1, self.options.max_num_seqs // count)

    @property
    def health(self) -> EngineHealth:
        if self.dead_reason is not None:
            return EngineHealth("dead", self.dead_reason)
        if self._llm is not None:
            return EngineHealth("ready")
        if self._start_task is not None and not self._start_task.done():
            return EngineHealth("starting")
        if self._start_error is not None:
            return EngineHealth("failed", str(self._start_error))
        return EngineHealth("stopped")

    def add_dead_listener(self, listener: Callable[[str], None]) -> None:
        """Called once, with the reason, when the engine dies."""
        self._dead_listeners.append(listener)

    def remove_dead_listener(self, listener: Callable[[str], None]) -> None:
        """Undo ``add_dead_listener`` (a server app closing over a pipeline it does not own)."""
        with contextlib.suppress(ValueError):
            self._dead_listeners.remove(listener)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            from transformers import AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                self.options.tokenizer or self.options.model
            )
        return self._tokenizer

    async def start(self, timeout: float | None = None) -> None:
        """Start vLLM once (or wait for the start under way); ``timeout`` bounds only this
        wait (EngineStartingError), never the start itself."""
        if self.dead_reason is not None:
            raise EngineDeadError(f"vLLM engine is dead: {self.dead_reason}")
        if self._llm is not None:
            return
        if self._start_task is None or self._start_task.done():
            self._start_error = None
            self.options = with_adapters(self.options, self.adapters)
            self._start_task = asyncio.get_running_loop().create_task(
                self._start(), name="veena-engine-start")
        try:
            await asyncio.wait_for(asyncio.shield(self._start_task), timeout)
        except asyncio.TimeoutError:
            raise EngineStartingError(
                f"vLLM engine for {self.options.model!r} is still starting after {timeout:.1f} s"
            ) from None

    async def _start(self) -> None:
        self._children_before = set(multiprocessing.active_children())
        try:
            self._llm = await asyncio.get_running_loop().run_in_executor(None, self._build)
        except Exception as e:
            if self._closing:
                raise EngineClosedError(f"vLLM for {self.options.model!r} was closed while "
                                        "it started") from e
            self._start_error = e
            if _model_missing(e):  # retrying cannot help: say so once, for good
                self.mark_dead(f"model {self.options.model!r} not found: {e}")
                raise EngineDeadError(f"vLLM cannot start: model {self.options.model!r} "
                                      f"not found ({e})") from e
            raise EngineError(f"failed to start vLLM for {self.options.model!r}: {e}") from e
        self._watch_task = asyncio.get_running_loop().create_task(
            self._watch(), name="veena-engine-watch")

    def _build(self):
        opts = self.options
        if opts.model.startswith(("/", "./", "../", "~")) and not os.path.exists(
                os.path.expanduser(opts.model)):
            raise FileNotFoundError(f"no model folder at {opts.model}")
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = engine_args(opts)
        if self._core is None:
            logger.info("starting vLLM engine", extra={"engine": asdict(opts)})
            llm = AsyncLLM.from_engine_args(args)
        else:  # one front end of a shared engine core: the same config, its own index
            core = dict(self._core)
            count, index = core.pop("client_count"), core.pop("client_index")
            logger.info("attaching to the shared vLLM engine core",
                        extra={"engine": asdict(opts), "client_index": index,
                               "client_count": count})
            args._api_process_count, args._api_process_rank = count, index
            config = args.create_engine_config(UsageContext.ENGINE_CONTEXT)
            llm = AsyncLLM.from_vllm_config(config, disable_log_stats=True,
                                            client_addresses=core, client_count=count,
                                            client_index=index)
        logger.info("vLLM engine ready", extra={"model": opts.model})
        return llm

    async def _watch(self) -> None:
        while self._llm is not None and self.dead_reason is None:
            if self._llm.errored:
                self.mark_dead("the vLLM engine core exited or errored")
                return
            await asyncio.sleep(self._health_poll_s)

    def mark_dead(self, reason: str) -> None:
        """Record that the engine is gone; fail every waiting request and tell listeners."""
        if self.dead_reason is not None:
            return
        self.dead_reason = reason
        logger.error("vLLM engine is dead", extra={"reason": reason,
                                                    "live_requests": len(self._live)})
        # fail every request blocked on vLLM now; the others see ``dead_reason`` when they
        # come back for more
        for live in self._live.values():
            if live.waiting and live.task is not None and not live.task.done():
                live.killed = True
                live.task.cancel()
        for listener in self._dead_listeners:
            try:
                listener(reason)
            except Exception:
                logger.exception("engine-dead listener failed")

    def add_adapter(self, adapter: Adapter, replace: bool = False) -> Adapter:
        """Serve a checked adapter (``replace``: new files of one served): any rank before
        the start (which sizes LoRA for it), after it one the engine fits (ValueError)."""
        if self._start_task is not None:
            check_fits_started(self.options, adapter.rank)
        (self.adapters.replace if replace else self.adapters.add)(adapter)
        logger.info("adapter registered", extra={"adapter": adapter.name, "path": adapter.path,
                                                 "lora_int_id": adapter.int_id})
        return adapter

    def new_request_id(self, prefix: str = "tts") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}-{next(self._ids)}"

    @property
    def num_unfinished_requests(self) -> int:
        """Requests vLLM still holds (zero once every stream has finished or been aborted)."""
        if self._llm is None or self.dead_reason is not None:
            return 0
        return self._llm.get_num_unfinished_requests()

    @property
    def live_request_ids(self) -> frozenset[str]:
        return frozenset(self._live)

    async def generate(
        self,
        prompt_token_ids: Sequence[int],
        sampling: SamplingOptions,
        request_id: str | None = None,
        adapter: Adapter | None = None,
    ) -> AsyncIterator[list[int]]:
        """Yield each batch of NEW token ids; exiting early aborts the vLLM request.

        A plain ``async for`` over vLLM's stream (no task or wait per token): engine death
        reaches a request through ``mark_dead``, which cancels the consumer while it waits on
        vLLM (turned into ``EngineDeadError`` here) and is checked whenever it comes back for
        more. Everything handed to vLLM is re-checked by type here (ValueError), whatever
        the caller validated before."""
        params = sampling.validate().to_vllm()
        prompt = {"prompt_token_ids": list(check_int_list(
            "prompt_token_ids", prompt_token_ids, 0, MAX_TOKEN_ID))}
        if not prompt["prompt_token_ids"]:
            raise ValueError("prompt_token_ids is empty")
        await self.start()
        lora = {} if adapter is None else {"lora_request": adapter.lora_request()}
        if adapter is not None:  # its files stay while vLLM may read them (ValueError: gone)
            self.adapters.hold(adapter)
        assert self._llm is not None
        request_id = request_id or self.new_request_id()
        live = _LiveRequest(asyncio.current_task())
        self._live[request_id] = live
        finished = False
        outputs = self._llm.generate(prompt, params, request_id, **lora)
        try:
            live.waiting = True
            async for out in outputs:
                live.waiting = False
                self.last_output = time.monotonic()
                finished = out.finished
                if out.outputs:
                    new = list(out.outputs[0].token_ids)
                    if new:
                        yield new
                if finished:
                    break
                if self.dead_reason is not None:  # it died while the caller had the tokens
                    raise EngineDeadError(f"vLLM engine died during request {request_id}: "
                                          f"{self.dead_reason}")
                live.waiting = True
        except asyncio.CancelledError:
            if live.killed and live.task is not None and live.task.uncancel() == 0:
                # our own cancel from mark_dead, and nobody else's: the engine is gone
                raise EngineDeadError(f"vLLM engine died during request {request_id}: "
                                      f"{self.dead_reason}") from None
            raise
        except (GeneratorExit, EngineError):
            raise
        except Exception as e:  # vLLM raises its own types; callers see ours
            live.waiting = False
            if live.killed and live.task is not None and live.task.cancelling():
                live.task.uncancel()  # vLLM turned our cancel into its own error
            if self._llm is not None and getattr(self._llm, "errored", False):
                self.mark_dead(f"vLLM engine errored: {e!r}")
                raise EngineDeadError(f"vLLM engine died: {e}") from e
            raise EngineError(f"vLLM request {request_id} failed: {e}") from e
        finally:
            live.waiting = False
            self._live.pop(request_id, None)
            if not finished and self._llm is not None and self.dead_reason is None:
                await self._abort(request_id)
            with contextlib.suppress(Exception):
                await outputs.aclose()
            if adapter is not None:
                self.adapters.release(adapter)

    async def _abort(self, request_id: str) -> None:
        try:
            await asyncio.shield(self._llm.abort(request_id))
            logger.debug("aborted vLLM request", extra={"request_id": request_id})
        except Exception:
            logger.exception("failed to abort vLLM request", extra={"request_id": request_id})

    async def aclose(self) -> None:
        """Shut the engine down. A start still under way is abandoned where this process
        launched the engine: its engine-core processes are stopped (SIGTERM, then SIGKILL),
        so vLLM's wait for them ends at once instead of after the whole load (minutes for a
        large model)."""
        self._closing = True
        start, asked = self._start_task, set()
        while start is not None and not start.done():
            if self._core is None:  # the processes the start spawned: vLLM's engine core
                for child in set(multiprocessing.active_children()) - self._children_before:
                    # a core still loading only notes a SIGTERM (vLLM 0.32): killed next poll
                    if child.pid in asked:
                        _kill_tree(child.pid)
                    else:
                        child.terminate()
                    asked.add(child.pid)
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(start), _ABANDON_POLL_S)
        if self._watch_task is not None:
            self._watch_task.cancel()
        if self._llm is not None:
            llm, self._llm = self._llm, None
            llm.shutdown()
            # AsyncLLM.__del__ shuts down again, and at interpreter exit its module globals
            # are gone (a "TypeError: 'NoneType' object is not callable" traceback): the
            # engine is already down, so the second call has nothing left to do.
            llm.shutdown = lambda *args, **kwargs: None
