"""NeuCodec (NeuTTS Air) as a codec of the pipeline: windows of 50 Hz FSQ codes -> 24 kHz PCM.
Deterministic (no noise), so a window decodes the same alone or batched. XCodec2 (Llasa) is
the same decoder at other sizes (``neucodec_model.XCODEC2_CONFIG``).

The decoder attends over its whole window and normalises over it, so a window's audio
depends on all of its frames: windows carry left and right context (the family's
``DecodeShape``) and the stitcher crossfades their seams; ``bench/neucodec_stream.py``
measures the error against one pass.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from .base import CodecInput
from .cuda_graphs import batch_plan, first_rows, graphed_or_none
from .neucodec_model import CONFIG_FILE, NeuCodecConfig, NeuCodecDecoder, load_decoder

logger = logging.getLogger(__name__)


def codec_dir(model_dir: str) -> Path:
    """A local NeuCodec folder, or a hub id (its checkpoint downloaded first)."""
    path = Path(model_dir)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_dir, allow_patterns=["pytorch_model.bin",
                                                             "model.safetensors", "*.json",
                                                             "*.yaml"]))


class NeuCodecCodec:
    name = "neucodec"
    sample_rate = 24000
    samples_per_step = 480

    def __init__(self, model: NeuCodecDecoder, *, device: str = "cpu", cuda_graphs: bool = False,
                 max_graph_batch: int = 64) -> None:
        """``cuda_graphs``: replay the decoder from a CUDA graph per (padded batch, window
        size) when ``device`` is CUDA (see ``cuda_graphs``)."""
        self.model = model.to(device).eval().float()
        self.device = torch.device(device)
        self.config = model.config
        self.sample_rate = model.config.sample_rate
        self.samples_per_step = model.config.hop_length
        self.max_graph_batch = max_graph_batch
        self.graphs = graphed_or_none(self.model, self.device, cuda_graphs, name="neucodec")

    @classmethod
    def load(cls, model_dir: str, *, device: str = "cpu", cuda_graphs: bool = False,
             config: NeuCodecConfig | None = None) -> "NeuCodecCodec":
        """The published layout: ``pytorch_model.bin`` (or ``model.safetensors``) with
        ``generator.*`` and ``fc_post_a.*``; sizes from ``veena_codec.json`` where the folder
        has one, else ``config``, else the published NeuCodec's. ValueError for a checkpoint
        of another shape."""
        path = codec_dir(model_dir)
        model = load_decoder(path, config)
        logger.info("loaded NeuCodec decoder", extra={"codec_model": str(path), "device": device})
        return cls(model, device=device, cuda_graphs=cuda_graphs)

    @classmethod
    def random(cls, *, seed: int = 0, device: str = "cpu", config: NeuCodecConfig | None = None,
               cuda_graphs: bool = False) -> "NeuCodecCodec":
        torch.manual_seed(seed)
        return cls(NeuCodecDecoder(config), device=device, cuda_graphs=cuda_graphs)

    def batch_call(self, batch: Sequence[CodecInput]
                   ) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
        """The decode call for ``batch`` and its codes tensor: the graph's, with the batch
        padded to its bucket, or the eager one. Audio rows past ``len(batch)`` are padding."""
        n = len(batch)
        call, rows = batch_plan(self.graphs, self.model, n, self.max_graph_batch)
        codes = np.zeros((rows, np.asarray(batch[0].codes).shape[0]), dtype=np.int64)
        codes[:n] = np.stack([np.asarray(b.codes) for b in batch])
        if codes.min(initial=0) < 0 or codes.max(initial=0) >= self.config.codebook_size:
            raise ValueError(f"NeuCodec codes must be in 0..{self.config.codebook_size - 1}")
        return call, [torch.from_numpy(codes).to(self.device)]

    @torch.inference_mode()
    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        if not batch:
            return []
        call, inputs = self.batch_call(batch)
        audio = first_rows(call(*inputs), len(batch))
        hop = self.samples_per_step  # a window's leading context (the reference's codes)
        return [a[b.context_steps * hop:] for a, b in zip(audio, batch)]

    def blank_window(self, steps: int, seed: int = 0) -> CodecInput:
        """A window of ``steps`` zero codes (warm-up, graph captures)."""
        return CodecInput(codes=np.zeros(steps, np.int64), start_step=0, seed=seed)

    def warmup(self) -> None:
        self.decode([self.blank_window(10)])


def write_tiny_checkpoint(folder: Path, *, seed: int = 0, config: NeuCodecConfig | None = None,
                          encoder: bool = False) -> Path:
    """A random NeuCodec checkpoint in the published layout (``pytorch_model.bin``; its
    sizes in ``veena_codec.json``), for tiny models and tests: small by default.
    ``encoder``: with the encoder's tensors and a tiny w2v-bert-2.0 beside them (cloning)."""
    config = (config or NeuCodecConfig.tiny()).validate()
    torch.manual_seed(seed)
    state = NeuCodecDecoder(config).state_dict()
    folder.mkdir(parents=True, exist_ok=True)
    if encoder:
        from .neucodec_encoder import tiny_encoder_state

        state.update(tiny_encoder_state(folder, config.vq_dim, len(config.levels), seed))
    torch.save(state, folder / "pytorch_model.bin")
    (folder / CONFIG_FILE).write_text(json.dumps(config.to_dict(), indent=1) + "\n")
    return folder
