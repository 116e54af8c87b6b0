"""Chains and platforms shared by the tests of the remat + offload DPs (joint, joint_exact)."""

from __future__ import annotations

import numpy as np

from chainoffload.chain import Chain
from chainoffload.platform import Platform
from chainoffload.simulate import keep_all_peak


def random_chain(rng, length):
    """A small chain with uneven sizes and times, and a cheaper forward without autograd."""
    act = rng.integers(1, 100, length + 1) * 1000
    saved = act[1:] + rng.integers(0, 300, length) * 1000
    fwd = rng.uniform(0.5, 2.0, length)
    return Chain(fwd, fwd * rng.uniform(1, 3, length), act, saved, rng.integers(0, 50, length) * 1000,
                 rng.integers(0, 50, length) * 1000, fwd_nosave=fwd * rng.uniform(0.5, 1.0, length))


def instances(seed, count, lengths=(2, 14)):
    """``count`` (chain, platform) pairs: memory anywhere from the floor to the keep-all peak,
    links from very slow to fast, with and without latency, duplex or not."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        chain = random_chain(rng, int(rng.integers(*lengths)))
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        memory = int(floor + rng.uniform(0.02, 1.0) * (top - floor))
        bw = float(rng.choice([1e4, 1e5, 3e5, 1e6, 1e8]))
        yield chain, Platform(memory=memory, bandwidth_d2h=bw, bandwidth_h2d=bw,
                              latency=float(rng.choice([0.0, 0.01])), duplex=bool(rng.integers(0, 2)))


def slow_link_chain(rng, length=30):
    """Units of 1-64 MiB times 1-5 with ~2 ps of forward per byte: at 25 GB/s a unit takes 10-40
    times its own forward to copy, so no copy hides behind one op."""
    act = rng.integers(1 << 20, 1 << 26, size=length + 1)
    saved = act[1:] * rng.integers(1, 6, size=length)
    fwd = saved * 2e-12 * rng.uniform(0.5, 2.0, size=length)
    return Chain(fwd, 2 * fwd, act, saved, act[1:] // 2, act[1:])


def fraction_platform(chain, fraction, bandwidth=25e9, latency=1e-5):
    """The platform whose memory is ``fraction`` of the way from the chain's floor to its peak."""
    floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
    return Platform(memory=int(floor + fraction * (top - floor)), bandwidth_d2h=bandwidth, bandwidth_h2d=bandwidth,
                    latency=latency)


def unit_heavy_instances(seed, count):
    """Chains whose units are 4-12 times their output, on slow links: moving a_{i} alone out of a
    kept unit i can pay where moving the whole unit cannot."""
    rng = np.random.default_rng(seed)
    for _ in range(count):
        length = int(rng.integers(4, 7))
        act = rng.integers(10, 40, length + 1) * 1000
        saved = act[1:] * rng.integers(4, 12, length)
        fwd = rng.uniform(0.5, 2.0, length)
        chain = Chain(fwd, 2 * fwd, act, saved, np.zeros(length, int), np.zeros(length, int))
        floor, top = chain.stage_memory_floor(), keep_all_peak(chain)
        bw = float(rng.choice([2e4, 5e4, 1e5]))
        yield chain, Platform(memory=int(floor + rng.uniform(0.3, 0.95) * (top - floor)), bandwidth_d2h=bw,
                              bandwidth_h2d=bw)
