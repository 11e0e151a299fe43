"""Parameter counts, weight and KV bytes from config.json against hand arithmetic."""

import pytest

from livekit.plugins.veena.sizing.shape import ModelConfigError, ModelShape, read_model_config

from .configs import MAYA1_3B, ORPHEUS_3B, SPARK_05B, write_config


def _llama_3b_params(vocab: int) -> int:
    # per layer: q 3072x3072, k and v 3072x1024, o 3072x3072, gate/up/down 3 x 3072x8192,
    # two norms of 3072; embeddings tied (no lm_head); one final norm
    layer = 3072 * 3072 + 2 * 3072 * 1024 + 3072 * 3072 + 3 * 3072 * 8192 + 2 * 3072
    return vocab * 3072 + 28 * layer + 3072


def test_orpheus_3b_by_hand():
    shape = ModelShape.from_config(ORPHEUS_3B)
    assert shape.parameters == _llama_3b_params(156940) == 3_300_867_072
    assert shape.weight_bytes() == 3_300_867_072 * 2  # bfloat16
    assert shape.kv_bytes_per_token() == 28 * 8 * 128 * 2 * 2 == 114_688
    assert shape.weight_bytes("float32") == 3_300_867_072 * 4


def test_maya1_3b_by_hand():
    shape = ModelShape.from_config(MAYA1_3B)
    assert shape.parameters == _llama_3b_params(156960) == 3_300_928_512
    assert shape.kv_bytes_per_token() == 114_688


def test_spark_05b_by_hand():
    # Qwen2: q/k/v carry biases; head size 896 / 14 = 64, 2 KV heads of 64 = 128
    layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    shape = ModelShape.from_config(SPARK_05B)
    assert shape.head_dim == 64 and shape.qkv_bias
    assert shape.parameters == 166000 * 896 + 24 * layer + 896 == 506_634_112
    assert shape.kv_bytes_per_token() == 24 * 2 * 64 * 2 * 2 == 12_288


def test_untied_lm_head_and_float32_checkpoint():
    shape = ModelShape.from_config({**ORPHEUS_3B, "tie_word_embeddings": False,
                                    "torch_dtype": "float32"})
    assert shape.parameters == 3_300_867_072 + 156940 * 3072
    assert shape.served_dtype() == "bfloat16"  # vLLM's auto serves it in 16 bits


def test_lora_slot_by_hand():
    # rank 16 on q/k/v, o, gate/up, down of 28 layers: A is in x r, B is r x out
    ins = 3 * 3072 + 3072 + 2 * 3072 + 8192
    outs = (3072 + 2 * 1024) + 3072 + 2 * 8192 + 3072
    assert ModelShape.from_config(ORPHEUS_3B).lora_slot_bytes(16) == 28 * 16 * (ins + outs) * 2


@pytest.mark.parametrize("bad", [{"num_hidden_layers": True}, {"num_hidden_layers": 28.0},
                                 {"vocab_size": -1}, {"num_key_value_heads": 48},
                                 {"hidden_size": None}])
def test_bad_config_values_are_refused(bad):
    with pytest.raises(ModelConfigError):
        ModelShape.from_config({**ORPHEUS_3B, **bad})


def test_reads_a_folder_or_its_llm_subfolder(tmp_path):
    write_config(tmp_path / "spark", SPARK_05B, "LLM")
    assert read_model_config(str(tmp_path / "spark"), "LLM")["hidden_size"] == 896
    write_config(tmp_path / "orpheus", ORPHEUS_3B)
    assert read_model_config(str(tmp_path / "orpheus"), "LLM")["hidden_size"] == 3072
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{not json")
    with pytest.raises(ModelConfigError):
        read_model_config(str(tmp_path / "broken"))
