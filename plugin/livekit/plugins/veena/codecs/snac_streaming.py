"""SNAC's decoder run incrementally: each step is decoded once, and the audio is exactly the
one-pass decode of the whole utterance.

Windowed decoding (``windowing``) re-decodes context around every window: at exactly real
time it keeps windows small, so it decodes two to four samples per sample kept, and its seams
are close to, not equal to, the one-pass decode. SNAC's decoder is a stack of convolutions
with a finite reach, so it can also be run the way a streaming convolution runs: every layer
keeps the last inputs its kernel still needs and emits only the outputs no future input can
change. A stream's audio then trails its codes by the decoder's reach (``lookahead_steps``
steps, about 2.3 frames of 24 kHz SNAC), each step is decoded once, and the samples equal
``SNAC.decode`` of all the codes at once, up to float rounding; the keyed noise
(``snac_noise.KeyedNoiseBlock``) is a function of absolute position, so it matches too.

Streams at the same point of their life (same new-step count, same per-layer buffer shapes)
decode together in one batch; a stream's state lives in its ``SnacStream``, owned by the
request that decodes it, so nothing outlives the request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from .base import CodecInput, StreamPart
from .snac_noise import SEED_MASK, KeyedNoiseBlock, keyed_normal


@dataclass
class SnacStream:
    """One utterance's decoder state: per-layer input history and positions, and the audio
    decoded but not yet handed out. Owned by its request; dropped with it."""

    seed: int
    buffers: list[torch.Tensor] = field(default_factory=list)
    """Per layer with history: the inputs its kernel still needs."""
    trims: list[int] = field(default_factory=list)
    """Per transposed convolution: outputs still to cut from the front (its padding)."""
    positions: list[int] = field(default_factory=list)
    """Per noise layer: its next output's position in the utterance."""
    audio: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.float32))
    """Final samples not yet handed out."""
    handed_out: int = 0
    """Samples handed out in windows' audio."""
    ended: bool = False

    def shapes(self) -> tuple:
        """Streams with equal shapes run their layers on stacked tensors."""
        return (tuple(b.shape[-1] for b in self.buffers), tuple(self.trims))


class _Group:
    """Streams run together through one call: their state stacked on the batch axis."""

    def __init__(self, streams: list[SnacStream], final: bool, device: torch.device) -> None:
        self.streams, self.final, self.device = streams, final, device
        one = len(streams) == 1
        self.buffers = [streams[0].buffers[i] if one else torch.cat([s.buffers[i] for s in streams])
                        for i in range(len(streams[0].buffers))]
        self.trims = list(streams[0].trims)
        self.positions = [list(p) for p in zip(*(s.positions for s in streams))]
        self.seeds = torch.tensor([s.seed for s in streams], dtype=torch.int64, device=device)

    def advance(self, slot: int, count: int) -> torch.Tensor:
        """Each stream's position at noise layer ``slot``, then move it on by ``count``."""
        now = self.positions[slot]
        self.positions[slot] = [p + count for p in now]
        return torch.tensor(now, dtype=torch.int64, device=self.device)

    def store(self) -> None:
        one = len(self.streams) == 1
        for i, stream in enumerate(self.streams):
            stream.buffers = list(self.buffers) if one else [b[i:i + 1] for b in self.buffers]
            stream.trims = list(self.trims)
            stream.positions = [p[i] for p in self.positions]


class _Layer:
    """One decoder layer run on new inputs only: ``run`` returns the outputs now final."""

    def delay(self, held: int) -> int:
        """Outputs held back (in output samples) when ``held`` inputs are held back above."""
        return held

    def initial(self, stream: SnacStream, device: torch.device) -> None:
        """Append this layer's fresh state to a new stream's."""

    def run(self, x: torch.Tensor, group: _Group) -> torch.Tensor:
        raise NotImplementedError


def _folded(conv: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight norm computed once (SNAC recomputes it on every call)."""
    return conv.weight.detach(), None if conv.bias is None else conv.bias.detach()


class _Pointwise(_Layer):
    def __init__(self, fn) -> None:
        self.fn = fn

    def run(self, x, group):
        return self.fn(x) if x.shape[-1] else x


class _PointConv(_Layer):
    """A kernel-1 convolution."""

    def __init__(self, conv: nn.Conv1d) -> None:
        self.weight, self.bias = _folded(conv)
        self.groups, self.out_channels = conv.groups, conv.out_channels

    def run(self, x, group):
        if x.shape[-1] == 0:  # nothing final yet (the first steps of a stream)
            return x.new_zeros(x.shape[0], self.out_channels, 0)
        return F.conv1d(x, self.weight, self.bias, groups=self.groups)


class _Conv(_Layer):
    """A stride-1 convolution padded to keep its length: it keeps the last ``2 * pad``
    inputs; an output is final once the input ``pad`` after it exists."""

    def __init__(self, conv: nn.Conv1d, slot: int) -> None:
        k, d, pad = conv.kernel_size[0], conv.dilation[0], conv.padding[0]
        if conv.stride[0] != 1 or not isinstance(pad, int) or 2 * pad != d * (k - 1):
            raise ValueError("only stride-1, length-keeping convolutions stream")
        self.weight, self.bias = _folded(conv)
        self.dilation, self.groups, self.pad, self.slot = d, conv.groups, pad, slot
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels

    def delay(self, held):
        return held + self.pad

    def initial(self, stream, device):
        stream.buffers.append(torch.zeros(1, self.in_channels, self.pad, device=device))

    def run(self, x, group):
        seen = torch.cat([group.buffers[self.slot], x], dim=-1)
        if group.final:
            seen = F.pad(seen, (0, self.pad))
        reach = 2 * self.pad
        group.buffers[self.slot] = seen[..., max(0, seen.shape[-1] - reach):]
        if seen.shape[-1] <= reach:
            return seen.new_zeros(seen.shape[0], self.out_channels, 0)
        return F.conv1d(seen, self.weight, self.bias, dilation=self.dilation, groups=self.groups)


class _ConvTranspose(_Layer):
    """An upsampling transposed convolution: unpadded output ``m`` is final once input
    ``m // stride`` exists, so it keeps the inputs whose kernels still reach ahead."""

    def __init__(self, conv: nn.ConvTranspose1d, slot: int, trim: int) -> None:
        self.weight, self.bias = _folded(conv)
        self.stride, self.kernel = conv.stride[0], conv.kernel_size[0]
        self.padding, self.output_padding = conv.padding[0], conv.output_padding[0]
        if conv.dilation[0] != 1 or self.output_padding > self.padding:
            raise ValueError("this transposed convolution does not stream")
        self.groups, self.slot, self.trim = conv.groups, slot, trim
        self.history = math.ceil(self.kernel / self.stride) - 1
        self.in_channels = conv.in_channels

    def delay(self, held):
        return held * self.stride + self.padding

    def initial(self, stream, device):
        stream.buffers.append(torch.zeros(1, self.in_channels, self.history, device=device))
        stream.trims.append(self.padding)

    def run(self, x, group):
        s, h = self.stride, self.history
        seen = torch.cat([group.buffers[self.slot], x], dim=-1)
        group.buffers[self.slot] = seen[..., seen.shape[-1] - h:]
        if x.shape[-1] == 0 and not group.final:
            return x.new_zeros(x.shape[0], self.weight.shape[1] * self.groups, 0)
        full = F.conv_transpose1d(seen, self.weight, self.bias, stride=s, groups=self.groups)
        end = seen.shape[-1] * s  # later inputs still add to what lies past here
        if group.final:  # nothing follows: through the end of SNAC's padded output
            end += self.kernel - s - self.padding + self.output_padding
        out = full[..., h * s:end]
        cut = min(group.trims[self.trim], out.shape[-1])
        group.trims[self.trim] -= cut
        return out[..., cut:]


class _Noise(_Layer):
    """``KeyedNoiseBlock``: noise keyed by (seed, block, position in the utterance)."""

    def __init__(self, block: KeyedNoiseBlock, slot: int) -> None:
        self.weight = block.linear.weight.detach()
        self.salt, self.keys, self.slot = block.salt, block.keys, slot

    def initial(self, stream, device):
        stream.positions.append(0)

    def run(self, x, group):
        t = x.shape[-1]
        starts = group.advance(self.slot, t)
        if not self.keys.enabled or t == 0:
            return x
        steps = starts[:, None] + torch.arange(t, dtype=torch.int64, device=x.device)
        noise = keyed_normal(group.seeds, self.salt, steps).to(x.dtype)[:, None, :]
        return x + noise * F.conv1d(x, self.weight)


class _Sequence(_Layer):
    def __init__(self, layers: list[_Layer]) -> None:
        self.layers = layers

    def delay(self, held):
        for layer in self.layers:
            held = layer.delay(held)
        return held

    def initial(self, stream, device):
        for layer in self.layers:
            layer.initial(stream, device)

    def run(self, x, group):
        for layer in self.layers:
            x = layer.run(x, group)
        return x


class _Residual(_Sequence):
    """``x + block(x)``: ``x`` waits until the block's outputs for it are final."""

    def __init__(self, layers: list[_Layer], slot: int, channels: int) -> None:
        super().__init__(layers)
        self.slot, self.channels = slot, channels

    def initial(self, stream, device):
        stream.buffers.append(torch.zeros(1, self.channels, 0, device=device))
        super().initial(stream, device)

    def run(self, x, group):
        y = super().run(x, group)
        waiting = torch.cat([group.buffers[self.slot], x], dim=-1)
        n = y.shape[-1]
        group.buffers[self.slot] = waiting[..., n:]
        return waiting[..., :n] + y


class _Builder:
    """Walks SNAC's decoder and builds its streaming twin, numbering the state slots."""

    def __init__(self) -> None:
        self.buffers = self.trims = self.noises = 0

    def _buffer(self) -> int:
        self.buffers += 1
        return self.buffers - 1

    def build(self, module: nn.Module) -> _Layer:
        from snac.layers import DecoderBlock, NoiseBlock, ResidualUnit, Snake1d

        if isinstance(module, nn.Sequential):
            return _Sequence([self.build(m) for m in module])
        if isinstance(module, DecoderBlock):
            return self.build(module.block)
        if isinstance(module, ResidualUnit):
            slot = self._buffer()
            inner = self.build(module.block)
            return _Residual(inner.layers, slot, module.block[0].alpha.shape[1])
        if isinstance(module, (Snake1d, nn.Tanh, nn.Identity)):
            return _Pointwise(module)
        if isinstance(module, KeyedNoiseBlock):
            self.noises += 1
            return _Noise(module, self.noises - 1)
        if isinstance(module, NoiseBlock):
            raise ValueError("SNAC's own NoiseBlock draws torch.randn per call: install the "
                             "keyed noise (SnacCodec) before streaming")
        if isinstance(module, nn.ConvTranspose1d):
            self.trims += 1
            return _ConvTranspose(module, self._buffer(), self.trims - 1)
        if isinstance(module, nn.Conv1d):
            if module.kernel_size[0] == 1 and module.padding[0] == 0:
                return _PointConv(module)
            return _Conv(module, self._buffer())
        raise ValueError(f"no streaming form for {type(module).__name__}")


class SnacStreamDecoder:
    """SNAC's quantizer and decoder, stepped: ``decode`` takes each stream's new steps and
    returns each window's audio, equal to the one-pass decode."""

    def __init__(self, model: nn.Module, level_cols: Sequence[np.ndarray],
                 device: torch.device, samples_per_step: int) -> None:
        """``model``: a SNAC whose noise blocks are keyed (``SnacCodec`` installs them)."""
        self.model, self.device = model, device
        self._level_cols = list(level_cols)
        self._layers = _Builder().build(model.decoder.model)
        self._latent_channels = int(model.decoder.model[0].in_channels)
        self.samples_per_step = samples_per_step
        self.delay_samples = int(self._layers.delay(0))
        """How far the final audio trails the steps fed (SNAC 24 kHz: 4757 samples)."""
        self.lookahead_steps = math.ceil(self.delay_samples / self.samples_per_step)
        """Steps after a step whose audio is final: a window's right context."""

    def new_stream(self, seed: int) -> SnacStream:
        stream = SnacStream(seed=seed & SEED_MASK)  # as the windowed decode keys it
        self._layers.initial(stream, self.device)
        return stream

    @torch.inference_mode()
    def decode(self, batch: Sequence[CodecInput]) -> list[np.ndarray]:
        """One array per window: its kept steps' samples. A stream's windows go in order;
        streams whose layer shapes and new-step counts match run as one batch."""
        todo = [(np.asarray(item.codes)[item.stream.skip:], item.stream) for item in batch]
        for codes, part in todo:
            if part.stream.ended and len(codes):
                raise ValueError("steps sent to a stream that has ended")
        waiting = [(c, p) for c, p in todo if len(c) or (p.flush and not p.stream.ended)]
        while waiting:
            key = self._key(*waiting[0])
            group, seen, rest = [], set(), []
            for codes, part in waiting:
                if id(part.stream) not in seen and self._key(codes, part) == key:
                    group.append((codes, part))
                else:
                    rest.append((codes, part))
                seen.add(id(part.stream))  # a stream's later windows wait for its earlier
            self._step(group)
            waiting = rest
        return [self._hand_out(part) for _, part in todo]

    @staticmethod
    def _key(codes: np.ndarray, part: StreamPart) -> tuple:
        return len(codes), part.flush, part.stream.shapes()

    def _step(self, group: list[tuple[np.ndarray, StreamPart]]) -> None:
        streams = [part.stream for _, part in group]
        flush = group[0][1].flush
        state = _Group(streams, flush, self.device)
        audio = self._layers.run(self._latents([codes for codes, _ in group]), state)
        state.store()
        out = audio[:, 0, :].float().cpu().numpy()
        for row, (codes, part) in zip(out, group):
            stream = part.stream
            stream.audio = np.concatenate([stream.audio, row]) if len(stream.audio) else row
            stream.ended = flush

    def _latents(self, codes: list[np.ndarray]) -> torch.Tensor:
        """SNAC's quantizer output for the new steps: step by step, no context needed."""
        batch = np.stack(codes)
        if batch.shape[1] == 0:  # a flush with no new step
            return torch.zeros(len(codes), self._latent_channels, 0, device=self.device)
        levels = [torch.from_numpy(np.ascontiguousarray(batch[:, :, cols].reshape(len(codes), -1)))
                  .to(self.device) for cols in self._level_cols]
        return self.model.quantizer.from_codes(levels)

    def _hand_out(self, part: StreamPart) -> np.ndarray:
        stream = part.stream
        count = len(stream.audio) if part.last else \
            part.keep_end * self.samples_per_step - stream.handed_out
        if count > len(stream.audio):
            raise ValueError(f"window needs {count} samples, its stream has {len(stream.audio)} "
                             "final: less right context than the decoder's reach")
        out, stream.audio = stream.audio[:count], stream.audio[count:]
        stream.handed_out += count
        return out
