"""The chain model: per-stage times and sizes of a network cut into L stages.

See docs/model.md, "The chain". Stage i (1-based in the text) is index ``i - 1`` of every
length-L array and index ``i`` of ``act``. A :class:`Chain` is validated once, on
construction; its arrays are contiguous and read-only, so kernels can trust them.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ._jsonio import JsonIO

__all__ = ["Chain", "ChainError"]

_TIME_FIELDS = ("fwd", "bwd")
_SIZE_FIELDS = ("saved", "fwd_tmp", "bwd_tmp")


class ChainError(ValueError):
    """A chain's data is malformed; the message names the field and the stage."""


def _as_times(name: str, values: Any, length: int | None) -> np.ndarray:
    try:
        arr = np.array(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise ChainError(f"chain.{name}: expected a list of numbers, got {values!r:.80}") from None
    if arr.ndim != 1:
        raise ChainError(f"chain.{name}: expected a flat list, got shape {arr.shape}")
    if length is not None and arr.shape[0] != length:
        raise ChainError(f"chain.{name}: expected {length} values (one per stage), got {arr.shape[0]}")
    for idx, v in enumerate(arr):
        if not math.isfinite(v) or v < 0:
            raise ChainError(f"chain.{name}: stage {idx + 1} has {name}={float(v)!r}; times must be finite and >= 0")
    return arr


def _as_sizes(name: str, values: Any, length: int, *, first_stage: int = 1) -> np.ndarray:
    try:
        raw = list(values)
    except TypeError:
        raise ChainError(f"chain.{name}: expected a list of integers, got {values!r:.80}") from None
    if len(raw) != length:
        what = "one per stage plus the input a_0" if first_stage == 0 else "one per stage"
        raise ChainError(f"chain.{name}: expected {length} values ({what}), got {len(raw)}")
    out = np.empty(length, dtype=np.int64)
    for idx, v in enumerate(raw):
        stage = idx + first_stage
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must be integers (bytes)")
        fv = float(v)
        if not math.isfinite(fv) or fv < 0:
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must be finite and >= 0")
        if fv != math.floor(fv):
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; sizes must be whole bytes")
        if fv >= 2**62:
            raise ChainError(f"chain.{name}: stage {stage} has {name}={v!r}; too large")
        out[idx] = int(v)
    return out


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
        for i in range(length):
            if saved_arr[i] < act_arr[i + 1]:
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
        act = self.act
        best = 0
        for i in range(1, self.length + 1):
            inp = int(act[i - 1]) if i > 1 else 0  # a_0 is counted once
            f_need = int(act[0]) + inp + int(self.saved[i - 1]) + int(self.fwd_tmp[i - 1])
            b_need = (
                int(act[0])
                + inp
                + int(self.saved[i - 1])
                + int(act[i])
                + int(act[i - 1])
                + int(self.bwd_tmp[i - 1])
            )
            best = max(best, f_need, b_need)
        return best

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

    def replace(self, **changes: Any) -> "Chain":
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
    def from_dict(cls, data: Mapping[str, Any]) -> "Chain":
        """Build a chain from docs/model.md's JSON object; unknown or missing keys are errors."""
        if not isinstance(data, Mapping):
            raise ChainError(f"chain: expected a JSON object, got {type(data).__name__}")
        required = ("fwd", "bwd", "act", "saved", "fwd_tmp", "bwd_tmp")
        missing = [k for k in required if k not in data]
        if missing:
            raise ChainError(f"chain: missing field(s) {', '.join(missing)}")
        known = set(required) | {"name", "fwd_nosave"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ChainError(f"chain: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return cls(
            data["fwd"],
            data["bwd"],
            data["act"],
            data["saved"],
            data["fwd_tmp"],
            data["bwd_tmp"],
            data.get("fwd_nosave"),
            name=data.get("name", "chain"),
        )
