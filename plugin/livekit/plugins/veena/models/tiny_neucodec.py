"""A tiny random NeuTTS-layout model (``make-tiny-model --profile neutts``): a 2-layer Qwen2
whose tokenizer has the profile's real prompt and stop tokens and its 65,536 speech tokens
added in code order (one contiguous id range, as the family checks at load), beside a tiny
random NeuCodec checkpoint in the published layout.

The output head is tilted towards the speech tokens, so a generation is codec steps (random
codes: noise, which is what random weights sound like) rather than text.
"""

from __future__ import annotations

from pathlib import Path

from .profiles.neucodec import NeuCodecProfile
from .tiny_model import build_tokenizer, save_tokenizer

QWEN2_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Qwen2's own special tokens (``<|endoftext|>`` is its EOS and padding)."""

NEUTTS_CONTROL = ("<|TEXT_REPLACE|>", "<|SPEECH_REPLACE|>", "<|TEXT_PROMPT_START|>",
                  "<|TEXT_PROMPT_END|>", "<|SPEECH_GENERATION_START|>",
                  "<|SPEECH_GENERATION_END|>", "<|TEXT_UNDERSTANDING_START|>",
                  "<|TEXT_UNDERSTANDING_END|>")
"""The NeuTTS tokens its prompts use (``_apply_chat_template`` looks each up by name)."""

_FIRST = 1024
"""The first id after the trained byte-level vocabulary."""


def neutts_vocab(profile: NeuCodecProfile) -> tuple[dict[int, str], list[str], int]:
    """(named ids, special tokens, first speech id): the specials, then the speech tokens in
    code order."""
    special = list(dict.fromkeys([*QWEN2_SPECIAL, *NEUTTS_CONTROL, profile.text_start,
                                  profile.text_end, profile.speech_start, *profile.stop_tokens]))
    names = {_FIRST + i: s for i, s in enumerate(special)}
    base = _FIRST + len(special)
    names.update({base + c: profile.speech_token_format.format(c)
                  for c in range(profile.codebook_size)})
    return names, special, base


def _qwen2(vocab_size: int, out: Path, eos_id: int, speech: range, seed: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=eos_id, eos_token_id=eos_id, torch_dtype="float32")
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():
        embed, head = model.model.embed_tokens.weight, model.lm_head.weight
        embed.normal_(0.0, 0.02)
        head.normal_(0.0, 1.0)
        embed[:, :4] = 0.0
        head[:, :4] = 0.0
        embed[:, 0] = 1.0  # every token says "speech comes next"
        head[speech.start : speech.stop, 0] = 2.5
    model.save_pretrained(str(out), safe_serialization=True)


def write_neutts_tokenizer(profile: NeuCodecProfile, out: Path) -> tuple[int, range]:
    """The tokenizer alone (the prompt golden's): (vocabulary size, speech ids)."""
    names, special, base = neutts_vocab(profile)
    end = base + profile.codebook_size
    speech = [names[i] for i in range(base, end)]
    tok = build_tokenizer(names, end + (-end % 64), special, added=speech)
    save_tokenizer(tok, out, bos="<|endoftext|>", eos="<|endoftext|>")
    return end + (-end % 64), range(base, end)


def make_neucodec_model(profile: NeuCodecProfile, out: Path, seed: int) -> None:
    """Tokenizer, tiny Qwen2 and tiny codec (its ``neucodec`` folder) into ``out``."""
    from ..codecs.neucodec import write_tiny_checkpoint

    vocab_size, speech = write_neutts_tokenizer(profile, out)
    _qwen2(vocab_size, out, _FIRST + QWEN2_SPECIAL.index("<|endoftext|>"), speech, seed)
    write_tiny_checkpoint(out / "neucodec", seed=seed)
