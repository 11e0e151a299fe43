"""A model's shape from its ``config.json`` alone (no weights read): the parameter count, the
bytes its weights and each token's KV cache take, and a LoRA slot's bytes, for the decoder
architectures these TTS models are built on (Llama: Orpheus, Veena, Maya1; Qwen2: Spark,
NeuTTS Air)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..validation import check_int

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "fp8": 1}

_BIASED_QKV = {"qwen2": True}
"""Architectures whose q/k/v projections carry a bias where the config does not say
(``attention_bias``): Qwen2's always do, Llama's do not."""


class ModelConfigError(ValueError):
    """A config that is missing, unreadable or not a decoder this arithmetic knows."""


@dataclass(frozen=True)
class ModelShape:
    """What the memory arithmetic needs of a decoder-only transformer."""

    model_type: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    qkv_bias: bool
    checkpoint_dtype: str
    max_positions: int

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "ModelShape":
        """Every field checked by type and range (a config from the hub is outside input)."""
        if not isinstance(config, Mapping):
            raise ModelConfigError("config.json must hold a JSON object")
        try:
            heads = check_int("num_attention_heads", config.get("num_attention_heads"), 1, 1 << 12)
            hidden = check_int("hidden_size", config.get("hidden_size"), 1, 1 << 20)
            head_dim = config.get("head_dim") or hidden // heads
            shape = cls(
                model_type=str(config.get("model_type", "")),
                layers=check_int("num_hidden_layers", config.get("num_hidden_layers"), 1, 4096),
                hidden=hidden,
                heads=heads,
                kv_heads=check_int("num_key_value_heads",
                                   config.get("num_key_value_heads", heads), 1, heads),
                head_dim=check_int("head_dim", head_dim, 1, 1 << 14),
                intermediate=check_int("intermediate_size", config.get("intermediate_size"),
                                       1, 1 << 22),
                vocab=check_int("vocab_size", config.get("vocab_size"), 1, 1 << 24),
                tied_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=bool(config.get("attention_bias",
                                         _BIASED_QKV.get(str(config.get("model_type")), False))),
                checkpoint_dtype=str(config.get("torch_dtype") or config.get("dtype")
                                     or "bfloat16"),
                max_positions=check_int("max_position_embeddings",
                                        config.get("max_position_embeddings", 4096), 1, 1 << 24),
            )
        except ValueError as e:
            raise ModelConfigError(f"config.json: {e}") from None
        return shape

    @property
    def parameters(self) -> int:
        """Embeddings, per layer q/k/v/o (with q/k/v biases where the model has them), the
        gated MLP's three matrices and two norms, the final norm, and an lm_head unless it
        is the embedding matrix."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        if self.qkv_bias:
            attention += q + 2 * kv
        layer = attention + 3 * self.hidden * self.intermediate + 2 * self.hidden
        embed = self.vocab * self.hidden
        return embed + self.layers * layer + self.hidden + (0 if self.tied_embeddings else embed)

    def served_dtype(self, dtype: str = "auto") -> str:
        """vLLM's ``dtype="auto"`` on a GPU: the checkpoint's 16-bit type, and a float32
        checkpoint in 16 bits too."""
        if dtype != "auto":
            return dtype
        return "bfloat16" if self.checkpoint_dtype == "float32" else self.checkpoint_dtype

    def weight_bytes(self, dtype: str = "auto") -> int:
        return self.parameters * dtype_bytes(self.served_dtype(dtype))

    def kv_bytes_per_token(self, dtype: str = "auto") -> int:
        """Keys and values of every layer: layers x KV heads x head size x 2 x bytes."""
        return self.layers * self.kv_heads * self.head_dim * 2 * dtype_bytes(
            self.served_dtype(dtype))

    def lora_slot_bytes(self, rank: int, dtype: str = "auto") -> int:
        """One adapter slot as vLLM reserves it: A (in x rank) and B (rank x out) for every
        layer's q/k/v, o, gate/up and down projections."""
        q, kv = self.heads * self.head_dim, self.kv_heads * self.head_dim
        h, i = self.hidden, self.intermediate
        ins = 3 * h + q + 2 * h + i          # qkv (three slices), o, gate and up, down
        outs = (q + 2 * kv) + h + 2 * i + h
        return self.layers * rank * (ins + outs) * dtype_bytes(self.served_dtype(dtype))


def dtype_bytes(dtype: str) -> int:
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ModelConfigError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") \
            from None


def read_model_config(model: str, subfolder: str = "") -> dict[str, Any]:
    """``config.json`` of a local folder (``subfolder`` inside it where the profile keeps its
    LLM there), else of a hub repository: that one file is downloaded (or read from the
    Hugging Face cache), never the weights."""
    name = f"{subfolder}/config.json" if subfolder else "config.json"
    folder = Path(model).expanduser()
    if folder.is_dir():
        path = folder / name
        if not path.is_file() and subfolder:
            path = folder / "config.json"
    else:
        path = _hub_config(model, name)
    try:
        return json.loads(Path(path).read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise ModelConfigError(f"cannot read {path}: {e}") from None


def _hub_config(repo: str, name: str) -> str:
    try:
        from huggingface_hub import hf_hub_download
        from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError
    except ImportError:
        raise ModelConfigError(f"{repo!r} is not a folder here, and reading a hub model's "
                               "config needs huggingface_hub (pip install huggingface_hub)") \
            from None

    try:
        return hf_hub_download(repo, name)
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as e:
        raise ModelConfigError(f"cannot fetch {name} of {repo!r}: {e}") from None
