"""``veena-tts plan`` on the configs of Orpheus 3B, Spark 0.5B and Maya1 3B, against hand
arithmetic of each stream's KV cache and the streams that fit."""

import math
import re

import pytest

from livekit.plugins.veena import cli
from livekit.plugins.veena.sizing.fit import fit_streams, stream_footprint
from livekit.plugins.veena.models.profiles import MAYA1, NEUTTS, ORPHEUS, SPARK
from livekit.plugins.veena.sizing.shape import ModelShape

from .configs import MAYA1_3B, ORPHEUS_3B, SPARK_05B, write_config

GIB = 2**30
H100 = 81559 * 2**20  # nvidia-smi's total
RESERVE = 2 * GIB


def _blocks(tokens: int) -> int:
    return math.ceil(tokens / 16) * 16


def _streams(memory: int, weights: int, per_stream: int, util: float = 0.85) -> int:
    return (int(memory * util) - weights - RESERVE) // per_stream


# a stream holds one chunk of 250 characters at its largest: prompt (a token per character,
# 64 fixed ids, a voice description of up to 500 characters for Maya1, 32 speaker tokens
# for Spark) and the audio the runaway guard allows (1.5 s + 0.1 s per character)
ORPHEUS_TOKENS = _blocks(250 + 64 + math.ceil(26.5 * 7 * 24000 / 2048))  # 314 + 2174
MAYA1_TOKENS = _blocks(250 + 64 + 500 + math.ceil(26.5 * 7 * 24000 / 2048))
SPARK_TOKENS = _blocks(250 + 64 + 32 + 26.5 * 50 + 32)


@pytest.mark.parametrize("config,profile,tokens,kv_per_token,weights", [
    (ORPHEUS_3B, ORPHEUS, ORPHEUS_TOKENS, 114_688, 3_300_867_072 * 2),
    (MAYA1_3B, MAYA1, MAYA1_TOKENS, 114_688, 3_300_928_512 * 2),
    (SPARK_05B, SPARK, SPARK_TOKENS, 12_288, 506_634_112 * 2),
])
def test_streams_that_fit_by_hand(config, profile, tokens, kv_per_token, weights):
    shape = ModelShape.from_config(config)
    foot = stream_footprint(shape, profile)
    assert foot.tokens == tokens
    assert foot.kv_bytes == tokens * kv_per_token
    for memory in (H100, 23034 * 2**20, 24 * GIB):
        fit = fit_streams(shape, foot, memory)
        assert fit.streams == _streams(memory, weights, tokens * kv_per_token)


def test_neutts_holds_its_whole_context():
    """NeuTTS Air (a Qwen2.5 0.5B backbone): prompt and output share 2048 tokens, and a
    reference clip's codes fill the prompt, so a stream holds the whole context."""
    shape = ModelShape.from_config({**SPARK_05B, "vocab_size": 217_000})
    foot = stream_footprint(shape, NEUTTS)
    assert foot.tokens == 2048 and foot.audio_tokens == math.ceil(26.5 * 50)
    assert foot.kv_bytes == 2048 * 24 * 2 * 64 * 2 * 2


def test_orpheus_on_an_h100(tmp_path, capsys):
    model = write_config(tmp_path / "orpheus", ORPHEUS_3B)
    assert cli.main(["plan", "--model", str(model), "--profile", "orpheus", "--gpu", "H100"]) == 0
    out = capsys.readouterr().out
    assert ORPHEUS_TOKENS == 2496
    streams = _streams(H100, 3_300_867_072 * 2, 2496 * 114_688)
    assert streams == 223
    assert re.search(rf"streams that fit +{streams}\n", out)
    assert "parameters            3,300,867,072 (bfloat16" in out
    assert "KV cache per stream   273.0 MiB" in out  # 2496 x 112 KiB
    # 223 streams: two engine sequences each; one process carries 192, so two of them
    assert "VEENA_MAX_NUM_SEQS=446" in out and "VEENA_SERVER_WORKERS=2" in out
    assert "VEENA_SHARED_ENGINE=1" in out and "VEENA_DECODE_MAX_BATCH=64" in out
    assert "bench/gpu.sh" in out and out.count("streams that fit") == 1


def test_spark_folder_streams_wanted_and_a_memory_size(tmp_path, capsys):
    model = write_config(tmp_path / "spark", SPARK_05B, "LLM")  # Spark-TTS keeps its LLM in LLM/
    assert cli.main(["plan", "--model", str(model), "--profile", "spark", "--gpu", "L4",
                     "--gpu-memory-gib", "8", "--streams", "300"]) == 0
    out = capsys.readouterr().out
    l4 = _streams(23034 * 2**20, 506_634_112 * 2, SPARK_TOKENS * 12_288)
    small = _streams(8 * GIB, 506_634_112 * 2, SPARK_TOKENS * 12_288)
    assert re.findall(r"streams that fit +(\d+)", out) == [str(l4), str(small)]
    assert l4 > 300 > small
    assert re.findall(r"^  300 streams +(.*)$", out, re.M)[0] == "fit"
    assert re.findall(r"^  300 streams +(.*)$", out, re.M)[1].startswith("do NOT fit")
    assert f"VEENA_MAX_NUM_SEQS={2 * small}" in out  # the streams that fit, not 300


def test_lora_slots_take_from_the_cache(tmp_path, capsys):
    model = write_config(tmp_path / "orpheus", ORPHEUS_3B)
    cli.main(["plan", "--model", str(model), "--profile", "orpheus", "--gpu", "H100"])
    without = int(re.search(r"streams that fit +(\d+)", capsys.readouterr().out)[1])
    cli.main(["plan", "--model", str(model), "--profile", "orpheus", "--gpu", "H100",
              "--max-loras", "64", "--lora-rank", "64"])
    with_lora = int(re.search(r"streams that fit +(\d+)", capsys.readouterr().out)[1])
    slot = ModelShape.from_config(ORPHEUS_3B).lora_slot_bytes(64)
    assert with_lora == (int(H100 * 0.85) - 3_300_867_072 * 2 - RESERVE - 64 * slot) // (
        2496 * 114_688) < without


@pytest.mark.parametrize("argv", [["--gpu", "H1000"], ["--streams", "0"],
                                  ["--gpu-memory-gib", "nan"],
                                  ["--gpu-memory-utilization", "1.5"]])
def test_bad_options_are_one_line_and_exit_2(tmp_path, capsys, caplog, argv):
    model = write_config(tmp_path / "orpheus", ORPHEUS_3B)
    assert cli.main(["plan", "--model", str(model), "--profile", "orpheus", *argv]) == 2
    assert capsys.readouterr().out == ""
    assert [r.message for r in caplog.records if r.levelname == "ERROR"]


def test_a_folder_without_a_config_is_exit_2(tmp_path, caplog):
    assert cli.main(["plan", "--model", str(tmp_path), "--profile", "orpheus"]) == 2
    assert "config.json" in caplog.text
