"""One pipeline per (model, profile) per process: a second profile for the same model folder
is a second pipeline, the same pair is the same pipeline (no engine is started here)."""

from livekit.plugins.veena.plugin import tts as veena_tts


async def test_shared_pipeline_is_keyed_by_model_and_profile(tiny_model_dir):
    a = veena_tts.shared_pipeline(tiny_model_dir, "veena")
    b = veena_tts.shared_pipeline(tiny_model_dir, "orpheus")
    try:
        assert a is not b and (a.profile.name, b.profile.name) == ("veena", "orpheus")
        assert veena_tts.shared_pipeline(tiny_model_dir, "veena") is a
        assert not a.engine.started and not b.engine.started
    finally:
        for key in ((tiny_model_dir, "veena"), (tiny_model_dir, "orpheus")):
            await veena_tts._PIPELINES.pop(key).aclose()
