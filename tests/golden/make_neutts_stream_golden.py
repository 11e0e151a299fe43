"""Golden output of Neuphonic's own streaming decode (``neutts`` 1.4.1,
``NeuTTS._infer_stream_ggml``), for ``tests/test_neucodec_stream_bench.py``: the benchmark's
rewrite of that scheme (``bench/neucodec_stream.NeuphonicStream``) must yield the same chunks.

Not run by CI, nor by the test suite; run it by hand in the side environment of
``make_neucodec_golden.py`` (its header says how it was built), plus ``neutts`` itself:

    /tmp/side-env-neucodec/bin/pip install --no-deps neutts==1.4.1
    /tmp/side-env-neucodec/bin/python tests/golden/make_neutts_stream_golden.py

``neutts`` is read and run, never copied (its code is under the NeuTTS Open License).
``_infer_stream_ggml`` runs unchanged on a ``NeuTTS`` object made without ``__init__`` (which
loads a GGUF model through llama.cpp): the object gets ``__init__``'s streaming constants,
no watermarker, a backbone that streams the given codes as ``<|speech_N|>`` texts (one per
step, as llama.cpp does) and, as its codec, the official ``NeuCodec`` at the reduced size of
``tests/golden/neucodec`` (its ``pytorch_model.bin``), so ``NeuTTS._decode`` is theirs too.
``librosa`` and ``phonemizer`` are imported by ``neutts`` at module level and not used on this
path: stubs stand in for them.

Writes ``tests/golden/neutts_stream/golden.npz``: reference and generated codes (three
lengths: a stream shorter than one chunk, one ending on a chunk, one with a short last
chunk), and every chunk the official generator yielded, concatenated, with their lengths.
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_neucodec_golden as neucodec_golden  # noqa: E402

logger = logging.getLogger("make_neutts_stream_golden")

OUT = Path(__file__).resolve().parent / "neutts_stream"
SEED = 20251208
STREAMS = {"short_12": (60, 12), "chunks_80": (60, 80), "tail_103": (40, 103)}
"""name: (reference codes, generated codes)."""


def _stub(name: str, **attrs) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


class _Backbone:
    """llama.cpp's streaming completion, as ``_infer_stream_ggml`` reads it."""

    def __init__(self, codes: list[int]) -> None:
        self.codes = codes

    def reset(self) -> None:
        pass

    def __call__(self, prompt, **_):
        for c in self.codes:
            yield {"choices": [{"text": f"<|speech_{c}|>"}]}


def _neutts(codec) -> object:
    from neutts.neutts import NeuTTS

    tts = NeuTTS.__new__(NeuTTS)
    tts.sample_rate, tts.max_context, tts.hop_length = 24_000, 2048, 480
    tts.streaming_overlap_frames, tts.streaming_frames_per_chunk = 1, 25
    tts.streaming_lookforward, tts.streaming_lookback = 5, 50
    tts.streaming_stride_samples = 25 * 480
    tts._is_quantized_model, tts._is_onnx_codec, tts._seed = True, False, 0
    tts.watermarker = None
    tts.codec = codec
    tts._ggml_prompt = lambda *a, **k: ""
    return tts


def main() -> None:
    logging.basicConfig(level=logging.INFO)
    neucodec_golden._stub_torchaudio()
    neucodec_golden._torchtune_rope_alone()
    _stub("librosa")
    _stub("phonemizer")
    _stub("phonemizer.backend", EspeakBackend=None)
    _stub("phonemizer.backend.espeak")
    _stub("phonemizer.backend.espeak.wrapper", EspeakWrapper=None)
    codec = neucodec_golden._official_model().eval()
    state = torch.load(neucodec_golden.OUT / "pytorch_model.bin", weights_only=True)
    codec.load_state_dict(state, strict=False)
    g = torch.Generator().manual_seed(SEED)
    arrays, notes = {}, {}
    for name, (ref, n) in STREAMS.items():
        codes = torch.randint(0, 65536, (ref + n,), generator=g).tolist()
        tts = _neutts(codec)
        tts.backbone = _Backbone(codes[ref:])
        with torch.inference_mode():
            chunks = list(tts._infer_stream_ggml(codes[:ref], "", ""))
        arrays[f"{name}_codes"] = np.asarray(codes, np.int64)
        arrays[f"{name}_chunks"] = np.concatenate(chunks).astype(np.float32)
        arrays[f"{name}_lengths"] = np.asarray([len(c) for c in chunks], np.int64)
        notes[name] = {"reference": ref, "generated": n, "chunks": len(chunks)}
        logger.info("%s: %s", name, arrays[f"{name}_lengths"].tolist())
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "golden.npz", **arrays)
    (OUT / "cases.json").write_text(json.dumps(
        {"neutts": "1.4.1", "neucodec": "0.0.6", "seed": SEED, "decoder": "tests/golden/neucodec",
         "streams": notes}, indent=1) + "\n")


if __name__ == "__main__":
    main()
