"""The model-family seam: a third family is one module plus a profile. This one lives only
in the tests: a toy codec that turns each SNAC-band audio token of the tiny model into a
constant run of samples, driven through the product's own Pipeline and Turn."""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import pytest

from livekit.plugins.veena.codecs.base import CodecInput
from livekit.plugins.veena.models.families import (
    DecodeShape,
    ModelFamily,
    family_for,
    register_family,
)
from livekit.plugins.veena.models.profiles import VEENA, VoiceChecks
from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
from livekit.plugins.veena.pipeline.pacing import PacingOptions
from livekit.plugins.veena.pipeline.parsing import (
    KIND_AUDIO,
    KIND_STOP,
    ParseStats,
    TokenTable,
)
from livekit.plugins.veena.pipeline.pipeline import Pipeline
from livekit.plugins.veena.pipeline.turn import Turn, TurnOptions
from livekit.plugins.veena.pipeline.windowing import WindowOptions

STEP = 40


@dataclass(frozen=True)
class ToyProfile(VoiceChecks):
    name: str = "toy"
    voices: tuple[str, ...] = ("kavya",)
    default_voice: str = "kavya"
    codec: str = "toy"
    codec_model: str = ""
    sample_rate: int = 8000
    tokens_per_second: float = 200.0
    sampling: SamplingOptions = SamplingOptions()


class ToyCodec:
    name = "toy"
    sample_rate = 8000
    samples_per_step = STEP

    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        return [np.repeat(np.asarray(i.codes, np.float32) / 4096.0 - 0.5, STEP) for i in batch]

    def warmup(self) -> None:
        pass


class ToyTrack:
    """Each audio token is one step whose code is its value within its band."""

    def __init__(self, table: TokenTable) -> None:
        self._table = table
        self.stats = ParseStats()
        self.steps: list[int] = []

    def feed(self, ids: Sequence[int]) -> int:
        before = len(self.steps)
        for t in ids:
            if self._table.kind[t] == KIND_STOP:
                self.stats.stopped = True
                break
            if self._table.kind[t] == KIND_AUDIO:
                self.steps.append(int(self._table.value[t]) % 4096)
        return len(self.steps) - before

    def window_input(self, w, seed: int) -> CodecInput:
        return CodecInput(np.asarray(self.steps[w.start:w.end]), w.start, seed)

    @property
    def speaker_globals(self):
        return None


@register_family
class ToyFamily(ModelFamily):
    codec = "toy"

    decode_defaults = DecodeShape(WindowOptions(first=3, new=5, left=1, right=1),
                                  PacingOptions(max_new=32))

    def load_codec(self, codec_model: str, device: str, *, cuda_graphs: bool = False
                   ) -> ToyCodec:
        return ToyCodec()

    def token_table(self, tokenizer) -> TokenTable:
        return TokenTable.for_snac(VEENA)

    def new_track(self, table, request_id, speaker_globals) -> ToyTrack:
        return ToyTrack(table)

    def prompt(self, tokenizer, text, voice, speaker_globals) -> list[int]:
        return VEENA.build_prompt(tokenizer, text, voice)


def test_family_is_picked_by_the_profiles_codec():
    assert isinstance(family_for(ToyProfile()), ToyFamily)
    assert family_for(VEENA).codec == "snac" and not family_for(VEENA).has_speaker_globals
    with pytest.raises(ValueError, match="no model family"):
        family_for(ToyProfile(codec="nonesuch"))
    with pytest.raises(ValueError, match="speaker_globals"):
        family_for(ToyProfile()).check_globals([1, 2])


@pytest.mark.engine
async def test_a_third_family_runs_through_pipeline_and_turn(pipeline):
    toy = Pipeline(pipeline.engine, ToyCodec(), ToyProfile())  # the session's engine
    try:
        syn = toy.synthesize("Hello toy.", sampling=SamplingOptions(max_tokens=28), seed=1)
        pcm = np.concatenate([c.pcm async for c in syn])
        steps = syn.tracks[0].steps
        assert len(steps) > 0 and len(pcm) == len(steps) * STEP
        assert np.allclose(pcm, np.repeat(np.asarray(steps, np.float32) / 4096 - 0.5, STEP))
        pushed = []
        turn = Turn(toy, TurnOptions(voice="kavya", sampling=SamplingOptions(max_tokens=14),
                                     seed=3, chunk_crossfade_ms=0))
        await turn.speak(_aiter("One.", "Two."), pushed.append)
        assert sum(map(len, pushed)) > 0 and len(turn.request_ids) == 2
    finally:
        await toy.scheduler.aclose()


async def _aiter(*items):
    for i in items:
        yield i


def test_no_profile_type_checks_outside_the_families():
    root = Path(__file__).resolve().parents[2] / "plugin" / "livekit" / "plugins" / "veena"
    pattern = re.compile(r"isinstance\([^)]*(SnacProfile|BiCodecProfile)")
    offenders = [str(p.relative_to(root)) for p in root.rglob("*.py")
                 if "families" not in p.parts and pattern.search(p.read_text())]
    assert offenders == []
