"""Model profiles: prompt layouts from the model cards, overrides, clear errors; the
``spark`` prompts token for token as Spark-TTS's own cli/SparkTTS.py builds them."""

from pathlib import Path

import pytest

from livekit.plugins.veena.models.download import llm_location
from livekit.plugins.veena.models.families import family_for
from livekit.plugins.veena.models.profiles import (
    CLONED_VOICE,
    ORPHEUS,
    SPARK,
    SPARK_GENDERS,
    SPARK_LEVELS,
    VEENA,
    VEENA3,
    get_profile,
    resolve_profile,
    spark_voice,
    with_overrides,
)
from livekit.plugins.veena.models.tiny_model import make_tiny_model


class _Tok:
    def encode(self, text, add_special_tokens=False):
        self.seen = (text, add_special_tokens)
        return [1, 2, 3]


def test_veena_prompt_layout():
    tok = _Tok()
    assert VEENA.build_prompt(tok, "Namaste", "kavya") == [128259, 1, 2, 3, 128260, 128261, 128257]
    assert tok.seen == ("<spk_kavya> Namaste", False)


def test_orpheus_prompt_layout():
    tok = _Tok()
    assert ORPHEUS.build_prompt(tok, "Hi", "tara") == [128259, 1, 2, 3, 128009, 128260, 128261, 128257]
    assert tok.seen == ("tara: Hi", True)


def test_overrides_and_lookup():
    custom = with_overrides(VEENA, voices=("asha",), default_voice="asha")
    assert custom.check_voice("asha") == "asha" and VEENA.voices != custom.voices
    assert get_profile("veena3") is VEENA3 and len(VEENA3.voices) == 12
    with pytest.raises(ValueError, match="known profiles: veena, orpheus, maya1, veena3, spark"):
        get_profile("nope")


# -- spark: the official prompts -----------------------------------------------------------------
# Spark-TTS's maps (sparktts/utils/token_parser.py): GENDER_MAP and LEVELS_MAP.
OFFICIAL_GENDER = {"female": 0, "male": 1}
OFFICIAL_LEVELS = {"very_low": 0, "low": 1, "moderate": 2, "high": 3, "very_high": 4}


def official_control_prompt(gender, pitch, speed, text):
    """SparkTTS.process_prompt_control, piece by piece as it joins them."""
    style = (f"<|gender_{OFFICIAL_GENDER[gender]}|>" f"<|pitch_label_{OFFICIAL_LEVELS[pitch]}|>"
             f"<|speed_label_{OFFICIAL_LEVELS[speed]}|>")
    return "".join(["<|task_controllable_tts|>", "<|start_content|>", text, "<|end_content|>",
                    "<|start_style_label|>", style, "<|end_style_label|>"])


def official_clone_prompt(text, global_ids):
    """SparkTTS.process_prompt without a reference transcript."""
    globals_ = "".join(f"<|bicodec_global_{i}|>" for i in global_ids)
    return "".join(["<|task_tts|>", "<|start_content|>", text, "<|end_content|>",
                    "<|start_global_token|>", globals_, "<|end_global_token|>"])


@pytest.fixture(scope="module")
def spark_tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    root = make_tiny_model(tmp_path_factory.mktemp("tiny-spark"), "spark")
    return AutoTokenizer.from_pretrained(llm_location(str(root), SPARK)), root


TEXTS = ["Hello, world. How are you today?", "नमस्ते, आप कैसे हैं? मैं ठीक हूँ।",
         "  spaces,\nnew lines and <|not a token|> {braces} "]


@pytest.mark.parametrize("text", TEXTS)
def test_spark_prompts_are_the_official_ones_token_for_token(spark_tokenizer, text):
    tok, _ = spark_tokenizer
    official = lambda prompt: tok([prompt]).input_ids[0]  # noqa: E731  (as SparkTTS.inference)
    for gender in SPARK_GENDERS:
        for pitch, speed in (("very_low", "very_high"), ("moderate", "moderate"), ("high", "low")):
            ours = SPARK.build_prompt(tok, text, spark_voice(gender, pitch, speed))
            assert ours == official(official_control_prompt(gender, pitch, speed, text))
    ids = list(range(4064, 4096))
    assert SPARK.build_prompt(tok, text, CLONED_VOICE, ids) == official(official_clone_prompt(text, ids))
    # a later request of a named voice: the cloning prompt with the captured globals
    assert (SPARK.build_prompt(tok, text, "male-low-high", ids)
            == official(official_clone_prompt(text, ids)))


def test_spark_tokenizer_layout(spark_tokenizer):
    """Control tokens special, BiCodec tokens whole but not special (as in Spark-TTS's
    tokenizer, whose inference decodes with skip_special_tokens and still reads them)."""
    tok, root = spark_tokenizer
    ids = tok.encode("<|bicodec_semantic_8191|><|bicodec_global_0|><|im_end|>",
                     add_special_tokens=False)
    assert len(ids) == 3
    assert tok.decode(ids, skip_special_tokens=True) == "<|bicodec_semantic_8191|><|bicodec_global_0|>"
    added = {t.content: t.special for t in tok.added_tokens_decoder.values()}
    for control in ("<|task_controllable_tts|>", "<|gender_1|>", "<|pitch_label_4|>",
                    "<|speed_label_0|>", "<|start_global_token|>", "<|end_style_label|>"):
        assert added[control] is True, control
    assert added["<|bicodec_global_7|>"] is False and added["<|bicodec_semantic_0|>"] is False
    assert (Path(root) / "LLM" / "config.json").is_file() and (Path(root) / "BiCodec").is_dir()
    assert resolve_profile(str(root)) is SPARK  # its manifest
    assert (Path(root) / "config.yaml").is_file()


def test_spark_voices_sampling_and_limits():
    assert len(SPARK.voices) == 2 * 5 * 5 and SPARK.default_voice == "female-moderate-moderate"
    assert SPARK.render_voice("male-very_low-high") == "<|gender_1|><|pitch_label_0|><|speed_label_3|>"
    assert set(SPARK_LEVELS) == set(OFFICIAL_LEVELS) and set(SPARK_GENDERS) == set(OFFICIAL_GENDER)
    with pytest.raises(ValueError, match="unknown voice"):
        SPARK.check_voice("female-medium-moderate")
    with pytest.raises(ValueError, match="gender"):
        spark_voice("robot")
    s = SPARK.sampling  # cli/SparkTTS.py inference defaults
    assert (s.temperature, s.top_k, s.top_p, s.repetition_penalty) == (0.8, 50, 0.95, 1.0)
    assert SPARK.stop_tokens == ("<|im_end|>",) and SPARK.max_new_tokens == 3000
    assert "CC BY-NC-SA 4.0" in SPARK.licence
    family = family_for(SPARK)
    assert family.round_budget(10_000) == 3000 and family.round_budget(120) == 120


def test_spark_generates_freely_and_veena3_is_constrained():
    import numpy as np

    from livekit.plugins.veena.pipeline.engine_options import SamplingOptions
    from livekit.plugins.veena.pipeline.parsing import (
        KIND_GLOBAL,
        KIND_SEMANTIC,
        KIND_STOP,
        TokenTable,
    )

    kind = np.array([0, KIND_GLOBAL, KIND_SEMANTIC, KIND_STOP], np.int8)
    table = TokenTable(kind, np.array([-1, 0, 0, -1]))
    base = SamplingOptions()
    spark, veena3 = family_for(SPARK), family_for(VEENA3)
    assert spark.capture_sampling(base, table) is None  # one generation writes the globals
    free = spark.constrain(base, table)
    assert free.allowed_token_ids is None and free.stop_token_ids == (3,)
    assert veena3.capture_sampling(base, table).allowed_token_ids == (1,)
    assert veena3.constrain(base, table).allowed_token_ids == (2, 3)
    assert veena3.round_budget(10_000) == 10_000


def test_veena3_prompt_is_labelled_unverified_and_overridable():
    assert VEENA3.prompt_source.startswith("UNVERIFIED")
    assert "cli/SparkTTS.py" in SPARK.prompt_source
    mine = with_overrides(VEENA3, first_prompt_template="<|task_tts|><|spk|>{voice}{text}<|start_global_token|>")
    tok = _Tok()
    mine.build_prompt(tok, "hi", "kavya")
    assert tok.seen == ("<|task_tts|><|spk|>kavyahi<|start_global_token|>", False)


def test_a_spark_layout_folder_reads_as_spark(tmp_path, monkeypatch):
    monkeypatch.delenv("VEENA_PROFILE", raising=False)
    (tmp_path / "LLM").mkdir()
    (tmp_path / "BiCodec").mkdir()
    assert resolve_profile(str(tmp_path)) is SPARK
    assert llm_location(str(tmp_path), SPARK) == str(tmp_path / "LLM")
    assert llm_location(str(tmp_path / "BiCodec"), SPARK) == str(tmp_path / "BiCodec")
    assert resolve_profile(str(tmp_path / "BiCodec")) is VEENA


def test_a_known_hub_id_or_its_cache_snapshot_picks_its_profile(tmp_path, monkeypatch):
    from livekit.plugins.veena.models.profiles import MAYA1, ORPHEUS, SPARK, resolve_profile

    monkeypatch.delenv("VEENA_PROFILE", raising=False)
    assert resolve_profile("maya-research/maya1") is MAYA1
    assert resolve_profile("Maya-Research/Maya1") is MAYA1  # hub ids are case-insensitive
    assert resolve_profile("canopylabs/orpheus-3b-0.1-ft") is ORPHEUS
    assert resolve_profile("SparkAudio/Spark-TTS-0.5B") is SPARK
    assert resolve_profile("maya-research/veena-tts") is VEENA
    snapshot = tmp_path / "hub" / "models--maya-research--maya1" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    assert resolve_profile(str(snapshot)) is MAYA1
    # not a prefix match, and what the user names still wins
    assert resolve_profile("maya-research/maya1-extra") is VEENA
    assert resolve_profile("maya-research/maya1", "orpheus") is ORPHEUS
    monkeypatch.setenv("VEENA_PROFILE", "orpheus")
    assert resolve_profile("maya-research/maya1") is ORPHEUS
