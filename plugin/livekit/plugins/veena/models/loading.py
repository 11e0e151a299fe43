"""Building a pipeline for a model: where its checkpoint and codec are, which profile reads
it, what vLLM starts with, and every decode tunable from its ``VEENA_*`` variable.

The pipeline itself (``pipeline/``) takes its engine, codec, profile and options ready made;
everything that reads the environment, the disk or the model hub to make them is here.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import math
import re
import threading
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from ..codecs.torch_threads import single_threaded_torch
from ..pipeline.engine import EngineOptions, VllmEngine
from ..pipeline.engine_options import has_cuda
from ..pipeline.family import DecodeShape, family_for
from ..normalization import NormalizationOptions, check_mode, check_pronunciations
from ..pipeline.guards import GuardOptions
from ..pipeline.options import MAX_QUEUED_OUTPUT_STEPS, PipelineOptions
from ..pipeline.pacing import PacingOptions
from ..pipeline.pipeline import Pipeline
from ..pipeline.scheduler import SchedulerOptions
from ..pipeline.windowing import WindowOptions
from ..settings import env_bool, env_bool_or_auto, env_float, env_int, env_str
from ..sizing.fit import decode_batch_for
from ..sizing.machine import choose_codec_device
from ..validation import check_int
from ..watermark import check_watermark_mode, watermarker_for
from .adapters import (AdapterError, adapter_folder, check_name, lora_from_env,
                       register_adapter)
from .download import llm_location, local_checkpoint
from .families import BiCodecFamily, SnacFamily
from .profiles import ModelProfile, read_manifest, resolve_profile

logger = logging.getLogger(__name__)

LOCAL_ENGINE_MODULES = ("torch", "vllm", "snac", "safetensors", "yaml")
"""What running a model in this process needs beyond the base (client-side) install."""


class MissingExtraError(ImportError):
    """The local engine's packages are not installed (the base install is the client)."""


def require_local_engine() -> None:
    """Say exactly what to install before anything tries to import torch or vLLM."""
    missing = [m for m in LOCAL_ENGINE_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtraError(
            "running a model in this process (veena.TTS(model=...), veena-tts say/serve) needs "
            "the local engine: pip install 'livekit-plugins-veena[cpu]' on a machine without "
            "CUDA, or 'livekit-plugins-veena[cuda]' with CUDA (missing: " + ", ".join(missing)
            + "); or speak through a server with veena.TTS(base_url=...)")


def _decode_shape_from_env(prefix: str, d: DecodeShape) -> DecodeShape:
    """A family's windows from ``PREFIX_FIRST/_NEW/_LEFT/_RIGHT/_MAX`` (and the pacing
    settings every family shares)."""
    window = WindowOptions(
        first=env_int(f"{prefix}_FIRST", d.window.first),
        new=env_int(f"{prefix}_NEW", d.window.new),
        left=env_int(f"{prefix}_LEFT", d.window.left),
        right=env_int(f"{prefix}_RIGHT", d.window.right),
    ).validate()
    pacing = PacingOptions(
        max_new=env_int(f"{prefix}_MAX", d.pacing.max_new),
        rebuffer_ms=env_float("VEENA_REBUFFER_MS", d.pacing.rebuffer_ms),
        margin=env_float("VEENA_WINDOW_MARGIN", d.pacing.margin),
        pull_tick_ms=env_float("VEENA_PULL_TICK_MS", d.pacing.pull_tick_ms),
    ).validate()
    return DecodeShape(window, pacing)


def codec_device_from_env() -> tuple[str, str]:
    """``VEENA_CODEC_DEVICE`` (default ``auto``: CUDA where present) resolved, and why."""
    return choose_codec_device(env_str("VEENA_CODEC_DEVICE", "auto"), has_cuda())


def with_machine_decode_batch(options: PipelineOptions,
                              engine: EngineOptions) -> PipelineOptions:
    """On CUDA, unless ``VEENA_DECODE_MAX_BATCH`` is set: a batch that follows the streams
    this process admits (``sizing.fit.decode_batch_for``); the CPU keeps its default."""
    if not options.codec_device.startswith("cuda") or env_int("VEENA_DECODE_MAX_BATCH", None):
        return options
    batch = decode_batch_for(engine.max_num_seqs // 2)
    logger.info("decode batch up to %d (from max_num_seqs %d; VEENA_DECODE_MAX_BATCH sets it)",
                batch, engine.max_num_seqs)
    return replace(options, scheduler=replace(options.scheduler, max_batch=batch))


def _non_negative(name: str, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    return value


def pipeline_options_from_env() -> PipelineOptions:
    """Every decode-side tunable from its ``VEENA_*`` variable (ValueError naming a bad one),
    each built-in family's windows included, so a bad value is reported before any model
    loads."""
    d = PipelineOptions()
    return PipelineOptions(
        decode={family.codec: _decode_shape_from_env(family.decode_env, family.decode_defaults)
                for family in (SnacFamily, BiCodecFamily)},
        adaptive_windows=env_bool("VEENA_ADAPTIVE_WINDOWS", d.adaptive_windows),
        crossfade_ms=env_float("VEENA_CROSSFADE_MS", d.crossfade_ms),
        scheduler=SchedulerOptions(
            max_batch=env_int("VEENA_DECODE_MAX_BATCH", d.scheduler.max_batch),
            max_wait_ms=env_float("VEENA_DECODE_MAX_WAIT_MS", d.scheduler.max_wait_ms),
            adaptive_batch=env_bool("VEENA_DECODE_ADAPTIVE_BATCH", d.scheduler.adaptive_batch),
        ),
        codec_device=codec_device_from_env()[0],
        codec_cuda_graphs=env_bool("VEENA_CODEC_CUDA_GRAPHS", d.codec_cuda_graphs),
        snac_streaming=env_bool_or_auto("VEENA_SNAC_STREAMING", d.snac_streaming),
        torch_threads=env_int("VEENA_TORCH_THREADS", d.torch_threads),
        freeze_gc_heap=env_bool("VEENA_FREEZE_GC_HEAP", d.freeze_gc_heap),
        queued_output_steps=check_int(
            "VEENA_QUEUED_OUTPUT_STEPS",
            env_int("VEENA_QUEUED_OUTPUT_STEPS", d.queued_output_steps), 0,
            MAX_QUEUED_OUTPUT_STEPS),
        guards=_guard_options_from_env(d.guards),
        normalization=_normalization_from_env(d.normalization),
        gc_full_interval_s=_non_negative(
            "VEENA_GC_FULL_INTERVAL_S",
            env_float("VEENA_GC_FULL_INTERVAL_S", d.gc_full_interval_s)),
        watermark=check_watermark_mode(env_str("VEENA_WATERMARK", d.watermark).strip().lower()),
        watermark_weights=env_str("VEENA_WATERMARK_WEIGHTS", d.watermark_weights).strip(),
    )


def _normalization_from_env(d: NormalizationOptions) -> NormalizationOptions:
    """``VEENA_TEXT_NORMALIZATION`` (auto, off), ``VEENA_NORMALIZATION_LOCALE`` (empty: the
    profile's) and ``VEENA_PRONUNCIATIONS_FILE`` (a JSON object of word to spoken form)."""
    mode = env_str("VEENA_TEXT_NORMALIZATION", d.mode)
    try:
        check_mode(mode)
    except ValueError as e:
        raise ValueError(f"VEENA_TEXT_NORMALIZATION: {e}") from None
    locale = env_str("VEENA_NORMALIZATION_LOCALE", "") or d.locale
    if locale is not None and not re.fullmatch(r"[a-z]{2}(-[A-Z]{2})?", locale):
        raise ValueError(f"VEENA_NORMALIZATION_LOCALE must look like en-IN, got {locale!r}")
    words = dict(d.pronunciations)
    path = env_str("VEENA_PRONUNCIATIONS_FILE", "")
    if path:
        try:
            words.update(check_pronunciations(json.loads(Path(path).read_text("utf-8"))))
        except (OSError, ValueError) as e:
            raise ValueError(f"VEENA_PRONUNCIATIONS_FILE {path}: {e}") from None
    return NormalizationOptions(mode=mode, locale=locale, pronunciations=words)


def _guard_options_from_env(d: GuardOptions) -> GuardOptions:
    per_char = env_str("VEENA_GUARD_RUNAWAY_S_PER_CHAR", "")
    options = GuardOptions(
        empty_tokens=env_int("VEENA_GUARD_EMPTY_TOKENS", d.empty_tokens),
        loop_repeats=env_int("VEENA_GUARD_LOOP_REPEATS", d.loop_repeats),
        loop_min_s=env_float("VEENA_GUARD_LOOP_MIN_S", d.loop_min_s),
        loop_max_s=env_float("VEENA_GUARD_LOOP_MAX_S", d.loop_max_s),
        runaway_base_s=env_float("VEENA_GUARD_RUNAWAY_BASE_S", d.runaway_base_s),
        runaway_s_per_char=(env_float("VEENA_GUARD_RUNAWAY_S_PER_CHAR", 0.0) if per_char
                            else d.runaway_s_per_char),
        silence_s=env_float("VEENA_GUARD_SILENCE_S", d.silence_s),
        silence_dbfs=env_float("VEENA_GUARD_SILENCE_DBFS", d.silence_dbfs),
        fade_ms=env_float("VEENA_GUARD_FADE_MS", d.fade_ms),
    )
    try:
        return options.validate()
    except ValueError as e:  # named as the variable the user set
        raise ValueError(f"VEENA_GUARD_{str(e).upper().split(' ', 1)[0]}: {e}") from None


def engine_options_of(model: str, profile: str | ModelProfile | None = None) -> EngineOptions:
    """What ``load_pipeline`` starts vLLM with for ``model`` (a shared engine core,
    ``server/shared_engine``, must be started with the same)."""
    prof = resolve_profile(model, profile)
    return EngineOptions.from_env(llm_location(local_checkpoint(model, prof), prof), profile=prof)


def codec_location(model: str, profile: ModelProfile, codec_model: str | None = None) -> str:
    """Where a model's codec is: the one given, else ``VEENA_CODEC_MODEL``, else the folder its
    manifest names, else the profile's codec folder inside a local model (a Spark-TTS
    checkpoint carries ``BiCodec/``), else the profile's codec (a hub id)."""
    codec_model = codec_model or env_str("VEENA_CODEC_MODEL", "") or None
    if codec_model:
        return codec_model
    manifest = read_manifest(model)
    if manifest.get("codec_model"):
        return str(Path(model) / manifest["codec_model"])
    inside = Path(model) / profile.codec_model
    return str(inside) if inside.is_dir() else profile.codec_model


def load_pipeline(model: str, *, profile: str | ModelProfile | None = None,
                  codec_model: str | None = None, engine_options: EngineOptions | None = None,
                  options: PipelineOptions | None = None,
                  engine_core: dict | None = None,
                  lora: Mapping[str, str] | None = None) -> Pipeline:
    """Build from a model path or hub id; a ``veena_tts.json`` beside it names the profile.
    ``engine_core``: attach to that shared engine core (``VllmEngine``'s ``core``).
    ``lora``: LoRA adapters to serve, {name: folder or hub id}, beside ``VEENA_LORA``'s;
    each is checked against the model before the engine starts (``AdapterError``)."""
    require_local_engine()
    from_env = options is None
    options = options or pipeline_options_from_env()
    prof = resolve_profile(model, profile)
    model = local_checkpoint(model, prof)  # a Spark-TTS hub id: its snapshot
    manifest = read_manifest(model)
    codec_model = codec_location(model, prof, codec_model)
    if manifest.get("random_weights"):
        logger.warning("this model has random weights: it produces noise, not speech",
                       extra={"model": model})
    if options.torch_threads > 0:
        import torch

        torch.set_num_threads(options.torch_threads)
    engine_options = engine_options or EngineOptions.from_env(llm_location(model, prof),
                                                              profile=prof)
    if from_env:
        options = with_machine_decode_batch(options, engine_options)
    device, why = codec_device_from_env()
    logger.info("codec on %s (%s)", options.codec_device,
                why if device == options.codec_device else "the caller's PipelineOptions")
    with single_threaded_torch(options.codec_device):
        codec = family_for(prof).load_codec(codec_model, options.codec_device,
                                            cuda_graphs=options.codec_cuda_graphs,
                                            streaming=options.streams_snac())
    watermarker = watermarker_for(options.watermark, prof, options.watermark_weights or None)
    engine = VllmEngine(engine_options, core=engine_core)
    pipeline = Pipeline(engine, codec, prof, options, watermarker=watermarker)
    pipeline.codec_model = codec_model
    pipeline.random_weights = bool(manifest.get("random_weights")) or (
        engine_options.load_format == "dummy")
    serve_adapters(pipeline, {**lora_from_env(), **(lora or {})})
    return pipeline


def serve_adapters(pipeline: Pipeline, lora: Mapping[str, str]) -> None:
    """Register each adapter of ``lora`` with the pipeline's engine, checked against its
    model; one already served under the same name from the same folder is kept (several
    ``veena.TTS`` of one process share a pipeline). Blocking: it reads the weights."""
    engine = pipeline.engine
    for name, location in lora.items():
        served = engine.adapters.get(check_name(name))
        if served is not None:
            if Path(served.source).resolve() != adapter_folder(location).resolve():
                raise AdapterError(f"adapter {name!r} is already served from {served.source}")
            continue
        if name in pipeline.profile.voices:
            raise AdapterError(f"adapter name {name!r} is already a voice of profile "
                               f"{pipeline.profile.name!r}")
        register_adapter(engine, name, location, engine.options.model)


_ENCODERS: "weakref.WeakKeyDictionary[Pipeline, Any]" = weakref.WeakKeyDictionary()
_ENCODERS_LOCK = threading.Lock()


def speaker_encoder(pipeline: Pipeline) -> Any:
    """The family's speaker encoder from ``pipeline``'s codec checkpoint (voice cloning),
    loaded once per pipeline on first use; ValueError where the family or the pipeline has
    none. Blocking: call it off the event loop."""
    with _ENCODERS_LOCK:
        encoder = _ENCODERS.get(pipeline)
        if encoder is None:
            if pipeline.codec_model is None:
                raise ValueError("this pipeline was built without a codec checkpoint path, "
                                 "so it has no speaker encoder (build it with load_pipeline)")
            encoder = pipeline.family.load_speaker_encoder(pipeline.codec_model,
                                                           pipeline.options.codec_device)
            _ENCODERS[pipeline] = encoder
        return encoder
