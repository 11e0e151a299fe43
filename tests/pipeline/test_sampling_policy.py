"""A request's token budget: the caller's own ``max_tokens`` (within the model context), else
one step past the chunk's one bound (``guards.chunk_bound_s``: the runaway guard ends a
runaway, not the engine) and, where the model card caps a request itself, within the card's
cap (Veena's sample: ``min(int(len(text) * 1.3) * 7 + 21, 700)``)."""

import math
from dataclasses import replace

from livekit.plugins.veena.models.profiles import ORPHEUS, VEENA
from livekit.plugins.veena.pipeline.guards import GuardOptions, RunGuards
from livekit.plugins.veena.pipeline.pipeline import Pipeline, PipelineOptions

from ..fakes import FakeEngine, ToneCodec


def _main(profile, text, max_tokens=None, guards=GuardOptions()):
    p = Pipeline(FakeEngine(), ToneCodec(), profile, PipelineOptions(guards=guards))
    policy = p.sampling
    asked = replace(policy.defaults(), max_tokens=max_tokens)
    bound = RunGuards.for_run(guards, text, p.codec, p.family, max_tokens is None).max_steps
    return policy.main(asked, text, 10, p.table, bound).max_tokens, bound


def test_veena_chunks_keep_the_model_cards_token_cap():
    for chars, cap in ((10, 112), (50, 476), (100, 700), (400, 700)):
        got, bound = _main(VEENA, "x" * chars)
        assert cap == min(int(chars * 1.3) * 7 + 21, 700)  # the card's own formula
        assert got == min(cap, 7 * (bound + 1) + 70)


def test_the_default_budget_is_one_step_past_the_chunks_bound_in_spoken_length():
    for text, length in (("x" * 50, 50), ("今天天气很好", 18), ("ok 你好", 9)):
        got, bound = _main(ORPHEUS, text)
        assert bound == math.ceil((1.5 + 0.1 * length) * 24000 / 2048)
        # + the 64 tokens the empty guard allows first, to a whole frame
        assert got == 7 * (bound + 1) + 70


def test_a_given_max_tokens_is_the_callers_and_no_bound_is_no_budget():
    assert _main(VEENA, "x" * 50, max_tokens=900) == (900, None)
    assert _main(ORPHEUS, "x" * 50, max_tokens=5000) == (5000, None)  # past any bound of ours
    off = GuardOptions(runaway_s_per_char=0)
    got, bound = _main(ORPHEUS, "x" * 50, guards=off)
    assert bound is None and got == (1 << 20) - 10  # the context only


def test_a_request_fits_the_context_for_any_text_of_its_languages():
    p = Pipeline(FakeEngine(), ToneCodec(), replace(ORPHEUS, languages=("zh",)),
                 PipelineOptions())
    p.engine.options = replace(p.engine.options, max_model_len=4096)
    policy = p.sampling
    chars = policy.max_chars_per_request()
    text = "好" * chars  # the most audio per character
    bound = RunGuards.for_run(GuardOptions(), text, p.codec, p.family, True).max_steps
    prompt = int(chars * 1.5) + 96
    assert policy.main(policy.defaults(), text, prompt, p.table,
                       bound).max_tokens == 7 * (bound + 1) + 70 <= 4096 - prompt
