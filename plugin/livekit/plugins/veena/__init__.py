"""LiveKit Agents TTS plugin: self-hosted streaming Veena/Orpheus (SNAC) and Spark/Veena3
(BiCodec) speech on vLLM."""

from .version import __version__

__all__ = ["__version__"]
