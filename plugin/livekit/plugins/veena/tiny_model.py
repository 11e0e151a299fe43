"""Tiny random-weight models with a real profile's token layout, built offline.

Tests and install checks need a model vLLM can really serve, but nothing may be downloaded.
The tiny Llama keeps the profile's exact vocabulary and token ids; its random output head is
tilted so that it follows the codec's token grammar (SNAC: interleave position p is followed
by p + 1; BiCodec: globals, then semantic tokens). The codes themselves stay random, so the
audio is noise: that is what random weights sound like.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from .profiles import MANIFEST, BiCodecProfile, ModelProfile, SnacProfile, get_profile

logger = logging.getLogger(__name__)

_CORPUS = [
    "Hello, this is a small test of the streaming speech pipeline.",
    "The quick brown fox jumps over the lazy dog. How are you today?",
    "Numbers like 3.14 and 2026 appear in text, as do names such as Dr. Rao.",
    "नमस्ते, आप कैसे हैं? मैं ठीक हूँ। धन्यवाद॥",
    "यह एक छोटा परीक्षण वाक्य है। हम हिंदी और English दोनों बोलते हैं।",
    "Voice agents speak while the language model is still writing.",
    "kavya agastya maitri vinaya tara leah jess leo dan mia zac zoe",
]


def _train_bpe(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS * 20, trainer=trainer)
    return tok


def _build_tokenizer(named_ids: dict[int, str], vocab_size: int, special: list[str]):
    """A byte-level BPE whose vocabulary is padded so that ``named_ids`` sit at their ids."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    base = json.loads(_train_bpe(512).to_str())["model"]
    vocab: dict[str, int] = dict(base["vocab"])
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in base["merges"]]
    if len(vocab) > min(named_ids):
        raise ValueError("the trained vocabulary overlaps the reserved ids")
    for i in range(len(vocab), vocab_size):
        vocab[named_ids.get(i, f"<|reserved_{i}|>")] = i
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in special])
    return tok


def _save_tokenizer(tok, out: Path, bos: str, eos: str) -> None:
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token=eos)
    fast.save_pretrained(str(out))


def _llama(vocab_size: int, out: Path, bos_id: int, eos_id: int, tilt, seed: int) -> None:
    """Save a 2-layer Llama whose output head is tilted by ``tilt(embed, head)``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        embed = model.model.embed_tokens.weight
        head = model.lm_head.weight
        embed.normal_(0.0, 0.02)
        head.normal_(0.0, 1.0)
        tilt(embed, head)
    model.save_pretrained(str(out), safe_serialization=True)


# Hidden dimensions 0..7 carry the grammar state; the rest stays random.
_GAIN = 1.0
_PULL = 2.5


def _tilt_snac(profile: SnacProfile):
    def tilt(embed, head):
        base, width, n = profile.audio_token_base, profile.codebook_size, profile.tokens_per_frame
        embed[:, :8] = 0.0
        head[:, :8] = 0.0
        for p in range(n):
            rows = slice(base + p * width, base + (p + 1) * width)
            embed[rows, p] = _GAIN  # "I am position p"
            head[rows, (p - 1) % n] = _PULL  # "I follow position p - 1"
        start = profile.suffix_ids[-1]  # START_OF_SPEECH: what comes next is position 0
        embed[start, 7] = _GAIN
        head[base : base + width, 7] = _PULL

    return tilt


def _snac_named_ids(profile: SnacProfile, vocab_size: int) -> dict[int, str]:
    names = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128009: "<|eot_id|>"}
    for i in range(128256, min(vocab_size, profile.vocab_end)):
        names[i] = f"<custom_token_{i - 128256}>"
    return names


def _write_snac_codec(out: Path, seed: int) -> None:
    import torch
    from snac import SNAC

    from .codecs.snac import SNAC_24KHZ_CONFIG

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG, indent=2))
    torch.save(SNAC(**SNAC_24KHZ_CONFIG).state_dict(), out / "pytorch_model.bin")


def snac_vocab_size(profile: SnacProfile) -> int:
    """The vocabulary of a SNAC-layout model: every audio token, padded to a multiple of 64."""
    return profile.vocab_end + (-profile.vocab_end % 64)


def write_snac_tokenizer(profile: SnacProfile, out: Path) -> None:
    """A tokenizer with ``profile``'s real special and audio token ids (no weights): what a
    real-size model with random weights (vLLM ``load_format="dummy"``) needs beside its
    config."""
    vocab_size = snac_vocab_size(profile)
    named = _snac_named_ids(profile, vocab_size)
    special = sorted({named[i] for i in (*profile.prefix_ids, *profile.suffix_ids,
                                         *profile.stop_token_ids, 128000, 128001, 128009)})
    tok = _build_tokenizer(named, vocab_size, special)
    _save_tokenizer(tok, out, bos="<|begin_of_text|>", eos="<|end_of_text|>")


def _make_snac_model(profile: SnacProfile, out: Path, seed: int) -> None:
    write_snac_tokenizer(profile, out)
    _llama(snac_vocab_size(profile), out, 128000, 128001, _tilt_snac(profile), seed)
    _write_snac_codec(out / "snac", seed)


_SPARK_CONTROL = ("<|task_tts|>", "<|start_speaker|>", "<|end_speaker|>", "<|start_content|>",
                  "<|end_content|>", "<|start_global_token|>", "<|end_global_token|>",
                  "<|start_semantic_token|>", "<|endoftext|>")


def _make_bicodec_model(profile: BiCodecProfile, out: Path, seed: int) -> None:
    """A Spark-layout tokenizer (every BiCodec token a special token, as in Spark-TTS), a
    random Llama (generation is constrained to globals, then semantic tokens, by the
    pipeline itself) and a random-init BiCodec in the official folder layout."""
    import torch
    import yaml
    from safetensors.torch import save_file

    from .codecs.bicodec_model import DEFAULT_CONFIG, BiCodecDecoder
    from .codecs.bicodec_speaker import DEFAULT_SPEAKER_CONFIG, BiCodecSpeakerEncoder

    names = [*_SPARK_CONTROL, *profile.stop_tokens]
    names += [profile.global_token_format.format(i) for i in range(profile.global_codebook_size)]
    names += [profile.semantic_token_format.format(i) for i in range(profile.semantic_codebook_size)]
    names = list(dict.fromkeys(names))
    first = 1024
    named = {first + i: n for i, n in enumerate(names)}
    vocab_size = first + len(names) + (-(first + len(names)) % 64)
    tok = _build_tokenizer(named, vocab_size, names)
    _save_tokenizer(tok, out, bos="<|endoftext|>", eos="<|im_end|>")
    _llama(vocab_size, out, first + names.index("<|endoftext|>"), first + names.index("<|im_end|>"),
           lambda embed, head: None, seed)
    codec_dir = out / "BiCodec"
    codec_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    state = {k: v.contiguous() for k, v in BiCodecDecoder().state_dict().items()}
    # the speaker encoder's tensors too, as in a real checkpoint: tiny models clone voices
    state.update({k: v.contiguous() for k, v in BiCodecSpeakerEncoder().model.state_dict().items()})
    save_file(state, str(codec_dir / "model.safetensors"))
    config = {**DEFAULT_SPEAKER_CONFIG, **DEFAULT_CONFIG,
              "speaker_encoder": {**DEFAULT_SPEAKER_CONFIG["speaker_encoder"],
                                  **DEFAULT_CONFIG["speaker_encoder"]}}
    (codec_dir / "config.yaml").write_text(yaml.safe_dump({"audio_tokenizer": config}))


def make_tiny_model(out_dir: str | Path, profile: str | ModelProfile = "veena", seed: int = 0) -> Path:
    """Build a tiny random model for ``profile`` into ``out_dir`` and return its path."""
    prof = get_profile(profile) if isinstance(profile, str) else profile
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    logger.info("building tiny random %s model", prof.name, extra={"dir": str(out)})
    builders = {"snac": (_make_snac_model, "snac"), "bicodec": (_make_bicodec_model, "BiCodec")}
    if prof.codec not in builders:
        raise ValueError(f"no tiny model builder for codec {prof.codec!r}")
    build, codec_dir = builders[prof.codec]
    build(prof, out, seed)
    manifest = {"profile": prof.name, "codec_model": codec_dir, "random_weights": True}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out
