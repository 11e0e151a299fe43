"""The NeuTTS family end to end on the command line, and its LoRA voices through vLLM, on
the family's one engine start.

``make-tiny-model --profile neutts`` (a tiny Qwen2 with NeuTTS's tokens and a tiny NeuCodec),
then ``say --lora acme=A --voice acme`` writes a 24 kHz WAV. ``say`` runs in this process
(``cli.main``), so that before it closes its pipeline (the one ``load_pipeline`` built from
``--lora``) the same vLLM engine answers the checks' requests, with per-step logprobs asked
of vLLM itself (our engine shell yields ids only): the checks cost no engine start of their
own (about 12 s of requests and 2 s of teacher on two busy cores). A transformers
``Qwen2ForCausalLM`` teacher-forced on the same tokens, with adapter A merged into its
weights as PEFT defines the merge (``W + lora_alpha / r * B @ A``,
``tests.helpers.merge_lora``), gives the same logprobs within float32 rounding; the base
model's differ by far more.

Adapter A (rank 8) is on all seven of Qwen2's projections (q/k/v/o, gate/up/down) of both
layers. Qwen2's q/k/v projections have biases, zero as the tiny model is initialised: they
are given seeded random values first, so the adapter's sum with a biased projection is
checked too. The engine runs float32 (``VEENA_DTYPE``), as the teacher does."""

import asyncio
import contextlib
import io
import wave
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from livekit.plugins.veena import cli
from livekit.plugins.veena.models import loading
from livekit.plugins.veena.models.tiny_model import make_random_adapter

from ..helpers import merge_lora

pytestmark = pytest.mark.engine

TEXT = "Hello there, this is NeuTTS."
SEED, STEPS = 3, 100  # 2 s: the tiny model never stops by itself
TRANSCRIPT = "This is the reference clip, read aloud."
REFERENCE = tuple(int(c) for c in np.random.default_rng(5).integers(0, 65536, 120))
TOP = 20  # logprobs per step asked of vLLM (its max_logprobs): the top 20 and the sampled
TOLERANCE = 1e-3
"""The largest |vLLM - teacher| logprob allowed, in nats. Measured: at most 3.7e-5 over every
logprob vLLM returned for the three requests (two prompts; with and without the adapter):
float32 rounding, vLLM's kernels summing in another order than transformers'. Against the
other model (base for merged, merged for base) the worst differences were ~10 nats, so
dropping the adapter, or a merge that is not the one vLLM applies, fails (``FAR``)."""
FAR = 100 * TOLERANCE


def _random_qkv_biases(model: Path) -> None:
    """Seeded random q/k/v biases (Qwen2's; the tiny model initialises them to zero)."""
    weights = load_file(str(model / "model.safetensors"))
    gen = torch.Generator().manual_seed(11)
    biases = [k for k in weights if k.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias"))]
    assert len(biases) == 2 * 3
    for key in biases:
        weights[key] = torch.randn(weights[key].shape, generator=gen) * 0.5
    save_file(weights, str(model / "model.safetensors"), metadata={"format": "pt"})


def _teacher(model: Path):
    """The transformers model of the folder ``model``, float32."""
    from transformers import Qwen2ForCausalLM

    return Qwen2ForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()


def _teacher_logprobs(lm, prompt: list[int], ids: list[int]) -> np.ndarray:
    """Teacher-forced: row ``t`` is the log-softmax over the vocabulary before ``ids[t]``."""
    with torch.no_grad():
        logits = lm(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits.double(), dim=-1).numpy()


def _worst(asked: list[dict[int, float]], teacher: np.ndarray) -> float:
    """The largest |vLLM - teacher| over every logprob vLLM returned."""
    assert len(asked) == len(teacher)
    return max(abs(lp - teacher[t, tok]) for t, step in enumerate(asked)
               for tok, lp in step.items())


async def _ask(p, prompt: list[int], sampling, adapter) -> dict:
    """One request straight to the vLLM engine ``p`` wraps, with per-step logprobs."""
    from vllm.sampling_params import RequestOutputKind

    params = sampling.validate().to_vllm()
    params.logprobs = TOP
    params.output_kind = RequestOutputKind.FINAL_ONLY
    lora = {} if adapter is None else {"lora_request": adapter.lora_request()}
    final = None
    async for out in p.engine._llm.generate({"prompt_token_ids": list(prompt)}, params,
                                            p.engine.new_request_id("check"), **lora):
        final = out.outputs[0]
    return {"prompt": list(prompt), "ids": list(final.token_ids),
            "logprobs": [{tok: lp.logprob for tok, lp in step.items()}
                         for step in final.logprobs]}


async def _checks(p, said: dict) -> None:
    """The checks' requests, on the engine ``say`` started (before it closes); none where
    say did not speak once (its tests then fail on what it did)."""
    from dataclasses import replace

    if len(said["requests"]) != 1 or not p.engine.started:
        return
    (request,) = said["requests"]
    acme = p.engine.adapters.get("acme")
    # a voice WITH a reference (its transcript and codes), as the family prompts it
    prompt = p.family.prompt(p.engine.tokenizer, TEXT, TRANSCRIPT, REFERENCE)
    sampling = p.family.constrain(replace(p.sampling.defaults(), max_tokens=60, seed=SEED),
                                  p.table)
    # in one batch (a seeded request samples alike in any batch)
    said["again"], said["base"], said["reference"] = await asyncio.gather(
        _ask(p, request["prompt"], request["sampling"], acme),
        _ask(p, request["prompt"], request["sampling"], None),
        _ask(p, prompt, sampling, acme))


@pytest.fixture(scope="module")
def said(tmp_path_factory) -> dict:
    """``make-tiny-model --profile neutts``, then ``say --lora acme=A --voice acme``: what
    it wrote and printed, the engine requests it made, and the checks' answers."""
    root = tmp_path_factory.mktemp("neutts-say")
    model = root / "neutts"
    assert cli.main(["make-tiny-model", str(model), "--profile", "neutts"]) == 0
    _random_qkv_biases(model)
    adapter = make_random_adapter(root / "A", model, rank=8, alpha=16, seed=1)
    out = {"root": root, "model": model, "adapter": adapter, "wav": root / "a.wav",
           "requests": []}
    real_load = loading.load_pipeline

    def load_pipeline(*args, **kwargs):
        p = real_load(*args, **kwargs)
        out["lora"] = kwargs.get("lora")
        generate, aclose = p.engine.generate, p.aclose

        async def recorded(prompt, sampling, request_id=None, adapter=None):
            entry = {"prompt": list(prompt), "sampling": sampling, "adapter": adapter,
                     "ids": []}
            out["requests"].append(entry)
            async for ids in generate(prompt, sampling, request_id, adapter):
                entry["ids"] += ids
                yield ids

        async def checked_then_closed():
            p.engine.generate = generate
            try:
                await _checks(p, out)
            finally:
                await aclose()

        p.engine.generate, p.aclose = recorded, checked_then_closed
        return p

    stdout = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout):
        mp.setattr(loading, "load_pipeline", load_pipeline)
        for name, value in (("VEENA_DTYPE", "float32"), ("VEENA_MAX_MODEL_LEN", "2048"),
                            ("VEENA_MAX_NUM_SEQS", "4"), ("VEENA_CPU_KVCACHE_GIB", "0.0625")):
            mp.setenv(name, value)
        out["code"] = cli.main(["say", "--model", str(model), "--lora", f"acme={adapter}",
                                "--voice", "acme", "--seed", str(SEED), "--max-tokens",
                                str(STEPS), "-o", str(out["wav"]), TEXT])
    out["stdout"] = stdout.getvalue()
    return out


@pytest.fixture(scope="module")
def teachers(said) -> dict:
    merged = merge_lora(said["model"], said["adapter"], said["root"] / "merged")
    return {"merged": _teacher(merged), "base": _teacher(said["model"])}


def test_make_tiny_model_then_say_writes_a_24khz_wav(said):
    assert said["code"] == 0
    assert f"wav={said['wav']}" in said["stdout"]
    with wave.open(str(said["wav"])) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate()) == (1, 2, 24000)
        frames = w.getnframes()
        samples = np.frombuffer(w.readframes(frames), np.int16)
    # 100 tokens, one 480-sample step each (min_tokens 50 is met)
    assert frames == STEPS * 480 and np.count_nonzero(samples) > frames // 2


def test_say_speaks_the_adapter_voice_through_its_adapter(said):
    """``--voice acme`` names the adapter: say's one request carries it, and the same
    request with the same seed, through the same engine, samples the same tokens with it
    and other tokens without it."""
    assert said["lora"] == {"acme": str(said["adapter"])}
    (request,) = said["requests"]
    assert request["adapter"] is not None and request["adapter"].name == "acme"
    assert len(request["ids"]) == STEPS
    assert said["again"]["ids"] == request["ids"]
    assert said["base"]["ids"] != request["ids"]


@pytest.mark.parametrize("asked, model", [("again", "merged"), ("base", "base"),
                                          ("reference", "merged")])
def test_vllms_logprobs_are_the_teacher_forced_models(said, teachers, asked, model):
    """Each step's logprobs from vLLM (the sampled token's and the top 20) equal the
    transformers model's, teacher-forced on the same prompt and tokens: with adapter A,
    the model with A merged into its weights; without it, the base model. The other model
    is far off, so the adapter is what makes the difference."""
    answer = said[asked]
    assert len(answer["ids"]) >= 50
    other = "base" if model == "merged" else "merged"
    lp = {m: _teacher_logprobs(teachers[m], answer["prompt"], answer["ids"])
          for m in (model, other)}
    assert _worst(answer["logprobs"], lp[model]) < TOLERANCE
    assert _worst(answer["logprobs"], lp[other]) > FAR
