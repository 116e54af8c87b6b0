"""Brute-force oracle for tiny chains: enumerate schedules, simulate each, keep the best.

The oracle the CP-SAT model (``chainoffload.solvers.cpsat``) is held to. It walks the same
space as that model (NOTE [ cpsat: expressible timings ] there): every fixed-order schedule in
the format whose explicit ``before`` waits are on offloads, and judges each candidate with the
one simulator, so it shares no timing or memory code with the model.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator

from .chain import Chain
from .order import fixed_order, transfer_events, trigger, wait_ops
from .platform import Platform
from .result import Result, Status
from .schedule import Schedule, Transfer
from .simulate import simulate

__all__ = ["brute_force", "enumerate_schedules"]

# NOTE [ brute force: what is enumerated ]
# Per unit u (1..L, unit L included: offloading it frees nothing for long but can delay a
# queue): not offloaded, or moved whole or as a_u alone (``moves: "act"``, when act[u] differs
# from saved[u]: else both moves are the same schedule), with an offload trigger event e_O and
# a prefetch trigger e_P with
# end(F_u) <= e_O <= e_P <= end of the op before B_{u+1} (B_L for u = L; a prefetch triggered
# at or after the start of the backward that reads the unit is a read violation), and an
# optional `before` on the offload at an op after its trigger op and before B_{u+1} (at
# B_{u+1} or later it is implied by the wait on P_u, which starts after O_u ends). Waits on
# prefetches are not enumerated (they never free memory; the CP-SAT model has none either).
# Then every order of the transfers that share a channel and a trigger event (the list order
# decides their FIFO order).
#
# Pruning, none of which removes a distinct timeline:
# * the start of op k+1 is dropped as a trigger when op k+1 certainly starts at the instant op
#   k ends (an F op, or a B op with no prefetch to wait for, and no explicit wait on it): it is
#   then the same instant as the end of op k and, since ties at one event take every order,
#   every queue it could produce is produced from the end of op k;
# * an offload with no prefetch, or a prefetch before its offload, is malformed and skipped.


def enumerate_schedules(chain: Chain, platform: Platform) -> Iterator[Schedule]:
    """Every candidate schedule of NOTE [ brute force: what is enumerated ], lazily."""
    length = chain.length
    ops = fixed_order(length)
    n = len(ops)
    units = list(range(1, length + 1)) if platform.can_transfer else []
    channel = {"offload": 0, "prefetch": 1 if platform.duplex else 0}
    # 1. what each unit moves (nothing, all of it, or a_u alone) and the explicit waits.
    per_unit_waits = [[None, *wait_ops(length, u)] for u in units]
    per_unit_moves = [[None, "unit"] + (["act"] if chain.act[u] != chain.saved[u - 1] else []) for u in units]
    for chosen in itertools.product(*per_unit_moves):
        moves = {u: c for u, c in zip(units, chosen, strict=True) if c is not None}
        off = list(moves)
        wait_options = [per_unit_waits[u - 1] for u in off]
        for waits in itertools.product(*wait_options):
            before = dict(zip(off, waits, strict=True))
            waited = {b for b in waits if b is not None}
            # 2. trigger events, merging a start that certainly equals the previous end.
            certain = set()
            for k in range(1, n):
                kind, j = ops[k]
                if k in waited:
                    continue
                needs = {j - 1} | ({length} if j == length else set()) if kind == "B" else set()
                if kind == "F" or not (needs & set(off)):
                    certain.add(2 * k)
            event_options = []
            for u in off:
                lo, hi = transfer_events(length, u)
                events = [e for e in range(lo, hi + 1) if e not in certain]
                b = before[u]
                pairs = [
                    (eo, ep)
                    for eo in events
                    for ep in events
                    if eo <= ep and (b is None or eo // 2 < b)
                ]
                event_options.append(pairs)
            for events in itertools.product(*event_options):
                transfers = []
                for u, (eo, ep) in zip(off, events, strict=True):
                    transfers.append(Transfer("offload", u, *trigger(eo), before[u], moves[u]))
                    transfers.append(Transfer("prefetch", u, *trigger(ep), moves=moves[u]))
                yield from _tie_orders(ops, transfers, channel)


def _tie_orders(ops, transfers: list[Transfer], channel: dict[str, int]) -> Iterator[Schedule]:
    """Every list order that differs in the FIFO order of same-event, same-channel transfers."""
    groups: dict[tuple[int, int], list[Transfer]] = {}
    for t in transfers:
        groups.setdefault((t.event, channel[t.kind]), []).append(t)
    keys = sorted(groups)
    options = []
    for key in keys:
        members = groups[key]
        if len(members) == 1:
            options.append([members])
            continue
        perms = []
        for perm in itertools.permutations(members):
            # An offload and its own prefetch at one event: the offload must be listed first.
            seen: set[int] = set()
            ok = True
            for t in perm:
                if t.kind == "offload":
                    seen.add(t.unit)
                elif any(o.unit == t.unit and o.kind == "offload" for o in members) and t.unit not in seen:
                    ok = False
                    break
            if ok:
                perms.append(list(perm))
        options.append(perms)
    for choice in itertools.product(*options):
        out = [t for group in choice for t in group]
        yield Schedule(ops, tuple(out))


def brute_force(chain: Chain, platform: Platform, *, max_length: int = 6) -> Result:
    """The best schedule of a tiny chain by exhaustive enumeration and simulation.

    Parameters
    ----------
    chain, platform
        The instance.
    max_length
        Refuse chains longer than this. The count of candidates grows exponentially
        (measured: about 20 at L = 2, 2-3 * 10^3 at L = 3 and 0.6-1.2 * 10^6 at L = 4, about
        a minute there; L = 5 and 6 take hours).

    Returns
    -------
    Result
        Status ``optimal`` with the best feasible schedule (ties: the first enumerated) and
        ``lower_bound`` equal to its makespan, or ``infeasible`` when no candidate fits (with
        ``min_memory`` the least peak among candidates that only break the memory rule).
        ``info["candidates"]`` is the number simulated.

    Raises
    ------
    ValueError
        If ``chain.length > max_length``.
    """
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length: {max_length!r} must be an integer >= 1")
    if chain.length > max_length:
        raise ValueError(
            f"chain.length: {chain.length} stages is above max_length={max_length}; brute force enumerates "
            "exponentially many schedules (use method 'cpsat' instead)"
        )
    t0 = time.perf_counter()
    best: Schedule | None = None
    best_makespan = math.inf
    least_peak = math.inf
    count = 0
    for schedule in enumerate_schedules(chain, platform):
        count += 1
        tl = simulate(chain, platform, schedule)
        if tl.feasible:
            if tl.makespan < best_makespan:
                best, best_makespan = schedule, tl.makespan
        elif tl.violation.rule == "memory":
            least_peak = min(least_peak, tl.peak_memory)
    runtime = time.perf_counter() - t0
    if best is None:
        return Result(
            "brute-force",
            Status.INFEASIBLE,
            None,
            runtime=runtime,
            min_memory=None if not math.isfinite(least_peak) else int(least_peak),
            info={"candidates": count},
            message=f"brute-force: none of {count} schedules fits in {platform.memory} B",
        )
    return Result(
        "brute-force",
        Status.OPTIMAL,
        best,
        makespan=best_makespan,
        lower_bound=best_makespan,
        runtime=runtime,
        info={"candidates": count},
    )
