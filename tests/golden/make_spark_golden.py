"""Golden outputs of Spark-TTS's own BiCodec code, for ``tests/codecs/test_bicodec_golden.py``.

Not run by CI, nor by the test suite: it needs the official implementation, which cannot live
beside the project's environment (its torchaudio dependency is a CUDA build on PyPI). Run it
by hand, once, when the golden files must change (then commit ``tests/golden/spark/``):

    python3 -m venv /tmp/sparkvenv
    /tmp/sparkvenv/bin/pip install torch==2.13.0            # the CPU build, from local disk
    /tmp/sparkvenv/bin/pip install "numpy>=2.2.3" einops einx omegaconf packaging safetensors \
        soundfile soxr tqdm pyyaml transformers
    /tmp/sparkvenv/bin/pip install --no-deps torchaudio spark-tts-lib==0.2.1
    # PyPI's torchaudio is a CUDA build whose C++ extension cannot load beside the CPU torch;
    # without its shared libraries torchaudio imports, and MelSpectrogram is pure Python.
    rm /tmp/sparkvenv/lib/python3.11/site-packages/torchaudio/lib/*.so
    /tmp/sparkvenv/bin/python tests/golden/make_spark_golden.py

``spark-tts-lib`` 0.2.1 is SparkAudio/Spark-TTS's ``sparktts`` package as a wheel (the same
modules; weight norm through ``torch.nn.utils.parametrizations``). Everything below builds and
runs those modules; nothing of them is copied here.

What it writes into ``tests/golden/spark/`` (about 4 MB):
- ``config.yaml``: the model root's settings the reference-clip path reads
  (``ref_segment_duration``, ``latent_hop_length``, ``volume_normalize``, ``sample_rate``);
- ``BiCodec/config.yaml`` + ``BiCodec/model.safetensors``: the official checkpoint layout
  (an ``audio_tokenizer`` section; every tensor of ``BiCodec``, the feature encoder, postnet,
  x-vector head and mel buffers included; weight norm under the old ``weight_g``/``weight_v``
  names, as in the released checkpoint), at a reduced size with seeded random weights. Values
  are rounded to float16 and stored as float16 to keep the file small; the official code
  computes in float32 on exactly those values. The speaker encoder's ECAPA-TDNN is the
  official ``ECAPA_TDNN`` class at 32 channels instead of 512 (its ``channels`` argument;
  ``SpeakerEncoder`` itself hard-codes 512);
- ``clips/*.wav``: reference clips (quiet, stereo with different channels, 24 kHz, a short
  clip that gets tiled);
- ``golden.npz`` and ``cases.json``: for fixed semantic/global ids the speaker vector
  (``SpeakerEncoder.detokenize``) and the waveform (``BiCodec.detokenize``); for each clip,
  through ``BiCodecTokenizer``'s own loading (``load_audio``, ``get_ref_clip``), the mel
  spectrogram, the perceiver's latents before quantisation and the 32 global ids
  (``BiCodec.tokenize``).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import numpy as np
import soundfile
import torch
import yaml
from safetensors.torch import load_file, save_file

logger = logging.getLogger("make_spark_golden")

OUT = Path(__file__).resolve().parent / "spark"
SEED = 20250301

# The official config.yaml's structure and key names, at a reduced size. mel_params and the
# speaker tokens (32 tokens, FSQ levels [4]*6, 8192 semantic codes of dim 8, hop 320) are the
# released values; widths and depths are small.
AUDIO_TOKENIZER = {
    "mel_params": {"sample_rate": 16000, "n_fft": 1024, "win_length": 640, "hop_length": 320,
                   "mel_fmin": 10, "mel_fmax": None, "num_mels": 128},
    "encoder": {"input_channels": 24, "vocos_dim": 32, "vocos_intermediate_dim": 48,
                "vocos_num_layers": 2, "out_channels": 24, "sample_ratios": [1, 1]},
    "decoder": {"input_channel": 24, "channels": 48, "rates": [8, 5, 4, 2],
                "kernel_sizes": [16, 11, 8, 4]},
    "quantizer": {"input_dim": 24, "codebook_size": 8192, "codebook_dim": 8, "commitment": 0.25,
                  "codebook_loss_weight": 2.0, "use_l2_normlize": True,
                  "threshold_ema_dead_code": 0.2},
    "speaker_encoder": {"input_dim": 128, "out_dim": 24, "latent_dim": 16, "token_num": 32,
                        "fsq_levels": [4, 4, 4, 4, 4, 4], "fsq_num_quantizers": 1},
    "prenet": {"input_channels": 24, "vocos_dim": 32, "vocos_intermediate_dim": 48,
               "vocos_num_layers": 3, "out_channels": 24, "condition_dim": 24,
               "sample_ratios": [1, 1], "use_tanh_at_final": False},
    "postnet": {"input_channels": 24, "vocos_dim": 32, "vocos_intermediate_dim": 48,
                "vocos_num_layers": 1, "out_channels": 24, "use_tanh_at_final": False},
}
# The released Spark-TTS-0.5B BiCodec/config.yaml dimensions (audio_tokenizer section): only the
# names and shapes of its tensors are recorded (official_layout.json), for the full-size
# loading check; no weights of this size are stored.
FULL_SIZE = {
    **AUDIO_TOKENIZER,
    "encoder": {"input_channels": 1024, "vocos_dim": 384, "vocos_intermediate_dim": 2048,
                "vocos_num_layers": 12, "out_channels": 1024, "sample_ratios": [1, 1]},
    "decoder": {"input_channel": 1024, "channels": 1536, "rates": [8, 5, 4, 2],
                "kernel_sizes": [16, 11, 8, 4]},
    "quantizer": {**AUDIO_TOKENIZER["quantizer"], "input_dim": 1024},
    "speaker_encoder": {"input_dim": 128, "out_dim": 1024, "latent_dim": 128, "token_num": 32,
                        "fsq_levels": [4, 4, 4, 4, 4, 4], "fsq_num_quantizers": 1},
    "prenet": {"input_channels": 1024, "vocos_dim": 384, "vocos_intermediate_dim": 2048,
               "vocos_num_layers": 12, "out_channels": 1024, "condition_dim": 1024,
               "sample_ratios": [1, 1], "use_tanh_at_final": False},
    "postnet": {"input_channels": 1024, "vocos_dim": 384, "vocos_intermediate_dim": 2048,
                "vocos_num_layers": 6, "out_channels": 1024, "use_tanh_at_final": False},
}
ROOT_CONFIG = {"sample_rate": 16000, "latent_hop_length": 320, "ref_segment_duration": 6,
               "volume_normalize": True}
ECAPA_CHANNELS = 32

DECODE_CASES = {"short": 50, "long": 137}
"""Name -> number of semantic tokens; each case has its own seeded semantic and global ids."""


def _import_official():
    """The wheel's modules without its package ``__init__`` (which imports the LLM wrapper
    and the hub download helpers, none of them needed here)."""
    spec = importlib.util.find_spec("spark_tts_lib")
    if spec is None:
        raise SystemExit("spark-tts-lib is not installed: see this script's docstring")
    pkg = types.ModuleType("spark_tts_lib")
    pkg.__path__ = list(spec.submodule_search_locations)
    sys.modules["spark_tts_lib"] = pkg
    from spark_tts_lib.models import audio_tokenizer, bicodec
    from spark_tts_lib.modules.speaker import ecapa_tdnn
    from spark_tts_lib.utils import audio, file

    return bicodec, audio_tokenizer, ecapa_tdnn, audio, file


def _build(official, config_path: Path, ecapa_channels: int | None = ECAPA_CHANNELS):
    """``BiCodec`` assembled as ``BiCodec.load_from_checkpoint`` assembles it, from the
    config file, with the speaker encoder's ECAPA-TDNN at ``ecapa_channels`` (None: as
    ``SpeakerEncoder`` builds it, 512)."""
    bicodec, _, ecapa_tdnn, _, file = official
    from spark_tts_lib.modules.encoder_decoder.feat_decoder import Decoder
    from spark_tts_lib.modules.encoder_decoder.feat_encoder import Encoder
    from spark_tts_lib.modules.encoder_decoder.wave_generator import WaveGenerator
    from spark_tts_lib.modules.speaker.speaker_encoder import SpeakerEncoder
    from spark_tts_lib.modules.vq.factorized_vector_quantize import (
        FactorizedVectorQuantize,
    )

    cfg = file.load_config(str(config_path))["audio_tokenizer"]
    speaker = SpeakerEncoder(**cfg["speaker_encoder"])
    if ecapa_channels is not None:
        speaker.speaker_encoder = ecapa_tdnn.ECAPA_TDNN(
            channels=ecapa_channels, feat_dim=cfg["speaker_encoder"]["input_dim"],
            embed_dim=cfg["speaker_encoder"]["out_dim"], global_context_att=True)
    return bicodec.BiCodec(
        mel_params=cfg["mel_params"], encoder=Encoder(**cfg["encoder"]),
        decoder=WaveGenerator(**cfg["decoder"]), quantizer=FactorizedVectorQuantize(**cfg["quantizer"]),
        speaker_encoder=speaker, prenet=Decoder(**cfg["prenet"]), postnet=Decoder(**cfg["postnet"]))


_LOUD = ("speaker_encoder.speaker_encoder.layer1.", "speaker_encoder.speaker_encoder.conv.",
         "speaker_encoder.perceiver_sampler.proj_context.", "speaker_encoder.quantizer.project_in.")
"""Layers given more gain: the mel spectrogram is small (magnitudes, no log) and random
batch-norm statistics do not rescale it, so without it the perceiver's learned queries,
not the clip, would decide the speaker tokens."""


def _randomise(model: torch.nn.Module, gen: torch.Generator) -> None:
    """Seeded random values for every parameter and batch-norm statistic, scaled so that the
    signal neither vanishes nor saturates through the random network, then rounded to float16
    (the stored precision)."""
    def normal(shape, std):
        return torch.randn(shape, generator=gen) * std

    def uniform(shape, low, high):
        return low + (high - low) * torch.rand(shape, generator=gen)

    with torch.no_grad():
        for name, p in model.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if name.endswith("original0"):  # weight norm's magnitude, one per output channel
                value = uniform(p.shape, 0.6, 1.4)
            elif leaf == "alpha":  # Snake
                value = uniform(p.shape, 0.5, 2.0)
            elif leaf == "gamma":  # ConvNeXt layer scale / RMSNorm gain
                value = uniform(p.shape, 0.3, 1.0) if ".convnext." in name else 1 + normal(p.shape, 0.1)
            elif leaf == "latents":  # small, so the clip (not the queries) sets the tokens
                value = normal(p.shape, 0.5)
            elif leaf == "bias":
                value = normal(p.shape, 0.5)
            elif p.dim() == 1:  # layer / batch norm weights
                value = 1 + normal(p.shape, 0.1)
            elif ".scale." in name and name.endswith("weight"):  # AdaLayerNorm scale from the speaker
                value = normal(p.shape, 1.0 / p.shape[1] ** 0.5)
            else:
                fan_in = p[0].numel() if p.dim() > 1 else 1
                gain = 4.0 if name.startswith(_LOUD) else 1.0
                value = normal(p.shape, gain / fan_in ** 0.5)
            p.copy_(value.half().float())
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(normal(b.shape, 0.1).half().float())
            elif name.endswith("running_var"):
                b.copy_(uniform(b.shape, 0.5, 1.5).half().float())


def _calibrate_output(model: torch.nn.Module, gen: torch.Generator, target_rms: float = 0.3) -> None:
    """Scale the wave generator's last convolution so the waveform sits well inside the final
    tanh (a saturated output would hide differences)."""
    last = model.decoder.model[-2]  # WNConv1d before the tanh
    seen: list[torch.Tensor] = []
    hook = last.register_forward_hook(lambda mod, inputs, output: seen.append(output))
    with torch.no_grad():
        model.eval()
        model.detokenize(torch.randint(0, 8192, (1, 60), generator=gen),
                         torch.randint(0, 4096, (1, 1, 32), generator=gen))
        hook.remove()
        rms = float(seen[0].pow(2).mean().sqrt())
        g = last.parametrizations.weight.original0
        g.copy_((g * target_rms / rms).half().float())
        last.bias.copy_((last.bias * target_rms / rms).half().float())


def _old_weight_norm_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The released checkpoint's names: ``weight_g``/``weight_v`` (``torch.nn.utils.weight_norm``).
    Weights (already float16 values) are stored as float16; the mel transform's buffers
    (its window and filter bank, not random) stay float32."""
    out = {}
    for key, value in state.items():
        key = key.replace(".parametrizations.weight.original0", ".weight_g")
        key = key.replace(".parametrizations.weight.original1", ".weight_v")
        half = value.is_floating_point() and not key.startswith("mel_transformer.")
        out[key] = value.detach().to(torch.float16 if half else value.dtype).contiguous()
    return out


def _clips(rng: np.random.Generator) -> dict[str, tuple[np.ndarray, int, str]]:
    """Name -> (samples [frames] or [frames, channels], rate, soundfile subtype)."""
    def voiced(seconds, rate, f0, level):
        t = np.arange(int(seconds * rate)) / rate
        wobble = 1 + 0.05 * np.sin(2 * np.pi * 4 * t)
        tone = sum(np.sin(2 * np.pi * f0 * k * wobble * t + rng.uniform(0, 6)) / k for k in range(1, 12))
        envelope = 0.55 + 0.45 * np.sin(2 * np.pi * 2.5 * t + rng.uniform(0, 6))
        x = tone * envelope + 0.3 * rng.normal(size=len(t))
        return level * x / np.abs(x).max()

    stereo = np.stack([voiced(2.2, 16000, 210, 0.6), voiced(2.2, 16000, 95, 0.9)], axis=1)
    return {
        "quiet": (voiced(2.5, 16000, 180, 0.04), 16000, "PCM_16"),  # peak below 0.1
        "stereo": (stereo, 16000, "PCM_16"),  # channel 0 differs from the mean
        "rate24k": (voiced(2.0, 24000, 140, 0.5), 24000, "PCM_16"),  # resampled to 16 kHz
        "short": (voiced(1.3, 16000, 230, 0.7), 16000, "PCM_24"),  # tiled to the 6 s segment
    }


def _write_full_size_layout(official) -> None:
    """Every tensor name and shape of a full-size official checkpoint (old weight-norm names),
    built by the official modules from the released dimensions."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "config.yaml"
        cfg.write_text(yaml.safe_dump({"audio_tokenizer": FULL_SIZE}))
        state = _build(official, cfg, ecapa_channels=None).state_dict()
    names = {k.replace(".parametrizations.weight.original0", ".weight_g")
              .replace(".parametrizations.weight.original1", ".weight_v"): list(v.shape)
             for k, v in state.items()}
    layout = {"config": {"audio_tokenizer": FULL_SIZE}, "tensors": names,
              "parameters": sum(int(np.prod(s)) for s in names.values())}
    (OUT / "official_layout.json").write_text(json.dumps(layout, indent=1) + "\n")
    logger.info("full-size layout: %d tensors, %.1f M values", len(names), layout["parameters"] / 1e6)


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    torch.set_num_threads(2)
    official = _import_official()
    _, audio_tokenizer, _, audio, _ = official
    codec_dir = OUT / "BiCodec"
    codec_dir.mkdir(parents=True, exist_ok=True)
    (OUT / "clips").mkdir(exist_ok=True)
    (OUT / "config.yaml").write_text(yaml.safe_dump(ROOT_CONFIG, sort_keys=False))
    (codec_dir / "config.yaml").write_text(
        yaml.safe_dump({"audio_tokenizer": AUDIO_TOKENIZER}, sort_keys=False))

    gen = torch.Generator().manual_seed(SEED)
    built = _build(official, codec_dir / "config.yaml")
    _randomise(built, gen)
    _calibrate_output(built, gen)
    save_file(_old_weight_norm_names(built.state_dict()), str(codec_dir / "model.safetensors"))

    # Everything below runs a fresh model loaded from the saved file, as a user's would be.
    model = _build(official, codec_dir / "config.yaml")
    missing, unexpected = model.load_state_dict(load_file(str(codec_dir / "model.safetensors")),
                                                strict=False)
    if missing or unexpected:
        raise SystemExit(f"the saved checkpoint does not round-trip: {missing[:3]} {unexpected[:3]}")
    model.eval()
    model.remove_weight_norm()

    arrays: dict[str, np.ndarray] = {}
    cases: dict[str, dict] = {"decode": {}, "clips": {}}
    rng = np.random.default_rng(SEED)
    with torch.no_grad():
        for name, n in DECODE_CASES.items():
            semantic = torch.from_numpy(rng.integers(0, 8192, (1, n)))
            globals_ = torch.from_numpy(rng.integers(0, 4096, (1, 1, 32)))
            speaker = model.speaker_encoder.detokenize(globals_)
            wav = model.detokenize(semantic, globals_)
            arrays[f"decode_{name}_semantic"] = semantic[0].numpy()
            arrays[f"decode_{name}_globals"] = globals_[0, 0].numpy()
            arrays[f"decode_{name}_speaker"] = speaker[0].numpy()
            arrays[f"decode_{name}_wav"] = wav[0, 0].numpy()
            cases["decode"][name] = {"tokens": n, "wav_rms": float(wav.pow(2).mean().sqrt()),
                                     "wav_peak": float(wav.abs().max())}
            logger.info("decode %s: %d tokens -> %d samples, rms %.3f, peak %.3f", name, n,
                        wav.shape[-1], cases["decode"][name]["wav_rms"], cases["decode"][name]["wav_peak"])

        # BiCodecTokenizer's own clip path (load_audio, get_ref_clip, model.tokenize); only its
        # wav2vec2 features, which feed the semantic tokens and not the globals, are replaced
        # by noise of the right shape.
        tokenizer = audio_tokenizer.BiCodecTokenizer.__new__(audio_tokenizer.BiCodecTokenizer)
        tokenizer.config = ROOT_CONFIG
        tokenizer.device = torch.device("cpu")
        tokenizer.model = model
        feat_dim = AUDIO_TOKENIZER["encoder"]["input_channels"]
        tokenizer.extract_wav2vec2_features = lambda wav: torch.randn(
            1, len(wav) // 320, feat_dim, generator=gen)
        for name, (samples, rate, subtype) in _clips(rng).items():
            path = OUT / "clips" / f"{name}.wav"
            soundfile.write(str(path), samples, rate, subtype=subtype)
            wav, ref_wav = tokenizer.process_audio(path)
            global_ids, _ = tokenizer.tokenize(path)
            mel = model.mel_transformer(ref_wav).squeeze(1)
            _, frames = model.speaker_encoder.speaker_encoder(mel.transpose(1, 2), True)
            latents = model.speaker_encoder.perceiver_sampler(frames.transpose(1, 2))
            arrays[f"clip_{name}_mel"] = mel[0].numpy()
            arrays[f"clip_{name}_latents"] = latents[0].numpy()
            arrays[f"clip_{name}_globals"] = global_ids.reshape(-1).numpy()
            cases["clips"][name] = {
                "file": f"clips/{name}.wav", "rate": rate, "subtype": subtype,
                "channels": 1 if samples.ndim == 1 else samples.shape[1],
                "prepared_samples": int(len(wav)), "ref_samples": int(ref_wav.shape[-1]),
                "prepared_peak": float(np.abs(wav).max()),
                "prepared_rms": float(np.sqrt(np.mean(np.square(wav)))),
            }
            logger.info("clip %s: %d prepared samples, peak %.3f, globals %s", name, len(wav),
                        cases["clips"][name]["prepared_peak"], global_ids.reshape(-1)[:8].tolist())
        # the official volume rule, on its own, for the quiet clip's check
        quiet = soundfile.read(str(OUT / "clips" / "quiet.wav"))[0]
        arrays["quiet_volume_normalized"] = audio.audio_volume_normalize(quiet).astype(np.float32)

    np.savez_compressed(OUT / "golden.npz", **arrays)
    _write_full_size_layout(official)
    cases["source"] = {"package": "spark-tts-lib==0.2.1", "torch": torch.__version__,
                       "seed": SEED, "ecapa_channels": ECAPA_CHANNELS, "stored_dtype": "float16"}
    (OUT / "cases.json").write_text(json.dumps(cases, indent=2) + "\n")
    total = sum(p.stat().st_size for p in OUT.rglob("*") if p.is_file())
    logger.info("wrote %s (%.2f MB)", OUT, total / 1e6)


if __name__ == "__main__":
    main()
