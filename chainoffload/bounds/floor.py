"""Memory: the keep-all memory at each op and the proven floor of pure offloading."""

from __future__ import annotations

import numpy as np

from ..chain import Chain

__all__ = ["keep_all_start_memory", "offload_memory_floor"]


def keep_all_start_memory(chain: Chain) -> np.ndarray:
    """Memory in use at the start of each compute op of the schedule that offloads nothing.

    Op k of the fixed order F_1..F_L, B_L..B_1, just after its own allocation, by ``docs/model.md``'s
    rules (every earlier op's frees have happened; no later op has started):

    * F_i: ``a_0 + saved_1 + ... + saved_i + fwd_tmp_i``;
    * B_i: ``a_0 + saved_1 + ... + saved_i + g_i + g_{i-1} + bwd_tmp_i`` where g_i (act[i]) was
      allocated by B_{i+1} (by B_i itself for i = L) and g_{i-1} is B_i's own allocation.

    The simulator's memory curve of :meth:`Schedule.keep_all` takes exactly these values at the
    op starts (tests check it) when every op has a positive duration; its peak is their maximum.

    Returns
    -------
    numpy.ndarray
        int64, length 2L, indexed like the compute sequence.
    """
    length = chain.length
    act = chain.act.astype(np.int64)
    cum = np.cumsum(chain.saved.astype(np.int64))  # cum[i-1] = saved_1 + ... + saved_i
    fwd_part = int(act[0]) + cum + chain.fwd_tmp.astype(np.int64)
    stages = np.arange(length, 0, -1)  # B_L .. B_1
    bwd_part = int(act[0]) + cum[stages - 1] + act[stages] + act[stages - 1] + chain.bwd_tmp.astype(np.int64)[stages - 1]
    return np.concatenate([fwd_part, bwd_part]).astype(np.int64)


def offload_memory_floor(chain: Chain) -> int:
    """A proven lower bound on the peak memory of every pure-offloading schedule of ``chain``.

    Whatever is offloaded and whenever, at the start of each op (just after its allocation)
    these bytes are on the GPU:

    * F_i: a_0, the whole unit i-1 (F_i reads a_{i-1}, so the GPU copy of unit i-1 is freed
      only at the end of F_i or later), saved[i] and fwd_tmp[i];
    * B_i: a_0, saved[i] (back on the GPU: P_i ends before B_{i+1} starts), the whole unit
      i-1 (P_{i-1} must end before B_i starts), g_i (allocated by B_{i+1}, or by B_L itself),
      g_{i-1} and bwd_tmp[i].

    "Unit 0" is a_0, counted once. Both hold for ops of duration zero too, by docs/model.md's
    rules for one instant: a zero-length op's frees come after its own allocation (order
    2k + 1), and so does the release of an offloaded original whose last reader is a
    zero-length op (rule "zero-length reader": a zero-length F_i still reads a_{i-1} when it
    allocates). The floor is the largest of these and of :meth:`Chain.stage_memory_floor`
    (below which :func:`chainoffload.solve` refuses the instance anyway).

    When every op takes some time, infinite bandwidth and no latency reach this floor:
    offloading every unit as soon as it is made and prefetching it just before its backward
    runs at it with no wait, and the fluid LP is feasible at exactly this memory (tests check
    both).

    Returns
    -------
    int
        Bytes.
    """
    if not isinstance(chain, Chain):
        raise TypeError(f"offload_memory_floor: chain must be a Chain, got {type(chain).__name__}")
    # Vectorised (the Python loop took ~4 s at 10^6 stages, before a time limit could act);
    # each sum adds chain sizes, below 2T < 2^61 (NOTE [ memory sums fit int64 ]): int64 is exact.
    act, saved = chain.act, chain.saved
    a0 = int(act[0])
    prev_unit = np.concatenate([[0], saved[:-1]])  # unit 0 is a_0, already counted
    # A zero-length op holds what it reads while it allocates (docs/model.md, "One instant"):
    # the floor was loose there (603 B where no schedule fits below 701 B, issue 33).
    f_need = a0 + saved + chain.fwd_tmp + prev_unit
    b_need = a0 + saved + prev_unit + act[1:] + act[:-1] + chain.bwd_tmp
    return int(max(chain.stage_memory_floor(), int(f_need.max()), int(b_need.max())))

