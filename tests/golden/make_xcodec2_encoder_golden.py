"""Golden codes of HKUST's own ``xcodec2`` 0.1.5 encoder (``XCodec2Model.encode_code``, what a
Llasa voice clone runs), for ``tests/codecs/test_xcodec2_encoder_golden.py``.

Not run by CI, nor by the test suite: ``xcodec2`` pins torch 2.5, torchaudio, torchao and
torchtune versions that do not install beside the project's torch. Run it by hand, once, when
the golden files must change (then commit ``tests/golden/xcodec2_encoder/``):

    python3 -m venv /tmp/side-xcodec2
    /tmp/side-xcodec2/bin/pip install torch==2.13.0  # the CPU build, from local disk
    /tmp/side-xcodec2/bin/pip install numpy einops einx transformers==5.19.0 safetensors \
        soundfile                                                  # .venv's transformers
    /tmp/side-xcodec2/bin/pip install --no-deps xcodec2==0.1.5 vector-quantize-pytorch==1.17.8 \
        torchtune==0.6.1
    /tmp/side-xcodec2/bin/python tests/golden/make_xcodec2_encoder_golden.py

As in ``make_neucodec_golden.py`` (whose helpers it uses): torchaudio is a stub module (nothing
on the encode path calls it) and torchtune's rotary embedding is loaded alone (its package
import needs torchao). ``XCodec2Model.__init__`` downloads w2v-bert-2.0 from the model hub, so
the object is made without it (``nn.Module.__init__``) and given the official submodules at a
reduced size: a w2v-bert-2.0 of 18 layers of 32 (the model reads hidden state 16) with its
published feature extractor, ``SemanticEncoder(32, 16, 16)``, ``CodecEncoder_Transformer(ngf=2,
hidden_dim=16)``, ``fc_prior`` 32 -> 32 and the ``CodecDecoderVocos`` whose ``ResidualFSQ``
quantizes (vq_dim 32, levels 4 x 8). ``XCodec2Model.encode_code`` itself is the official
method, unchanged, given each clip as the model card gives it: a [1, T] float tensor at 16 kHz.

What it writes into ``tests/golden/xcodec2_encoder/`` (about 2 MB):
- ``model.safetensors``: every tensor of that model under its own names (the w2v-bert-2.0
  ones as ``semantic_model.*``; weight norm as torch's parametrizations,
  ``*.parametrizations.weight.original0/1``, as ``xcodec2``'s ``WNConv1d`` makes it), seeded
  random weights with every norm's scale and bias perturbed (the quantizer's ``project_in``
  scaled by 8, so that the codes spread over the codebook), stored as float16 (the official
  code computes in float32 on exactly those values); ``veena_codec.json``: the decoder sizes;
- ``w2v-bert-2.0/``: that w2v-bert-2.0's config and feature extractor, without weights (the
  checkpoint has them, as the published XCodec2 checkpoint, 0.8 B parameters, has
  w2v-bert-2.0's 0.6 B);
- ``golden.npz`` + ``cases.json``: per clip its samples, the official codes and the
  quantizer's input (captured at ``project_in``) to compare before rounding.
"""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import torch
import transformers
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.golden.make_neucodec_golden import (  # noqa: E402
    W2V_FEATURES, W2V_SIZES, _perturb, _rms, _stub_torchaudio, _torchtune_rope_alone)

logger = logging.getLogger("make_xcodec2_encoder_golden")

OUT = Path(__file__).resolve().parent / "xcodec2_encoder"
SEED = 20261207
SIZES = {"hidden_dim": 64, "depth": 2, "heads": 4, "vq_dim": 32, "hop_length": 320,
         "sample_rate": 16000, "levels": [4] * 8}
CLIPS = {  # name: seconds; seeded noise under a few tones at 16 kHz
    "clip_2s": 2.03,
    "clip_whole_hops": 3.2,  # a multiple of 320 samples: the reference pads a whole hop
    "clip_1s": 1.0,
    "clip_loud_5s": 5.17,
}


def _official_model() -> nn.Module:
    from transformers import SeamlessM4TFeatureExtractor, Wav2Vec2BertConfig, Wav2Vec2BertModel
    from xcodec2.modeling_xcodec2 import XCodec2Model
    from xcodec2.vq.codec_decoder_vocos import CodecDecoderVocos
    from xcodec2.vq.codec_encoder import CodecEncoder_Transformer
    from xcodec2.vq.module import SemanticEncoder

    half = SIZES["vq_dim"] // 2
    model = XCodec2Model.__new__(XCodec2Model)
    nn.Module.__init__(model)
    # as XCodec2Model.__init__ does it, at a reduced size and without the hub
    model.semantic_model = Wav2Vec2BertModel(
        Wav2Vec2BertConfig(**W2V_SIZES, output_hidden_states=True)).eval()
    model.SemanticEncoder_module = SemanticEncoder(W2V_SIZES["hidden_size"], half, half)
    model.CodecEnc = CodecEncoder_Transformer(ngf=2, hidden_dim=half)
    model.generator = CodecDecoderVocos(hidden_dim=SIZES["hidden_dim"], depth=SIZES["depth"],
                                        heads=SIZES["heads"], pos_meb_dim=16,
                                        hop_length=SIZES["hop_length"], vq_dim=SIZES["vq_dim"])
    model.fc_prior = nn.Linear(SIZES["vq_dim"], SIZES["vq_dim"])
    model.fc_post_a = nn.Linear(SIZES["vq_dim"], SIZES["hidden_dim"])
    model.feature_extractor = SeamlessM4TFeatureExtractor(**W2V_FEATURES)
    return model.eval()


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    _stub_torchaudio()
    _torchtune_rope_alone()
    torch.manual_seed(SEED)
    g = torch.Generator().manual_seed(SEED)
    model = _official_model()
    _perturb(model, g)
    with torch.no_grad():  # spread the quantizer's input over its levels (x8 keeps float16)
        model.generator.quantizer.project_in.weight.mul_(8.0)
        model.generator.quantizer.project_in.bias.mul_(8.0)
    OUT.mkdir(parents=True, exist_ok=True)
    # its config and feature extractor only: its weights are in the checkpoint, as XCodec2's
    model.semantic_model.config.save_pretrained(OUT / "w2v-bert-2.0")
    model.feature_extractor.save_pretrained(OUT / "w2v-bert-2.0")
    from safetensors.torch import save_file

    params = dict(model.named_parameters())  # buffers (filters, windows) stay float32
    save_file({k: (v.half() if k in params else v).contiguous()
               for k, v in model.state_dict().items()}, str(OUT / "model.safetensors"))
    (OUT / "veena_codec.json").write_text(json.dumps(SIZES, indent=1) + "\n")

    captured = []
    hook = model.generator.quantizer.project_in.register_forward_hook(
        lambda _m, _i, out: captured.append(out.detach().clone()))
    arrays, clips = {}, {}
    for name, seconds in CLIPS.items():
        n = int(round(seconds * 16000))
        t = torch.arange(n) / 16000
        wav = 0.05 * torch.randn(n, generator=g)
        for hz in (140.0, 280.0, 1100.0):
            wav += 0.2 * torch.sin(2 * torch.pi * hz * t + float(torch.rand(1, generator=g)) * 6)
        if "loud" in name:
            wav = wav * 3.0
        captured.clear()
        codes = model.encode_code(wav[None].float())  # the official method, [1, 1, F]
        arrays[f"{name}_wav"] = wav.numpy().astype(np.float32)
        arrays[f"{name}_codes"] = codes[0, 0].numpy().astype(np.int64)
        arrays[f"{name}_project_in"] = captured[-1][0].numpy().astype(np.float32)
        clips[name] = {"samples": n, "frames": int(codes.shape[-1]),
                       "project_in_rms": _rms(captured[-1])}
        logger.info("%s: %s codes %s", name, clips[name], codes[0, 0, :8].tolist())
    hook.remove()
    np.savez_compressed(OUT / "golden.npz", **arrays)
    (OUT / "cases.json").write_text(json.dumps(
        {"xcodec2": "0.1.5", "vector_quantize_pytorch": "1.17.8", "torch": torch.__version__,
         "transformers": transformers.__version__, "seed": SEED, "sizes": SIZES,
         "w2v_sizes": W2V_SIZES, "clips": clips}, indent=1) + "\n")


if __name__ == "__main__":
    main()
