"""Boundary marks: CUDA events and allocator figures on a GPU, ``perf_counter`` on CPU.

The profiler's recorder marks each stage's start and end with a :class:`Timer`; block discovery
uses one to time its forward with autograd, the profile's warm-up (NOTE [ discovery as the
warm-up ]).
"""

from __future__ import annotations

import time
from typing import Any

import torch

__all__ = ["Timer"]


class Timer:
    """Boundary marks: CUDA events and allocator figures on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device

    def mark(self) -> tuple[Any, int, int]:
        """(time or event, bytes allocated now, peak bytes since the previous mark)."""
        if not self.cuda:
            return time.perf_counter(), 0, 0
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        alloc = torch.cuda.memory_allocated(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        return ev, alloc, peak

    def seconds(self, a: Any, b: Any) -> float:
        if not self.cuda:
            return max(0.0, b - a)
        return max(0.0, a.elapsed_time(b) / 1e3)

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
