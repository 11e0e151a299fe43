"""The built-in model families, registered with the pipeline's family seam
(``pipeline.family``) as this package is imported: SNAC (Orpheus, Veena, Maya1), BiCodec
(Spark-TTS, Veena3) and NeuCodec (NeuTTS Air, Llasa)."""

from ...pipeline.family import (
    DecodeShape,
    InvalidGlobalsError,
    ModelFamily,
    family_for,
    register_family,
)
from .bicodec import BiCodecFamily
from .neucodec import NeuCodecFamily
from .snac import SnacFamily

__all__ = ["BiCodecFamily", "DecodeShape", "InvalidGlobalsError", "ModelFamily",
           "NeuCodecFamily", "SnacFamily", "family_for", "register_family"]
