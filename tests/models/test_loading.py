"""What ``load_pipeline`` records of a model for the server to tell: whether its weights are
random (its manifest says so, or vLLM was told to make them up)."""

import json
import shutil
from pathlib import Path

from livekit.plugins.veena.models.loading import load_pipeline
from livekit.plugins.veena.pipeline.engine_options import EngineOptions
from livekit.plugins.veena.pipeline.options import PipelineOptions


async def test_random_weights_from_the_manifest_or_dummy_loading(tiny_model_dir, tmp_path):
    real = Path(shutil.copytree(tiny_model_dir, tmp_path / "real"))
    manifest = json.loads((real / "veena_tts.json").read_text())
    assert manifest.pop("random_weights") is True
    (real / "veena_tts.json").write_text(json.dumps(manifest))
    for model, load_format, random in ((tiny_model_dir, "auto", True), (str(real), "auto", False),
                                       (str(real), "dummy", True)):
        pipeline = load_pipeline(model, options=PipelineOptions(),
                                 engine_options=EngineOptions(model, load_format=load_format))
        try:
            assert pipeline.random_weights is random, (model, load_format)
        finally:
            await pipeline.aclose()


async def test_the_start_up_log_says_where_the_codec_runs_and_why(tiny_model_dir, caplog,
                                                                   monkeypatch):
    monkeypatch.delenv("VEENA_CODEC_DEVICE", raising=False)
    with caplog.at_level("INFO", logger="livekit.plugins.veena.models.loading"):
        pipeline = load_pipeline(tiny_model_dir, engine_options=EngineOptions(tiny_model_dir))
        await pipeline.aclose()
    assert pipeline.options.codec_device == "cpu"  # no CUDA here: auto picks the CPU
    assert "codec on cpu (VEENA_CODEC_DEVICE=auto and CUDA is not available)" in caplog.text
