"""Admission control on its own: slots, a bounded FIFO wait queue, refusals at once."""

import asyncio

import pytest

from livekit.plugins.veena.server.admission import (
    Admission,
    AdmissionOptions,
    Overloaded,
)


async def _settle():
    """Let woken tasks run (a hand-over takes a few loop turns; no clock involved)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def _hold(adm: Admission, release: asyncio.Event, log: list, name: str):
    async with adm.slot():
        log.append(name)
        await release.wait()


async def test_slots_queue_and_refusals():
    rejected = []
    adm = Admission(AdmissionOptions(max_active=2, max_queued=2, max_queue_wait_s=3600),
                    on_reject=rejected.append)
    release = {n: asyncio.Event() for n in "abcd"}
    log: list = []
    tasks = {n: asyncio.create_task(_hold(adm, release[n], log, n)) for n in "abcd"}
    await _settle()
    assert adm.active == 2 and adm.queued == 2 and log == ["a", "b"]
    with pytest.raises(Overloaded) as info:
        async with adm.slot():
            pass
    assert info.value.reason == "queue_full" and rejected == ["queue_full"]
    release["b"].set()
    await tasks["b"]
    await _settle()
    assert log == ["a", "b", "c"] and adm.active == 2 and adm.queued == 1  # FIFO hand-over
    for n in "acd":
        release[n].set()
    await asyncio.gather(*tasks.values())
    assert adm.active == 0 and adm.queued == 0 and log == ["a", "b", "c", "d"]


async def test_queue_wait_bound_refuses_and_cancelled_waiters_leave_no_trace():
    adm = Admission(AdmissionOptions(max_active=1, max_queued=4, max_queue_wait_s=0.05))
    release = asyncio.Event()
    holder = asyncio.create_task(_hold(adm, release, [], "a"))
    await _settle()
    with pytest.raises(Overloaded) as info:
        async with adm.slot():
            pass
    assert info.value.reason == "queue_timeout" and adm.queued == 0
    waiter = asyncio.create_task(_hold(adm, asyncio.Event(), [], "w"))
    await _settle()
    assert adm.queued == 1
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert adm.queued == 0 and adm.active == 1
    release.set()
    await holder
    assert adm.active == 0
