"""Fetch a model and its codec ahead of time (``python -m livekit.agents download-files``,
``veena-tts download``), so the first job of a fresh container does not download a 3B model
while a caller waits.

Everything goes through ``huggingface_hub`` into its cache, so ``HF_HOME``, ``HF_ENDPOINT``
and ``HF_HUB_OFFLINE`` behave as they do everywhere else (offline: the cache must already
hold the files). Failures are one clear ``DownloadError``, never a stack trace.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .profiles import ModelProfile, read_manifest, resolve_profile

logger = logging.getLogger(__name__)


class DownloadError(RuntimeError):
    """The hub could not be reached, or it does not have the model."""


def _snapshot(repo_id: str, *, endpoint: str | None, cache_dir: str | None) -> Path:
    from huggingface_hub import snapshot_download

    logger.info("downloading %s (progress below)", repo_id, extra={"repo": repo_id})
    try:
        path = snapshot_download(repo_id, endpoint=endpoint, cache_dir=cache_dir)
    except Exception as e:  # the hub's errors are many types: one clear message here
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            raise DownloadError(
                f"{repo_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set: "
                "download it once online (veena-tts download) or point HF_HOME at a cache "
                "that holds it") from None
        where = endpoint or os.environ.get("HF_ENDPOINT") or "the Hugging Face hub"
        raise DownloadError(
            f"cannot download {repo_id!r} from {where}: {type(e).__name__}: {e}. Check the "
            "model id and the network, or pre-fill the cache and set HF_HUB_OFFLINE=1"
        ) from None
    logger.info("downloaded %s", repo_id, extra={"repo": repo_id, "path": path})
    return Path(path)


def download_model(model: str | None = None, *, profile: str | ModelProfile | None = None,
                   endpoint: str | None = None, cache_dir: str | None = None) -> list[Path]:
    """Fetch ``model`` (default ``VEENA_MODEL``) and its codec; return the local folders.

    The codec comes from the model's own folder where its ``veena_tts.json`` or the
    profile says so (BiCodec lives inside Spark-layout repositories), else from the
    profile's codec repository (SNAC 24 kHz). A checkpoint in Spark-TTS's layout returns
    its root, then its LLM folder and its ``BiCodec/`` folder."""
    model = model or os.environ.get("VEENA_MODEL")
    if not model:
        raise DownloadError("no model to download: pass one or set VEENA_MODEL")
    local = Path(model).expanduser()
    folder = local if local.is_dir() else _snapshot(model, endpoint=endpoint, cache_dir=cache_dir)
    manifest = read_manifest(str(folder))
    prof = resolve_profile(str(folder), profile)
    folders = [folder]
    codec = os.environ.get("VEENA_CODEC_MODEL") or manifest.get("codec_model") or prof.codec_model
    llm = getattr(prof, "llm_folder", "")
    if llm:  # Spark-TTS's layout: LLM/ (what vLLM loads) beside BiCodec/
        if not (folder / llm).is_dir() or not (folder / codec).is_dir():
            raise DownloadError(f"{model!r} has no {llm}/ and {codec}/ folders: is it a "
                                f"{prof.name} checkpoint (profile {prof.name!r})?")
        logger.info("found the LLM and its codec", extra={"llm": str(folder / llm),
                                                          "codec_model": str(folder / codec)})
        return [folder, folder / llm, folder / codec]
    if (folder / codec).is_dir() or Path(codec).expanduser().is_dir():
        return folders  # inside the model's folder, or already local
    if "/" not in codec:
        raise DownloadError(f"the codec folder {codec!r} of profile {prof.name!r} is not in "
                            f"{model!r}; set VEENA_CODEC_MODEL to its location")
    folders.append(_snapshot(codec, endpoint=endpoint, cache_dir=cache_dir))
    # what cloning reads beside the codec (NeuCodec's encoder: w2v-bert-2.0)
    for extra in getattr(prof, "encoder_models", ()):
        folders.append(_snapshot(extra, endpoint=endpoint, cache_dir=cache_dir))
    return folders


def local_checkpoint(model: str, profile: ModelProfile) -> str:
    """``model`` as a local folder where the profile keeps its LLM in a subfolder
    (Spark-TTS's ``LLM/``): vLLM cannot load a subfolder of a hub repository, so such a hub
    id is fetched into the cache first (``DownloadError`` if it cannot be). Anything else is
    returned as it is."""
    if getattr(profile, "llm_folder", "") and not Path(model).expanduser().is_dir():
        return str(_snapshot(model, endpoint=None, cache_dir=None))
    return model


def llm_location(model: str, profile: ModelProfile) -> str:
    """What the engine loads: the checkpoint's LLM folder where the profile has one and the
    folder holds it (a released Spark-TTS checkpoint), else ``model`` itself."""
    sub = getattr(profile, "llm_folder", "")
    if sub and (Path(model) / sub).is_dir():
        return str(Path(model) / sub)
    return model
