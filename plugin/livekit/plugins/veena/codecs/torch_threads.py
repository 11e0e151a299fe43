"""Torch's CPU threads and the codec: one OpenMP team in the process, the decoding thread's.

On a CPU, torch runs its ops on an OpenMP thread team per calling thread, and libgomp
spins between parallel regions only while the process holds no more OpenMP threads than
cores. A codec decode is hundreds of small ops, so a second team (the main thread's, left
by building the model there) makes every decode about half as slow again (57 → 85 ms for a
4-frame SNAC window on 2 cores). The model is therefore built with one thread, and its
warm-up and decodes run on the decode scheduler's thread alone.
"""

from __future__ import annotations

import contextlib
from typing import Iterator


@contextlib.contextmanager
def single_threaded_torch(device: str) -> Iterator[None]:
    """Run the block with one torch CPU thread where ``device`` is the CPU (no OpenMP team
    is left behind on this thread), then give the thread count back; elsewhere, as is."""
    if not device.startswith("cpu"):
        yield
        return
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
