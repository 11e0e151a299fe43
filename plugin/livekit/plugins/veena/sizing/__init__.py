"""Sizing a GPU for a model from its config alone: what the weights, each stream's KV cache
and LoRA slots take (``shape``, ``fit``), the GPUs people buy (``gpus``), the defaults a
process takes from the machine it runs on (``machine``) and ``veena-tts plan`` (``plan``).
"""

from .fit import Fit, StreamFootprint, fit_streams, stream_footprint
from .gpus import GPUS, Gpu, find_gpu
from .machine import MachineFacts, choose_codec_device, engine_defaults
from .shape import ModelShape, read_model_config

__all__ = ["GPUS", "Fit", "Gpu", "MachineFacts", "ModelShape", "StreamFootprint",
           "choose_codec_device", "engine_defaults", "find_gpu", "fit_streams",
           "read_model_config", "stream_footprint"]
