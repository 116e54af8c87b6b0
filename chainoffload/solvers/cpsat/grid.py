"""Integer durations of one instance: the time grid CP-SAT works on."""

from __future__ import annotations

import dataclasses
import math

from ...chain import Chain
from ...order import fixed_order
from ...platform import Platform, PlatformError
from .._options import OptionError

__all__ = ["TimeGrid"]

# NOTE [ cpsat: time scale ]
# CP-SAT needs integers. Every duration d (seconds) becomes round(d * scale) units (compute
# ops at least 1 unit, so that a zero-length op's transient still counts for an instant, as
# the simulator counts it). For the same decisions, every event time is a max-plus
# expression of durations, so the model's time / scale and the simulator's time differ by
# at most R / scale, where R = sum over all compute ops and all possible transfers of
# |round(d * scale) - d * scale| (`TimeGrid.slack`). Hence:
#   |simulated makespan - objective / scale| <= R / scale      (checked by the tests), and
#   lower_bound = (CP-SAT's proven bound - R) / scale.
# A gap below R units cannot be resolved by the integer model, so the search stops there
# (absolute_gap_limit = R) and reports optimal: then the simulated makespan is within
# 3 R / scale of the lower bound (`info["tolerance"]` is R / scale).
# The default scale puts the compute time at 10^6 units, so R / scale is ~1e-6 of it per
# stage. One caveat: two events from unrelated max-plus chains that coincide in integers
# (a free and an allocation at the same unit) may fall in the other order in floats. The
# solver then replays its schedule in the simulator before reporting it, and when the
# simulator rejects it re-solves on a perturbed scale (at most `_RETRIES` times) from the
# previous solution; it never reports a schedule the simulator rejects. The same caveat
# applies to the bound: it is proven for the integer model, and holds for the float instance
# unless the float optimum relies on such a coincidence (its rounded replay breaking memory).
# A float lower bound b on the makespan enters the integer model as "objective >=
# floor(b * scale - R)": every float schedule of makespan >= b replays in integers to at
# least b * scale - R units, so no integer solution that is a float schedule is cut off.

#: Units of the whole compute time on the default grid.
TARGET_UNITS = 1_000_000

#: The longest duration the grid holds, in units: the largest float below which every integer is exact.
MAX_UNITS = 2.0**53

#: The most units the default grid gives the horizon (every compute op and every transfer the
#: model may pick, end to end: no schedule of the model's space is longer). A slow link beside a
#: fast compute (transfers 10^10 times the compute time) put a copy beyond MAX_UNITS on the
#: default grid and a valid instance was refused as misuse (issue 33); the default scale is
#: lowered instead until the horizon fits, with 2^13 to spare below MAX_UNITS for sums.
HORIZON_UNITS = 2.0**40


@dataclasses.dataclass(frozen=True)
class TimeGrid:
    """Integer durations of one instance at one time scale.

    Attributes
    ----------
    scale
        Integer units per second.
    op
        Duration of each compute op of the fixed order (index into ``fixed_order``), units.
    offload, prefetch
        Duration of O_u / P_u moving unit u whole, at index u - 1, units (``None`` when a link
        has bandwidth 0).
    offload_act, prefetch_act
        The same when they move a_u alone (act[u] bytes; ``moves: "act"``).
    slack
        R: the sum of all rounding errors, in units (NOTE [ cpsat: time scale ]).
    """

    scale: float
    op: tuple[int, ...]
    offload: tuple[int, ...] | None
    prefetch: tuple[int, ...] | None
    offload_act: tuple[int, ...] | None
    prefetch_act: tuple[int, ...] | None
    slack: float

    @classmethod
    def build(cls, chain: Chain, platform: Platform, scale: float | None = None) -> TimeGrid:
        """Round ``chain``'s and ``platform``'s durations at ``scale`` (default: compute time = 10^6 units)."""
        if scale is None:
            base = chain.compute_time
            scale = TARGET_UNITS / base if base > 0 else 1.0
            horizon = cls.horizon(chain, platform)
            if not math.isfinite(horizon):
                # Copies so long that their sum overflows float64 (latency 1e308 s): no grid
                # counts them, and the simulator's times would overflow too.
                raise PlatformError(
                    f"platform.latency / bandwidth: copies take so long (latency {platform.latency:.6g} s, bandwidth "
                    f"{platform.bandwidth_d2h:.6g} / {platform.bandwidth_h2d:.6g} B/s) that their sum overflows float64; "
                    "cpsat's integer time grid cannot count them")
            if horizon * scale > HORIZON_UNITS:
                scale = HORIZON_UNITS / horizon
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise OptionError(f"time_scale: {scale!r} must be a finite number of units per second > 0")
        scale = float(scale)
        err = 0.0
        ops = []
        for kind, stage in fixed_order(chain.length):
            d = float(chain.fwd[stage - 1] if kind == "F" else chain.bwd[stage - 1]) * scale
            di = max(1, int(round(d)))
            err += abs(di - d)
            ops.append(di)
        transfers: list[tuple[int, ...] | None] = []
        # Whole units (saved[u]) and a_u alone (act[u]); every transfer the model may pick
        # counts in R, whichever move it makes.
        for sizes in (chain.saved, chain.act[1:]):
            for timer in (platform.d2h_time, platform.h2d_time):
                times = [timer(int(s)) for s in sizes]
                if not all(math.isfinite(t) for t in times):
                    transfers.append(None)
                    continue
                row = []
                for s, t in zip(sizes, times, strict=True):
                    if not t * scale <= MAX_UNITS:
                        # A finite time can still overflow once scaled (latency 1e308 s): the model
                        # counts in integers, and a float beyond 2^53 is no longer a whole count.
                        bandwidth = platform.bandwidth_d2h if timer == platform.d2h_time else platform.bandwidth_h2d
                        # Only a scale given by the caller gets here: the default fits the horizon.
                        raise OptionError(
                            f"time_scale: {scale:.6g} units per second puts a copy of {int(s)} B ({t:.6g} s: latency "
                            f"{platform.latency:.6g} s, bandwidth {bandwidth:.6g} B/s) beyond the integer grid's "
                            f"{MAX_UNITS:.3g} units; give at most {HORIZON_UNITS / cls.horizon(chain, platform):.6g}, or leave it out"
                        )
                    di = int(round(t * scale))
                    err += abs(di - t * scale)
                    row.append(di)
                transfers.append(tuple(row))
        if any(t is None for t in transfers):
            transfers = [None] * 4
        # Float sums in another order, for safety: one unit per 2^40 of the horizon.
        err += sum(ops) * 2.0**-40
        return cls(scale, tuple(ops), transfers[0], transfers[1], transfers[2], transfers[3], err)

    @staticmethod
    def horizon(chain: Chain, platform: Platform) -> float:
        """Seconds no schedule of the model's space exceeds: every compute op, then every
        transfer it may pick (each unit whole and a_u alone, both ways), one after another."""
        total = float(chain.compute_time)
        for timer in (platform.d2h_time, platform.h2d_time):
            times = [timer(int(s)) for s in chain.saved] + [timer(int(a)) for a in chain.act[1:]]
            finite = [t for t in times if math.isfinite(t)]
            total += sum(finite)
        return total if total > 0 else 1.0

    def fits(self, chain: Chain, platform: Platform, scale: float) -> bool:
        """Whether a grid at ``scale`` holds this instance's horizon (for a perturbed retry)."""
        return self.horizon(chain, platform) * scale <= HORIZON_UNITS

    @property
    def can_transfer(self) -> bool:
        """Whether both directions have finite transfer times."""
        return self.offload is not None

    def transfer(self, kind: str, unit: int, moves: str = "unit") -> int:
        """Units of the ``kind`` (offload / prefetch) transfer of ``unit`` that ``moves`` unit / act."""
        table = {("offload", "unit"): self.offload, ("prefetch", "unit"): self.prefetch,
                 ("offload", "act"): self.offload_act, ("prefetch", "act"): self.prefetch_act}[kind, moves]
        return table[unit - 1]

    def units_below(self, seconds: float) -> int:
        """The largest integer objective that a float makespan of ``seconds`` or more cannot replay under.

        NOTE [ cpsat: time scale ]: ``floor(seconds * scale - R)``, never below 0.
        """
        if not math.isfinite(seconds):
            return 0
        return max(0, int(math.floor(seconds * self.scale - self.slack)))
