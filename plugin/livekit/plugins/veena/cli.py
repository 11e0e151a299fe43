"""veena-tts: speak a text to a WAV file, build a tiny test model, or run the server."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
import time
import wave
from pathlib import Path

from .log import configure_logging

logger = logging.getLogger("livekit.plugins.veena.cli")

DEFAULT_TINY_DIR = Path(".cache/tiny-veena")
TINY = "tiny"
"""The model name that asks for the tiny random-weight model (``serve --model tiny``)."""


class _Progress:
    """Audio written so far: one self-updating line on a terminal; otherwise a log line at
    1, 2, 4, 8 ... seconds of audio, so a long text still logs only a handful."""

    def __init__(self, request_id: str) -> None:
        self._tty = sys.stderr.isatty()
        self._next = 1.0
        self._request_id = request_id

    def update(self, seconds: float, final: bool) -> None:
        if self._tty:
            sys.stderr.write(f"\rspeaking: {seconds:6.2f} s of audio" + ("\n" if final else ""))
            sys.stderr.flush()
        elif seconds >= self._next or final:
            while self._next <= seconds:
                self._next *= 2
            logger.info("progress: %.2f s of audio", seconds,
                        extra={"request_id": self._request_id})


def _resolve_model(model: str | None, profile: str | None = None) -> str:
    """The model to speak with: --model, else VEENA_MODEL, else a tiny random model in
    ``profile``'s layout (``veena`` when none is named: ``.cache/tiny-veena``)."""
    from .models.profiles import MANIFEST, get_profile
    from .models.tiny_model import make_tiny_model

    model = model or os.environ.get("VEENA_MODEL")
    if model and model != TINY:
        return model
    name = get_profile(profile).name if profile else "veena"
    folder = DEFAULT_TINY_DIR.parent / f"tiny-{name}"
    if not (folder / MANIFEST).is_file():
        logger.info("no model configured: building the tiny random %s model in %s", name, folder)
        make_tiny_model(folder, name)
    logger.warning(
        "using the tiny RANDOM-weight model at %s: the WAV will be noise, not speech. "
        "Point --model (or VEENA_MODEL) at a real checkpoint such as maya-research/veena-tts "
        "to hear speech.", folder,
    )
    return str(folder)


async def _say(args: argparse.Namespace) -> int:
    from .models import loading
    from .models.adapters import lora_from_env
    from .models.profiles import resolve_profile
    from .pipeline.stitching import to_int16
    from .pipeline.tags import strip_unknown_tags
    from .voices.call_voice import resolve_voice, voice_file_at

    model = _resolve_model(args.model, args.profile)
    profile = resolve_profile(model, args.profile)
    try:  # a saved voice and the adapters are read and checked before any engine work
        lora = lora_from_env(args.lora)
        voice = resolve_voice(profile, profile.default_voice if args.voice is None else args.voice,
                              seed=args.seed, lookup=voice_file_at(profile), adapters=lora)
        pipeline = loading.load_pipeline(model, profile=profile, lora=lora)
    except ValueError as e:  # a clear line, no traceback (VoiceFileError, AdapterError too)
        logger.error("%s", e)
        return 2
    try:
        await pipeline.start()
        sampling = pipeline.sampling.defaults()
        if args.max_tokens:
            from dataclasses import replace

            sampling = replace(sampling, max_tokens=args.max_tokens)
        text, removed = strip_unknown_tags(args.text, profile.tags)
        if removed:  # never read aloud: the model does not perform them
            logger.warning("removed tags the model does not perform",
                           extra={"removed_tags": removed, "profile": profile.name})
        # numbers, money and dates as people say them (-v logs the text the model reads)
        text = await pipeline.normalized(text, "say", args.text_normalization)
        syn = pipeline.synthesize(text, voice=voice.voice, sampling=sampling, seed=voice.seed,
                                  speaker_globals=voice.speaker_globals, adapter=voice.adapter)
        out = Path(args.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        progress = _Progress(syn.request_id)
        with wave.open(str(out), "wb") as wav:
            wav.setnchannels(1)
            wav.setsampwidth(2)
            wav.setframerate(pipeline.sample_rate)
            async for chunk in syn:
                wav.writeframes(to_int16(chunk.pcm).tobytes())
                progress.update(syn.timings.audio_seconds, chunk.final)
        t = syn.timings
        if t.first_audio_ms is None:  # every chunk empty, retried too: nothing to listen to
            out.unlink(missing_ok=True)
            logger.error("the model produced no audio for this text (no WAV written)",
                         extra={"request_id": syn.request_id})
            return 1
        sys.stdout.write(
            f"first_audio_ms={t.first_audio_ms:.0f} audio_s={t.audio_seconds:.2f} "
            f"rtf={t.real_time_factor:.2f} wav={out}\n"
        )
        return 0
    finally:
        await pipeline.aclose()


async def _capture(args: argparse.Namespace) -> int:
    from .models import loading
    from .voices.files import capture_voice

    model = _resolve_model(args.model, args.profile)
    pipeline = loading.load_pipeline(model, profile=args.profile)
    try:
        await pipeline.start()
        saved = await capture_voice(pipeline, args.text, args.voice or pipeline.profile.default_voice,
                                    seed=args.seed, model=model)
        path = saved.save(args.output)
        logger.info("voice saved", extra={"path": str(path), "voice": saved.voice,
                                          "profile": saved.profile})
        sys.stdout.write(f"voice={path}\n")
        return 0
    finally:
        await pipeline.aclose()


async def _clone(args: argparse.Namespace) -> int:
    from .models import loading
    from .voices.files import VoiceFileError, clone_voice

    model = _resolve_model(args.model, args.profile)
    wav = Path(args.reference).read_bytes()
    pipeline = loading.load_pipeline(model, profile=args.profile)  # the engine is never started
    try:
        saved = await clone_voice(pipeline, wav, model=model, text=args.text)
    except ValueError as e:  # no speaker encoder for this model, or a checkpoint without one
        raise VoiceFileError(str(e)) from None
    finally:
        await pipeline.aclose()
    path = saved.save(args.output)
    logger.info("voice cloned", extra={"path": str(path), "reference": args.reference,
                                       "profile": saved.profile})
    sys.stdout.write(f"voice={path}\n")
    return 0


def _design(args: argparse.Namespace) -> int:
    """A SNAC voice from words and a seed: checked by the profile, written; no engine."""
    from .models.profiles import get_profile, resolve_profile
    from .voices.files import VoiceFileError, design_voice

    model = args.model or os.environ.get("VEENA_MODEL") or ""
    try:
        profile = (get_profile(args.profile) if args.profile
                   else resolve_profile(model) if model else get_profile("maya1"))
    except ValueError as e:  # an unknown profile name
        raise VoiceFileError(str(e)) from None
    saved = design_voice(profile, args.description, seed=args.seed, model=model)
    path = saved.save(args.output)
    logger.info("voice designed: written to %s", path,
                extra={"path": str(path), "profile": saved.profile, "seed": saved.seed})
    sys.stdout.write(f"voice={path}\n")
    return 0


_WATERMARK_HELP = ("the Perth output watermark: auto, where the model's reference applies it "
                   "(neutts) and resemble-perth is installed; on; off (default: "
                   "VEENA_WATERMARK, auto)")


def main(argv: list[str] | None = None) -> int:
    from .watermark import WATERMARK_MODES

    parser = argparse.ArgumentParser(prog="veena-tts", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command", required=True)

    say = sub.add_parser("say", help="speak TEXT into a WAV file through the streaming pipeline")
    say.add_argument("text")
    say.add_argument("-o", "--output", default="out.wav")
    say.add_argument("--voice", default=None, help="a profile voice (spark: GENDER-PITCH-SPEED, "
                     "e.g. female-moderate-high), or a saved voice file (.json; neutts, "
                     "llasa: a cloned reference, 'voice clone')")
    say.add_argument("--model", default=None, help="model path or hub id (default: VEENA_MODEL)")
    say.add_argument("--profile", default=None,
                     help="veena, orpheus, maya1, veena3, spark, neutts or llasa")
    say.add_argument("--seed", type=int, default=None)
    say.add_argument("--max-tokens", type=int, default=None)
    say.add_argument("--text-normalization", choices=("auto", "off"), default=None,
                     help="spell out numbers, money and dates (default: "
                          "VEENA_TEXT_NORMALIZATION, auto)")
    say.add_argument("--lora", action="append", default=[], metavar="NAME=PATH_OR_ID",
                     help="serve a LoRA adapter as voice NAME (repeatable; VEENA_LORA too)")
    say.add_argument("--watermark", choices=WATERMARK_MODES, default=None, help=_WATERMARK_HELP)

    voice = sub.add_parser("voice", help="saved voices: capture or clone (BiCodec), "
                                         "design (SNAC)")
    voice_sub = voice.add_subparsers(dest="voice_command", required=True)
    capture = voice_sub.add_parser("capture", help="speak TEXT once and save the voice it used")
    capture.add_argument("text")
    capture.add_argument("-o", "--output", required=True, help="the voice file (.json)")
    capture.add_argument("--voice", default=None, help="the profile voice to capture with")
    capture.add_argument("--model", default=None)
    capture.add_argument("--profile", default=None)
    capture.add_argument("--seed", type=int, default=None)

    clone = voice_sub.add_parser("clone", help="a voice from a reference clip (WAV, 1-30 s): "
                                               "the codec encoder's speaker tokens (BiCodec: "
                                               "32 globals; NeuTTS: the clip's codes and "
                                               "--text), no engine")
    clone.add_argument("reference", help="the reference clip (.wav)")
    clone.add_argument("--text", default=None,
                       help="what the clip says, word for word (NeuTTS: required; a "
                            "3-15 s clip fits the model's 2048-token context best)")
    clone.add_argument("-o", "--output", required=True, help="the voice file (.json)")
    clone.add_argument("--model", default=None)
    clone.add_argument("--profile", default=None)

    design = voice_sub.add_parser(
        "design", help="a SNAC voice from words and a seed, written to a voice file; no engine "
                       "work (nothing is spoken: the file pins what the prompt says and how it "
                       "is sampled)",
        description="Write a voice file for a SNAC model: DESCRIPTION (a description in words "
                    "for maya1, checked by its rule: 1-500 characters, no quotes, angle "
                    "brackets or control characters; or a preset name) and a seed. No model "
                    "is loaded and nothing is spoken.")
    design.add_argument("description", help="the voice in words (maya1), or a preset name")
    design.add_argument("-o", "--output", required=True, help="the voice file (.json)")
    design.add_argument("--seed", type=int, default=None,
                        help="the sampling seed (default: a random one, written to the file)")
    design.add_argument("--profile", default=None,
                        help="default: the model's (--model / VEENA_MODEL), else maya1")
    design.add_argument("--model", default=None,
                        help="the model the voice is for, recorded in the file")

    download = sub.add_parser("download", help="fetch MODEL (default VEENA_MODEL) and its codec "
                                               "into the Hugging Face cache")
    download.add_argument("model", nargs="?", default=None)
    download.add_argument("--model", dest="model_option", default=None, metavar="MODEL",
                          help="the same, spelled as say and serve take it")
    download.add_argument("--profile", default=None)
    download.add_argument("--lora", action="append", default=[], metavar="NAME=PATH_OR_ID",
                          help="also fetch this LoRA adapter (repeatable; VEENA_LORA too)")

    from .sizing import plan as sizing_plan

    sizing_plan.add_parser(sub)

    tiny = sub.add_parser("make-tiny-model", help="build a tiny random-weight model in DIR")
    tiny.add_argument("dir")
    tiny.add_argument("--profile", default="veena")
    tiny.add_argument("--seed", type=int, default=0)

    serve = sub.add_parser("serve", help="run the TTS server (WebSocket + OpenAI-compatible HTTP)")
    serve.add_argument("--model", default=None,
                       help="model path or hub id (default: VEENA_MODEL; required); "
                            "'tiny': a tiny random-weight test model")
    serve.add_argument("--profile", default=None)
    serve.add_argument("--host", default=os.environ.get("VEENA_HOST", "127.0.0.1"))
    serve.add_argument("--lora", action="append", default=[], metavar="NAME=PATH_OR_ID",
                       help="serve a LoRA adapter as voice NAME (repeatable; adds to VEENA_LORA)")
    serve.add_argument("--port", type=int, default=None, help="default VEENA_PORT, 8700")
    serve.add_argument("--workers", type=int, default=None,
                       help="server processes sharing the port, each with its own engine on "
                            "1/N of the GPU memory share (default VEENA_SERVER_WORKERS, 1)")
    serve.add_argument("--shared-engine", action=argparse.BooleanOptionalAction, default=None,
                       help="with several workers: one vLLM engine core with the whole GPU "
                            "memory share, each worker one of its front ends (default "
                            "VEENA_SHARED_ENGINE, off)")
    serve.add_argument("--watermark", choices=WATERMARK_MODES, default=None,
                       help=_WATERMARK_HELP)

    # -v anywhere on the line, as scripts/veena-tts.sh takes it (SUPPRESS: a subcommand's
    # default must not undo a -v given before it)
    for command in [*sub.choices.values(), *voice_sub.choices.values()]:
        command.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    configure_logging(args.verbose)
    if getattr(args, "watermark", None):  # read with the other VEENA_* (every worker too)
        os.environ["VEENA_WATERMARK"] = args.watermark
    started = time.perf_counter()
    if args.command in ("say", "voice"):
        from .voices.files import VoiceFileError
        from .voices.reference_clip import ReferenceClipError

        try:
            if args.command == "voice" and args.voice_command == "design":
                return _design(args)
            run = (_say if args.command == "say" else _clone if args.voice_command == "clone"
                   else _capture)
            return asyncio.run(run(args))
        except (VoiceFileError, ReferenceClipError, OSError) as e:  # a clear line, no traceback
            logger.error("%s", e)
            return 2
    if args.command == "download":
        from .models.adapters import download_adapters, lora_from_env
        from .models.download import DownloadError, download_model
        from .normalization import grammars

        if args.model and args.model_option and args.model != args.model_option:
            parser.error(f"two models given: {args.model} and --model {args.model_option}")
        try:
            lora = lora_from_env(args.lora)
            folders = download_model(args.model or args.model_option, profile=args.profile)
            for folder in [*folders, *download_adapters(lora)]:
                sys.stdout.write(f"{folder}\n")
            grammars.prepare()  # the text-normalisation grammars, compiled once
        except (DownloadError, ValueError) as e:  # AdapterError is a ValueError
            logger.error("%s", e)
            return 2
        return 0
    if args.command == "plan":
        return sizing_plan.run(args)
    if args.command == "make-tiny-model":
        from .models.tiny_model import make_tiny_model

        path = make_tiny_model(args.dir, args.profile, seed=args.seed)
        logger.info("tiny model ready in %.1f s", time.perf_counter() - started,
                    extra={"dir": str(path)})
        return 0
    if args.command == "serve":
        from .models.adapters import lora_from_env, settle_lora_env
        from .models.loading import pipeline_options_from_env
        from .server.app import ServerOptions, run_server
        from .server.workers import run_workers
        from .settings import env_bool, env_int
        from .validation import check_int

        model = args.model or os.environ.get("VEENA_MODEL")
        if not model:  # never a random model nobody asked for
            logger.error("serve needs a model: --model NAME_OR_PATH (or VEENA_MODEL), e.g. "
                         "--model maya-research/veena-tts; --model tiny serves a tiny "
                         "random-weight test model")
            return 2
        if model == TINY:
            model = _resolve_model(model, args.profile)
            logger.warning("SERVING THE TINY RANDOM-WEIGHT TEST MODEL (%s): every client hears "
                           "noise, not speech; /health says random_weights", model)
        try:
            # every setting read now, before minutes of model loading (or in each worker)
            ServerOptions.from_env()
            pipeline_options_from_env()
            if args.lora:  # every worker's pipeline serves them, as VEENA_LORA's
                lora = lora_from_env(args.lora)
                os.environ["VEENA_LORA"] = " ".join(f"{n}={p}" for n, p in lora.items())
            settle_lora_env()  # a shared core and its front ends start LoRA alike
            port = check_int("port", args.port if args.port is not None
                             else env_int("VEENA_PORT", 8700), 0, 65535)
            workers = args.workers if args.workers is not None else env_int(
                "VEENA_SERVER_WORKERS", 1)
            shared = (args.shared_engine if args.shared_engine is not None
                      else env_bool("VEENA_SHARED_ENGINE", False))
            if workers == 1:
                return run_server(model, profile=args.profile, host=args.host, port=port)
            return run_workers(model, profile=args.profile, host=args.host, port=port,
                               workers=workers, verbose=args.verbose, shared_engine=shared)
        except (ValueError, OSError) as e:  # a bad count, a port in use: one clear line
            logger.error("cannot start the server: %s", e)
            return 2
    return 2


if __name__ == "__main__":
    sys.exit(main())
