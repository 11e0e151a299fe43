"""A request's token budget: at most ``max_audio_s_per_char`` of audio per character, and,
where the model card caps a request itself, the card's cap (Veena's sample:
``min(int(len(text) * 1.3) * 7 + 21, 700)``) on the default budget of every chunk."""

from dataclasses import replace

from livekit.plugins.veena.models.profiles import ORPHEUS, VEENA
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from ..fakes import FakeEngine, ToneCodec


def _main(profile, text, max_tokens=None):
    p = Pipeline(FakeEngine(), ToneCodec(), profile, PipelineOptions())
    policy = p.sampling
    asked = replace(policy.defaults(), max_tokens=max_tokens)
    return policy.main(asked, text, 10, p.table).max_tokens, policy.token_budget(text, 10)


def test_veena_chunks_keep_the_model_cards_token_cap():
    for chars, cap in ((10, 112), (50, 476), (100, 700), (400, 700)):
        got, budget = _main(VEENA, "x" * chars)
        assert cap == min(int(chars * 1.3) * 7 + 21, 700)  # the card's own formula
        assert got == min(cap, budget) and got <= cap
    assert _main(VEENA, "x" * 50)[0] < _main(VEENA, "x" * 50)[1]  # tighter than ours


def test_a_given_max_tokens_and_a_card_without_a_cap_keep_the_budget():
    got, budget = _main(VEENA, "x" * 50, max_tokens=900)
    assert got == min(900, budget) > 476
    got, budget = _main(ORPHEUS, "x" * 50)
    assert got == budget > 476
