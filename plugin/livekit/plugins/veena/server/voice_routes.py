"""``GET /v1/voices`` (the voices a client can name) and ``POST /v1/voices`` (a voice from a
reference clip, optionally saved under a name).

A saved name is unique: it may not be a profile voice's (it would replace that voice for
every client) nor an existing saved voice's, and two uploads racing for one name cannot both
win: the name is reserved in this process first, and the file is created only where no file
of that name exists (``VoiceFile.save(exclusive=True)``), which also holds between replicas
sharing one ``VEENA_VOICES_DIR``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from ..voices.files import VOICE_NAME, VoiceFile, clone_voice
from ..voices.reference_clip import ReferenceClipError
from .errors import json_error
from .health import profile_tags
from .state import server_state

logger = logging.getLogger(__name__)

_CLIP_CODES = {"empty": "empty_audio", "not_wav": "not_wav", "unsupported": "unsupported_audio",
               "too_short": "audio_too_short", "too_long": "audio_too_long", "silent": "silent_audio"}


async def voices(request: web.Request) -> web.Response:
    """``GET /v1/voices``: the profile's voices (a profile with ``described_voices`` also
    takes a description in words: its voices are presets, each with its description), the
    saved ones (``VEENA_VOICES_DIR``: a designed voice with its description and seed), the
    LoRA adapters served (each a voice name: a user's fine-tuned voice) and the expressive
    tags the model performs."""
    state = server_state(request)
    state.voices.refresh()
    profile = state.pipeline.profile
    described = bool(getattr(profile, "described_voices", False))
    body = {"profile": profile.name, "voices": list(profile.voices),
            "described_voices": described, "tags": profile_tags(profile),
            "saved": [_saved(name, v) for name, v in state.voices.by_name.items()],
            "adapters": [{"name": a.name, "rank": a.rank}
                         for a in state.pipeline.engine.adapters]}
    if described:
        body["presets"] = {v: profile.render_voice(v) for v in profile.voices}
    return web.json_response(body)


def _saved(name: str, v: VoiceFile) -> dict:
    entry = {"name": name, "voice": v.voice, "model": v.model}
    if v.seed is not None:
        entry["seed"] = v.seed
    if v.adapter is not None:
        entry["adapter"] = v.adapter
    return entry


async def _read_upload(request: web.Request, limit: int) -> bytes | web.Response:
    """The clip's bytes: the raw body (e.g. ``Content-Type: audio/wav``) or the ``file`` part
    of a multipart form; past ``limit`` bytes the read stops with 413. A malformed form (no
    boundary, a body that is not the form it claims) is a 400, never a 500."""
    too_large = json_error("upload_too_large", f"the upload is larger than {limit} bytes "
                           "(VEENA_MAX_VOICE_UPLOAD_BYTES)")
    if request.content_length is not None and request.content_length > limit + (1 << 16):
        return too_large
    try:
        read = lambda: request.content.read(1 << 16)  # noqa: E731
        if request.content_type.startswith("multipart/"):
            reader = await request.multipart()
            while ((part := await reader.next()) is not None
                   and getattr(part, "name", None) != "file"):
                await part.release()
            if part is None or not hasattr(part, "read_chunk"):
                return json_error("bad_request", "the multipart form has no 'file' part")
            read = lambda: part.read_chunk(1 << 16)  # noqa: E731
        data = bytearray()
        while chunk := await read():
            data += chunk
            if len(data) > limit:
                return too_large
    except (ValueError, AssertionError, HttpProcessingError, ConnectionError) as e:
        # aiohttp's multipart reader raises ValueError (and, for some malformed bodies,
        # AssertionError) on what the client sent
        return json_error("bad_request", f"the upload could not be read: {e or type(e).__name__}")
    return bytes(data)


async def clone(request: web.Request) -> web.Response:
    """``POST /v1/voices``: a WAV reference clip in, a voice file (JSON) out; with
    ``?name=NAME`` it is also saved in ``VEENA_VOICES_DIR`` and usable by that name. A model
    whose voice is a reference (NeuTTS) also needs ``?text=`` (what the clip says)."""
    state = server_state(request)
    name = request.query.get("name")
    if name is not None:
        if not VOICE_NAME.fullmatch(name):
            return json_error("bad_field", "name must be 1-64 letters, digits, '_' or '-'")
        if state.options.voices_dir is None:
            return json_error("bad_request", "this server has no VEENA_VOICES_DIR to save into")
        if state.voices.is_profile_voice(name):
            return json_error("voice_exists", f"{name!r} is one of the model's own voices")
        if state.voices.find(name) is not None or name in state.voices.names_taken:
            return json_error("voice_exists", f"a voice named {name!r} exists")
        state.voices.names_taken.add(name)
    try:
        return await _clone_and_save(request, name)
    finally:
        state.voices.names_taken.discard(name)


async def _clone_and_save(request: web.Request, name: str | None) -> web.Response:
    state = server_state(request)
    data = await _read_upload(request, state.options.max_voice_upload_bytes)
    if isinstance(data, web.Response):
        return data
    async with state.voices.clone_lock:  # one clone at a time beside the decode work
        try:
            saved = await clone_voice(state.pipeline, data, text=request.query.get("text"))
        except ReferenceClipError as e:
            return json_error(_CLIP_CODES[e.reason], str(e))
        except ValueError as e:  # no speaker encoder: another family, or a checkpoint without
            return json_error("cannot_clone", str(e))
    body = saved.to_json()
    if name is not None:
        try:
            saved.save(Path(state.options.voices_dir) / f"{name}.json", exclusive=True)
        except FileExistsError:  # another replica sharing the folder saved it first
            return json_error("voice_exists", f"a voice named {name!r} exists")
        state.voices.by_name[name] = saved
        body["name"] = name
    logger.info("voice cloned", extra={"voice_name": name, "bytes": len(data)})
    return web.json_response(body)
