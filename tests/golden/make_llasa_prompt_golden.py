"""Golden Llasa prompts, made by the prompt-building lines of HKUST's own Llasa cloning example,
for ``tests/models/test_llasa_prompt.py``.

The reference is the model card of ``HKUSTAudio/Llasa-1B`` (the same lines in the cards of
Llasa-3B, Llasa-8B and Llasa-1B-Multilingual), "Speech synthesis utilizing a given speech
prompt": ``input_text = prompt_text + target_text`` (nothing between them),
``formatted_text = f"<|TEXT_UNDERSTANDING_START|>{input_text}<|TEXT_UNDERSTANDING_END|>"``,
the chat ``[user: "Convert the text to speech:" + formatted_text, assistant:
"<|SPEECH_GENERATION_START|>" + "".join(f"<|s_{c}|>" for c in codes)]`` and
``tokenizer.apply_chat_template(chat, tokenize=True, return_tensors='pt',
continue_final_message=True)``; without a reference (its first example) the assistant turn is
``"<|SPEECH_GENERATION_START|>"`` alone. HKUST publishes no package, so ``reference_prompt``
below restates those few lines as the card writes them, and nothing else.

The tokenizer. Llasa's ``tokenizer_config.json`` (11.7 MB, on the hub behind a licence gate)
could not be read here. What it carries follows from HKUST's training code
(``zhenye234/LLaSA_training``, ``train_tts.py``): ``AutoTokenizer.from_pretrained(
"meta-llama/Llama-3.2-1B-Instruct")``, ``add_tokens`` of eight control tokens
(``<|TEXT_GENERATION_START|>`` ... ``<|SPEECH_UNDERSTANDING_END|>``) and then the 65,536
``<|s_N|>`` tokens (plain added tokens, not special ones), ``save_pretrained``: the chat
template is Llama-3.2-Instruct's, which opens every chat with a system header that carries
"Cutting Knowledge Date: December 2023" and "Today Date: " + the day it runs
(``strftime_now("%d %b %Y")``). Two third-party Llasa ports show that header in the prompts
they decoded from the real tokenizer. ``tests/golden/llasa/chat_template.jinja`` is
Llama-3.2-Instruct's template as published (``meta-llama/Llama-3.2-1B-Instruct``
``tokenizer_config.json``, copied from a verbatim public copy of that file's
``chat_template`` value). The tiny tokenizer is the project's tiny Llasa tokenizer
(``make-tiny-model --profile llasa``: Llama-3's special tokens, Llasa's eight control tokens
and its 65,536 ``<|s_N|>`` tokens added in that order as plain tokens) with that template
set, so every token the prompt names is a real one; only the byte-level text vocabulary is
tiny.

The day. The reference's prompt holds the day it runs, so the golden is made on a fixed day
(``DAY``): the clock that ``transformers`` reads for ``strftime_now`` is frozen, and the
reference lines run unchanged. The test freezes the same clock.

Not run by CI, nor by the test suite. Run by hand, once, when the golden file must change
(then commit ``tests/golden/llasa/prompt_ids.json``):

    # 1. the tokenizer, in the project's environment
    .venv/bin/python tests/golden/make_llasa_prompt_golden.py tokenizer /tmp/llasa-golden-tok
    # 2. the prompts, in a side environment with the transformers of the card's time
    python3 -m venv /tmp/side-llasa
    /tmp/side-llasa/bin/pip install torch==2.13.0    # the CPU build, from local disk
    /tmp/side-llasa/bin/pip install transformers==4.48.3 jinja2 numpy
    /tmp/side-llasa/bin/python tests/golden/make_llasa_prompt_golden.py golden \
        /tmp/llasa-golden-tok

It writes ``tests/golden/llasa/prompt_ids.json``: the versions, the day, hashes of the
tokenizer's vocabulary and of its chat template (the test checks it has the same tokenizer),
the text the template rendered for the first case, and per case the inputs and the ids.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent / "llasa"
OUT = HERE / "prompt_ids.json"
TEMPLATE = HERE / "chat_template.jinja"
DAY = (2026, 12, 7)
"""The day the golden's prompts are rendered on (the template writes it as "07 Dec 2026")."""

CASES = [
    {"prompt_text": "A chance to leave him alone, but... No. She just wanted to see him again.",
     "target_text": "Dealing with family secrets is never easy.",
     "codes": "seeded"},
    {"prompt_text": "对，这就是我万人敬仰的太乙真人，虽然有点婴儿肥，但也掩不住我逼人的帅气。",
     "target_text": "突然，身边一阵笑声。我看着他们，意气风发地挺直了胸膛。",
     "codes": "edges"},
    {"prompt_text": "It was 3:45 pm on May 2nd, 2025 - I paid $12.50.",
     "target_text": "Dr. Rao said: \"don't worry\"; it's fine... isn't it?",
     "codes": "seeded"},
    {"prompt_text": None,  # the card's first example: no reference at all
     "target_text": "Hello from the streaming speech pipeline!",
     "codes": None},
]


def vocab_hash(vocab: dict[str, int]) -> str:
    """sha256 of the vocabulary as sorted ``token\\tid`` lines."""
    lines = "\n".join(f"{t}\t{i}" for t, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(lines.encode()).hexdigest()


def case_codes(index: int, kind: str | None) -> list[int]:
    import random

    if kind is None:
        return []
    rng = random.Random(2000 + index)
    codes = [rng.randrange(65536) for _ in range(120)]
    if kind == "edges":
        codes = [0, 1, 65535, 32768, 65534, 7, *codes[:60]]
    return codes


def frozen_clock(module) -> None:
    """Makes ``module.datetime.now()`` return ``DAY`` (``transformers``' chat-template module
    reads the day for ``strftime_now`` through its own ``datetime`` name)."""

    class _Day(_dt.datetime):
        @classmethod
        def now(cls, tz=None):
            return cls(*DAY, 12, 0, 0)

    module.datetime = _Day


def write_tokenizer(folder: str) -> None:
    from transformers import AutoTokenizer

    from livekit.plugins.veena.models.profiles import LLASA
    from livekit.plugins.veena.models.tiny_neucodec import write_neutts_tokenizer

    write_neutts_tokenizer(LLASA, Path(folder))
    tok = AutoTokenizer.from_pretrained(folder)
    tok.chat_template = TEMPLATE.read_text()
    tok.save_pretrained(folder)
    # readable by the transformers of the card's time too: the fast tokenizer's class and
    # the template inside tokenizer_config.json, as Llasa's own files have them
    config_file = Path(folder) / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    config.update(tokenizer_class="PreTrainedTokenizerFast", chat_template=tok.chat_template)
    config_file.write_text(json.dumps(config, indent=1, ensure_ascii=False) + "\n")


def reference_prompt(tokenizer, prompt_text: str | None, target_text: str,
                     codes: list[int]) -> list[int]:
    """The model card's prompt-building lines, as it writes them."""
    if prompt_text is None:  # "Speech synthesis solely from input text"
        input_text = target_text
        formatted_text = f"<|TEXT_UNDERSTANDING_START|>{input_text}<|TEXT_UNDERSTANDING_END|>"
        chat = [
            {"role": "user", "content": "Convert the text to speech:" + formatted_text},
            {"role": "assistant", "content": "<|SPEECH_GENERATION_START|>"}
        ]
    else:  # "Speech synthesis utilizing a given speech prompt"
        input_text = prompt_text + target_text
        speech_ids_prefix = [f"<|s_{speech_id}|>" for speech_id in codes]
        formatted_text = f"<|TEXT_UNDERSTANDING_START|>{input_text}<|TEXT_UNDERSTANDING_END|>"
        chat = [
            {"role": "user", "content": "Convert the text to speech:" + formatted_text},
            {"role": "assistant", "content": "<|SPEECH_GENERATION_START|>"
             + ''.join(speech_ids_prefix)}
        ]
    input_ids = tokenizer.apply_chat_template(
        chat,
        tokenize=True,
        return_tensors='pt',
        continue_final_message=True
    )
    return [int(t) for t in input_ids[0]]


def write_golden(folder: str) -> None:
    import importlib.metadata as md

    import torch
    import transformers
    from transformers.utils import chat_template_utils

    frozen_clock(chat_template_utils)
    tok = transformers.AutoTokenizer.from_pretrained(folder)
    assert tok.chat_template == TEMPLATE.read_text(), "the tokenizer lacks Llama-3.2's template"
    out = {
        "made_by": "HKUSTAudio/Llasa-1B model card's prompt lines (tests/golden/"
                   "make_llasa_prompt_golden.py)",
        "transformers": transformers.__version__,
        "tokenizers": md.version("tokenizers"),
        "torch": torch.__version__,
        "day": list(DAY),
        "vocab_sha256": vocab_hash(tok.get_vocab()),
        "chat_template_sha256": hashlib.sha256(tok.chat_template.encode()).hexdigest(),
        "cases": [],
    }
    for i, case in enumerate(CASES):
        codes = case_codes(i, case["codes"])
        ids = reference_prompt(tok, case["prompt_text"], case["target_text"], codes)
        out["cases"].append({"prompt_text": case["prompt_text"],
                             "target_text": case["target_text"], "codes": codes, "ids": ids})
    first = out["cases"][0]
    out["rendered_head_case0"] = tok.decode(first["ids"][:len(first["ids"]) - len(first["codes"])])
    OUT.write_text(json.dumps(out, ensure_ascii=False) + "\n")
    print(f"wrote {OUT} ({len(out['cases'])} cases)\n{out['rendered_head_case0']}")


if __name__ == "__main__":
    step, folder = sys.argv[1], sys.argv[2]
    {"tokenizer": write_tokenizer, "golden": write_golden}[step](folder)
