"""A user's fine-tuned voices as LoRA adapters: found (a folder or a hub id), checked against
the base model, then registered with the engine by name.

An adapter that could fail inside vLLM's engine core (a load error there can stop the engine
for every caller) never gets that far: before registration its ``adapter_config.json`` and
every tensor of ``adapter_model.safetensors`` are read here and checked against the base
model's ``config.json`` (names, layers, shapes, rank, finite values). A failure is one
``AdapterError`` (a ``ValueError``) saying what is wrong.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..pipeline.adapters import Adapter, check_adapter_name
from ..pipeline.engine import VllmEngine
from ..settings import env_str

logger = logging.getLogger(__name__)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
MAX_ADAPTER_RANK = 512
"""vLLM's largest LoRA rank."""

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
TARGET_MODULES = ATTENTION + MLP
"""The Llama projections an adapter may train (what PEFT and Unsloth's TTS recipes target)."""

_TENSOR = re.compile(r"base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\."
                     r"(\w+)\.lora_([AB])\.weight")


class AdapterError(ValueError):
    """An adapter that cannot be served: the reason, naming the file and field."""


@dataclass(frozen=True)
class CheckedAdapter:
    """What registration needs of an adapter that passed every check."""

    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]


def parse_lora_specs(specs: Iterable[str] | str | None) -> dict[str, str]:
    """``NAME=PATH_OR_ID`` items (``--lora``, repeatable; ``VEENA_LORA``: the same list,
    separated by commas or spaces) as {name: location}; a bad item is an ``AdapterError``."""
    if specs is None:
        return {}
    if isinstance(specs, str):
        specs = specs.replace(",", " ").split()
    found: dict[str, str] = {}
    for item in specs:
        name, sep, location = str(item).partition("=")
        if not sep or not location.strip():
            raise AdapterError(f"a LoRA adapter is NAME=PATH_OR_HUB_ID, got {item!r}")
        name = check_name(name.strip())
        if name in found:
            raise AdapterError(f"adapter {name!r} is named twice")
        found[name] = location.strip()
    return found


def lora_from_env(given: Iterable[str] = ()) -> dict[str, str]:
    """``VEENA_LORA``'s adapters (every pipeline of this process registers them), then
    ``given`` (``--lora`` items; a name given again wins)."""
    return {**parse_lora_specs(env_str("VEENA_LORA", "")), **parse_lora_specs(given)}


def check_name(name: Any) -> str:
    try:
        return check_adapter_name(name)
    except ValueError as e:
        raise AdapterError(str(e)) from None


def adapter_folder(location: str, *, endpoint: str | None = None,
                   cache_dir: str | None = None) -> Path:
    """A local folder in PEFT layout: ``location`` itself, or a hub id downloaded (only its
    config and safetensors weights) into the Hugging Face cache (offline: from the cache)."""
    local = Path(location).expanduser()
    if local.is_dir():
        return local
    if location.startswith(("/", ".", "~")) or location.count("/") != 1:
        raise AdapterError(f"no adapter folder at {location!r} (a hub id is OWNER/NAME)")
    from huggingface_hub import snapshot_download

    logger.info("downloading adapter %s", location, extra={"repo": location})
    try:
        return Path(snapshot_download(location, endpoint=endpoint, cache_dir=cache_dir,
                                      allow_patterns=[CONFIG_FILE, WEIGHTS_FILE]))
    except Exception as e:  # the hub's errors are many types: one clear message
        raise AdapterError(f"cannot download adapter {location!r}: {type(e).__name__}: {e}"
                           ) from None


def base_shapes(model: str) -> tuple[int, dict[str, tuple[int, int]]]:
    """The base model's layer count and each target module's (in, out) features, from its
    config (a local folder or a hub id; a Llama: what every supported family is)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(model).to_dict()
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
        inter = int(config["intermediate_size"])
        layers = int(config["num_hidden_layers"])
    except Exception as e:  # a missing or foreign config: one clear message
        raise AdapterError(f"cannot read the base model's config ({model}): {e}") from None
    return layers, {
        "q_proj": (hidden, heads * head_dim), "k_proj": (hidden, kv_heads * head_dim),
        "v_proj": (hidden, kv_heads * head_dim), "o_proj": (heads * head_dim, hidden),
        "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden),
    }


def adapter_folders(root: str | Path) -> dict[str, Path]:
    """Each folder directly under ``root`` that holds an adapter config, by its name (a name
    that cannot be an adapter's is skipped; so is a hidden folder)."""
    found = {}
    for path in sorted(Path(root).iterdir()):
        if path.is_dir() and (path / CONFIG_FILE).is_file() and not path.name.startswith("."):
            try:
                found[check_name(path.name)] = path
            except AdapterError:
                logger.warning("skipped a folder whose name is not an adapter name",
                               extra={"folder": str(path)})
    return found


def _config(folder: Path) -> tuple[int, float, tuple[str, ...]]:
    path = folder / CONFIG_FILE
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise AdapterError(f"{folder} has no {CONFIG_FILE} (a PEFT LoRA adapter folder "
                           "holds it beside adapter_model.safetensors)") from None
    except (OSError, ValueError) as e:
        raise AdapterError(f"{path} is not readable JSON: {e}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_ADAPTER_RANK:
        raise AdapterError(f"{path}: rank r must be an int in [1, {MAX_ADAPTER_RANK}], "
                           f"got {rank!r}")
    alpha = config.get("lora_alpha", rank)
    if (not isinstance(alpha, (int, float)) or isinstance(alpha, bool)
            or not math.isfinite(alpha) or alpha <= 0):
        raise AdapterError(f"{path}: lora_alpha must be a finite number > 0, got {alpha!r}")
    for flag in ("use_dora", "modules_to_save", "layers_to_transform", "rank_pattern",
                 "alpha_pattern"):
        if config.get(flag):
            raise AdapterError(f"{path}: {flag} is not supported (vLLM serves plain LoRA "
                               "on the projections only)")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias {config['bias']!r} is not supported (only 'none')")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, str) for t in targets):
        raise AdapterError(f"{path}: target_modules must list module names, got {targets!r}")
    unsupported = sorted(set(targets) - set(TARGET_MODULES))
    if unsupported:
        raise AdapterError(f"{path}: unsupported target modules {unsupported}; supported: "
                           f"{', '.join(TARGET_MODULES)}")
    return rank, float(alpha), tuple(sorted(set(targets)))


def check_adapter(location: str, model_dir: str) -> CheckedAdapter:
    """Read and check one adapter against the base model in ``model_dir`` (blocking: it
    reads every tensor; call it off the event loop)."""
    folder = adapter_folder(location)
    rank, alpha, targets = _config(folder)
    layers, shapes = base_shapes(model_dir)
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        other = " (adapter_model.bin is not read: convert it to safetensors)" if (
            folder / "adapter_model.bin").exists() else ""
        raise AdapterError(f"{folder} has no {WEIGHTS_FILE}{other}")
    from safetensors import safe_open

    pairs: dict[tuple[int, str], set[str]] = {}
    try:
        with safe_open(str(weights), framework="pt") as f:
            for key in f.keys():
                _check_tensor(key, f.get_tensor(key), rank, targets, layers, shapes, pairs)
    except AdapterError:
        raise
    except Exception as e:  # a truncated or corrupt file: safetensors' own error
        raise AdapterError(f"{weights} is not a readable safetensors file: {e}") from None
    half = sorted(f"layer {i} {m}" for (i, m), ab in pairs.items() if ab != {"A", "B"})
    if half:
        raise AdapterError(f"{weights}: lora_A and lora_B must come in pairs; unpaired: "
                           f"{', '.join(half[:4])}")
    if not pairs:
        raise AdapterError(f"{weights} holds no LoRA weights")
    return CheckedAdapter(str(folder.resolve()), rank, alpha, targets)


def _check_tensor(key: str, tensor: Any, rank: int, targets: tuple[str, ...], layers: int,
                  shapes: Mapping[str, tuple[int, int]], pairs: dict) -> None:
    match = _TENSOR.fullmatch(key)
    if match is None:
        raise AdapterError(f"unexpected tensor {key!r} (a LoRA adapter of a Llama holds "
                           "base_model.model.model.layers.N.<self_attn|mlp>.<proj>.lora_<A|B>"
                           ".weight only)")
    layer, parent, module, side = int(match[1]), match[2], match[3], match[4]
    if module not in targets or parent != ("self_attn" if module in ATTENTION else "mlp"):
        raise AdapterError(f"tensor {key!r} is not on a target module of the config")
    if layer >= layers:
        raise AdapterError(f"tensor {key!r}: the base model has {layers} layers (is the "
                           "adapter for another base model?)")
    fan_in, fan_out = shapes[module]
    want = (rank, fan_in) if side == "A" else (fan_out, rank)
    if tuple(tensor.shape) != want:
        raise AdapterError(f"tensor {key!r} has shape {tuple(tensor.shape)}, the base model "
                           f"needs {want} (is the adapter for another base model?)")
    if not tensor.is_floating_point():
        raise AdapterError(f"tensor {key!r} is not floating point ({tensor.dtype})")
    if not bool(tensor.isfinite().all()):
        raise AdapterError(f"tensor {key!r} holds NaN or infinite values")
    pairs.setdefault((layer, module), set()).add(side)


def register_adapter(engine: VllmEngine, name: str, location: str, model_dir: str) -> Adapter:
    """Check ``location`` against the base model, then serve it as ``name`` (the engine
    refuses a rank past its ``max_lora_rank`` once started). Blocking."""
    check_name(name)
    checked = check_adapter(location, model_dir)
    try:
        return engine.add_adapter(name, checked.path, checked.rank, checked.alpha)
    except ValueError as e:
        raise AdapterError(str(e)) from None


def download_adapters(lora: Mapping[str, str], *, endpoint: str | None = None,
                      cache_dir: str | None = None) -> list[Path]:
    """Fetch every adapter of {name: location} ahead of time (``veena-tts download --lora``,
    ``download-files`` with ``VEENA_LORA``): their local folders, in order."""
    return [adapter_folder(location, endpoint=endpoint, cache_dir=cache_dir)
            for location in lora.values()]


def settle_lora_env() -> None:
    """Processes that share one engine (a shared core and its front ends, ``serve --workers
    N --shared-engine``) must start LoRA alike, but only the front ends register adapters.
    Where adapters are configured (``VEENA_LORA``, ``VEENA_ADAPTERS_DIR``) and LoRA is left
    on auto, turn it on and fix ``VEENA_MAX_LORA_RANK`` from their configs (at least 16),
    in this process's environment, which every process it starts inherits."""
    from ..pipeline.adapters import served_rank
    from ..settings import env_bool_or_auto

    if env_bool_or_auto("VEENA_ENABLE_LORA", None) is not None:
        return  # set: every process reads the same
    folders = [adapter_folder(location) for location in lora_from_env().values()]
    root = env_str("VEENA_ADAPTERS_DIR", "")
    if root and Path(root).is_dir():
        folders += adapter_folders(root).values()
    if not folders and not root:
        return
    ranks = []
    for folder in folders:
        try:
            ranks.append(_config(folder)[0])
        except AdapterError as e:  # served by none of the processes: its rank does not count
            logger.warning("adapter not counted for the engine's LoRA rank: %s", e)
    os.environ["VEENA_ENABLE_LORA"] = "1"
    if not env_str("VEENA_MAX_LORA_RANK", ""):
        os.environ["VEENA_MAX_LORA_RANK"] = str(served_rank(max(ranks, default=0)))
