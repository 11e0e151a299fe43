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
from dataclasses import dataclass
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


def build_tokenizer(named_ids: dict[int, str], vocab_size: int, special: list[str],
                     added: list[str] = ()):
    """A byte-level BPE whose vocabulary is padded so that ``named_ids`` sit at their ids;
    ``special`` become special tokens, ``added`` whole (never split) but not special."""
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
    if added:
        tok.add_tokens([AddedToken(s, special=False, normalized=False) for s in added])
    return tok


def save_tokenizer(tok, out: Path, bos: str, eos: str) -> None:
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


@dataclass(frozen=True)
class _Llama3Tokenizer:
    """What a SNAC-layout checkpoint's Llama-3 tokenizer does that its profile need not say."""

    eos: int = 128001
    """The EOS of the tokenizer and of the model's (generation) config."""
    tag_tokens: bool = False
    """Whether the profile's expressive tags are single added tokens (not split)."""


_LLAMA3_TOKENIZERS = {
    # maya-research/maya1: a Llama-3 chat model, so EOS is <|eot_id|> (128009), which its own
    # prompt carries: only ``ignore_eos`` keeps it from ending a request. Its 20 emotion tags
    # are single tokens; the tiny model puts them right after the audio tokens.
    "maya1": _Llama3Tokenizer(eos=128009, tag_tokens=True),
}

_LLAMA3_NAMES = {128000: "<|begin_of_text|>", 128001: "<|end_of_text|>", 128009: "<|eot_id|>"}


def _llama3_tokenizer(profile: SnacProfile) -> _Llama3Tokenizer:
    return _LLAMA3_TOKENIZERS.get(profile.name, _Llama3Tokenizer())


def _tag_tokens(profile: SnacProfile) -> list[str]:
    """The profile's tags as the tokens its tokenizer holds (none where they are plain text)."""
    return [f"<{t}>" for t in profile.tags] if _llama3_tokenizer(profile).tag_tokens else []


def _snac_named_ids(profile: SnacProfile, vocab_size: int) -> dict[int, str]:
    names = dict(_LLAMA3_NAMES)
    for i in range(128256, min(vocab_size, profile.vocab_end)):
        names[i] = f"<custom_token_{i - 128256}>"
    for i, tag in enumerate(_tag_tokens(profile)):
        names[profile.vocab_end + i] = tag
    return names


def _write_snac_codec(out: Path, seed: int) -> None:
    import torch
    from snac import SNAC

    from ..codecs.snac import SNAC_24KHZ_CONFIG

    torch.manual_seed(seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(SNAC_24KHZ_CONFIG, indent=2))
    torch.save(SNAC(**SNAC_24KHZ_CONFIG).state_dict(), out / "pytorch_model.bin")


def snac_vocab_size(profile: SnacProfile) -> int:
    """The vocabulary of a SNAC-layout model: every audio token (then its tag tokens, if
    any), padded to a multiple of 64."""
    end = profile.vocab_end + len(_tag_tokens(profile))
    return end + (-end % 64)


def write_snac_tokenizer(profile: SnacProfile, out: Path) -> None:
    """A tokenizer with ``profile``'s real special and audio token ids (no weights): what a
    real-size model with random weights (vLLM ``load_format="dummy"``) needs beside its
    config."""
    vocab_size = snac_vocab_size(profile)
    named = _snac_named_ids(profile, vocab_size)
    special = sorted({named[i] for i in (*profile.prefix_ids, *profile.suffix_ids,
                                         *profile.stop_token_ids, *_LLAMA3_NAMES)})
    tok = build_tokenizer(named, vocab_size, special, added=_tag_tokens(profile))
    # as Llama-3's tokenizer.json does: encode(..., add_special_tokens=True) prepends BOS
    from tokenizers import processors

    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", 128000)])
    eos = _LLAMA3_NAMES[_llama3_tokenizer(profile).eos]
    save_tokenizer(tok, out, bos="<|begin_of_text|>", eos=eos)


def _make_snac_model(profile: SnacProfile, out: Path, seed: int) -> None:
    write_snac_tokenizer(profile, out)
    _llama(snac_vocab_size(profile), out, 128000, _llama3_tokenizer(profile).eos,
           _tilt_snac(profile), seed)
    _write_snac_codec(out / "snac", seed)


# Spark-TTS's control tokens that our prompts and its output grammar use (its tokenizer has
# more: ages, emotions, fine-grained pitch and speed values), plus Veena3's guessed speaker
# markers. They are special tokens; the BiCodec tokens are added tokens that are not special,
# as in Spark-TTS's tokenizer (its inference decodes with skip_special_tokens and still reads
# them back).
_SPARK_CONTROL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|task_tts|>",
                  "<|task_controllable_tts|>", "<|start_content|>", "<|end_content|>",
                  "<|start_style_label|>", "<|end_style_label|>", "<|gender_0|>", "<|gender_1|>",
                  *(f"<|pitch_label_{i}|>" for i in range(5)),
                  *(f"<|speed_label_{i}|>" for i in range(5)),
                  "<|start_global_token|>", "<|end_global_token|>", "<|start_semantic_token|>",
                  "<|end_semantic_token|>", "<|start_speaker|>", "<|end_speaker|>")

# Spark-TTS-0.5B's root config.yaml: the reference-clip settings its tokenizer reads.
_SPARK_ROOT_CONFIG = {"sample_rate": 16000, "latent_hop_length": 320, "ref_segment_duration": 6,
                      "volume_normalize": True}


def _bicodec_grammar(profile: BiCodecProfile, ids: dict[str, int]) -> list[tuple[int, int]]:
    """(token, the token that should follow it) pairs of Spark-TTS's output grammar: a style
    label or ``<|start_global_token|>`` -> one of 8 runs of 32 consecutive globals ->
    ``<|end_global_token|>`` -> ``<|start_semantic_token|>`` -> one of 8 runs of 500
    consecutive semantic tokens -> ``<|end_semantic_token|>`` -> ``<|im_end|>``."""
    glob = lambda i: ids[profile.global_token_format.format(i)]  # noqa: E731
    sem = lambda i: ids[profile.semantic_token_format.format(i)]  # noqa: E731
    n, run = profile.num_global_tokens, 500
    pairs = [(ids[t], glob(n * k)) for t in ("<|end_style_label|>", "<|start_global_token|>")
             for k in range(8)]
    pairs += [(glob(i), glob(i + 1) if i % n != n - 1 else ids["<|end_global_token|>"])
              for i in range(8 * n)]
    pairs.append((ids["<|end_global_token|>"], ids["<|start_semantic_token|>"]))
    pairs += [(ids["<|start_semantic_token|>"], sem(run * k)) for k in range(8)]
    pairs += [(sem(i), sem(i + 1) if i % run != run - 1 else ids["<|end_semantic_token|>"])
              for i in range(8 * run)]
    pairs.append((ids["<|end_semantic_token|>"], ids["<|im_end|>"]))
    return pairs


def _tilt_bicodec(pairs: list[tuple[int, int]]):
    """Each token's output row points along the embedding of the token it follows, so a free
    generation (Spark's own, unconstrained) walks the grammar: 32 globals, then semantic
    tokens, then the stop token. The starting run is sampled, so seeds give other voices."""
    import torch

    def tilt(embed, head):
        curs = sorted({c for c, _ in pairs})
        embed[curs] *= 20.0  # the token itself outweighs what the random layers add
        for cur, nxt in pairs:
            head[nxt] = 0.0
        for cur, nxt in pairs:
            head[nxt] += 10.0 * embed[cur] / torch.linalg.vector_norm(embed[cur])

    return tilt


def _make_bicodec_model(profile: BiCodecProfile, out: Path, seed: int) -> None:
    """A Spark-layout tokenizer (control tokens special, BiCodec tokens added but not special,
    as in Spark-TTS), a random Llama tilted towards BiCodec tokens, and a random-init BiCodec
    in the official folder layout. With ``profile.llm_folder`` (Spark-TTS) the whole
    checkpoint is laid out as released: ``LLM/``, ``BiCodec/`` and the root ``config.yaml``."""
    import torch
    import yaml
    from safetensors.torch import save_file

    from ..codecs.bicodec_model import DEFAULT_CONFIG, BiCodecDecoder
    from ..codecs.bicodec_speaker import DEFAULT_SPEAKER_CONFIG, BiCodecSpeakerEncoder

    control = list(dict.fromkeys([*_SPARK_CONTROL, *profile.stop_tokens]))
    audio = [profile.global_token_format.format(i) for i in range(profile.global_codebook_size)]
    audio += [profile.semantic_token_format.format(i) for i in range(profile.semantic_codebook_size)]
    names = control + audio
    first = 1024
    named = {first + i: n for i, n in enumerate(names)}
    vocab_size = first + len(names) + (-(first + len(names)) % 64)
    llm_dir = out / profile.llm_folder if profile.llm_folder else out
    llm_dir.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer(named, vocab_size, control, added=audio)
    save_tokenizer(tok, llm_dir, bos="<|endoftext|>", eos="<|im_end|>")
    ids = {n: i for i, n in named.items()}
    _llama(vocab_size, llm_dir, ids["<|endoftext|>"], ids["<|im_end|>"],
           _tilt_bicodec(_bicodec_grammar(profile, ids)), seed)
    (out / "config.yaml").write_text(yaml.safe_dump(_SPARK_ROOT_CONFIG))
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
    if prof.codec == "neucodec":
        from .tiny_neucodec import make_neucodec_model

        builders["neucodec"] = (make_neucodec_model, prof.codec_variant)
    if prof.codec not in builders:
        raise ValueError(f"no tiny model builder for codec {prof.codec!r}")
    build, codec_dir = builders[prof.codec]
    build(prof, out, seed)
    manifest = {"profile": prof.name, "codec_model": codec_dir, "random_weights": True}
    (out / MANIFEST).write_text(json.dumps(manifest, indent=2))
    return out


def make_random_adapter(out_dir: str | Path, base_model: str | Path, *, rank: int = 8,
                        alpha: float = 16.0, targets: tuple[str, ...] | None = None,
                        seed: int = 0, zero: bool = False) -> Path:
    """A seeded random LoRA adapter for ``base_model`` in PEFT's layout (tests, benchmarks):
    ``lora_A`` and ``lora_B`` on ``targets`` (default: every projection) of every layer.
    ``zero``: B is all zeros, so the adapter adds nothing (same shapes, same code path)."""
    import json

    import torch
    from safetensors.torch import save_file

    from .adapters import ATTENTION, CONFIG_FILE, TARGET_MODULES, WEIGHTS_FILE, base_shapes

    targets = tuple(targets or TARGET_MODULES)
    layers, shapes = base_shapes(str(base_model))
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(layers):
        for module in targets:
            fan_in, fan_out = shapes[module]
            parent = "self_attn" if module in ATTENTION else "mlp"
            key = f"base_model.model.model.layers.{layer}.{parent}.{module}"
            tensors[f"{key}.lora_A.weight"] = torch.randn(rank, fan_in, generator=gen) / fan_in**0.5
            b = torch.randn(fan_out, rank, generator=gen) * 0.02
            tensors[f"{key}.lora_B.weight"] = torch.zeros_like(b) if zero else b
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / WEIGHTS_FILE))
    (out / CONFIG_FILE).write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": list(targets),
        "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model)}, indent=2))
    return out
