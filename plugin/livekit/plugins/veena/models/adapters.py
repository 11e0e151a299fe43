"""A user's fine-tuned voices as LoRA adapters: found (a folder or a hub id), checked against
the base model, then registered with the engine by name.

An adapter that could fail inside vLLM's engine core (a load error there can stop the engine
for every caller) never gets that far: before registration its files are copied
(``adapter_files``: the copy is what vLLM reads, under an id from its name and hash), its
``adapter_config.json`` passes vLLM's own ``PEFTHelper`` validation against the engine's LoRA
limits, and every tensor of ``adapter_model.safetensors`` is checked against the base model's
``config.json`` (names, layers, shapes, rank, finite values). Any failure, whatever raised
it, is one ``AdapterError`` (a ``ValueError``) saying what is wrong.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..pipeline.adapters import Adapter, check_adapter_name
from ..pipeline.engine import VllmEngine
from ..settings import env_str
from .adapter_files import (CONFIG_FILE, WEIGHTS_FILE, adapter_id, copy_files, discard,
                            publish, stamp)

logger = logging.getLogger(__name__)

__all__ = ["CONFIG_FILE", "WEIGHTS_FILE", "AdapterError", "CheckedAdapter", "check_adapter"]

MAX_ADAPTER_RANK = 512
"""vLLM's largest LoRA rank."""
MAX_ALPHA = 1e30
"""Far above any trained adapter's ``lora_alpha``; NaN and infinity are refused too."""

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

    name: str
    int_id: int
    path: str
    """The checked copy (what vLLM reads)."""
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    source: str
    """The folder it was copied from."""
    stamp: tuple
    """``adapter_files.stamp`` of the source as it was copied."""

    def adapter(self) -> Adapter:
        return Adapter(self.name, self.int_id, self.path, self.rank, self.alpha,
                       source=self.source, stamp=self.stamp, owned=True)


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

    from ..sizing.shape import ModelShape

    try:
        shape = ModelShape.from_config(AutoConfig.from_pretrained(model).to_dict())
    except Exception as e:  # a missing or foreign config: one clear message
        raise AdapterError(f"cannot read the base model's config ({model}): {e}") from None
    hidden, heads, kv_heads = shape.hidden, shape.heads, shape.kv_heads
    head_dim, inter = shape.head_dim, shape.intermediate
    return shape.layers, {
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


def _config(folder: Path, max_lora_rank: int = MAX_ADAPTER_RANK,
            shown: Path | None = None) -> tuple[int, float, tuple[str, ...]]:
    """The config's rank, alpha and targets, once vLLM's own ``PEFTHelper`` accepts it with
    ``max_lora_rank`` (messages name ``shown``, the user's folder, where ``folder`` is a
    copy)."""
    path = (shown or folder) / CONFIG_FILE
    try:
        config = json.loads((folder / CONFIG_FILE).read_text())
    except FileNotFoundError:
        raise AdapterError(f"{shown or folder} has no {CONFIG_FILE} (a PEFT LoRA adapter "
                           "folder holds it beside adapter_model.safetensors)") from None
    except (OSError, ValueError, RecursionError) as e:  # RecursionError: nested too deep
        raise AdapterError(f"{path} is not readable JSON: {type(e).__name__}: {e}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{path} is not a JSON object")
    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterError(f"{path}: peft_type {config.get('peft_type')!r} is not LORA")
    rank = config.get("r")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 1 <= rank <= MAX_ADAPTER_RANK:
        raise AdapterError(f"{path}: rank r must be an int in [1, {MAX_ADAPTER_RANK}], "
                           f"got {rank!r}")
    if "lora_alpha" not in config:
        raise AdapterError(f"{path}: lora_alpha is missing (vLLM requires it)")
    alpha = config["lora_alpha"]
    if not isinstance(alpha, (int, float)) or isinstance(alpha, bool) or not (
            0 < alpha < MAX_ALPHA):  # (compared, never converted: a huge int overflows)
        raise AdapterError(f"{path}: lora_alpha must be a number in (0, {MAX_ALPHA:g}), "
                           f"got {_short(alpha)}")
    for flag in ("use_dora", "modules_to_save", "layers_to_transform", "rank_pattern",
                 "alpha_pattern"):
        if config.get(flag):
            raise AdapterError(f"{path}: {flag} is not supported (vLLM serves plain LoRA "
                               "on the projections only)")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"{path}: bias {_short(config['bias'])} is not supported "
                           "(only 'none')")
    targets = config.get("target_modules")
    if isinstance(targets, str):
        targets = [targets]
    if not isinstance(targets, list) or not targets or not all(
            isinstance(t, str) for t in targets):
        raise AdapterError(f"{path}: target_modules must list module names, got "
                           f"{_short(targets)}")
    unsupported = sorted(set(targets) - set(TARGET_MODULES))
    if unsupported:
        raise AdapterError(f"{path}: unsupported target modules {_short(unsupported)}; "
                           f"supported: {', '.join(TARGET_MODULES)}")
    _vllm_check(config, max_lora_rank, path)
    return rank, float(alpha), tuple(sorted(set(targets)))


def _vllm_check(config: dict, max_lora_rank: int, path: Path) -> None:
    """vLLM's own validation of the config (what its core runs as it loads the adapter,
    where a refusal is fatal), with the engine's ``max_lora_rank``."""
    from vllm.config.lora import LoRAConfig
    from vllm.lora.peft_helper import PEFTHelper

    try:
        helper = PEFTHelper.from_dict({**config, "vllm_max_position_embeddings": None})
        helper.validate_legal(LoRAConfig(max_lora_rank=max_lora_rank, max_loras=1))
    except Exception as e:  # vLLM's ValueError, or a TypeError on a value of a wrong type
        raise AdapterError(f"{path}: vLLM refuses this adapter: {_short(str(e), 300)}"
                           ) from None


def _short(value: Any, limit: int = 80) -> str:
    text = value if isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def check_adapter(name: str, location: str, model_dir: str,
                  max_lora_rank: int | None = None) -> CheckedAdapter:
    """Copy one adapter's files and check the copy against the base model in ``model_dir``
    and an engine's ``max_lora_rank`` (None: vLLM's largest; an engine not started yet
    sizes itself to fit). Blocking: it reads every tensor; call it off the event loop."""
    check_name(name)
    folder = adapter_folder(location)
    before = stamp(folder)
    try:
        copy, digest = copy_files(folder)
    except OSError as e:
        raise AdapterError(f"cannot read the adapter at {folder}: {e}") from None
    try:
        rank, alpha, targets = _check_files(copy, folder, model_dir,
                                            max_lora_rank or MAX_ADAPTER_RANK)
        path = publish(copy, name, adapter_id(name, digest))
    except AdapterError:
        discard(copy)
        raise
    except Exception as e:  # anything a hostile file makes a parser raise: a bad adapter
        discard(copy)
        raise AdapterError(f"{folder} cannot be read as a LoRA adapter: "
                           f"{type(e).__name__}: {_short(str(e), 200)}") from None
    return CheckedAdapter(name, adapter_id(name, digest), str(path), rank, alpha, targets,
                          os.path.abspath(folder), before)


def _check_files(copy: Path, folder: Path, model_dir: str,
                 max_lora_rank: int) -> tuple[int, float, tuple[str, ...]]:
    rank, alpha, targets = _config(copy, max_lora_rank, shown=folder)
    layers, shapes = base_shapes(model_dir)
    weights, shown = copy / WEIGHTS_FILE, folder / WEIGHTS_FILE
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
        raise AdapterError(f"{shown} is not a readable safetensors file: {e}") from None
    half = sorted(f"layer {i} {m}" for (i, m), ab in pairs.items() if ab != {"A", "B"})
    if half:
        raise AdapterError(f"{shown}: lora_A and lora_B must come in pairs; unpaired: "
                           f"{', '.join(half[:4])}")
    if not pairs:
        raise AdapterError(f"{shown} holds no LoRA weights")
    return rank, alpha, targets


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
    """Check ``location`` against the base model and the engine's LoRA limits, then serve
    it as ``name``. Blocking."""
    return serve_checked(engine, check_adapter(name, location, model_dir,
                                               engine.options.max_lora_rank))


def serve_checked(engine: VllmEngine, checked: CheckedAdapter, *,
                  replace: bool = False) -> Adapter:
    """Register a checked adapter (``replace``: in place of the one served under its name);
    a refusal frees its copy and is an ``AdapterError``."""
    try:
        return engine.add_adapter(checked.adapter(), replace)
    except ValueError as e:
        if not any(a.path == checked.path for a in engine.adapters):
            shutil.rmtree(checked.path, ignore_errors=True)
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

    root = env_str("VEENA_ADAPTERS_DIR", "")
    if root and not Path(root).is_dir():
        raise AdapterError(f"VEENA_ADAPTERS_DIR {root} is not a folder")
    if env_bool_or_auto("VEENA_ENABLE_LORA", None) is not None:
        return  # set: every process reads the same
    folders = [adapter_folder(location) for location in lora_from_env().values()]
    if root:
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
