"""BiCodec (Spark-TTS) as a codec of the pipeline: windows of semantic tokens plus the
utterance's 32 globals -> 16 kHz PCM. Deterministic (no noise), so a window decodes the same
alone or batched."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from .base import CodecInput
from .bicodec_model import DEFAULT_CONFIG, BiCodecDecoder
from .cuda_graphs import batch_plan, first_rows, graphed_or_none

logger = logging.getLogger(__name__)

_DECODE_PREFIXES = ("quantizer.", "speaker_encoder.quantizer.", "speaker_encoder.project.",
                    "prenet.", "decoder.")


def _decode_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Keep the decode-side tensors; map old-style weight-norm names onto parametrizations."""
    out = {}
    for key, value in state.items():
        if not key.startswith(_DECODE_PREFIXES) or "speaker_encoder.speaker_encoder." in key:
            continue
        key = key.replace(".weight_g", ".parametrizations.weight.original0")
        key = key.replace(".weight_v", ".parametrizations.weight.original1")
        out[key] = value
    return out


def bicodec_dir(model_dir: str) -> Path:
    """A local BiCodec folder, or ``repo[:subfolder]`` on the hub (downloaded first; the
    subfolder defaults to ``BiCodec``)."""
    path = Path(model_dir)
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    repo, _, sub = model_dir.partition(":")
    return Path(snapshot_download(repo, allow_patterns=[f"{sub or 'BiCodec'}/*"])) / (sub or "BiCodec")


class BiCodecCodec:
    name = "bicodec"
    sample_rate = 16000
    samples_per_step = 320

    def __init__(self, model: BiCodecDecoder, *, device: str = "cpu", cuda_graphs: bool = False,
                 max_graph_batch: int = 64) -> None:
        """``cuda_graphs``: replay the decoder from a CUDA graph per (padded batch, window
        size) when ``device`` is CUDA (see ``cuda_graphs``)."""
        self.model = model.to(device).eval().float()
        self.device = torch.device(device)
        self.samples_per_step = model.decoder.hop
        self.max_graph_batch = max_graph_batch
        self.graphs = graphed_or_none(self._decode_tensors, self.device, cuda_graphs,
                                      name="bicodec")

    @classmethod
    def load(cls, model_dir: str, *, device: str = "cpu", cuda_graphs: bool = False
             ) -> "BiCodecCodec":
        """Load the official layout: ``model_dir/config.yaml`` + ``model_dir/model.safetensors``
        (``BiCodec/`` inside a Spark-TTS checkpoint; a hub id is downloaded first)."""
        import yaml
        from safetensors.torch import load_file

        path = bicodec_dir(model_dir)
        config = yaml.safe_load((path / "config.yaml").read_text())
        config = config.get("audio_tokenizer", config)
        model = BiCodecDecoder({k: config[k] for k in DEFAULT_CONFIG if k in config})
        missing, _ = model.load_state_dict(_decode_state(load_file(str(path / "model.safetensors"))),
                                           strict=False)
        if missing:
            raise ValueError(f"BiCodec checkpoint {path} lacks decoder tensors: {missing[:5]}")
        logger.info("loaded BiCodec decoder", extra={"codec_model": str(path), "device": device})
        return cls(model, device=device, cuda_graphs=cuda_graphs)

    @classmethod
    def random(cls, *, seed: int = 0, device: str = "cpu", config: dict | None = None,
               cuda_graphs: bool = False) -> "BiCodecCodec":
        torch.manual_seed(seed)
        return cls(BiCodecDecoder(config), device=device, cuda_graphs=cuda_graphs)

    def _decode_tensors(self, semantic: torch.Tensor, speaker: torch.Tensor) -> torch.Tensor:
        return self.model.detokenize(semantic, speaker)[:, 0, :]

    def batch_call(self, batch: Sequence[CodecInput]
                   ) -> tuple[Callable[..., torch.Tensor], list[torch.Tensor]]:
        """The decode call for ``batch`` and its device tensors: the graph's, with the batch
        padded to its bucket, or the eager one. Audio rows past ``len(batch)`` are padding."""
        n = len(batch)
        call, rows = batch_plan(self.graphs, self._decode_tensors, n, self.max_graph_batch)
        semantic = np.zeros((rows, np.asarray(batch[0].codes).shape[0]), dtype=np.int64)
        semantic[:n] = np.stack([np.asarray(b.codes) for b in batch])
        speaker = np.zeros((rows, 32), dtype=np.int64)
        speaker[:n] = np.stack([np.asarray(b.speaker) for b in batch])
        return call, [torch.from_numpy(a).to(self.device) for a in (semantic, speaker)]

    @torch.inference_mode()
    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        if not batch:
            return []
        call, inputs = self.batch_call(batch)
        return first_rows(call(*inputs), len(batch))

    def blank_window(self, steps: int, seed: int = 0) -> CodecInput:
        """A window of ``steps`` zero tokens with zero speaker ids (warm-up, graph captures)."""
        return CodecInput(codes=np.zeros(steps, np.int64), start_step=0, seed=seed,
                          speaker=np.zeros(32, np.int64))

    def warmup(self) -> None:
        self.decode([self.blank_window(10)])
