"""The Orpheus profile end to end, its prompt and stop ids written as literals from
canopyai/Orpheus-TTS: ``orpheus_tts/engine_class.py`` ``_format_prompt`` builds
START_OF_HUMAN, the Llama-3 tokenizer's ids of ``"voice: text"`` (with its BOS), then
END_OF_TEXT, END_OF_HUMAN, START_OF_AI, START_OF_SPEECH, and decodes them to a string that
vLLM tokenises again with specials on: one more BOS first. The stop id, END_OF_SPEECH 128258,
is the one the package's realtime streaming example passes (``generate_tokens_sync``'s own
default is 49158). The tiny SNAC-layout tokenizer adds BOS as Llama-3's does."""

from dataclasses import replace

import pytest
from transformers import AutoTokenizer

from livekit.plugins.veena.models.profiles import ORPHEUS, VEENA
from livekit.plugins.veena.models.tiny_model import write_snac_tokenizer
from livekit.plugins.veena.pipeline.pipeline import Pipeline


@pytest.fixture(scope="module")
def llama3_like_tokenizer(tmp_path_factory):
    out = tmp_path_factory.mktemp("orpheus-tok")
    write_snac_tokenizer(ORPHEUS, out)
    tok = AutoTokenizer.from_pretrained(str(out))
    assert tok("hi")["input_ids"][0] == 128000, "adds BOS like Llama-3's tokenizer"
    return tok


def test_orpheus_prompt_is_the_reference_prompt(llama3_like_tokenizer):
    tok = llama3_like_tokenizer
    text = "Hello there, how are you?"
    words = tok.encode("tara: Hello there, how are you?", add_special_tokens=False)
    assert ORPHEUS.build_prompt(tok, text, "tara") == [
        128000, 128259, 128000, *words, 128009, 128260, 128261, 128257]
    assert ORPHEUS.stop_token_ids == (128258,)


def test_veena_prompt_has_no_bos(llama3_like_tokenizer):
    """maya-research/veena-tts' model card: START_OF_HUMAN, ``<spk_NAME> text``, then
    END_OF_HUMAN, START_OF_AI, START_OF_SPEECH; no BOS."""
    tok = llama3_like_tokenizer
    words = tok.encode("<spk_kavya> Namaste.", add_special_tokens=False)
    assert VEENA.build_prompt(tok, "Namaste.", "kavya") == [128259, *words, 128260, 128261,
                                                            128257]


@pytest.mark.engine
async def test_orpheus_speaks_end_to_end(pipeline):
    """The same tiny SNAC-layout Llama read with the Orpheus profile: its prompt (with BOS)
    reaches vLLM, frames are parsed and decoded, and the request ends on a stop id or its
    token budget."""
    orpheus = Pipeline(pipeline.engine, pipeline.scheduler.codec, ORPHEUS)
    try:
        budget = replace(orpheus.sampling.defaults(), max_tokens=7 * 24)  # the tiny model
        # never stops: a budget of its own, not the default one the runaway guard would cut
        syn = orpheus.synthesize("Hello from Orpheus.", voice="leo", seed=4, sampling=budget)
        pcm = await syn.collect()
        assert len(pcm) > 0 and len(pcm) % 2048 == 0
        assert syn.tracks[0].steps and orpheus.sample_rate == 24000
        prompt = orpheus.family.prompt(orpheus.engine.tokenizer, "Hello from Orpheus.", "leo",
                                       None)
        assert prompt[:3] == [128000, 128259, 128000]
        assert prompt[-4:] == [128009, 128260, 128261, 128257]
        with pytest.raises(ValueError, match="valid voices"):
            orpheus.synthesize("Hi.", voice="kavya")
    finally:
        await orpheus.scheduler.aclose()


class _NoBos:
    """A tokenizer that puts nothing before the text, specials on or off."""

    def encode(self, text, add_special_tokens=False):
        return [1 + ord(c) % 200 for c in text]


def test_the_leading_bos_follows_the_loaded_tokenizer(llama3_like_tokenizer):
    """The references tokenise a prompt string with specials on: a BOS-prepending tokenizer
    gets one more BOS first, one that prepends nothing gets none (both kinds)."""
    from livekit.plugins.veena.models.profiles import MAYA1
    from livekit.plugins.veena.models.profiles.snac import leading_bos

    assert leading_bos(llama3_like_tokenizer) == (128000,)
    assert leading_bos(_NoBos()) == ()
    assert ORPHEUS.build_prompt(_NoBos(), "Hi.", "tara")[0] == 128259
    assert MAYA1.build_prompt(_NoBos(), "Hi.", "ava")[:2] == [128259, 128000]
    assert VEENA.build_prompt(llama3_like_tokenizer, "Hi.", "kavya")[0] == 128259  # not Veena
