"""The one schedule format every solver returns and the simulator replays.

A :class:`Schedule` is the compute sequence plus transfers, each tied to a trigger: the start
or the end of a compute op, after which the transfer is queued on its channel. This is what an
executor can do: a forward/backward hook enqueues a copy on a side stream; the compute stream
waits on the copy's event. The format and its rules are in ``docs/model.md``.

:meth:`Schedule.validate` checks the structure and resolves it into a :class:`Structure` (what
the simulator's kernel replays; cached per chain length). Search loops that hold schedules as
arrays skip the object: :func:`resolve` takes the arrays of :meth:`Schedule.arrays` directly
(see :mod:`chainoffload.simulate` for the array-level replay).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ._jsonio import JsonIO
from ._kernels import lazy
from .order import event as _event
from .order import fixed_order

_ks = lazy("structure")  # imports Numba on first use only

if TYPE_CHECKING:
    from .chain import Chain

__all__ = ["Schedule", "ScheduleError", "Transfer", "OP_KINDS", "fixed_order"]

#: Compute op kinds: F (F_all, run with autograd), B, and the rematerialization ops Fck / Fn.
OP_KINDS = ("F", "B", "Fck", "Fn")
OP_CODE = {kind: code for code, kind in enumerate(OP_KINDS)}
TRANSFER_KINDS = ("offload", "prefetch")
AT_KINDS = ("start", "end")
#: What a transfer moves: everything of unit i on the GPU ("unit"), or a_i alone ("act").
MOVES = ("unit", "act")


class ScheduleError(ValueError):
    """A schedule is malformed (not a schedule of this chain at all); the message says where.

    Malformed means the structure is wrong: an unknown stage, an index out of range, an offload
    without its prefetch. A well-formed schedule that breaks a timing or memory rule is not an
    error: :func:`chainoffload.simulate` reports it as infeasible.
    """


@dataclasses.dataclass(frozen=True)
class Transfer:
    """One offload (D2H copy of unit ``unit``) or prefetch (H2D copy back).

    Parameters
    ----------
    kind
        ``"offload"`` or ``"prefetch"``.
    unit
        Stage i whose data moves, 1-based.
    op
        0-based index into the compute sequence of the op whose start or end triggers it.
    at
        ``"start"`` or ``"end"`` of that op.
    before
        Optional 0-based index of a compute op (> ``op``) that does not start until this
        transfer ends.
    moves
        ``"unit"`` (default): everything of unit i that is on the GPU, saved[i] bytes when F_i
        made it whole, act[i] when Fck_i / Fn_i made a lone a_i. ``"act"``: a_i alone, act[i]
        bytes; the rest of a whole unit (saved[i] - act[i]) stays on the GPU. A prefetch moves
        what its offload moved and says the same.
    """

    kind: str
    unit: int
    op: int
    at: str = "end"
    before: int | None = None
    moves: str = "unit"

    @property
    def event(self) -> int:
        """Position of the trigger in the event sequence: ``2 * op`` (start) or ``2 * op + 1`` (end)."""
        return _event(self.op, self.at)

    def to_dict(self) -> dict[str, Any]:
        """The transfer as docs/model.md's JSON object."""
        out: dict[str, Any] = {"kind": self.kind, "unit": self.unit, "trigger": {"op": self.op, "at": self.at}}
        if self.before is not None:
            out["before"] = self.before
        if self.moves != "unit":
            out["moves"] = self.moves
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, index: int = 0) -> Transfer:
        """Parse a transfer from its JSON object; ``index`` is used in error messages."""
        where = f"schedule.transfers[{index}]"
        if not isinstance(data, Mapping):
            raise ScheduleError(f"{where}: expected an object, got {data!r:.60}")
        unknown = sorted(set(data) - {"kind", "unit", "trigger", "before", "moves"})
        if unknown:
            raise ScheduleError(f"{where}: unknown field(s) {', '.join(map(str, unknown))}")
        for key in ("kind", "unit", "trigger"):
            if key not in data:
                raise ScheduleError(f"{where}: missing field {key!r}")
        trig = data["trigger"]
        if not isinstance(trig, Mapping) or "op" not in trig or "at" not in trig:
            raise ScheduleError(f"{where}.trigger: expected {{\"op\": int, \"at\": \"start\"|\"end\"}}, got {trig!r:.60}")
        unknown = sorted(set(trig) - {"op", "at"})
        if unknown:
            raise ScheduleError(f"{where}.trigger: unknown field(s) {', '.join(map(str, unknown))}")
        for key, value in (("kind", data["kind"]), ("trigger.at", trig["at"]), ("moves", data.get("moves", "unit"))):
            if not isinstance(value, str):
                raise ScheduleError(f"{where}.{key}: expected a string, got {value!r:.40}")
        return cls(
            kind=data["kind"],
            unit=_int(data["unit"], f"{where}.unit"),
            op=_int(trig["op"], f"{where}.trigger.op"),
            at=trig["at"],
            before=None if data.get("before") is None else _int(data["before"], f"{where}.before"),
            moves=data.get("moves", "unit"),
        )


def _int(v: Any, where: str) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise ScheduleError(f"{where}: expected an integer, got {v!r}")
    return int(v)


@dataclasses.dataclass(frozen=True)
class Schedule(JsonIO):
    """A compute sequence plus triggered transfers.

    Parameters
    ----------
    compute
        Sequence of ``(kind, stage)`` with kind in ``OP_KINDS`` and stage 1-based.
    transfers
        The :class:`Transfer` list. Order matters only for ties: transfers with the same trigger
        are queued in list order.
    """

    _json_label = "schedule"
    _json_error = ScheduleError

    compute: tuple[tuple[str, int], ...]
    transfers: tuple[Transfer, ...] = ()

    def __post_init__(self) -> None:
        try:
            compute = tuple((str(k), int(s)) for k, s in self.compute)
        except (TypeError, ValueError):
            raise ScheduleError(f"schedule.compute: expected [kind, stage] pairs, got {self.compute!r:.80}") from None
        object.__setattr__(self, "compute", compute)
        transfers = tuple(self.transfers)
        for idx, t in enumerate(transfers):
            if not isinstance(t, Transfer):
                raise ScheduleError(f"schedule.transfers[{idx}]: expected a Transfer, got {t!r:.60}")
        object.__setattr__(self, "transfers", transfers)

    # -- construction ----------------------------------------------------------------------

    @classmethod
    def keep_all(cls, length: int) -> Schedule:
        """The fixed order with no transfer."""
        return cls(fixed_order(length), ())

    # -- queries ---------------------------------------------------------------------------

    def index(self, kind: str, stage: int) -> int:
        """0-based position of the first compute op ``(kind, stage)``."""
        try:
            return self.compute.index((kind, stage))
        except ValueError:
            raise ScheduleError(f"schedule.compute: no op {kind}_{stage}") from None

    @property
    def offloaded_units(self) -> tuple[int, ...]:
        """Stages whose unit is offloaded, sorted."""
        return tuple(sorted({t.unit for t in self.transfers if t.kind == "offload"}))

    def offloaded_bytes(self, chain: Chain) -> int:
        """Bytes copied to the host: what each offload moves (saved[i] for a whole unit i, act[i]
        for a lone a_i that an Fck_i / Fn_i made or that moves alone). Raises
        :class:`ScheduleError` if malformed."""
        return int(sum(self.transfer_bytes(chain)[k] for k, t in enumerate(self.transfers) if t.kind == "offload"))

    def transfer_bytes(self, chain: Chain) -> np.ndarray:
        """Bytes each transfer moves on ``chain``, in list order (see :class:`Transfer`'s ``moves``).
        Raises :class:`ScheduleError` if malformed."""
        self.validate(chain)
        return self._structure(chain.length).transfer_bytes(chain)

    def transfer_parts(self, chain: Chain) -> tuple[str, ...]:
        """What each transfer moves on ``chain``, in list order: ``"act"`` for a_i alone (act[i]
        bytes: ``moves="act"``, or a unit that an Fck_i / Fn_i made, which holds a_i alone) and
        ``"unit"`` for a whole unit (saved[i] bytes). Raises :class:`ScheduleError` if malformed."""
        self.validate(chain)
        size = self._structure(chain.length).tr_size  # < = L: act[i]; above: saved[i]
        return tuple("act" if s <= chain.length else "unit" for s in size)

    @functools.cached_property
    def has_remat(self) -> bool:
        """Whether the compute sequence uses rematerialization ops (Fck, Fn) or repeats a forward."""
        return any(k in ("Fck", "Fn") for k, _ in self.compute) or len(self.compute) != len(set(self.compute))

    def op_name(self, index: int) -> str:
        """Readable name of compute op ``index`` such as ``"B_3"``."""
        kind, stage = self.compute[index]
        return f"{kind}_{stage}"

    def transfer_name(self, index: int) -> str:
        """Readable name of transfer ``index`` such as ``"O_2"`` or ``"P_2"``."""
        t = self.transfers[index]
        return f"{'O' if t.kind == 'offload' else 'P'}_{t.unit}"

    # -- validation ------------------------------------------------------------------------

    def validate(self, chain: Chain) -> None:
        """Check the structure against ``chain``; raise :class:`ScheduleError` if malformed.

        Checked: op kinds and stages exist; the compute sequence is the fixed order F_1..F_L,
        B_L..B_1, or a rematerializing sequence that keeps ``docs/model.md``'s rules (every B_i
        once, in the order B_L..B_1, with unit i whole and a_{i-1} resident; every forward reads
        a resident a_{i-1}, none after its own backward; Fck_i / Fn_i not after B_{i+1}; F_i not
        over a whole unit i, Fck_i / Fn_i not over a resident a_i; Fn_i frees a lone a_{i-1});
        every transfer names a valid unit, trigger and ``before``; ``before`` comes after the
        trigger; at most one offload and one prefetch per unit; every offload has its prefetch
        and vice versa, moving the same part (``moves``); no prefetch is triggered before its
        offload. Timing, memory and reads
        of data that is not on the GPU are not checked here: :func:`chainoffload.simulate`
        reports them as violations.
        """
        length = chain.length
        # Structure depends on L alone; search loops replay one schedule many times.
        cache = self.__dict__.setdefault("_structures", {})
        if length in cache:
            return
        self._validate_fields(length)
        cache[length] = resolve(length, *self.arrays())

    def _structure(self, length: int) -> Structure:
        """The resolved structure (after :meth:`validate` for a chain of this length)."""
        return self.__dict__["_structures"][length]

    def _validate_fields(self, length: int) -> None:
        n = len(self.compute)
        fixed = not self.has_remat and self.compute == fixed_order(length)
        for idx, (kind, stage) in enumerate(() if fixed else self.compute):
            if kind not in OP_CODE:
                raise ScheduleError(f"schedule.compute[{idx}]: unknown op kind {kind!r}; known: {', '.join(OP_KINDS)}")
            if not 1 <= stage <= length:
                raise ScheduleError(f"schedule.compute[{idx}]: stage {stage} is not in 1..{length}")
        if not self.has_remat:
            expected = fixed_order(length)
            if not fixed:
                # The first op that differs from the fixed order, over the ops both have; a
                # sequence that is a prefix of it (or extends it) fails on its length below.
                for idx, (got, want) in enumerate(zip(self.compute, expected, strict=False)):
                    if got != want:
                        raise ScheduleError(
                            f"schedule.compute[{idx}]: expected {want[0]}_{want[1]} of the fixed order "
                            f"F_1..F_L, B_L..B_1, got {got[0]}_{got[1]}"
                        )
                raise ScheduleError(f"schedule.compute: expected {len(expected)} ops (F_1..F_{length}, B_{length}..B_1), got {n}")
        offload: dict[int, int] = {}
        prefetch: dict[int, int] = {}
        for idx, t in enumerate(self.transfers):
            where = f"schedule.transfers[{idx}]"
            if t.kind not in TRANSFER_KINDS:
                raise ScheduleError(f"{where}.kind: {t.kind!r} is not 'offload' or 'prefetch'")
            if not 1 <= t.unit <= length:
                raise ScheduleError(f"{where}.unit: {t.unit} is not a stage in 1..{length}")
            if t.at not in AT_KINDS:
                raise ScheduleError(f"{where}.trigger.at: {t.at!r} is not 'start' or 'end'")
            if t.moves not in MOVES:
                raise ScheduleError(f"{where}.moves: {t.moves!r} is not 'unit' (all of unit {t.unit} on the GPU) or 'act' (a_{t.unit} alone)")
            if not 0 <= t.op < n:
                raise ScheduleError(f"{where}.trigger.op: {t.op} is not an op index in 0..{n - 1}")
            if t.before is not None and not t.op < t.before < n:
                raise ScheduleError(
                    f"{where}.before: {t.before} must be an op index after the trigger op {t.op} and below {n}"
                )
            table = offload if t.kind == "offload" else prefetch
            if t.unit in table:
                raise ScheduleError(f"{where}: unit {t.unit} has a second {t.kind} (first at transfers[{table[t.unit]}])")
            table[t.unit] = idx
        for unit, idx in offload.items():
            if unit not in prefetch:
                raise ScheduleError(f"schedule.transfers[{idx}]: unit {unit} is offloaded but never prefetched")
        for unit, idx in prefetch.items():
            if unit not in offload:
                raise ScheduleError(f"schedule.transfers[{idx}]: unit {unit} is prefetched but never offloaded")
            o_idx = offload[unit]
            o, p = self.transfers[o_idx], self.transfers[idx]
            if p.moves != o.moves:
                raise ScheduleError(
                    f"schedule.transfers[{idx}].moves: the prefetch of unit {unit} moves {p.moves!r} but its offload "
                    f"(transfers[{o_idx}]) moves {o.moves!r}; a prefetch brings back what its offload moved"
                )
            if (p.event, idx) < (o.event, o_idx):
                raise ScheduleError(
                    f"schedule.transfers[{idx}]: the prefetch of unit {unit} is triggered before its offload "
                    f"(transfers[{o_idx}])"
                )

    # -- arrays for the kernels ---------------------------------------------------------------

    def arrays(self) -> tuple[np.ndarray, ...]:
        """Flat int64 arrays for the kernels.

        Returns ``(op_kind, op_stage, tr_kind, tr_unit, tr_op, tr_at, tr_before, tr_act)``: op
        kinds are codes of ``OP_KINDS``; transfer kind 0 = offload, 1 = prefetch; ``at`` 0 =
        start, 1 = end; ``before`` -1 when absent; ``act`` 1 when the transfer moves a_i alone.
        """
        cached = self.__dict__.get("_arrays")
        if cached is not None:
            return cached
        op_kind = np.array([OP_CODE.get(k, -1) for k, _ in self.compute], dtype=np.int64)
        op_stage = np.array([s for _, s in self.compute], dtype=np.int64)
        tr = self.transfers
        tr_kind = np.array([0 if t.kind == "offload" else 1 for t in tr], dtype=np.int64)
        tr_unit = np.array([t.unit for t in tr], dtype=np.int64)
        tr_op = np.array([t.op for t in tr], dtype=np.int64)
        tr_at = np.array([1 if t.at == "end" else 0 for t in tr], dtype=np.int64)
        tr_before = np.array([-1 if t.before is None else t.before for t in tr], dtype=np.int64)
        tr_act = np.array([t.moves == "act" for t in tr], dtype=np.int64)
        out = (op_kind, op_stage, tr_kind, tr_unit, tr_op, tr_at, tr_before, tr_act)
        for arr in out:
            arr.setflags(write=False)
        self.__dict__["_arrays"] = out
        return out

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The schedule as docs/model.md's JSON object."""
        return {"compute": [[k, s] for k, s in self.compute], "transfers": [t.to_dict() for t in self.transfers]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Schedule:
        """Parse a schedule from its JSON object (structure only; see :meth:`validate`).

        A schedule file's metadata keys (``chain``, ``platform``, ``solver``) are accepted and
        not read: :class:`~chainoffload.ScheduleFile` reads and checks them.
        """
        if not isinstance(data, Mapping):
            raise ScheduleError(f"schedule: expected a JSON object, got {type(data).__name__}")
        # A schedule file may also say what it was made for (chain, platform, solver): those
        # keys are ScheduleFile's, which checks them; a bare Schedule does not read them.
        unknown = sorted(set(map(str, data)) - {"compute", "transfers", "chain", "platform", "solver"})
        if unknown:
            raise ScheduleError(f"schedule: unknown field(s) {', '.join(unknown)}")
        if "compute" not in data:
            raise ScheduleError("schedule: missing field 'compute'")
        compute_raw = data["compute"]
        if not isinstance(compute_raw, list):
            raise ScheduleError(f"schedule.compute: expected a list, got {type(compute_raw).__name__}")
        compute = []
        for idx, op in enumerate(compute_raw):
            if not isinstance(op, (list, tuple)) or len(op) != 2 or not isinstance(op[0], str):
                raise ScheduleError(f"schedule.compute[{idx}]: expected [kind, stage], got {op!r:.60}")
            compute.append((op[0], _int(op[1], f"schedule.compute[{idx}] stage")))
        transfers_raw = data.get("transfers", [])
        if not isinstance(transfers_raw, list):
            raise ScheduleError(f"schedule.transfers: expected a list, got {type(transfers_raw).__name__}")
        transfers = [Transfer.from_dict(t, index=i) for i, t in enumerate(transfers_raw)]
        return cls(tuple(compute), tuple(transfers))

    @classmethod
    def from_units(
        cls, length: int, transfers: Iterable[Transfer] = (), compute: Sequence[tuple[str, int]] | None = None
    ) -> Schedule:
        """A fixed-order schedule (or ``compute``) with the given transfers."""
        return cls(tuple(compute) if compute is not None else fixed_order(length), tuple(transfers))


# -- the resolved structure ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True, eq=False)
class Structure:
    """A well-formed schedule resolved into the lists the simulator's kernel replays.

    Private to the package (the simulator and search loops use it); depends on the chain's
    length only. The fields are :func:`chainoffload._kernels.structure.resolve_kernel`'s arrays
    (see its docstring), plus the op and transfer kinds; :meth:`kernel_args` gives them in the
    order :func:`chainoffload._kernels.simulate.replay_kernel` takes them.
    """

    length: int
    op_kind: np.ndarray
    op_stage: np.ndarray
    alloc_ptr: np.ndarray
    alloc_size: np.ndarray
    free_ptr: np.ndarray
    free_size: np.ndarray
    free_src: np.ndarray
    wait_ptr: np.ndarray
    wait_tr: np.ndarray
    hold_ptr: np.ndarray
    hold_op: np.ndarray
    tr_kind: np.ndarray
    tr_event: np.ndarray
    tr_size: np.ndarray
    tr_src: np.ndarray
    tr_after: np.ndarray
    tr_order: np.ndarray

    def kernel_args(self) -> tuple[np.ndarray, ...]:
        """The arrays after the platform's scalars in ``replay_kernel``'s signature."""
        return (
            self.op_kind,
            self.op_stage,
            self.alloc_ptr,
            self.alloc_size,
            self.free_ptr,
            self.free_size,
            self.free_src,
            self.wait_ptr,
            self.wait_tr,
            self.hold_ptr,
            self.hold_op,
            self.tr_kind,
            self.tr_event,
            self.tr_size,
            self.tr_src,
            self.tr_after,
            self.tr_order,
        )

    def offloaded_bytes(self, chain: Chain) -> int:
        """Bytes the offloads move on ``chain``."""
        return int(self.transfer_bytes(chain)[self.tr_kind == 0].sum())

    def transfer_bytes(self, chain: Chain) -> np.ndarray:
        """Bytes each transfer moves on ``chain``."""
        sizes = _ks.size_table(chain.act, chain.saved, chain.fwd_tmp, chain.bwd_tmp)
        return sizes[self.tr_size]


def _sequence_errors() -> dict[int, str]:
    return {
        _ks.ERR_B_NOT_WHOLE: "{op}: B_{i} needs unit {i} whole on the GPU, but no F_{i} (F_all) ran since it was last freed",
        _ks.ERR_INPUT_ABSENT: "{op}: {kind}_{i} reads a_{p}, which is not resident",
        _ks.ERR_FWD_AFTER_B: "{op}: stage {i} runs a forward after its backward B_{i}",
        _ks.ERR_NO_READER: "{op}: {kind}_{i} after B_{q}: its output a_{i} would have no reader",
        _ks.ERR_F_RESIDENT: "{op}: F_{i} while unit {i} is already resident whole",
        _ks.ERR_CK_RESIDENT: "{op}: {kind}_{i} while a_{i} is already resident",
        _ks.ERR_FN_WHOLE_INPUT: "{op}: Fn_{i} frees its input a_{p}, but unit {p} is kept whole by F_{p}; use Fck_{i}",
    }


def resolve(
    length: int,
    op_kind: np.ndarray,
    op_stage: np.ndarray,
    tr_kind: np.ndarray,
    tr_unit: np.ndarray,
    tr_op: np.ndarray,
    tr_at: np.ndarray,
    tr_before: np.ndarray,
    tr_act: np.ndarray | None = None,
) -> Structure:
    """Check a compute sequence and resolve it with its transfers (arrays of :meth:`Schedule.arrays`).

    Private to the package: the array-level entry of search loops (see :mod:`chainoffload.simulate`).
    The fields must already be in range (what :meth:`Schedule.validate` checks before calling
    this; a search loop whose schedules are well formed by construction calls it directly).
    ``tr_act`` (1: the transfer moves a_i alone) defaults to every transfer moving its whole
    unit; a prefetch moves what its offload moves, whatever its own entry says.

    Returns
    -------
    Structure
        Read-only arrays, for :func:`chainoffload.simulate.replay` on any chain of ``length`` stages.

    Raises
    ------
    ScheduleError
        When the sequence breaks a rematerialization rule; the message names the op.
    """
    if tr_act is None:
        tr_act = np.zeros(tr_kind.shape[0], dtype=np.int64)
        tr_act.setflags(write=False)  # as Schedule.arrays(): one compiled signature
    out = _ks.resolve_kernel(length, op_kind, op_stage, tr_kind, tr_unit, tr_op, tr_at, tr_before, tr_act)
    err, k, arg = int(out[0]), int(out[1]), int(out[2])
    if err != _ks.ERR_NONE:
        raise ScheduleError(_sequence_message(err, k, arg, length, op_kind, op_stage))
    arrays = (op_kind, op_stage, *out[3:12], tr_kind, *out[12:])
    for arr in arrays:
        if arr.flags.writeable:
            arr.setflags(write=False)
    return Structure(length, *arrays)


def _sequence_message(err: int, k: int, arg: int, length: int, op_kind: np.ndarray, op_stage: np.ndarray) -> str:
    if err == _ks.ERR_B_MISSING:
        return f"schedule.compute: B_{arg} never runs (backward ops must run B_{length}..B_1)"
    kind, i = OP_KINDS[int(op_kind[k])], int(op_stage[k])
    op = f"schedule.compute[{k}] ({kind}_{i})"
    if err == _ks.ERR_B_ORDER:
        if arg >= 1:
            return f"{op}: backward ops must run once each in the order B_{length}..B_1; expected B_{arg}"
        return f"{op}: B_{i} runs a second time"
    return _sequence_errors()[err].format(op=op, kind=kind, i=i, p=i - 1, q=i + 1)
