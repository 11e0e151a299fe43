"""Golden outputs of Neuphonic's own ``neucodec`` 0.0.6, for ``tests/codecs/test_neucodec_golden.py``.

Not run by CI, nor by the test suite: the official package pins torchao, torchtune and
vector-quantize-pytorch versions that do not install beside the project's torch. Run it by
hand, once, when the golden files must change (then commit ``tests/golden/neucodec/``):

    python3 -m venv /tmp/side-env-neucodec
    /tmp/side-env-neucodec/bin/pip install torch==2.13.0        # the CPU build, from local disk
    /tmp/side-env-neucodec/bin/pip install numpy einops einx transformers==5.19.0 safetensors \
        soundfile                                                  # .venv's transformers
    /tmp/side-env-neucodec/bin/pip install --no-deps neucodec==0.0.6 \
        vector-quantize-pytorch==1.17.8 torchtune==0.6.1 local_attention hyper-connections \
        xcodec2==0.1.5
    /tmp/side-env-neucodec/bin/python tests/golden/make_neucodec_golden.py

Only ``torchtune.modules`` (its rotary embedding) is imported from torchtune, and nothing from
torchao; ``neucodec.model`` imports torchaudio at module level, and PyPI's torchaudio does not
load beside the CPU torch, so a stub module stands in for it (nothing on these paths calls it).
``NeuCodec.__init__`` downloads w2v-bert-2.0 from the model hub, so the ``NeuCodec`` object is
made without it (``nn.Module.__init__``) and given the official submodules at a reduced size;
``NeuCodec.decode_code`` itself is the official method, unchanged.

What it writes into ``tests/golden/neucodec/`` (well under 1 MB):
- ``pytorch_model.bin``: the published layout (``generator.*``, ``fc_post_a.*``, plus encoder
  tensors that a decoder ignores) of the official classes at a reduced size
  (``CodecDecoderVocos(hidden_dim=64, depth=2, heads=4, pos_meb_dim=16, vq_dim=32)``: head
  dim 16, so the rotary embedding has the size the published 1024/16 heads give it), seeded
  random weights with every norm's scale and bias perturbed, rounded to float16 and stored as
  float16 (the official code computes in float32 on exactly those values);
- ``veena_codec.json``: those sizes, for the project's loader;
- ``../xcodec2/``: the same for XCodec2 (``xcodec2`` 0.1.5's ``XCodec2Model.decode_code``, 16 kHz,
  hop 320), its checkpoint as ``model.safetensors``;
- ``golden.npz`` + ``cases.json``: codes and the official ``decode_code`` audio for each case,
  and the rotary-embedding check: the same decode with the rotary embedding replaced by the
  identity, and its relative RMS difference from the official output (and, for contrast, the
  difference where the embedding is given time as its position axis).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import logging
import sys
import types
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import nn

logger = logging.getLogger("make_neucodec_golden")

OUT = Path(__file__).resolve().parent / "neucodec"
SEED = 20251207
SIZES = {"hidden_dim": 64, "depth": 2, "heads": 4, "vq_dim": 32, "hop_length": 480,
         "sample_rate": 24000, "levels": [4] * 8}
W2V_SIZES = {"hidden_size": 32, "num_hidden_layers": 18, "num_attention_heads": 2,
             "intermediate_size": 64, "output_hidden_size": 32}
"""w2v-bert-2.0's own config at a reduced size (18 layers: the reference reads layer 16)."""
W2V_FEATURES = {"feature_size": 80, "num_mel_bins": 80, "padding_side": "right",
                "padding_value": 1, "return_attention_mask": True, "sampling_rate": 16000,
                "stride": 2}
"""w2v-bert-2.0's published preprocessor_config.json."""
CLIPS = {  # name: seconds; seeded noise under a few tones at 16 kHz
    "clip_2s": 2.03,
    "clip_whole_hops": 3.2,  # a multiple of 320 samples: the reference pads a whole hop
    "clip_1s": 1.0,
}
CASES = {  # name: codes [B, 1, F]
    "batch2_37": lambda g: torch.randint(0, 65536, (2, 1, 37), generator=g),
    "one_5": lambda g: torch.randint(0, 65536, (1, 1, 5), generator=g),
    "edges_12": lambda g: torch.tensor([[[0, 65535, 1, 4, 16, 64, 256, 1024, 4096, 16384,
                                          21845, 43690]]]),
    "long_150": lambda g: torch.randint(0, 65536, (1, 1, 150), generator=g),
}


def _stub_torchaudio() -> None:
    """``neucodec.model`` imports torchaudio (for file loading and resampling only)."""
    audio = types.ModuleType("torchaudio")
    audio.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    audio.transforms = types.ModuleType("torchaudio.transforms")
    audio.load = None
    sys.modules["torchaudio"] = audio
    sys.modules["torchaudio.transforms"] = audio.transforms


def _torchtune_rope_alone() -> None:
    """``torchtune``'s package import needs torchao (no build matches torch 2.13); the
    decoder needs only ``torchtune.modules.RotaryPositionalEmbeddings``, whose file imports
    nothing of torchtune: load that file alone as ``torchtune.modules``."""
    spec = importlib.util.find_spec("torchtune")
    path = Path(spec.submodule_search_locations[0]) / "modules" / "position_embeddings.py"
    rope_spec = importlib.util.spec_from_file_location("torchtune.modules", path)
    rope = importlib.util.module_from_spec(rope_spec)
    rope_spec.loader.exec_module(rope)
    package = types.ModuleType("torchtune")
    package.modules = rope
    sys.modules["torchtune"] = package
    sys.modules["torchtune.modules"] = rope


def _official_model(encoder: bool = False) -> nn.Module:
    from neucodec.codec_decoder_vocos import CodecDecoderVocos
    from neucodec.model import NeuCodec

    model = NeuCodec.__new__(NeuCodec)
    nn.Module.__init__(model)
    model.sample_rate, model.hop_length = SIZES["sample_rate"], SIZES["hop_length"]
    model.generator = CodecDecoderVocos(hidden_dim=SIZES["hidden_dim"], depth=SIZES["depth"],
                                        heads=SIZES["heads"], pos_meb_dim=16,
                                        hop_length=SIZES["hop_length"], vq_dim=SIZES["vq_dim"])
    model.fc_post_a = nn.Linear(SIZES["vq_dim"], SIZES["hidden_dim"])
    half = SIZES["vq_dim"] // 2  # semantic and acoustic halves of fc_prior's input
    model.fc_prior = nn.Linear(SIZES["vq_dim"], SIZES["vq_dim"])
    if encoder:
        from neucodec.codec_encoder import CodecEncoder
        from neucodec.module import SemanticEncoder
        from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel

        model.semantic_model = Wav2Vec2BertModel(Wav2Vec2BertConfig(**W2V_SIZES),
                                                 ).eval()
        model.semantic_model.config.output_hidden_states = True
        model.feature_extractor = SeamlessM4TFeatureExtractor(**W2V_FEATURES)
        model.SemanticEncoder_module = SemanticEncoder(W2V_SIZES["hidden_size"], half, half)
        model.CodecEnc = CodecEncoder(ngf=2, hidden_dim=half)
    return model


def _perturb(model: nn.Module, g: torch.Generator) -> None:
    """Seeded noise on every parameter (norm scales and biases too, so a swapped weight or
    a missed bias shows), then rounded to float16 values."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            scale = 0.1 if p.ndim == 1 else 0.3 * float(p.std()) + 1e-3
            p.add_(torch.randn(p.shape, generator=g) * scale)
            p.copy_(p.half().float())


class _RopeOverTime(nn.Module):
    """The rotary embedding given ``[b, t, h, d]`` as torchtune expects (what the reference
    does not do): shows that the layout question matters to the check."""

    def __init__(self, rope: nn.Module) -> None:
        super().__init__()
        self.rope = rope

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rope(x.transpose(1, 2)).transpose(1, 2)


def _encode_clips(model: nn.Module, g: torch.Generator, arrays: dict) -> dict:
    """Each clip's codes through the official ``encode_code`` (a [1, 1, T] tensor at 16 kHz),
    and the quantizer's input (captured at ``project_in``) to compare before rounding."""
    captured = []
    hook = model.generator.quantizer.project_in.register_forward_hook(
        lambda _m, _i, out: captured.append(out.detach().clone()))
    clips = {}
    for name, seconds in CLIPS.items():
        n = int(round(seconds * 16000))
        t = torch.arange(n) / 16000
        wav = 0.05 * torch.randn(n, generator=g)
        for hz in (140.0, 280.0, 1100.0):
            wav += 0.2 * torch.sin(2 * torch.pi * hz * t + float(torch.rand(1, generator=g)) * 6)
        captured.clear()
        codes = model.encode_code(wav[None, None].float())  # [1, 1, F]
        arrays[f"{name}_wav"] = wav.numpy().astype(np.float32)
        arrays[f"{name}_codes"] = codes[0, 0].numpy().astype(np.int64)
        arrays[f"{name}_project_in"] = captured[-1][0].numpy().astype(np.float32)
        clips[name] = {"samples": n, "frames": int(codes.shape[-1])}
        logger.info("%s: %s codes %s", name, clips[name], codes[0, 0, :8].tolist())
    hook.remove()
    return clips


def _xcodec2(g: torch.Generator) -> None:
    """XCodec2 (Llasa's codec, ``xcodec2`` 0.1.5): the same decoder at 16 kHz, hop 320, its
    ``XCodec2Model.decode_code`` on the same reduced sizes, the checkpoint as safetensors
    (its published format) in ``tests/golden/xcodec2/``."""
    from safetensors.torch import save_file
    from xcodec2.modeling_xcodec2 import XCodec2Model
    from xcodec2.vq.codec_decoder_vocos import CodecDecoderVocos

    sizes = {**SIZES, "hop_length": 320, "sample_rate": 16000}
    model = XCodec2Model.__new__(XCodec2Model)
    nn.Module.__init__(model)
    model.generator = CodecDecoderVocos(hidden_dim=sizes["hidden_dim"], depth=sizes["depth"],
                                        heads=sizes["heads"], pos_meb_dim=16,
                                        hop_length=sizes["hop_length"], vq_dim=sizes["vq_dim"])
    model.fc_post_a = nn.Linear(sizes["vq_dim"], sizes["hidden_dim"])
    model.eval()
    _perturb(model, g)
    out = OUT.parent / "xcodec2"
    out.mkdir(parents=True, exist_ok=True)
    params = dict(model.named_parameters())
    save_file({k: (v.half() if k in params else v).contiguous()
               for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
    (out / "veena_codec.json").write_text(json.dumps(sizes, indent=1) + "\n")
    codes = torch.randint(0, 65536, (2, 1, 40), generator=g)
    with torch.inference_mode():
        audio = model.decode_code(codes)  # the official method, [B, 1, T]
    np.savez_compressed(out / "golden.npz", codes=codes[:, 0].numpy().astype(np.int64),
                        audio=audio[:, 0].numpy().astype(np.float32))
    (out / "cases.json").write_text(json.dumps(
        {"xcodec2": "0.1.5", "torch": torch.__version__, "seed": SEED, "sizes": sizes,
         "audio_shape": list(audio.shape), "audio_rms": _rms(audio)}, indent=1) + "\n")
    logger.info("xcodec2: %s", list(audio.shape))


def _rms(a: torch.Tensor) -> float:
    return float(a.double().pow(2).mean().sqrt())


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    _stub_torchaudio()
    _torchtune_rope_alone()
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    model = _official_model(encoder=True).eval()
    _perturb(model, g)
    OUT.mkdir(parents=True, exist_ok=True)
    model.semantic_model.save_pretrained(OUT / "w2v-bert-2.0")
    model.feature_extractor.save_pretrained(OUT / "w2v-bert-2.0")
    params = dict(model.named_parameters())  # buffers (iSTFT window, filters) stay float32
    state = {k: v.half() if k in params else v for k, v in model.state_dict().items()
             if not k.startswith("semantic_model.")}
    torch.save(state, OUT / "pytorch_model.bin")
    (OUT / "veena_codec.json").write_text(json.dumps(SIZES, indent=1) + "\n")

    rope_free = _official_model().eval()
    rope_free.load_state_dict(model.state_dict(), strict=False)
    for block in rope_free.generator.backbone.transformers:
        block.att.rotary_embed = nn.Identity()

    by_time = _official_model().eval()  # the layout torchtune documents: positions = time
    by_time.load_state_dict(model.state_dict(), strict=False)
    for block in by_time.generator.backbone.transformers:
        block.att.rotary_embed = _RopeOverTime(block.att.rotary_embed)

    arrays, cases = {}, {}
    with torch.inference_mode():
        for name, make in CASES.items():
            codes = make(g)
            audio = model.decode_code(codes)  # the official method, [B, 1, T]
            no_rope = rope_free.decode_code(codes)
            over_time = by_time.decode_code(codes)
            arrays[f"{name}_codes"] = codes[:, 0].numpy().astype(np.int64)
            arrays[f"{name}_audio"] = audio[:, 0].numpy().astype(np.float32)
            cases[name] = {"codes_shape": list(codes.shape), "audio_shape": list(audio.shape),
                           "audio_rms": _rms(audio),
                           "rope_identity_rel_rms": _rms(no_rope - audio) / _rms(audio),
                           "rope_over_time_rel_rms": _rms(over_time - audio) / _rms(audio)}
            logger.info("%s: %s", name, cases[name])
        clips = _encode_clips(model, g, arrays)
    np.savez_compressed(OUT / "golden.npz", **arrays)
    _xcodec2(g)  # after everything above, so their golden files stay as they were
    (OUT / "cases.json").write_text(json.dumps(
        {"neucodec": "0.0.6", "vector_quantize_pytorch": "1.17.8", "torchtune": "0.6.1",
         "torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED,
         "sizes": SIZES, "w2v_sizes": W2V_SIZES, "cases": cases, "clips": clips},
        indent=1) + "\n")


if __name__ == "__main__":
    main()
