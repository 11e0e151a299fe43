"""A designed voice on the real tiny Maya1 model (vLLM, its Llama-3-style tokenizer, SNAC):
the prompt vLLM receives carries the voice file's description inside ``<description="...">``
and every request of every reply carries its seed; a preset in call scope keeps one seed
across replies. (The fake engine's tests in test_voice_design.py cover the rest.)"""

import pytest
from livekit.plugins import veena

from livekit.plugins.veena.voices.files import design_voice

pytestmark = pytest.mark.engine
DESCRIPTION = "Gravelly male voice in his 60s with a Scottish accent. Slow, kind pacing."


async def test_a_designed_voice_reaches_vllm_with_its_description_and_seed(maya1_pipeline,
                                                                          tmp_path, monkeypatch):
    p = maya1_pipeline
    seen: list[tuple[str, int]] = []
    real = p.engine.generate

    def recording(prompt, sampling, request_id=None):
        seen.append((p.engine.tokenizer.decode(list(prompt)), sampling.seed))
        return real(prompt, sampling, request_id)

    monkeypatch.setattr(p.engine, "generate", recording)
    path = design_voice(p.profile, DESCRIPTION, seed=99).save(tmp_path / "rob.json")
    filed = veena.TTS(pipeline=p, voice=str(path), max_tokens_per_chunk=70)
    for _ in range(2):
        frame = await filed.synthesize("Hello there <laugh> friend. How are you?").collect()
        assert frame.samples_per_channel > 0
    assert seen and {seed for _, seed in seen} == {99}
    assert all(f'<description="{DESCRIPTION}">' in text for text, _ in seen), seen[0][0]
    seen.clear()
    call = veena.TTS(pipeline=p, voice="noah", max_tokens_per_chunk=70)
    for _ in range(2):
        assert (await call.synthesize("Hello there, friend.").collect()).samples_per_channel > 0
    assert len(seen) >= 2 and len({seed for _, seed in seen}) == 1
    assert all(p.profile.render_voice("noah") in text for text, _ in seen)
    await filed.aclose()
    await call.aclose()
