"""The chain model: per-stage times and sizes of a network cut into L stages.

See docs/model.md, "The chain". Stage i (1-based in the text) is index ``i - 1`` of every
length-L array and index ``i`` of ``act``. A :class:`Chain` is validated once, on
construction; its arrays are contiguous and read-only, so kernels can trust them.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._jsonio import JsonIO, is_number

__all__ = ["Chain", "ChainError", "MAX_TOTAL_BYTES"]

#: The sizes of a chain (act, saved, fwd_tmp, bwd_tmp, all stages) must add up to less than
#: this, 2^60 B (1 EiB), so that no memory sum the simulator or a solver forms can wrap in int64
#: (``NOTE [ memory sums fit int64 ]``).
MAX_TOTAL_BYTES = 2**60

# NOTE [ memory sums fit int64 ]
# The kernels count memory in int64; a sum that wraps turns a huge peak into a small or
# negative one, and a schedule that cannot fit into an "optimal" one. So a chain is refused
# unless T = sum(act) + sum(saved) + sum(fwd_tmp) + sum(bwd_tmp) < 2^60, and a platform's
# memory must fit int64 (< 2^63). Then every sum formed stays below 2^63:
# * Memory in use at any instant, by the rules of the model, holds at most: a_0 once; each
#   gradient g_j once (B_{j+1}, or B_L for g_L, allocates it, and every B runs once); per unit i
#   at most three copies of at most saved[i] bytes (the copy a forward makes, a lone a_i that
#   the F_i re-run over it frees at its end, and the copy a prefetch brings back while the
#   offloaded copy is still held for its reader); and the transients of at most two compute
#   ops (one that ends and one that starts at one instant). That is at most
#   act[0] + sum(act) + 3 sum(saved) + 2 max(tmp) <= 3T, and the kernels' running sums are
#   these amounts at event boundaries.
# * A memory check compares such an amount with the limit (< 2^63) or subtracts one from the
#   other (both >= 0): no new magnitude. The solvers' own sums (keep-all's memory at each op,
#   CP-SAT's cumulative demands over every interval: each allocation of the fixed order once,
#   plus the prefetches) are at most 2T.
# So the largest magnitude is below 3T < 3 * 2^60, and a sum of two of them below 2^63. The
# same holds for times: every time is finite and so are sum(fwd) + sum(bwd) and
# sum(fwd_nosave) + sum(bwd); a makespan that still overflows to inf (transfers over a link of
# 1e-300 B/s, recomputation repeated) is never reported feasible (`solvers.judge`).

_TIME_FIELDS = ("fwd", "bwd")
_SIZE_FIELDS = ("saved", "fwd_tmp", "bwd_tmp")


class ChainError(ValueError):
    """A chain's data is malformed; the message names the field and the stage."""


def _as_list(name: str, values: Any, what: str) -> list:
    if isinstance(values, (str, bytes, Mapping)) or not hasattr(values, "__len__"):
        raise ChainError(f"chain.{name}: expected a list of {what}, got {values!r:.80}")
    return list(values.tolist() if isinstance(values, np.ndarray) else values)


def _as_times(name: str, values: Any, length: int | None) -> np.ndarray:
    raw = _as_list(name, values, "numbers (seconds)")
    if length is not None and len(raw) != length:
        raise ChainError(f"chain.{name}: expected {length} values (one per stage), got {len(raw)}")
    if all(type(v) is float or type(v) is int for v in raw):  # what JSON gives: one vectorised check
        try:
            arr = np.array(raw, dtype=np.float64)
        except OverflowError:
            arr = None
        if arr is not None and bool(np.all(np.isfinite(arr) & (arr >= 0))):
            return arr + 0.0  # -0.0 becomes 0.0: one encoding per value (see Chain.fingerprint)
    for idx, v in enumerate(raw):  # name the first bad stage
        if not is_number(v):
            raise ChainError(f"chain.{name}: stage {idx + 1} has {name}={v!r:.40}; times must be numbers (seconds)")
        try:
            fv = float(v)
        except OverflowError:
            fv = math.inf
        if not math.isfinite(fv) or fv < 0:
            raise ChainError(f"chain.{name}: stage {idx + 1} has {name}={v!r:.40}; times must be finite and >= 0")
    return np.array(raw, dtype=np.float64) + 0.0


def _as_sizes(name: str, values: Any, length: int, *, first_stage: int = 1) -> np.ndarray:
    raw = _as_list(name, values, "integers (bytes)")
    if len(raw) != length:
        what = "one per stage plus the input a_0" if first_stage == 0 else "one per stage"
        raise ChainError(f"chain.{name}: expected {length} values ({what}), got {len(raw)}")
    if all(type(v) is int for v in raw) and 0 <= min(raw) and max(raw) < MAX_TOTAL_BYTES:
        return np.array(raw, dtype=np.int64)  # what JSON gives: checked by two builtins
    out = np.empty(length, dtype=np.int64)
    for idx, v in enumerate(raw):  # name the first bad stage
        stage = idx + first_stage
        if not is_number(v):
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r:.40}; sizes must be integers (bytes)")
        if not isinstance(v, (int, np.integer)):
            fv = float(v)
            if not math.isfinite(fv) or fv != math.floor(fv):
                raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must be finite, whole bytes")
            v = int(fv)
        v = int(v)
        if v < 0:
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must be >= 0")
        if v >= MAX_TOTAL_BYTES:
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must stay below 2^60 B (1 EiB)")
        out[idx] = v
    return out


# NOTE [ chain fingerprint ]
# A schedule file records the fingerprint of the chain it was solved for, so that replaying it
# on another chain is refused rather than silently wrong. The hash covers the numbers only, in
# a fixed byte order, so it is stable across processes, machines and numpy versions; a float
# is hashed by its bits (JSON's shortest round-trip repr reads back to the same bits, and -0.0
# is stored as 0.0 on construction), so a chain saved and loaded again keeps its fingerprint.
_FINGERPRINT_FIELDS = ("fwd", "bwd", "fwd_nosave", "act", "saved", "fwd_tmp", "bwd_tmp")


def _check_sums(fwd: np.ndarray, bwd: np.ndarray, nosave: np.ndarray, sizes: dict[str, np.ndarray]) -> None:
    """Refuse sums that overflow: ``NOTE [ memory sums fit int64 ]``."""
    totals = {name: sum(arr.tolist()) for name, arr in sizes.items()}  # Python ints: exact
    total = sum(totals.values())
    if total >= MAX_TOTAL_BYTES:
        field = max(totals, key=totals.get)
        parts = ", ".join(f"{name} {value:.3g}" for name, value in totals.items())
        raise ChainError(
            f"chain.{field}: the sizes add up to {total} B ({parts}); they must stay below 2^60 B (1 EiB) "
            "so that every memory sum fits int64"
        )
    sum_bwd = sum(bwd.tolist())  # plain floats: inf without numpy's overflow warning
    for name, arr in (("fwd", fwd), ("fwd_nosave", nosave)):
        own = sum(arr.tolist())
        if not math.isfinite(own) or not math.isfinite(own + sum_bwd):
            who = name if not math.isfinite(own) else f"{name} + chain.bwd"
            raise ChainError(f"chain.{who}: the times sum to {own + sum_bwd!r}; sum({name}) + sum(bwd) must be finite")
    if not math.isfinite(sum_bwd):
        raise ChainError(f"chain.bwd: the times sum to {sum_bwd!r}; sum(fwd) + sum(bwd) must be finite")


def _readonly(arr: np.ndarray) -> np.ndarray:
    arr = np.ascontiguousarray(arr)
    arr.setflags(write=False)
    return arr


class Chain(JsonIO):
    """A chain of L stages with the times and sizes of docs/model.md's model.

    Parameters
    ----------
    fwd, bwd
        Per-stage time (seconds) of F_i run with autograd and of B_i; length L.
    act
        Size in bytes of a_i, the output of stage i, for i = 0..L (a_0 is the chain's input);
        the gradient g_i has the same size. Length L + 1.
    saved
        Per stage, all storage F_i produces that stays alive under autograd: its output a_i
        plus what it saved for B_i that it allocated itself. ``saved[i] >= act[i]``. This is the
        unit that can be offloaded. Length L.
    fwd_tmp, bwd_tmp
        Transient extra memory while F_i / B_i runs. Length L.
    fwd_nosave
        Optional time of F_i without autograd (for rematerialization); defaults to ``fwd``.
    name
        A label for tables and plots.

    Raises
    ------
    ChainError
        If a list has the wrong length, a value is negative, NaN or infinite, a size is not a
        whole number of bytes, or ``saved[i] < act[i]``. The message names field and stage.

    Notes
    -----
    Instances are immutable; arrays are contiguous, read-only numpy arrays (float64 times,
    int64 sizes). Index ``i - 1`` of a length-L array is stage i; ``act[i]`` is a_i.
    """

    _json_label = "chain"
    _json_error = ChainError

    __slots__ = ("name", "fwd", "bwd", "act", "saved", "fwd_tmp", "bwd_tmp", "fwd_nosave", "_explicit_nosave")

    def __init__(
        self,
        fwd: Sequence[float],
        bwd: Sequence[float],
        act: Sequence[int],
        saved: Sequence[int],
        fwd_tmp: Sequence[int] | None = None,
        bwd_tmp: Sequence[int] | None = None,
        fwd_nosave: Sequence[float] | None = None,
        *,
        name: str = "chain",
    ) -> None:
        if not isinstance(name, str):
            raise ChainError(f"chain.name: expected a string, got {name!r}")
        fwd_arr = _as_times("fwd", fwd, None)
        length = fwd_arr.shape[0]
        if length < 1:
            raise ChainError("chain.fwd: a chain needs at least one stage, got 0")
        bwd_arr = _as_times("bwd", bwd, length)
        act_arr = _as_sizes("act", act, length + 1, first_stage=0)
        saved_arr = _as_sizes("saved", saved, length)
        fwd_tmp_arr = _as_sizes("fwd_tmp", [0] * length if fwd_tmp is None else fwd_tmp, length)
        bwd_tmp_arr = _as_sizes("bwd_tmp", [0] * length if bwd_tmp is None else bwd_tmp, length)
        nosave_arr = fwd_arr.copy() if fwd_nosave is None else _as_times("fwd_nosave", fwd_nosave, length)
        _check_sums(fwd_arr, bwd_arr, nosave_arr, {"saved": saved_arr, "act": act_arr, "fwd_tmp": fwd_tmp_arr, "bwd_tmp": bwd_tmp_arr})
        # One vectorised comparison: a Python loop here took 1 s per 10^6 stages of reading.
        short = np.flatnonzero(saved_arr < act_arr[1:])
        if short.shape[0]:
            i = int(short[0])
            raise ChainError(
                f"chain.saved: stage {i + 1} has saved={int(saved_arr[i])} < act={int(act_arr[i + 1])}; "
                "saved[i] includes the output a_i, so it must be >= act[i]"
            )
        setattr_ = object.__setattr__
        setattr_(self, "name", name)
        setattr_(self, "fwd", _readonly(fwd_arr))
        setattr_(self, "bwd", _readonly(bwd_arr))
        setattr_(self, "act", _readonly(act_arr))
        setattr_(self, "saved", _readonly(saved_arr))
        setattr_(self, "fwd_tmp", _readonly(fwd_tmp_arr))
        setattr_(self, "bwd_tmp", _readonly(bwd_tmp_arr))
        setattr_(self, "fwd_nosave", _readonly(nosave_arr))
        setattr_(self, "_explicit_nosave", fwd_nosave is not None)

    def __setattr__(self, key: str, value: Any) -> None:
        raise AttributeError(f"Chain is immutable; build a new one (tried to set {key!r})")

    def __delattr__(self, key: str) -> None:
        raise AttributeError("Chain is immutable")

    # -- basic properties --------------------------------------------------------------------

    @property
    def length(self) -> int:
        """Number of stages L."""
        return int(self.fwd.shape[0])

    def __len__(self) -> int:
        return self.length

    @property
    def compute_time(self) -> float:
        """sum(fwd) + sum(bwd): the makespan with no waiting, the trivial lower bound.

        Summed in the order of the fixed schedule (F_1..F_L, B_L..B_1), as the simulator adds
        durations, so that a schedule with no wait has exactly this makespan.
        """
        total = 0.0
        for t in self.fwd.tolist():
            total += t
        for t in reversed(self.bwd.tolist()):
            total += t
        return total

    def stage_memory_floor(self) -> int:
        """The least memory any schedule of this chain needs, whatever it offloads or recomputes.

        Each stage must run its forward and its backward once with its own data on the GPU: F_i
        needs a_0, its input a_{i-1} and saved[i] + fwd_tmp[i]; B_i needs a_0, saved[i], g_i,
        g_{i-1}, bwd_tmp[i] and (it may read it) a_{i-1}. The floor is the largest of these.
        A memory limit below it is misuse, not an infeasible instance.
        """
        # Vectorised (a Python loop took 5 s at 10^6 stages, before any time limit could act):
        # each sum adds chain sizes, a_{i-1} twice at most, so it stays below 2T < 2^61 (NOTE
        # [ memory sums fit int64 ]) and int64 is exact.
        act = self.act
        inp = act[:-1].copy()
        inp[0] = 0  # a_0 is counted once
        f_need = act[0] + inp + self.saved + self.fwd_tmp
        b_need = act[0] + inp + self.saved + act[1:] + act[:-1] + self.bwd_tmp
        return int(max(int(f_need.max()), int(b_need.max()), 0))

    def fingerprint(self) -> str:
        """A hash of the chain's numbers, to tell which chain a schedule file was made for.

        ``"sha256:"`` and the hex SHA-256 digest of this encoding, the same on every machine
        and in every process (``NOTE [ chain fingerprint ]``): the ASCII line
        ``chainoffload.chain.v1\\n``, then for each field in the order ``fwd``, ``bwd``,
        ``fwd_nosave``, ``act``, ``saved``, ``fwd_tmp``, ``bwd_tmp`` the ASCII line
        ``NAME LENGTH\\n`` followed by its values as little-endian IEEE-754 binary64 (times) or
        two's-complement int64 (sizes). The name is left out (renaming a chain does not change
        its schedules); ``fwd_nosave`` is its value, explicit or defaulted to ``fwd``.
        """
        digest = hashlib.sha256(b"chainoffload.chain.v1\n")
        for name in _FINGERPRINT_FIELDS:
            arr = getattr(self, name)
            digest.update(f"{name} {arr.shape[0]}\n".encode("ascii"))
            digest.update(arr.astype("<i8" if arr.dtype.kind == "i" else "<f8").tobytes())
        return "sha256:" + digest.hexdigest()

    # -- equality, repr --------------------------------------------------------------------

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Chain):
            return NotImplemented
        return self.name == other.name and all(
            np.array_equal(getattr(self, f), getattr(other, f))
            for f in ("fwd", "bwd", "act", "saved", "fwd_tmp", "bwd_tmp", "fwd_nosave")
        )

    def __hash__(self) -> int:
        return hash((self.name, self.length, self.fwd.tobytes(), self.saved.tobytes()))

    def __repr__(self) -> str:
        return (
            f"Chain(name={self.name!r}, L={self.length}, compute_time={self.compute_time:.6g}s, "
            f"saved_total={int(self.saved.sum())}B)"
        )

    def replace(self, **changes: Any) -> Chain:
        """A new chain with some fields replaced (validated again)."""
        data = self.to_dict()
        if not self._explicit_nosave and "fwd_nosave" not in changes:
            data.pop("fwd_nosave", None)
        data.update({k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in changes.items()})
        return Chain.from_dict(data)

    # -- JSON ------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """The chain as docs/model.md's JSON object (plain Python lists and numbers)."""
        out: dict[str, Any] = {
            "name": self.name,
            "fwd": self.fwd.tolist(),
            "bwd": self.bwd.tolist(),
            "act": self.act.tolist(),
            "saved": self.saved.tolist(),
            "fwd_tmp": self.fwd_tmp.tolist(),
            "bwd_tmp": self.bwd_tmp.tolist(),
        }
        if self._explicit_nosave:
            out["fwd_nosave"] = self.fwd_nosave.tolist()
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Chain:
        """Build a chain from docs/model.md's JSON object; unknown or missing keys are errors
        (``fwd_tmp`` and ``bwd_tmp`` default to zeros, ``fwd_nosave`` to ``fwd``)."""
        if not isinstance(data, Mapping):
            raise ChainError(f"chain: expected a JSON object, got {type(data).__name__}")
        required = ("fwd", "bwd", "act", "saved")
        missing = [k for k in required if k not in data]
        if missing:
            raise ChainError(f"chain: missing field(s) {', '.join(missing)}")
        known = set(required) | {"name", "fwd_tmp", "bwd_tmp", "fwd_nosave"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ChainError(f"chain: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(
            data["fwd"],
            data["bwd"],
            data["act"],
            data["saved"],
            data.get("fwd_tmp"),
            data.get("bwd_tmp"),
            data.get("fwd_nosave"),
            name=data.get("name", "chain"),
        )
