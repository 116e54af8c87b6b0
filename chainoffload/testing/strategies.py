"""Hypothesis strategies for chains, platforms, instances and schedules.

Every bound is keyword-only and every value drawn obeys :class:`~chainoffload.Chain`'s and
:class:`~chainoffload.Platform`'s rules: sizes are whole bytes (``int``), times are finite floats
>= 0. See :mod:`chainoffload.testing` for an example.

:func:`schedules` and :func:`broken_schedules` draw fixed-order schedules (F_1..F_L, B_L..B_1);
:func:`well_formed_schedules` draws fixed-order and rematerializing ones, triggered anywhere the
format allows (so the simulator may report read violations). :func:`schedules` with ``valid=True`` draws
schedules that pass :meth:`Schedule.validate <chainoffload.Schedule.validate>` and break no
``read`` rule of the simulator on any platform with both bandwidths above zero; whether they fit
in memory depends on the platform. :func:`broken_schedules` draws schedules that break exactly
one rule, each labelled with what the simulator must say (:data:`BROKEN_KINDS`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, NamedTuple

from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from ..chain import MAX_TOTAL_BYTES, Chain
from ..order import f_pos, fixed_order, prefetch_deadline, transfer_events, trigger
from ..platform import Platform
from ..schedule import Schedule, Transfer
from ..simulate import keep_all_peak

__all__ = [
    "chains",
    "platforms",
    "instances",
    "schedules",
    "broken_schedules",
    "well_formed_schedules",
    "Instance",
    "BrokenSchedule",
    "BROKEN_KINDS",
    "STRUCTURE",
    "READ",
]

#: ``BrokenSchedule.error`` of a schedule that :meth:`Schedule.validate` must reject with
#: :class:`~chainoffload.ScheduleError` (so :func:`~chainoffload.simulate` raises it).
STRUCTURE = "structure"
#: ``BrokenSchedule.error`` of a well-formed schedule whose simulation must report
#: ``violation.rule == "read"`` (when memory is ample, so that no memory violation comes first).
READ = "read"

#: Every kind :func:`broken_schedules` draws, with the error expected and what ``where`` holds.
#: For ``"structure"`` kinds ``where`` is a fragment of the ScheduleError message; for ``"read"``
#: kinds it is ``Violation.op``, the name of the op the simulator must blame.
BROKEN_KINDS: dict[str, str] = {
    # structure: Schedule.validate raises ScheduleError
    "prefetch_before_offload": STRUCTURE,  # P_i triggered at an earlier event than O_i (or same event, listed first)
    "before_not_after_trigger": STRUCTURE,  # a transfer's `before` op is at or before its trigger op
    "duplicate_offload": STRUCTURE,  # a second offload of the same unit
    "duplicate_prefetch": STRUCTURE,  # a second prefetch of the same unit
    "offload_without_prefetch": STRUCTURE,  # O_i with no P_i
    "prefetch_without_offload": STRUCTURE,  # P_i with no O_i
    "unit_out_of_range": STRUCTURE,  # a transfer of unit 0 or L + 1
    "trigger_out_of_range": STRUCTURE,  # a trigger op index outside 0..2L-1
    "compute_order": STRUCTURE,  # the compute sequence is not F_1..F_L, B_L..B_1
    # read: simulate() reports violation.rule == "read"
    "offload_before_forward_end": READ,  # O_i triggered before F_i ends (it would copy data not yet made); op O_i
    "prefetch_too_late": READ,  # P_i triggered at or after the start of B_{i+1} (B_L for i = L); op B_{i+1}
}


class Instance(NamedTuple):
    """A chain and a platform drawn together (unpacks as ``chain, platform``)."""

    chain: Chain
    platform: Platform


class BrokenSchedule(NamedTuple):
    """A schedule that breaks one rule, and what the simulator must say about it.

    Attributes
    ----------
    schedule
        The schedule.
    kind
        A key of :data:`BROKEN_KINDS`.
    error
        :data:`STRUCTURE` (``simulate`` raises :class:`~chainoffload.ScheduleError`) or
        :data:`READ` (``simulate(...).violation.rule == "read"``).
    where
        For ``STRUCTURE``: a fragment of the error message (e.g. ``"schedule.transfers[3].before"``).
        For ``READ``: the expected ``Violation.op`` (e.g. ``"O_2"`` or ``"B_3"``).
    """

    schedule: Schedule
    kind: str
    error: str
    where: str


# -- helpers ---------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")
    return value


def _check_offloads(chain: Chain, min_offloads: Any, max_offloads: Any) -> None:
    _check_int("min_offloads", min_offloads, 0)
    if min_offloads > chain.length:
        raise ValueError(f"min_offloads: {min_offloads} is above the chain's {chain.length} units")
    if max_offloads is not None:
        _check_int("max_offloads", max_offloads, 0)
        if max_offloads < min_offloads:
            raise ValueError(f"max_offloads: {max_offloads} is below min_offloads={min_offloads}")


def _check_float(name: str, value: Any, low: float = 0.0, *, allow_inf: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value) or value < low:
        raise ValueError(f"{name}: expected a number >= {low}, got {value!r}")
    if not allow_inf and math.isinf(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


# -- chains ----------------------------------------------------------------------------------


@st.composite
def _chains(
    draw,
    min_length: int,
    max_length: int,
    min_bytes: int,
    max_bytes: int,
    min_time: float,
    max_time: float,
    time_resolution: float | None,
    tmp: bool,
    nosave: bool,
    name: str | SearchStrategy[str],
) -> Chain:
    length = draw(st.integers(min_length, max_length))
    size = st.integers(min_bytes, max_bytes)

    if time_resolution is None:
        time = st.floats(min_time, max_time, allow_nan=False, allow_infinity=False, allow_subnormal=False)
    else:
        # Whole multiples of the resolution: sums and differences of such times are exact far
        # more often, which keeps comparisons between methods free of rounding noise.
        lo = math.ceil(min_time / time_resolution)
        hi = math.floor(max_time / time_resolution)
        time = st.integers(lo, hi).map(lambda k: k * time_resolution)

    act = draw(st.lists(size, min_size=length + 1, max_size=length + 1))
    # saved[i] >= act[i]: draw it in [act[i], max_bytes]
    saved = [draw(st.integers(act[i + 1], max(act[i + 1], max_bytes))) for i in range(length)]
    fixed = st.lists(time, min_size=length, max_size=length)
    fwd = draw(fixed)
    bwd = draw(fixed)
    zeros = [0] * length
    sizes = st.lists(size, min_size=length, max_size=length)
    fwd_tmp = draw(sizes) if tmp else zeros
    bwd_tmp = draw(sizes) if tmp else zeros
    fwd_nosave = draw(fixed) if nosave else None
    label = draw(name) if isinstance(name, SearchStrategy) else name
    return Chain(fwd, bwd, act, saved, fwd_tmp, bwd_tmp, fwd_nosave, name=label)


def chains(
    *,
    min_length: int = 1,
    max_length: int = 8,
    min_bytes: int = 0,
    max_bytes: int = 1 << 16,
    min_time: float = 0.0,
    max_time: float = 10.0,
    time_resolution: float | None = None,
    tmp: bool = True,
    nosave: bool = False,
    name: str | SearchStrategy[str] = "hypothesis",
) -> SearchStrategy[Chain]:
    """Chains of ``min_length..max_length`` stages.

    Parameters
    ----------
    min_length, max_length
        Bounds on the number of stages L (``1 <= min_length <= max_length``).
    min_bytes, max_bytes
        Bounds on every size (``act``, ``saved``, ``fwd_tmp``, ``bwd_tmp``), whole bytes. ``saved[i]``
        is drawn in ``[act[i], max_bytes]`` so that it includes the output.
    min_time, max_time
        Bounds on ``fwd``, ``bwd`` (and ``fwd_nosave``), seconds. ``min_time > 0`` gives chains
        without zero-length ops.
    time_resolution
        If given, every time is a whole multiple of it (e.g. ``0.5``); otherwise any float in range.
    tmp
        Draw ``fwd_tmp`` and ``bwd_tmp`` (else they are 0).
    nosave
        Draw an explicit ``fwd_nosave`` (else it defaults to ``fwd``).
    name
        The chain's name, or a strategy of names (e.g. ``st.text()`` for JSON round trips).

    Returns
    -------
    SearchStrategy[Chain]
        Shrinks towards short chains with small sizes and times.

    Raises
    ------
    ValueError
        If a bound is out of range; the message names it.
    """
    _check_int("min_length", min_length, 1)
    _check_int("max_length", max_length, 1)
    if max_length < min_length:
        raise ValueError(f"max_length: {max_length} is below min_length={min_length}")
    _check_int("min_bytes", min_bytes, 0)
    _check_int("max_bytes", max_bytes, 0)
    if max_bytes < min_bytes:
        raise ValueError(f"max_bytes: {max_bytes} is below min_bytes={min_bytes}")
    if (4 * max_length + 1) * max_bytes >= MAX_TOTAL_BYTES:
        # act (L + 1 values), saved, fwd_tmp and bwd_tmp (L each) must add up to less than 2^60
        raise ValueError(
            f"max_bytes: {max_bytes} is too large for max_length={max_length} (a chain's sizes must add up to less than 2^60)"
        )
    min_time = _check_float("min_time", min_time)
    max_time = _check_float("max_time", max_time)
    if max_time < min_time:
        raise ValueError(f"max_time: {max_time} is below min_time={min_time}")
    if not math.isfinite(2.0 * max_length * max_time):
        raise ValueError(f"max_time: {max_time} is too large for max_length={max_length} (sum(fwd) + sum(bwd) must be finite)")
    if time_resolution is not None:
        time_resolution = _check_float("time_resolution", time_resolution)
        if time_resolution <= 0:
            raise ValueError(f"time_resolution: expected a time > 0, got {time_resolution!r}")
        if math.floor(max_time / time_resolution) < math.ceil(min_time / time_resolution):
            raise ValueError(
                f"time_resolution: no multiple of {time_resolution} lies in [min_time={min_time}, max_time={max_time}]"
            )
    if not isinstance(name, (str, SearchStrategy)):
        raise ValueError(f"name: expected a string or a strategy of strings, got {name!r}")
    return _chains(
        min_length, max_length, min_bytes, max_bytes, min_time, max_time, time_resolution, bool(tmp), bool(nosave), name
    )


# instances() takes a keyword named ``chains``; this keeps the function reachable there.
_default_chains = chains


# -- platforms -------------------------------------------------------------------------------


def _memory_range(chain: Chain | None, min_memory: int | None, max_memory: int | None, slack: float) -> tuple[int, int, list[int]]:
    """The memory interval to draw from and the edge values worth trying first."""
    if chain is None:
        lo = 0 if min_memory is None else min_memory
        hi = 2**40 if max_memory is None else max_memory
        edges = [lo, hi]
    else:
        floor = chain.stage_memory_floor()
        peak = keep_all_peak(chain)
        lo = floor if min_memory is None else max(floor, min_memory)
        # max(): with zero-length ops the keep-all peak can lie below the floor (the simulator
        # frees a zero-length B_i's unit before it allocates its gradients at that instant)
        hi = max(lo, peak + math.ceil(slack * peak)) if max_memory is None else max_memory
        # the keep-all peak and one byte under it are where keep-all flips between fitting and not
        edges = [lo, hi, peak, peak - 1, floor]
    if hi < lo:
        raise ValueError(
            f"max_memory: the memory range is empty ({lo} B .. {hi} B"
            + (f"; the chain needs at least {chain.stage_memory_floor()} B)" if chain is not None else ")")
        )
    return lo, hi, sorted({e for e in edges if lo <= e <= hi})


@st.composite
def _bandwidth(draw, low: float, high: float, zero: bool, inf: bool) -> float:
    options = ["finite"] + (["zero"] if zero else []) + (["inf"] if inf else [])
    which = draw(st.sampled_from(options))
    if which == "zero":
        return 0.0
    if which == "inf":
        return math.inf
    if low == high:
        return low
    # log-uniform, so that slow and fast links are both common
    e = draw(st.floats(math.log2(low), math.log2(high), allow_nan=False, allow_infinity=False))
    return min(high, max(low, 2.0**e))


@st.composite
def _platforms(
    draw,
    chain: Chain | SearchStrategy[Chain] | None,
    min_memory: int | None,
    max_memory: int | None,
    memory_slack: float,
    min_bandwidth: float | None,
    max_bandwidth: float | None,
    zero_bandwidth: bool,
    inf_bandwidth: bool,
    symmetric: bool,
    min_latency: float,
    max_latency: float | None,
    duplex: bool | None,
) -> Platform:
    if isinstance(chain, SearchStrategy):
        chain = draw(chain)
    lo, hi, edges = _memory_range(chain, min_memory, max_memory, memory_slack)
    memory = draw(st.one_of(st.sampled_from(edges), st.integers(lo, hi)) if edges else st.integers(lo, hi))

    if chain is not None and (min_bandwidth is None or max_bandwidth is None):
        # The bandwidth at which moving every unit out takes as long as the whole compute:
        # 64x either side of it covers links where transfers hide entirely and where they dominate.
        moved = max(1.0, float(chain.saved.sum()))
        scale = moved / chain.compute_time if chain.compute_time > 0 else moved
    else:
        scale = 1e9
    b_lo = scale / 64 if min_bandwidth is None else min_bandwidth
    b_hi = scale * 64 if max_bandwidth is None else max_bandwidth
    b_lo = max(b_lo, 1e-300)
    if b_hi < b_lo:
        raise ValueError(f"max_bandwidth: {b_hi} is below min_bandwidth={b_lo}")
    bw = _bandwidth(b_lo, b_hi, zero_bandwidth, inf_bandwidth)
    d2h = draw(bw)
    h2d = d2h if symmetric else draw(bw)

    if max_latency is None:
        # up to a tenth of an average op, so that latency matters without dominating
        max_latency = chain.compute_time / (20 * chain.length) if chain is not None else 1e-3
    max_latency = max(max_latency, min_latency)
    latency = draw(st.floats(min_latency, max_latency, allow_nan=False, allow_infinity=False, allow_subnormal=False))
    dup = draw(st.booleans()) if duplex is None else duplex
    return Platform(memory=memory, bandwidth_d2h=d2h, bandwidth_h2d=h2d, latency=latency, duplex=dup)


def platforms(
    *,
    chain: Chain | SearchStrategy[Chain] | None = None,
    min_memory: int | None = None,
    max_memory: int | None = None,
    memory_slack: float = 0.25,
    min_bandwidth: float | None = None,
    max_bandwidth: float | None = None,
    zero_bandwidth: bool = False,
    inf_bandwidth: bool = False,
    symmetric: bool = False,
    min_latency: float = 0.0,
    max_latency: float | None = None,
    duplex: bool | None = None,
) -> SearchStrategy[Platform]:
    """Platforms, optionally sized for a chain.

    Parameters
    ----------
    chain
        A chain (or a strategy of chains) to size the platform for. With one, the memory is
        drawn in ``[chain.stage_memory_floor(), peak + ceil(memory_slack * peak)]`` where ``peak``
        is :func:`~chainoffload.keep_all_peak`, so some draws fit without offloading and the rest
        need it; the floor, the peak, ``peak - 1`` and the top are tried first. The default
        bandwidths are centred on the chain's own scale (total saved bytes / compute time).
    min_memory, max_memory
        Bounds on the memory limit in bytes (intersected with the chain's floor when a chain is
        given). Without a chain: ``0 .. 2**40``.
    memory_slack
        How far above the keep-all peak the memory may go, as a fraction of it.
    min_bandwidth, max_bandwidth
        Bounds (bytes/s, > 0) of the finite bandwidths, drawn log-uniformly. Default: 64x either
        side of the chain's scale, or of 1 GB/s without a chain.
    zero_bandwidth, inf_bandwidth
        Also draw the edge cases 0 (no transfer possible: simulating a schedule that moves data
        raises :class:`~chainoffload.PlatformError`) and ``inf`` (a transfer costs only the latency).
    symmetric
        Use the same bandwidth in both directions.
    min_latency, max_latency
        Bounds on the per-transfer latency in seconds. Default maximum: a twentieth of the average
        op time of the chain, 1 ms without a chain.
    duplex
        Fix the duplex flag; ``None`` draws it.

    Returns
    -------
    SearchStrategy[Platform]

    Raises
    ------
    ValueError
        If a bound is out of range or the memory range is empty; the message names the bound.
    """
    if chain is not None and not isinstance(chain, (Chain, SearchStrategy)):
        raise ValueError(f"chain: expected a Chain or a strategy of chains, got {type(chain).__name__}")
    if min_memory is not None:
        _check_int("min_memory", min_memory, 0)
    if max_memory is not None:
        _check_int("max_memory", max_memory, 0)
    if min_memory is not None and max_memory is not None and max_memory < min_memory:
        raise ValueError(f"max_memory: {max_memory} is below min_memory={min_memory}")
    memory_slack = _check_float("memory_slack", memory_slack)
    if min_bandwidth is not None:
        min_bandwidth = _check_float("min_bandwidth", min_bandwidth)
        if min_bandwidth <= 0:
            raise ValueError(f"min_bandwidth: expected a bandwidth > 0, got {min_bandwidth!r} (use zero_bandwidth=True for 0)")
    if max_bandwidth is not None:
        max_bandwidth = _check_float("max_bandwidth", max_bandwidth)
        if max_bandwidth <= 0:
            raise ValueError(f"max_bandwidth: expected a bandwidth > 0, got {max_bandwidth!r}")
    if min_bandwidth is not None and max_bandwidth is not None and max_bandwidth < min_bandwidth:
        raise ValueError(f"max_bandwidth: {max_bandwidth} is below min_bandwidth={min_bandwidth}")
    min_latency = _check_float("min_latency", min_latency)
    if max_latency is not None:
        max_latency = _check_float("max_latency", max_latency)
        if max_latency < min_latency:
            raise ValueError(f"max_latency: {max_latency} is below min_latency={min_latency}")
    if duplex is not None and not isinstance(duplex, bool):
        raise ValueError(f"duplex: expected True, False or None, got {duplex!r}")
    if isinstance(chain, Chain):
        _memory_range(chain, min_memory, max_memory, memory_slack)  # fail now, not at draw time
    return _platforms(
        chain,
        min_memory,
        max_memory,
        memory_slack,
        min_bandwidth,
        max_bandwidth,
        bool(zero_bandwidth),
        bool(inf_bandwidth),
        bool(symmetric),
        min_latency,
        max_latency,
        duplex,
    )


@st.composite
def _instances(draw, chain_strategy: SearchStrategy[Chain], platform_options: dict[str, Any]) -> Instance:
    chain = draw(chain_strategy)
    return Instance(chain, draw(platforms(chain=chain, **platform_options)))


def instances(*, chains: SearchStrategy[Chain] | None = None, **platform_options: Any) -> SearchStrategy[Instance]:
    """A chain and a platform sized for it, as an :class:`Instance` (unpacks as ``chain, platform``).

    Parameters
    ----------
    chains
        The strategy of chains; default :func:`chains` with its defaults.
    **platform_options
        Keyword arguments of :func:`platforms` other than ``chain``.

    Returns
    -------
    SearchStrategy[Instance]
    """
    if "chain" in platform_options:
        raise ValueError("chain: instances() draws the chain itself; pass chains=<strategy> instead")
    # A bad option fails here, not at draw time.
    platforms(**platform_options)
    chain_strategy = _default_chains() if chains is None else chains
    if not isinstance(chain_strategy, SearchStrategy):
        raise ValueError(f"chains: expected a strategy of chains, got {type(chain_strategy).__name__}")
    return _instances(chain_strategy, dict(platform_options))


# -- schedules -------------------------------------------------------------------------------


@st.composite
def _listed(draw, pairs: list[tuple[int, int, int]], n: int, waits: bool, granular: bool = False) -> list[Transfer]:
    """Offloads and prefetches at the given ``(unit, offload event, prefetch event)``, with optional
    ``before`` waits, listed in a random order that keeps ties legal; with ``granular``, a pair
    may move a_i alone (``moves="act"``)."""
    out: list[Transfer] = []
    for u, e_o, e_p in pairs:
        moves = draw(st.sampled_from(("unit", "act"))) if granular else "unit"
        for kind, e in (("offload", e_o), ("prefetch", e_p)):
            op, at = trigger(e)
            before = None
            if waits and op + 1 < n:
                before = draw(st.one_of(st.none(), st.integers(op + 1, n - 1)))
            out.append(Transfer(kind, u, op, at, before, moves))
    order = draw(st.permutations(range(len(out))))
    listed = [out[k] for k in order]
    # An offload and its prefetch at the same event: the offload must come first in the list.
    pos = {(t.kind, t.unit): k for k, t in enumerate(listed)}
    for u, _, _ in pairs:
        ko, kp = pos[("offload", u)], pos[("prefetch", u)]
        if listed[ko].event == listed[kp].event and kp < ko:
            listed[ko], listed[kp] = listed[kp], listed[ko]
    return listed


@st.composite
def _transfer_pairs(draw, length: int, units: Iterable[int], waits: bool, act_alone: bool = False) -> list[Transfer]:
    """One valid offload and prefetch per unit, listed in a random order that keeps ties legal;
    with ``act_alone``, a pair may move a_i alone."""
    pairs = []
    for u in units:
        first, last = transfer_events(length, u)  # from the end of F_u to just before its first backward reader
        # offsets shrink towards the natural plan: offload at once, prefetch as late as allowed
        e_o = first + draw(st.integers(0, last - first))
        e_p = last - draw(st.integers(0, last - e_o))
        pairs.append((u, e_o, e_p))
    return draw(_listed(pairs, 2 * length, waits, granular=act_alone))


@st.composite
def _valid_schedules(
    draw, chain: Chain, min_offloads: int, max_offloads: int | None, waits: bool, act_alone: bool = False
) -> Schedule:
    length = chain.length
    hi = length if max_offloads is None else min(length, max_offloads)
    units = sorted(draw(st.sets(st.integers(1, length), min_size=min_offloads, max_size=hi)))
    transfers = draw(_transfer_pairs(length, units, waits, act_alone))
    return Schedule(fixed_order(length), tuple(transfers))


def schedules(
    chain: Chain,
    *,
    valid: bool = True,
    min_offloads: int = 0,
    max_offloads: int | None = None,
    waits: bool = True,
    kinds: Iterable[str] | None = None,
    act_alone: bool = False,
) -> SearchStrategy[Schedule]:
    """Fixed-order schedules of ``chain``.

    Parameters
    ----------
    chain
        The chain the schedules are for.
    valid
        True: schedules that pass :meth:`Schedule.validate <chainoffload.Schedule.validate>` and
        that the simulator accepts on any platform with both bandwidths above zero and memory at
        least their peak: a random set of offloaded units (unit L included), each offload
        triggered at or after the end of F_i, each prefetch at or after its offload and before the
        start of B_{i+1} (B_L for i = L), optional random ``before`` waits, transfers listed in a
        random order. False: schedules that break exactly one rule, drawn from
        :func:`broken_schedules` (use that to know which rule and what error to expect).
    min_offloads, max_offloads
        Bounds on the number of offloaded units (``valid=True``).
    waits
        Draw explicit ``before`` waits (``valid=True``).
    kinds
        For ``valid=False``, the kinds of breakage to draw (keys of :data:`BROKEN_KINDS`).
    act_alone
        Also draw transfers that move a_i alone (``moves="act"``, ``valid=True``): what the
        bounds and ``cpsat`` must cover, since the simulator accepts them.

    Returns
    -------
    SearchStrategy[Schedule]
        Shrinks towards fewer units, earliest offloads, latest prefetches and no waits.
    """
    if not isinstance(chain, Chain):
        raise ValueError(f"chain: expected a Chain, got {type(chain).__name__}")
    if not valid:
        return broken_schedules(chain, kinds=kinds).map(lambda b: b.schedule)
    if kinds is not None:
        raise ValueError("kinds: only for valid=False")
    _check_offloads(chain, min_offloads, max_offloads)
    return _valid_schedules(chain, min_offloads, max_offloads, bool(waits), bool(act_alone))


def _find(transfers: list[Transfer], kind: str, unit: int) -> int:
    return next(k for k, t in enumerate(transfers) if t.kind == kind and t.unit == unit)


@st.composite
def _broken(draw, chain: Chain, kinds: tuple[str, ...]) -> BrokenSchedule:
    length = chain.length
    n = 2 * length
    kind = draw(st.sampled_from(kinds))
    base = draw(_valid_schedules(chain, 1, None, True))
    tr = list(base.transfers)
    compute = list(base.compute)
    unit = draw(st.sampled_from(base.offloaded_units))
    ko, kp = _find(tr, "offload", unit), _find(tr, "prefetch", unit)
    o, p = tr[ko], tr[kp]
    where = ""
    if kind == "prefetch_before_offload":
        # any event before the offload's, or the same event listed ahead of it
        e = draw(st.integers(0, o.event))
        op, at = trigger(e)
        tr[kp] = Transfer("prefetch", unit, op, at, None)
        if e == o.event and kp > ko:
            tr[ko], tr[kp] = tr[kp], tr[ko]
        where = f"the prefetch of unit {unit} is triggered before its offload"
    elif kind == "before_not_after_trigger":
        k = draw(st.sampled_from([ko, kp]))
        t = tr[k]
        tr[k] = Transfer(t.kind, t.unit, t.op, t.at, draw(st.integers(0, t.op)))
        where = f"schedule.transfers[{k}].before"
    elif kind in ("duplicate_offload", "duplicate_prefetch"):
        src = o if kind == "duplicate_offload" else p
        tr.insert(draw(st.integers(0, len(tr))), Transfer(src.kind, src.unit, src.op, src.at, None))
        where = f"unit {unit} has a second {src.kind}"
    elif kind == "offload_without_prefetch":
        del tr[kp]
        where = f"unit {unit} is offloaded but never prefetched"
    elif kind == "prefetch_without_offload":
        del tr[ko]
        where = f"unit {unit} is prefetched but never offloaded"
    elif kind == "unit_out_of_range":
        bad = draw(st.sampled_from([0, length + 1]))
        k = draw(st.integers(0, len(tr)))
        tr.insert(k, Transfer(draw(st.sampled_from(["offload", "prefetch"])), bad, o.op, o.at, None))
        where = f"schedule.transfers[{k}].unit"
    elif kind == "trigger_out_of_range":
        bad = draw(st.sampled_from([-1, n, n + 7]))
        k = draw(st.integers(0, len(tr)))
        tr.insert(k, Transfer(draw(st.sampled_from(["offload", "prefetch"])), unit, bad, "end", None))
        where = f"schedule.transfers[{k}].trigger.op"
    elif kind == "compute_order":
        how = draw(st.sampled_from(["swap", "drop"]))
        if how == "swap":
            a = draw(st.integers(0, n - 2))
            compute[a], compute[a + 1] = compute[a + 1], compute[a]
        else:
            del compute[draw(st.integers(0, n - 1))]
        where = "schedule.compute"
    elif kind == "offload_before_forward_end":
        # from time 0 up to the start of F_i: the unit does not exist yet
        e = draw(st.integers(0, 2 * f_pos(unit)))
        op, at = trigger(e)
        tr[ko] = Transfer("offload", unit, op, at, None)
        where = f"O_{unit}"
    elif kind == "prefetch_too_late":
        e = draw(st.integers(prefetch_deadline(length, unit), 2 * n - 1))
        op, at = trigger(e)
        tr[kp] = Transfer("prefetch", unit, op, at, None)
        where = f"B_{unit + 1 if unit < length else length}"
    else:  # pragma: no cover - kinds are checked by broken_schedules()
        raise AssertionError(kind)
    return BrokenSchedule(Schedule(tuple(compute), tuple(tr)), kind, BROKEN_KINDS[kind], where)


def broken_schedules(chain: Chain, *, kinds: Iterable[str] | None = None) -> SearchStrategy[BrokenSchedule]:
    """Fixed-order schedules of ``chain`` that break exactly one rule, with the expected verdict.

    Each is a valid schedule from :func:`schedules` with one change (see :data:`BROKEN_KINDS`):

    ========================== ========= =========================================================
    kind                       error     what is broken; what ``simulate`` says
    ========================== ========= =========================================================
    prefetch_before_offload    structure P_i triggered before O_i; ScheduleError "triggered before its offload"
    before_not_after_trigger   structure ``before`` <= trigger op; ScheduleError "transfers[k].before"
    duplicate_offload          structure a second O_i; ScheduleError "has a second offload"
    duplicate_prefetch         structure a second P_i; ScheduleError "has a second prefetch"
    offload_without_prefetch   structure O_i alone; ScheduleError "offloaded but never prefetched"
    prefetch_without_offload   structure P_i alone; ScheduleError "prefetched but never offloaded"
    unit_out_of_range          structure unit 0 or L + 1; ScheduleError "transfers[k].unit"
    trigger_out_of_range       structure op -1, 2L or more; ScheduleError "transfers[k].trigger.op"
    compute_order              structure two ops swapped or one dropped; ScheduleError "schedule.compute"
    offload_before_forward_end read      O_i triggered before F_i ends; violation rule "read", op O_i
    prefetch_too_late          read      P_i triggered at or after B_{i+1} starts (B_L for i = L);
                                         violation rule "read", op B_{i+1} (B_L)
    ========================== ========= =========================================================

    A ``read`` verdict is the first violation only when memory is ample (otherwise a memory
    violation may come earlier); a memory violation is drawn by simulating a valid schedule on a
    platform whose memory is below its peak.

    Parameters
    ----------
    chain
        The chain the schedules are for.
    kinds
        The kinds to draw; default all of :data:`BROKEN_KINDS`.

    Returns
    -------
    SearchStrategy[BrokenSchedule]
    """
    if not isinstance(chain, Chain):
        raise ValueError(f"chain: expected a Chain, got {type(chain).__name__}")
    chosen = tuple(BROKEN_KINDS) if kinds is None else tuple(kinds)
    unknown = [k for k in chosen if k not in BROKEN_KINDS]
    if unknown or not chosen:
        raise ValueError(f"kinds: unknown kind(s) {unknown or chosen!r}; known: {', '.join(BROKEN_KINDS)}")
    return _broken(chain, chosen)


# -- any well-formed schedule, fixed-order or rematerializing ---------------------------------


@st.composite
def _remat_sequence(draw, length: int, force: bool) -> tuple[tuple[str, int], ...]:
    """A rotor-style persistent sequence: each segment keeps its whole first unit, or a checkpoint."""
    ops: list[tuple[str, int]] = []

    def segment(s: int, t: int, top: bool) -> None:
        # Runs B_t..B_s with a_{s-1} resident and nothing of stages s..t resident on entry.
        # 0: F_s, then (s+1..t), then B_s -- the fixed order when chosen everywhere;
        # 1: Fck_s then F_s over the lone a_s it made (both counted while F_s runs);
        # 2: checkpoint: Fck_s, Fn_{s+1}..Fn_{j-1}, then (j..t), then (s..j-1) again from a_{s-1}.
        # Fck_s needs a reader of a_s still to come: B_{s+1} has run unless s < t or t = L.
        low = 1 if (top and force) else 0
        how = draw(st.integers(low, 2 if s < t else (1 if t == length else 0)))
        if how == 2:
            j = draw(st.integers(s + 1, t))
            ops.append(("Fck", s))
            ops.extend(("Fn", k) for k in range(s + 1, j))
            segment(j, t, False)
            segment(s, j - 1, False)
            return
        if how == 1:
            ops.append(("Fck", s))
        ops.append(("F", s))
        if s < t:
            segment(s + 1, t, False)
        ops.append(("B", s))

    segment(1, length, True)
    return tuple(ops)


@st.composite
def _well_formed(draw, chain: Chain, remat: bool | None, min_offloads: int, max_offloads: int | None, waits: bool) -> Schedule:
    length = chain.length
    kind = remat if remat is not None else draw(st.booleans())
    compute = draw(_remat_sequence(length, True)) if kind else fixed_order(length)
    n = len(compute)
    hi = length if max_offloads is None else min(length, max_offloads)
    units = sorted(draw(st.sets(st.integers(1, length), min_size=min_offloads, max_size=hi)))
    pairs = []
    last_event = 2 * n - 1
    for u in units:
        makers = [k for k, (op, stage) in enumerate(compute) if stage == u and op != "B"]
        readers = [k for k, (op, stage) in enumerate(compute) if op == "B" and stage in (u, u + 1)]
        # Mostly near a maker's end and before the first backward reader (what a solver does),
        # sometimes anywhere: the simulator must say what happens then.
        deadline = 2 * readers[0] - 1 if readers else last_event
        if draw(st.integers(0, 7)) < 7:
            made = 2 * draw(st.sampled_from(makers)) + 1
            e_o = made + draw(st.integers(0, min(3, max(0, deadline - made))))
        else:
            e_o = draw(st.integers(0, last_event))
        if draw(st.integers(0, 7)) < 7 and deadline >= e_o:
            e_p = deadline - draw(st.integers(0, deadline - e_o))
        else:
            e_p = draw(st.integers(e_o, last_event))
        pairs.append((u, e_o, e_p))
    listed = draw(_listed(pairs, n, waits, granular=True))
    return Schedule(compute, tuple(listed))


def well_formed_schedules(
    chain: Chain,
    *,
    remat: bool | None = None,
    min_offloads: int = 0,
    max_offloads: int | None = None,
    waits: bool = True,
) -> SearchStrategy[Schedule]:
    """Schedules of ``chain`` that pass :meth:`Schedule.validate <chainoffload.Schedule.validate>`,
    fixed-order or rematerializing, with transfers triggered anywhere the format allows.

    Unlike :func:`schedules`, these may break a ``read`` rule (an offload before its data is made,
    a prefetch too late to be waited for) and may move a_i alone (``moves="act"``): they are
    for testing a simulator, which must say so.
    Most triggers are drawn where a solver would put them (an offload just after a maker of its
    unit, a prefetch before the unit's first backward reader), the rest anywhere.

    Parameters
    ----------
    chain
        The chain the schedules are for.
    remat
        ``False``: the fixed order F_1..F_L, B_L..B_1. ``True``: a rematerializing sequence in
        rotor's shape (each segment keeps its first unit whole, or a checkpoint of its input and
        re-runs; ``Fck``, ``Fn`` and repeated ``F`` ops; sometimes an ``F_i`` run over the lone
        a_i an ``Fck_i`` made). ``None``: either.
    min_offloads, max_offloads
        Bounds on the number of units with an offload and a prefetch.
    waits
        Draw explicit ``before`` waits.

    Returns
    -------
    SearchStrategy[Schedule]
        Shrinks towards the fixed order, fewer units and triggers near the makers.
    """
    if not isinstance(chain, Chain):
        raise ValueError(f"chain: expected a Chain, got {type(chain).__name__}")
    if remat is not None and not isinstance(remat, bool):
        raise ValueError(f"remat: expected True, False or None, got {remat!r}")
    _check_offloads(chain, min_offloads, max_offloads)
    return _well_formed(chain, remat, min_offloads, max_offloads, bool(waits))
