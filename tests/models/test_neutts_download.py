"""``download-files`` for NeuTTS: the language model, the NeuCodec checkpoint and what its
encoder needs for cloning (w2v-bert-2.0), from a local fake hub into the cache."""

from pathlib import Path

from livekit.plugins.veena.models.download import download_model
from tests.models.test_download import FakeHub, _repo_files

GOLDEN_CODEC = Path(__file__).parents[1] / "golden" / "neucodec"


def test_lm_codec_and_encoder_models_land_in_the_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("VEENA_CODEC_MODEL", raising=False)
    codec = {k: v for k, v in _repo_files(GOLDEN_CODEC).items() if "/" not in k}
    hub = FakeHub({"test/tiny-neutts": {"config.json": b'{"model_type": "qwen2"}'},
                   "neuphonic/neucodec": codec,
                   "facebook/w2v-bert-2.0": _repo_files(GOLDEN_CODEC / "w2v-bert-2.0")})
    try:
        folders = download_model("test/tiny-neutts", profile="neutts", endpoint=hub.url,
                                 cache_dir=str(tmp_path / "cache"))
    finally:
        hub.close()
    model, codec_dir, w2v = folders
    assert (model / "config.json").is_file()
    assert (codec_dir / "pytorch_model.bin").is_file()
    assert (w2v / "model.safetensors").is_file() and (w2v / "config.json").is_file()
