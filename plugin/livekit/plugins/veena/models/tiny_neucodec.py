"""Tiny random NeuCodec-family models (``make-tiny-model --profile neutts`` / ``llasa``): a
2-layer language model (NeuTTS: Qwen2; Llasa: Llama) whose tokenizer has the profile's real
prompt and stop tokens and its 65,536 speech tokens added in code order (one contiguous id
range, as the family checks at load), beside a tiny random codec checkpoint in the published
layout (NeuCodec 24 kHz; XCodec2, the same decoder at 16 kHz, hop 320).

The output head is tilted towards the speech tokens, so a generation is codec steps (random
codes: noise, which is what random weights sound like) rather than text. Llasa's tokenizer
carries a Llama-3-style chat template (its prompt goes through the tokenizer's own template).
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

LLAMA3_SPECIAL = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                  "<|end_header_id|>", "<|eot_id|>")

LLASA_CONTROL = ("<|TEXT_GENERATION_START|>", "<|TEXT_GENERATION_END|>",
                 "<|TEXT_UNDERSTANDING_START|>", "<|TEXT_UNDERSTANDING_END|>",
                 "<|SPEECH_GENERATION_START|>", "<|SPEECH_GENERATION_END|>",
                 "<|SPEECH_UNDERSTANDING_START|>", "<|SPEECH_UNDERSTANDING_END|>")
"""Llasa's eight control tokens, in the order its training code adds them (plain added
tokens, not special ones, right before its 65,536 ``<|s_N|>`` tokens)."""

LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
    "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{% endif %}")
"""Llama-3's chat template without its system-prompt preamble (the tiny Llasa's)."""

_FIRST = 1024
"""The first id after the trained byte-level vocabulary."""


def neutts_vocab(profile: NeuCodecProfile) -> tuple[dict[int, str], list[str], int]:
    """(named ids, special tokens, first speech id): the specials, then (Llasa) its control
    tokens as plain added tokens, then the speech tokens in code order."""
    prompt = [profile.text_start, profile.text_end, profile.speech_start, *profile.stop_tokens]
    if profile.chat_template:  # Llasa: Llama-3's specials; its own tokens added after them
        special = list(LLAMA3_SPECIAL)
        control = [t for t in dict.fromkeys([*LLASA_CONTROL, *prompt]) if t not in special]
    else:
        special = list(dict.fromkeys([*QWEN2_SPECIAL, *NEUTTS_CONTROL, *prompt]))
        control = []
    names = {_FIRST + i: s for i, s in enumerate([*special, *control])}
    base = _FIRST + len(special) + len(control)
    names.update({base + c: profile.speech_token_format.format(c)
                  for c in range(profile.codebook_size)})
    return names, special, base


def _tiny_lm(llama: bool, vocab_size: int, out: Path, bos_id: int, eos_id: int,
             speech: range, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config_type, model_type = ((LlamaConfig, LlamaForCausalLM) if llama
                               else (Qwen2Config, Qwen2ForCausalLM))
    config = config_type(vocab_size=vocab_size, hidden_size=128, intermediate_size=256,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=4096, tie_word_embeddings=False,
                         bos_token_id=bos_id, eos_token_id=eos_id, torch_dtype="float32")
    model = model_type(config)
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
    from transformers import PreTrainedTokenizerFast

    names, special, base = neutts_vocab(profile)
    end = base + profile.codebook_size
    added = [names[i] for i in range(_FIRST + len(special), end)]  # control (Llasa), speech
    tok = build_tokenizer(names, end + (-end % 64), special, added=added)
    if not profile.chat_template:
        save_tokenizer(tok, out, bos="<|endoftext|>", eos="<|endoftext|>")
    else:
        fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin_of_text|>",
                                       eos_token="<|eot_id|>")
        fast.chat_template = LLAMA3_CHAT_TEMPLATE
        fast.save_pretrained(str(out))
    return end + (-end % 64), range(base, end)


def make_neucodec_model(profile: NeuCodecProfile, out: Path, seed: int) -> None:
    """Tokenizer, tiny LM and tiny codec (its ``codec_variant`` folder) into ``out``."""
    from dataclasses import replace

    from ..codecs.neucodec import write_tiny_checkpoint
    from ..codecs.neucodec_model import NeuCodecConfig

    vocab_size, speech = write_neutts_tokenizer(profile, out)
    names, special, _ = neutts_vocab(profile)
    ids = {n: _FIRST + i for i, n in enumerate(special)}
    bos, eos = (("<|begin_of_text|>", "<|eot_id|>") if profile.chat_template
                else ("<|endoftext|>", "<|endoftext|>"))
    _tiny_lm(profile.chat_template, vocab_size, out, ids[bos], ids[eos], speech, seed)
    config = replace(NeuCodecConfig.tiny(), hop_length=profile.samples_per_token,
                     sample_rate=profile.sample_rate)
    # with the encoder's tensors (NeuCodec's, or XCodec2's: the same ones), so tiny models
    # clone voices
    write_tiny_checkpoint(out / profile.codec_variant, seed=seed, config=config, encoder=True)
