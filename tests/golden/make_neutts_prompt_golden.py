"""Golden NeuTTS prompts made by Neuphonic's own ``neutts`` 1.4.1, for
``tests/models/test_neutts_prompt.py``.

Not run by CI, nor by the test suite: ``neutts`` is under the NeuTTS Open License (read, never
copied here), so it lives only in a side environment. Run by hand, once, when the golden file
must change (then commit ``tests/golden/neutts/prompt_ids.json``):

    # 1. the tokenizer, in the project's environment (the tiny model's, with the real prompt
    #    tokens and 65,536 <|speech_N|> tokens added in order)
    .venv/bin/python tests/golden/make_neutts_prompt_golden.py tokenizer /tmp/neutts-golden-tok
    # 2. the prompts, in a side environment with neutts 1.4.1 and what its prompt path needs
    python3 -m venv /tmp/e-side/venv
    /tmp/e-side/venv/bin/pip install phonemizer==3.4.0 transformers==5.1.0 numpy
    /tmp/e-side/venv/bin/pip install --no-deps neutts==1.4.1
    /tmp/e-side/venv/bin/python tests/golden/make_neutts_prompt_golden.py golden \
        /tmp/neutts-golden-tok

Step 2 builds a ``neutts.NeuTTS`` without loading a backbone or a codec (no weights exist
here), gives it the tokenizer above and Neuphonic's own phonemizer (``_load_phonemizer``: its
``BasePhonemizer`` over the espeak-ng 1.52 bundled in the neutts wheel), and calls its
``_apply_chat_template(ref_codes, ref_text, text)`` for each case. ``neutts.neutts`` imports
torch, librosa and neucodec at module level for its model and codec paths; the prompt path
uses none of them, so they are empty stand-in modules here (installing them would change
nothing the prompt depends on).

It writes ``tests/golden/neutts/prompt_ids.json``: the versions, a hash of the tokenizer's
vocabulary (the test checks it is the same tokenizer), and per case the inputs, the phonemes
neutts made and the prompt ids.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

OUT = Path(__file__).resolve().parent / "neutts" / "prompt_ids.json"

CASES = [
    {"ref_text": "So I just tried this out, and honestly, it works really well.",
     "text": "Hello from the streaming speech pipeline!",
     "ref_codes": "seeded"},
    {"ref_text": "It was 3:45 pm on May 2nd, 2025 — I paid $12.50.",
     "text": "Dr. Rao said: \"don't worry\"; it's fine... isn't it?",
     "ref_codes": [0, 1, 65535, 32768, 65534, 7]},
    {"ref_text": "  Several   spaces\nand a newline.  ",
     "text": "Quotes ‘curly’ and “double”, an em dash — and 100%.",
     "ref_codes": "seeded"},
]


def vocab_hash(vocab: dict[str, int]) -> str:
    """sha256 of the vocabulary as sorted ``token\\tid`` lines."""
    lines = "\n".join(f"{t}\t{i}" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(lines.encode()).hexdigest()


def seeded_codes(index: int, count: int = 150) -> list[int]:
    import random

    rng = random.Random(1000 + index)
    return [rng.randrange(65536) for _ in range(count)]


def write_tokenizer(folder: str) -> None:
    from livekit.plugins.veena.models.profiles import NEUTTS
    from livekit.plugins.veena.models.tiny_neucodec import write_neutts_tokenizer

    write_neutts_tokenizer(NEUTTS, Path(folder))


def write_golden(folder: str) -> None:
    import importlib.machinery
    import importlib.metadata as md

    import transformers  # before the stand-ins: it finds no torch and stays text-only

    for name in ("torch", "librosa", "neucodec"):  # imported by neutts.neutts, unused here
        stub = types.ModuleType(name)
        stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
        stub.NeuCodec = stub.DistillNeuCodec = stub.Tensor = None  # names in signatures
        sys.modules[name] = stub
    from neutts.neutts import NeuTTS  # noqa: E402  (after the stand-ins)

    tts = NeuTTS.__new__(NeuTTS)
    tts.tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    tts.input_format = "phonemes"
    tts._load_phonemizer("en-us", "neuphonic/neutts-air")
    out = {
        "made_by": "neutts 1.4.1 NeuTTS._apply_chat_template (tests/golden/"
                   "make_neutts_prompt_golden.py)",
        "neutts": md.version("neutts"),
        "phonemizer": md.version("phonemizer"),
        "transformers": transformers.__version__,
        "espeak_ng": ".".join(map(str, tts.phonemizer.espeak_version)),
        "vocab_sha256": vocab_hash(tts.tokenizer.get_vocab()),
        "cases": [],
    }
    for i, case in enumerate(CASES):
        codes = seeded_codes(i) if case["ref_codes"] == "seeded" else case["ref_codes"]
        ids = tts._apply_chat_template(codes, case["ref_text"], case["text"])
        out["cases"].append({"ref_text": case["ref_text"], "text": case["text"],
                             "ref_codes": codes, "ref_phonemes": tts._to_phones(case["ref_text"]),
                             "text_phonemes": tts._to_phones(case["text"]),
                             "ids": [int(t) for t in ids]})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(out['cases'])} cases, espeak-ng {out['espeak_ng']})")


if __name__ == "__main__":
    step, folder = sys.argv[1], sys.argv[2]
    {"tokenizer": write_tokenizer, "golden": write_golden}[step](folder)
