"""``Turn`` on its own, on the session's tiny model: chunks in, one float stream out with one
crossfade per seam; a chunk's failure surfaces in order; closing aborts every request."""

import asyncio
import collections
from dataclasses import replace

import numpy as np
import pytest

from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions

from ..helpers import engine_settled

pytestmark = pytest.mark.engine
CHUNK = 5 * 2048  # 35 tokens = 5 SNAC frames per chunk


def _options(pipeline, **kw) -> TurnOptions:
    sampling = replace(pipeline.sampling.defaults(), max_tokens=35)
    return TurnOptions(voice="kavya", sampling=sampling, seed=11, **kw)


async def _texts(*chunks):
    for c in chunks:
        yield c


async def test_turn_joins_chunks_in_order_as_float(pipeline):
    turn = Turn(pipeline, _options(pipeline, chunk_crossfade_ms=15.0))
    pushed = []
    await turn.speak(_texts("First chunk.", "Second chunk.", "Third."), pushed.append)
    audio = np.concatenate(pushed)
    assert audio.dtype == np.float32 and np.abs(audio).max() <= 1.0
    assert len(audio) == 3 * CHUNK - 2 * 360  # 15 ms at 24 kHz per seam
    assert len(turn.request_ids) == 3 and turn.audio_pushed
    assert turn.chunk_globals == [None, None, None]  # SNAC: nothing to capture
    assert await engine_settled(pipeline)


async def test_a_chunk_reaches_the_listener_whole_as_decoded(pipeline):
    """Within a chunk no sample waits for the next window (at exactly real time each would be
    a sample the listener runs dry without): every push is whole frames, except the last
    window's, whose 15 ms tail waits for a next chunk's seam and comes at the turn's end."""
    turn = Turn(pipeline, replace(_options(pipeline, chunk_crossfade_ms=15.0),
                                  sampling=replace(pipeline.sampling.defaults(), max_tokens=70)))
    lengths = []
    await turn.speak(_texts("Whole frames, window by window."), lambda pcm: lengths.append(len(pcm)))
    assert len(lengths) >= 3 and sum(lengths) == 10 * 2048
    assert all(n % 2048 == 0 for n in lengths[:-2])
    assert lengths[-2] % 2048 == 2048 - 360 and lengths[-1] == 360


async def test_turn_is_deterministic_for_a_seed(pipeline):
    """The same tokens, so the same audio within the decode's rounding: the listener-paced
    windows are cut where the listener happened to be, so a float may differ in its last
    bits (seen on a loaded machine)."""
    (_, audio, frames), (_, again, frames_again) = [
        await _recorded_turn(pipeline, ("Same words.",)) for _ in range(2)]
    assert np.array_equal(frames[0], frames_again[0])
    assert len(audio) == len(again) == CHUNK
    assert np.abs(audio - again).max() <= 1 / 32767


async def test_turn_failure_surfaces_and_close_aborts(pipeline):
    turn = Turn(pipeline, _options(pipeline, max_chunks_in_flight=2))
    pushed = []

    async def texts():
        yield "A good first chunk."
        yield "   "  # empty chunks are skipped, not errors
        yield "x" * 100_000  # too long for one request: split, still fine

    task = asyncio.create_task(turn.speak(texts(), pushed.append))
    while not pushed:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert await engine_settled(pipeline) and pipeline.scheduler.pending == 0
    bad = Turn(pipeline, replace(_options(pipeline), voice="nobody"))
    with pytest.raises(ValueError, match="unknown voice"):
        await bad.speak(_texts("Hello."), pushed.append)


async def test_the_turns_task_wakes_per_chunk_not_per_window(pipeline, monkeypatch):
    """The playing chunk's windows reach ``push`` from their decode's completion, so neither
    the turn's own task nor the task generating a chunk wakes per window: each wakes a few
    times per chunk however many windows the chunk has (the turn's woke for every window
    before, and the generating task once or twice per window after that)."""
    sampling = replace(pipeline.sampling.defaults(), max_tokens=280)
    # no progress check comes due on a slow machine (each would wake the task once more)
    turn = Turn(pipeline, TurnOptions(voice="kavya", sampling=sampling, seed=11,
                                      timeout=3600.0))
    steps: collections.Counter = collections.Counter()
    run = asyncio.events.Handle._run

    def counted(handle):
        owner = getattr(handle._callback, "__self__", None)
        if isinstance(owner, asyncio.Task):
            steps[owner.get_name().split("-")[1] if "veena-" in owner.get_name()
                  else owner.get_name()] += 1
        return run(handle)

    pushed = []
    monkeypatch.setattr(asyncio.events.Handle, "_run", counted)
    speaking = asyncio.create_task(turn.speak(_texts("First chunk.", "Second chunk."),
                                              pushed.append), name="turn")
    await speaking
    monkeypatch.undo()
    assert len(pushed) >= 20  # 80 frames in two chunks
    # its start, each chunk's arrival and end, the end of the text (6-7 here)
    assert steps["turn"] <= 8
    # per chunk: its start, its run's end, perhaps its producer's end (4 here, 25 windows)
    assert steps["chunk"] <= 8
    assert await engine_settled(pipeline)


async def _recorded_turn(pipeline, texts):
    """A turn whose engine requests are noted: per request, its ``stream_interval`` and the
    cumulative token count at each delta vLLM handed over; and the turn's audio and frames."""
    seen: dict[str, list[int]] = {}
    generate = pipeline.engine.generate

    async def noting(prompt, sampling, request_id=None):
        counts = seen.setdefault(request_id, [sampling.stream_interval])
        total = 0
        async for ids in generate(prompt, sampling, request_id):
            total += len(ids)
            counts.append(total)
            yield ids

    pipeline.engine.generate = noting
    try:
        turn = Turn(pipeline, _options(pipeline))
        pushed = []
        await turn.speak(_texts(*texts), pushed.append)
    finally:
        del pipeline.engine.generate  # the engine's own method again
    frames = [np.stack(turn._syns[i].tracks[0].steps) for i in range(len(texts))]
    return [seen[rid] for rid in turn.request_ids], np.concatenate(pushed), frames


async def test_a_chunk_behind_a_generating_chunk_takes_its_tokens_frame_by_frame(
        pipeline, monkeypatch):
    """The second chunk starts while the first generates: vLLM hands it its first token, then
    one delta per frame (7 tokens; merged further while its producer is parked), and the
    first chunk every token. The model makes the same tokens and the turn the same audio as
    with every token delivered (VEENA_QUEUED_OUTPUT_STEPS=0)."""
    texts = ("First chunk.", "Second chunk.")
    requests, audio, frames = await _recorded_turn(pipeline, texts)
    (first, *first_counts), (second, *second_counts) = requests
    assert (first, second) == (1, 7)
    assert first_counts[-1] == second_counts[-1] == 35
    assert second_counts[0] == 1  # the first token at once
    assert set(second_counts) <= {1, 8, 15, 22, 29, 35}  # then every 7th, and the end
    assert len(second_counts) <= 6  # the first chunk's count depends on its consumer's pace

    monkeypatch.setattr(pipeline, "options", replace(pipeline.options, queued_output_steps=0))
    requests_off, audio_off, frames_off = await _recorded_turn(pipeline, texts)
    monkeypatch.undo()
    assert [r[0] for r in requests_off] == [1, 1]
    assert all(np.array_equal(a, b) for a, b in zip(frames, frames_off))
    assert len(audio) == len(audio_off)
    assert np.abs(audio - audio_off).max() <= 1 / 32767  # the decode's rounding at most
    assert await engine_settled(pipeline)


async def test_queued_output_steps_reads_the_environment_and_is_checked(pipeline, monkeypatch):
    from livekit.plugins.veena.models.loading import pipeline_options_from_env
    from livekit.plugins.veena.pipeline.pipeline import Pipeline

    assert pipeline_options_from_env().queued_output_steps == 1
    monkeypatch.setenv("VEENA_QUEUED_OUTPUT_STEPS", "0")
    assert pipeline_options_from_env().queued_output_steps == 0
    for bad in ("-1", "65", "1.5", "yes"):
        monkeypatch.setenv("VEENA_QUEUED_OUTPUT_STEPS", bad)
        with pytest.raises(ValueError, match="VEENA_QUEUED_OUTPUT_STEPS"):
            pipeline_options_from_env()
    for bad in (True, -1, 2.0):
        with pytest.raises(ValueError, match="queued_output_steps"):
            Pipeline(pipeline.engine, pipeline.codec, pipeline.profile,
                     replace(pipeline.options, queued_output_steps=bad))
    # 2 frames of SNAC: 14 tokens a delivery; a larger interval already asked for stays
    options = replace(pipeline.options, queued_output_steps=2)
    monkeypatch.setattr(pipeline, "options", options)
    sampling = pipeline.sampling.defaults()
    assert pipeline.sampling.queued(sampling).stream_interval == 14
    assert pipeline.sampling.queued(replace(sampling, stream_interval=21)).stream_interval == 21
