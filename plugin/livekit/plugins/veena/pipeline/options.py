"""The pipeline's decode-side tunables, typed, with their defaults in one place."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .family import DecodeShape
from ..normalization import NormalizationOptions
from .guards import GuardOptions
from .scheduler import SchedulerOptions

MAX_QUEUED_OUTPUT_STEPS = 64
"""``PipelineOptions.queued_output_steps`` at most (vLLM's interval stays within reason)."""


@dataclass(frozen=True)
class PipelineOptions:
    """Decode-side tunables (``models.loading.pipeline_options_from_env`` reads each from its
    ``VEENA_*`` variable)."""

    decode: Mapping[str, DecodeShape] = field(default_factory=dict)
    """Decode windows by family ``codec`` (``snac``, ``bicodec``); a family not named here
    decodes with its own ``decode_defaults``."""
    adaptive_windows: bool = True
    """Size windows from the listener's buffer (``pacing``); False: the fixed ramp."""
    crossfade_ms: float = 10.0
    scheduler: SchedulerOptions = SchedulerOptions()
    codec_device: str = "cpu"
    codec_cuda_graphs: bool = True
    """Where the codec runs on CUDA, replay its decoder from a CUDA graph per window shape
    (``codecs.cuda_graphs``): one launch instead of hundreds of kernels per call."""
    snac_streaming: bool | None = None
    """Decode SNAC incrementally (``codecs.snac_streaming``): every step once, exactly the
    one-pass audio, first audio after as many steps; no CUDA graphs. False: overlapping
    windows (``windowing``). None (``auto``): streaming where the codec runs on the CPU,
    where it measured better at every stream count tried (1-8); windows on CUDA, where the captured
    graphs are what a GPU's many streams were measured with."""
    torch_threads: int = 0
    """0 leaves torch's own default."""
    freeze_gc_heap: bool = True
    """Once started, freeze the start-up heap so full garbage collections stop pausing the
    event loop (``gc_heap``)."""
    queued_output_steps: int = 1
    """A text chunk that starts while an earlier chunk of its turn still generates (its audio
    waits behind that one's) has vLLM hand its tokens over once per this many codec steps
    (vLLM's ``stream_interval``; SNAC: 7 tokens a step) instead of per token: a seventh of
    the outputs for vLLM's front end to build and fewer wakes, each delivery at most one
    engine step later, which its listener, still hearing the earlier chunk, does not hear.
    0: every token. A first chunk always takes every token (its first audio waits on it)."""
    guards: GuardOptions = GuardOptions()
    normalization: NormalizationOptions = NormalizationOptions()
    """How text is normalised before the prompt (``normalization``): the default mode, the
    locale (None: the profile's) and the pronunciations every turn uses."""
    """The guards against a model going wrong inside a chunk (``guards``)."""
    gc_full_interval_s: float = 300.0
    """Once started, full garbage collections wait until no stream plays, or at most this
    long (checked as a stream starts); 0: Python's own schedule (``gc_heap``)."""
    watermark: str = "auto"
    """The output watermark (``watermark``), as ``load_pipeline`` resolves it: ``auto``,
    Perth's where the profile's reference applies it (NeuTTS) and ``resemble-perth`` is
    installed; ``on``, always (an error at start without the weights); ``off``."""
    watermark_weights: str = ""
    """A folder with Perth's ``hparams.yaml`` and checkpoint ("": the installed package's)."""

    def streams_snac(self) -> bool:
        """Whether ``load_pipeline`` builds a streaming SNAC codec (``auto`` resolved)."""
        if self.snac_streaming is not None:
            return self.snac_streaming
        return not self.codec_device.startswith("cuda")
