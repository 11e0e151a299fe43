"""LiveKit Agents TTS plugin: self-hosted streaming Veena/Orpheus/Maya1 (SNAC) and
Spark/Veena3 (BiCodec) speech on vLLM."""

from livekit.agents import Plugin

from .log import logger
from .models.families import ModelFamily, register_family
from .models.loading import MissingExtraError, load_pipeline
from .models.profiles import (
    MAYA1,
    ORPHEUS,
    SPARK,
    VEENA,
    VEENA3,
    BiCodecProfile,
    SnacProfile,
    get_profile,
    register_profile,
)
from .pipeline.chunking import ChunkerOptions
from .pipeline.engine import EngineDeadError, EngineOptions, SamplingOptions
from .pipeline.options import PipelineOptions
from .pipeline.pipeline import Pipeline
from .pipeline.sentences import SentenceTokenizer
from .pipeline.tags import tag_instructions
from .plugin.tts import TTS, ChunkedStream, SynthesizeStream
from .version import __version__

__all__ = [
    "TTS", "ChunkedStream", "SynthesizeStream", "SentenceTokenizer", "Pipeline", "load_pipeline",
    "MissingExtraError",
    "PipelineOptions", "EngineOptions", "SamplingOptions", "ChunkerOptions", "SnacProfile",
    "BiCodecProfile", "VEENA", "ORPHEUS", "MAYA1", "VEENA3", "SPARK", "get_profile",
    "register_profile", "ModelFamily", "register_family", "EngineDeadError", "tag_instructions",
    "__version__",
]


class VeenaPlugin(Plugin):
    def __init__(self) -> None:
        super().__init__(__name__, __version__, __package__, logger)

    def download_files(self) -> None:
        """``python -m livekit.agents download-files``: fetch ``VEENA_MODEL`` and its codec, and
        the LoRA adapters of ``VEENA_LORA``, into the Hugging Face cache. An agent that speaks
        through a server (``VEENA_TTS_URL``) and names no model has nothing to fetch."""
        import os

        from .models.adapters import download_adapters, lora_from_env
        from .models.download import download_model
        from .normalization import grammars

        if not os.environ.get("VEENA_MODEL"):
            logger.info("VEENA_MODEL is not set: no TTS model to download")
            return
        download_model()
        download_adapters(lora_from_env())
        grammars.prepare()  # the text-normalisation grammars, compiled once


Plugin.register_plugin(VeenaPlugin())
