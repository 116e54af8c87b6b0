"""The model's decision variables, as typed records.

One :class:`OpVar` per compute op of the fixed order, one :class:`UnitVar` per unit that can be
offloaded (its offload and prefetch as :class:`TransferVar`), the channel-order literals and
the literals that say which term each start's maximum takes (NOTE [ cpsat: expressible
timings ] in :mod:`.constraints`). Only variables live here; :mod:`.constraints` relates them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...chain import Chain
from ...order import fixed_order, transfer_events, wait_ops
from ...platform import Platform
from .grid import TimeGrid

__all__ = ["OpVar", "TransferVar", "UnitVar", "Variables", "TransferKey", "Cause"]

#: ("O", u) for the offload of unit u, ("P", u) for its prefetch.
TransferKey = tuple[str, int]
#: What a start may equal: "trigger", "offload" (a prefetch's own offload's end), "previous"
#: (an op's predecessor's end), or a transfer's key (that transfer's end).
Cause = str | TransferKey


@dataclasses.dataclass(frozen=True)
class OpVar:
    """Compute op ``index`` of the fixed order.

    Attributes
    ----------
    index, kind, stage
        Position in the fixed order, ``"F"`` or ``"B"``, stage 1..L.
    duration
        Units (at least 1; NOTE [ cpsat: time scale ]).
    start, end
        Integer variables, ``end = start + duration``.
    gap
        True when the op starts after its predecessor ends (it waited); ``None`` for op 0.
    """

    index: int
    kind: str
    stage: int
    duration: int
    start: Any
    end: Any
    gap: Any | None


@dataclasses.dataclass(frozen=True)
class TransferVar:
    """The offload or the prefetch of one unit.

    Attributes
    ----------
    kind
        ``"offload"`` or ``"prefetch"``.
    unit
        Stage 1..L.
    duration
        Units, moving the whole unit.
    act_duration
        Units, moving a_u alone (``moves: "act"``); equal to ``duration`` when the unit has no
        such move (act[u] = saved[u]).
    size
        The duration the transfer takes in the model: ``duration``, or ``act_duration`` when its
        unit's ``alone`` literal is true.
    channel
        0 (D2H, or the one channel of a half-duplex link) or 1 (H2D).
    present
        The unit's ``offloaded`` literal: the transfer exists iff it is true.
    start, end, interval
        Its run on the channel (an optional interval).
    event
        Its trigger event (2k: start of op k, 2k + 1: end of op k), an integer variable.
    trigger_time
        The time of that event.
    triggers
        One literal per allowed event (:func:`chainoffload.order.transfer_events`): exactly
        one is true when the transfer exists.
    """

    kind: str
    unit: int
    duration: int
    act_duration: int
    size: Any
    channel: int
    present: Any
    start: Any
    end: Any
    interval: Any
    event: Any
    trigger_time: Any
    triggers: dict[int, Any]

    @property
    def key(self) -> TransferKey:
        """``("O", unit)`` or ``("P", unit)``."""
        return ("O" if self.kind == "offload" else "P", self.unit)

    @property
    def events(self) -> tuple[int, ...]:
        """The allowed trigger events, in order."""
        return tuple(self.triggers)


@dataclasses.dataclass(frozen=True)
class UnitVar:
    """A unit that may be offloaded.

    Attributes
    ----------
    unit
        Stage 1..L.
    offloaded
        Literal: the unit goes to the host and comes back.
    alone
        Literal: what moves is a_u alone (``moves: "act"``; implies ``offloaded``); ``None``
        when act[u] = saved[u], where both moves are one schedule.
    whole
        Literal: the unit is offloaded and moves whole (``offloaded`` itself when ``alone`` is
        ``None``).
    offload, prefetch
        Its two transfers.
    waits
        Op k -> literal "op k starts exactly when the offload ends, and waits for it"
        (``before = k``), for k in :func:`chainoffload.order.wait_ops`.
    """

    unit: int
    offloaded: Any
    alone: Any | None
    whole: Any
    offload: TransferVar
    prefetch: TransferVar
    waits: dict[int, Any]


class Variables:
    """Every decision variable of the model of one instance on one time grid.

    Parameters
    ----------
    model
        The ``CpModel`` to add them to.
    chain, platform, grid
        The instance and its integer durations.
    keep
        Units that must stay resident: they get no :class:`UnitVar`.

    Attributes
    ----------
    ops
        One :class:`OpVar` per op of the fixed order.
    units
        Unit -> :class:`UnitVar`, for every unit that may be offloaded (none when a link has
        bandwidth 0).
    channels
        The transfer keys of each channel, in order (D2H then H2D; one list on a half-duplex link).
    order
        (a, b) -> literal "a runs before b on their channel", for every pair of transfers of
        different units on one channel, a before b in ``channels``; (b, a) is its negation.
    transfer_cause
        Transfer key -> {cause: literal "the start equals this term"}.
    op_cause
        Per op, {cause: literal}; empty for op 0. Explicit waits are the ``waits`` literals.
    canonical
        Whether triggers are canonical (NOTE [ cpsat: canonical triggers ]): every transfer
        lasts at least one unit.
    horizon
        An upper bound on every time.
    """

    def __init__(self, model: Any, chain: Chain, platform: Platform, grid: TimeGrid, keep: frozenset[int] = frozenset()):
        self.model, self.chain, self.platform, self.grid = model, chain, platform, grid
        self.length = length = chain.length
        horizon = sum(grid.op)
        if grid.can_transfer:
            # Every start equals some earlier end or event: no schedule is longer than all
            # durations end to end.
            # (A move of a_u alone is never longer than the whole unit's.)
            horizon += sum(grid.offload) + sum(grid.prefetch)
        self.horizon = horizon
        self.ops = self._make_ops()
        free = [u for u in range(1, length + 1) if u not in keep] if grid.can_transfer else []
        #: Units that may move a_u alone as a schedule of its own (act[u] != saved[u]).
        self.act_units = frozenset(u for u in free if int(chain.act[u]) != int(chain.saved[u - 1]))
        durations = [grid.transfer(kind, u, moves) for u in free for kind in ("offload", "prefetch")
                     for moves in (("unit", "act") if u in self.act_units else ("unit",))]
        self.canonical = bool(free) and min(durations) >= 1
        self.units = {u: self._make_unit(u) for u in free}
        offloads = [self.units[u].offload.key for u in free]
        prefetches = [self.units[u].prefetch.key for u in free]
        self.channels = [offloads, prefetches] if platform.duplex else [offloads + prefetches]
        self.order = self._make_order()
        self.transfer_cause = self._make_transfer_causes()
        self.op_cause = self._make_op_causes()

    # -- lookups -------------------------------------------------------------------------------

    def transfer(self, key: TransferKey) -> TransferVar:
        """The transfer of ``key``."""
        unit = self.units[key[1]]
        return unit.offload if key[0] == "O" else unit.prefetch

    def event_time(self, e: int) -> Any:
        """The time of event ``e``: the start (even) or end (odd) of op e // 2."""
        op = self.ops[e // 2]
        return op.start if e % 2 == 0 else op.end

    def before(self, a: TransferKey, b: TransferKey) -> Any:
        """Literal (or constant) "a runs before b on their channel"."""
        if a[1] == b[1]:
            return int(a[0] == "O")  # a unit's offload precedes its prefetch
        lit = self.order.get((a, b))
        return lit if lit is not None else ~self.order[(b, a)]

    # -- builders ------------------------------------------------------------------------------

    def _make_ops(self) -> list[OpVar]:
        md, h = self.model, self.horizon
        ops = []
        for k, (kind, stage) in enumerate(fixed_order(self.length)):
            start = md.new_int_var(0, h, f"S{k}")
            end = md.new_int_var(0, h, f"E{k}")
            gap = md.new_bool_var(f"gap{k}") if k else None
            ops.append(OpVar(k, kind, stage, self.grid.op[k], start, end, gap))
        return ops

    def _make_transfer(self, kind: str, u: int, present: Any, alone: Any | None) -> TransferVar:
        md, h, grid = self.model, self.horizon, self.grid
        tag = "O" if kind == "offload" else "P"
        duration = grid.transfer(kind, u)
        act_duration = grid.transfer(kind, u, "act") if alone is not None else duration
        size = duration if alone is None else duration - (duration - act_duration) * alone
        channel = 1 if kind == "prefetch" and self.platform.duplex else 0
        start = md.new_int_var(0, h, f"{tag}{u}_s")
        end = md.new_int_var(0, h, f"{tag}{u}_e")
        interval = md.new_optional_interval_var(start, size, end, present, f"{tag}{u}_iv")
        lo, hi = transfer_events(self.length, u)
        event = md.new_int_var(lo, hi, f"{tag}{u}_ev")
        trigger_time = md.new_int_var(0, h, f"{tag}{u}_trig")
        triggers = {e: md.new_bool_var(f"y_{tag}{u}_{e}") for e in range(lo, hi + 1)}
        return TransferVar(kind, u, duration, act_duration, size, channel, present, start, end, interval, event,
                           trigger_time, triggers)

    def _make_unit(self, u: int) -> UnitVar:
        md = self.model
        offloaded = md.new_bool_var(f"x{u}")
        alone = whole = None
        if u in self.act_units:
            alone = md.new_bool_var(f"act{u}")
            whole = md.new_bool_var(f"whole{u}")
            md.add(alone + whole == offloaded)
        offload = self._make_transfer("offload", u, offloaded, alone)
        prefetch = self._make_transfer("prefetch", u, offloaded, alone)
        waits = {k: md.new_bool_var(f"w{u}_{k}") for k in wait_ops(self.length, u)}
        return UnitVar(u, offloaded, alone, whole if whole is not None else offloaded, offload, prefetch, waits)

    def _make_order(self) -> dict[tuple[TransferKey, TransferKey], Any]:
        order = {}
        for chan in self.channels:
            for i, a in enumerate(chan):
                for b in chan[i + 1 :]:
                    if a[1] != b[1]:
                        order[(a, b)] = self.model.new_bool_var(f"p_{a[0]}{a[1]}_{b[0]}{b[1]}")
        return order

    def _make_transfer_causes(self) -> dict[TransferKey, dict[Cause, Any]]:
        md = self.model
        causes: dict[TransferKey, dict[Cause, Any]] = {}
        for chan in self.channels:
            for key in chan:
                tag = f"{key[0]}{key[1]}"
                mine: dict[Cause, Any] = {"trigger": md.new_bool_var(f"c_{tag}_trig")}
                if key[0] == "P" and self.platform.duplex:
                    # On one channel the offload is the transfer ahead of its prefetch anyway.
                    mine["offload"] = md.new_bool_var(f"c_{tag}_off")
                for other in chan:
                    if other == key or (other[1] == key[1] and other[0] == "P"):
                        continue  # itself, or its own prefetch (never ahead of the offload)
                    mine[other] = md.new_bool_var(f"c_{tag}_{other[0]}{other[1]}")
                causes[key] = mine
        return causes

    def _make_op_causes(self) -> list[dict[Cause, Any]]:
        md, length = self.model, self.length
        causes: list[dict[Cause, Any]] = [{}]
        for op in self.ops[1:]:
            # "starts when its predecessor ends" is exactly "did not wait".
            mine: dict[Cause, Any] = {"previous": ~op.gap}
            if op.kind == "B":
                # B_j waits for P_j and P_{j-1}; P_j already ended before B_{j+1} (j < L), so
                # only P_{j-1} (and P_L at B_L) can be the latest term.
                for u in (op.stage, op.stage - 1):
                    if u in self.units and not (u == op.stage and op.stage < length):
                        mine[("P", u)] = md.new_bool_var(f"c_op{op.index}_P{u}")
            causes.append(mine)
        return causes
