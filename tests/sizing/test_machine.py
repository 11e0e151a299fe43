"""Defaults from the machine, with the machine's facts passed in (this machine has no GPU):
the codec on CUDA where CUDA is present, ``max_num_seqs`` and the decode batch from the
GPU's memory and the model's config, the CPU's defaults unchanged."""

import pytest

from livekit.plugins.veena.models import loading
from livekit.plugins.veena.models.profiles import ORPHEUS
from livekit.plugins.veena.pipeline.engine_options import EngineOptions
from livekit.plugins.veena.pipeline.options import PipelineOptions
from livekit.plugins.veena.server.options import ServerOptions
from livekit.plugins.veena.sizing.machine import (CPU_MAX_NUM_SEQS, MachineFacts,
                                                  choose_codec_device)

from .configs import ORPHEUS_3B, write_config

H100 = MachineFacts(True, 81559 * 2**20, "NVIDIA H100 80GB HBM3")
L4 = MachineFacts(True, 23034 * 2**20, "NVIDIA L4")


@pytest.fixture(autouse=True)
def _no_settings(monkeypatch):
    for name in ("VEENA_MAX_NUM_SEQS", "VEENA_CODEC_DEVICE", "VEENA_DECODE_MAX_BATCH",
                 "VEENA_GPU_MEMORY_UTILIZATION", "VEENA_DTYPE", "VEENA_PROFILE",
                 "VEENA_TENSOR_PARALLEL_SIZE"):
        monkeypatch.delenv(name, raising=False)


def test_codec_device_auto_follows_cuda():
    device, why = choose_codec_device("auto", cuda=True)
    assert device == "cuda" and "CUDA is available" in why
    device, why = choose_codec_device("", cuda=False)
    assert device == "cpu" and "not available" in why
    assert choose_codec_device("cuda:1", cuda=True)[0] == "cuda:1"
    assert choose_codec_device("CPU", cuda=True)[0] == "cpu"  # set: kept, CUDA or not
    with pytest.raises(ValueError, match="CUDA is not available"):
        choose_codec_device("cuda", cuda=False)
    with pytest.raises(ValueError, match="auto, cpu, cuda"):
        choose_codec_device("gpu", cuda=True)


def test_this_machine_decodes_on_the_cpu_by_default(caplog):
    assert loading.pipeline_options_from_env().codec_device == "cpu"
    assert loading.codec_device_from_env()[1] == \
        "VEENA_CODEC_DEVICE=auto and CUDA is not available"


def test_max_num_seqs_follows_the_gpu_and_the_model(tmp_path, monkeypatch):
    model = str(write_config(tmp_path / "orpheus", ORPHEUS_3B))
    # 223 Orpheus streams fit an H100 at 0.85 (tests/sizing/test_plan.py's arithmetic)
    assert EngineOptions.from_env(model, facts=H100, profile=ORPHEUS).max_num_seqs == 446
    small = EngineOptions.from_env(model, facts=L4, profile=ORPHEUS).max_num_seqs
    assert small == 2 * ((int(23034 * 2**20 * 0.85) - 3_300_867_072 * 2 - 2**31)
                         // (2496 * 114_688))
    monkeypatch.setenv("VEENA_TENSOR_PARALLEL_SIZE", "2")  # two L4s: weights and cache split
    assert EngineOptions.from_env(model, facts=L4, profile=ORPHEUS).max_num_seqs == 2 * (
        (int(2 * 23034 * 2**20 * 0.85) - 3_300_867_072 * 2 - 2**31) // (2496 * 114_688))
    monkeypatch.delenv("VEENA_TENSOR_PARALLEL_SIZE")
    monkeypatch.setenv("VEENA_GPU_MEMORY_UTILIZATION", "0.5")  # a worker's share: fewer fit
    assert EngineOptions.from_env(model, facts=H100, profile=ORPHEUS).max_num_seqs < 446
    monkeypatch.setenv("VEENA_MAX_NUM_SEQS", "12")  # set: kept
    assert EngineOptions.from_env(model, facts=H100, profile=ORPHEUS).max_num_seqs == 12


def test_the_cpu_keeps_its_defaults(tmp_path):
    model = str(write_config(tmp_path / "orpheus", ORPHEUS_3B))
    opts = EngineOptions.from_env(model, facts=MachineFacts(False))
    assert opts.max_num_seqs == CPU_MAX_NUM_SEQS == 64
    assert opts.gpu_memory_utilization == 0.3 and opts.enforce_eager
    assert EngineOptions.from_env(model).max_num_seqs == 64  # detected: no CUDA here
    # a GPU with a config that cannot be read falls back to them too
    assert EngineOptions.from_env(str(tmp_path), facts=H100).max_num_seqs == 64


def test_admission_follows_max_num_seqs_up_to_a_process(tmp_path):
    assert ServerOptions().admission(64).max_active == 32  # the CPU default, as before
    assert ServerOptions().admission(470).max_active == 192  # one process's CPU
    assert ServerOptions(max_active_streams=300).admission(470).max_active == 300


def test_decode_batch_follows_the_streams_on_cuda(monkeypatch):
    cuda = PipelineOptions(codec_device="cuda")
    h100 = EngineOptions(model="m", max_num_seqs=470)
    assert loading.with_machine_decode_batch(cuda, h100).scheduler.max_batch == 64
    l4 = EngineOptions(model="m", max_num_seqs=86)
    assert loading.with_machine_decode_batch(cuda, l4).scheduler.max_batch == 16
    mid = EngineOptions(model="m", max_num_seqs=200)  # 100 streams: a batch of 32
    assert loading.with_machine_decode_batch(cuda, mid).scheduler.max_batch == 32
    cpu = PipelineOptions()
    assert loading.with_machine_decode_batch(cpu, h100).scheduler.max_batch == 16
    monkeypatch.setenv("VEENA_DECODE_MAX_BATCH", "8")
    assert loading.with_machine_decode_batch(cuda, h100) is cuda
