"""Random chains of realistic spread, for tests, benchmarks and users who test their own solvers.

Real networks have stages whose activations differ by one or two orders of magnitude (a
ResNet's first block against its last, an attention layer against a norm), a saved footprint a
few times the output (the inputs and intermediates autograd keeps), and times that grow with
the bytes a stage touches. :func:`random_chain` draws chains with those traits, reproducibly.
"""

from __future__ import annotations

import math

import numpy as np

from .chain import Chain

__all__ = ["random_chain"]


def random_chain(
    rng: np.random.Generator | int,
    length: int,
    *,
    act_size: int = 1 << 20,
    spread: float = 100.0,
    saved_ratio: tuple[float, float] = (1.0, 4.0),
    time_per_byte: float = 1e-9,
    time_noise: float = 0.3,
    bwd_ratio: tuple[float, float] = (1.5, 2.5),
    tmp_ratio: float = 0.25,
    name: str | None = None,
) -> Chain:
    """Draw a chain of ``length`` stages with sizes and times of realistic spread.

    Parameters
    ----------
    rng
        A numpy ``Generator``, or an integer seed for a fresh one. The same seed gives the same chain.
    length
        Number of stages L (>= 1).
    act_size
        The smallest activation size in bytes; a_i is drawn log-uniformly in
        ``[act_size, act_size * spread]`` (a_0 included).
    spread
        Ratio of the largest to the smallest activation size (>= 1); 100 is two orders of magnitude.
    saved_ratio
        ``saved[i] / act[i]`` is drawn uniformly in this range (low >= 1): what autograd keeps
        besides the output.
    time_per_byte
        Seconds of forward compute per saved byte, on average.
    time_noise
        Standard deviation of the log-normal noise on each forward time (0: times exactly
        proportional to saved bytes).
    bwd_ratio
        ``bwd[i] / fwd[i]`` is drawn uniformly in this range.
    tmp_ratio
        ``fwd_tmp[i]`` and ``bwd_tmp[i]`` are drawn uniformly in ``[0, tmp_ratio * act[i]]``.
    name
        The chain's label; default ``"random-L<length>"``.

    Returns
    -------
    Chain
        A validated chain; sizes are whole bytes, times in seconds.

    Raises
    ------
    ValueError
        If a parameter is out of range; the message names it.
    """
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        rng = np.random.default_rng(int(rng))
    if not isinstance(rng, np.random.Generator):
        raise ValueError(f"rng: expected a numpy Generator or an integer seed, got {type(rng).__name__}")
    if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or length < 1:
        raise ValueError(f"length: expected an integer >= 1, got {length!r}")
    if not (isinstance(act_size, (int, np.integer)) and act_size >= 1):
        raise ValueError(f"act_size: expected an integer >= 1 byte, got {act_size!r}")
    if not (math.isfinite(spread) and spread >= 1):
        raise ValueError(f"spread: expected a finite ratio >= 1, got {spread!r}")
    lo, hi = saved_ratio
    if not (1.0 <= lo <= hi and math.isfinite(hi)):
        raise ValueError(f"saved_ratio: expected (low, high) with 1 <= low <= high, got {saved_ratio!r}")
    if not (math.isfinite(time_per_byte) and time_per_byte > 0):
        raise ValueError(f"time_per_byte: expected a finite time > 0, got {time_per_byte!r}")
    if not (math.isfinite(time_noise) and time_noise >= 0):
        raise ValueError(f"time_noise: expected a finite value >= 0, got {time_noise!r}")
    blo, bhi = bwd_ratio
    if not (0 < blo <= bhi and math.isfinite(bhi)):
        raise ValueError(f"bwd_ratio: expected (low, high) with 0 < low <= high, got {bwd_ratio!r}")
    if not (math.isfinite(tmp_ratio) and tmp_ratio >= 0):
        raise ValueError(f"tmp_ratio: expected a finite value >= 0, got {tmp_ratio!r}")
    length = int(length)
    act = np.floor(act_size * np.exp(rng.uniform(0.0, math.log(spread), length + 1))).astype(np.int64)
    saved = np.ceil(act[1:] * rng.uniform(lo, hi, length)).astype(np.int64)
    fwd = saved * time_per_byte * np.exp(rng.normal(0.0, time_noise, length))
    bwd = fwd * rng.uniform(blo, bhi, length)
    fwd_tmp = np.floor(act[1:] * rng.uniform(0.0, tmp_ratio, length)).astype(np.int64)
    bwd_tmp = np.floor(act[1:] * rng.uniform(0.0, tmp_ratio, length)).astype(np.int64)
    return Chain(
        fwd.tolist(),
        bwd.tolist(),
        act.tolist(),
        saved.tolist(),
        fwd_tmp.tolist(),
        bwd_tmp.tolist(),
        name=name if name is not None else f"random-L{length}",
    )
