"""Audio codecs: turn a window of codec tokens into float32 PCM, many windows per call."""

from .base import Codec, CodecInput

__all__ = ["Codec", "CodecInput"]
