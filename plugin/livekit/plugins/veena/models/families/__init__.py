"""The built-in model families, registered with the pipeline's family seam
(``pipeline.family``) as this package is imported: SNAC (Orpheus, Veena, Maya1) and BiCodec
(Spark-TTS, Veena3)."""

from ...pipeline.family import (
    DecodeShape,
    InvalidGlobalsError,
    ModelFamily,
    family_for,
    register_family,
)
from .bicodec import BiCodecFamily
from .snac import SnacFamily

__all__ = ["BiCodecFamily", "DecodeShape", "InvalidGlobalsError", "ModelFamily",
           "SnacFamily", "family_for", "register_family"]
