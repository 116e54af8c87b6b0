"""A measured chain's reach: the whole step's keep-all peak, and what the chain can move.

:func:`step_peak` is the keep-all peak of a training step, the chain's plus what stays resident
outside it (NOTE [ resident outside the chain ] in plans.py); :func:`coverage` the share of it
the chain's units can move, and what it leaves out (NOTE [ coverage ]). Both read a profile's
chain and :class:`~chainoffload_torch.Sizes`; the plans (a budget's fraction, a refusal's
tail) and :attr:`chainoffload_torch.Profile.coverage` use them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import chainoffload as co
from chainoffload.units import format_bytes

from ._recorder import Sizes, held_grad_tmp

__all__ = ["Coverage", "coverage", "step_peak", "keep_all_chain"]


def step_peak(chain: co.Chain, sizes: Sizes | None) -> int:
    """The keep-all peak of a whole step: the chain's plus the bytes resident outside it.

    With nothing offloaded, a storage the forward releases late is in its unit until B_i, so
    the chain's keep-all figure, which also counts it in the fwd_tmp of the stages it outlives
    (NOTE [ late release ] in _recorder.py), is above the step's by as much: the keep-all peak
    is the chain's without those bytes, what plain training holds."""
    if sizes is None:
        return co.keep_all_peak(chain)
    return co.keep_all_peak(keep_all_chain(chain, sizes)) + sizes.resident_bytes


def keep_all_chain(chain: co.Chain, sizes: Sizes | None) -> co.Chain:
    """``chain`` less the late-release bytes, the bytes a recomputation makes again of a
    state object (NOTE [ state a recomputation puts back ] in _recompute.py) and those of the
    gradients held storages wait for (NOTE [ the gradient a held storage waits for ] in
    _recorder.py) in its ``fwd_tmp``: what plain training holds (exact when nothing moves)."""
    n = chain.length
    late = (getattr(sizes, "late_tmp", ()) or (0,) * n) if sizes is not None else (0,) * n
    again = (getattr(sizes, "restore_tmp", ()) or (0,) * n) if sizes is not None else (0,) * n
    # NOTE [ the gradient a held storage waits for ] in _recorder.py: the first forward has none.
    held = held_grad_tmp(sizes, n)[0]
    if not any(late) and not any(again) and not any(held):
        return chain
    return chain.replace(
        fwd_tmp=[
            max(0, int(f) - int(x) - int(y) - int(z)) for f, x, y, z in zip(chain.fwd_tmp, late, again, held, strict=True)
        ]
    )


@dataclasses.dataclass(frozen=True)
class Coverage:
    """How much of a step's activation memory the chain can move (NOTE [ coverage ]).

    Attributes
    ----------
    movable
        Bytes of the units that may be offloaded (not the last, held, aliased or unmovable).
    keep_all
        The keep-all peak of the chain.
    prefix
        a_0 (the hidden input of the first stage) and the bytes resident outside the chain: what
        the code before the first block saves when it is no stage, and the storages pinned
        resident (a key/value cache, a tensor later blocks read, a list of skips).
    last
        Unit L: the last block and the code after it (head, loss).
    resident
        Bytes of the other units that stay resident, with why, by unit.
    left_out
        Module lists found outside the chain (:attr:`Blocks.left_out`).
    lists
        The module lists the chain's blocks come from.
    """

    movable: int
    keep_all: int
    prefix: int
    last: int
    resident: dict[int, tuple[int, str]]
    left_out: tuple[tuple[str, int, bool], ...] = ()
    lists: tuple[str, ...] = ()

    @property
    def share(self) -> float:
        """``movable`` over the keep-all peak."""
        return self.movable / self.keep_all if self.keep_all else 0.0

    def describe(self) -> str:
        """One line: the share, and what is left out of it."""
        parts = [f"before the first block (a_0) {format_bytes(self.prefix)}", f"the last block and after it {format_bytes(self.last)}"]
        if self.resident:
            kept = sum(b for b, _ in self.resident.values())
            why = sorted({w for _, w in self.resident.values()})
            parts.append(f"{len(self.resident)} unit(s) kept resident ({', '.join(why)}) {format_bytes(kept)}")
        text = (
            f"the chain can move {format_bytes(self.movable)}, {100 * self.share:.0f} % of the keep-all peak "
            f"{format_bytes(self.keep_all)}; left out: {'; '.join(parts)}"
        )
        if self.left_out:
            lists = [n for n, _, before in self.left_out if before] + list(self.lists)
            lists += [n for n, _, before in self.left_out if not before]
            others = ", ".join(f"{n} ({k} blocks)" for n, k, _ in self.left_out)
            text += f"; module lists outside the chain: {others}: blocks={lists!r} would add them"
        return text


# NOTE [ coverage ]
# A chain moves only its units, less those that must stay (the last, held, aliased, unmovable
# ones): what runs before the first block sits in a_0 and what runs after the last in unit L,
# both resident. The share of the keep-all peak the movable units make is the most offloading
# can ever take off the peak; offload() warns below half, naming the parts left out and the
# module lists the search saw outside the chain, as a blocks= to try.


def coverage(chain: co.Chain, sizes: Sizes, blocks: Any = None) -> Coverage:
    """What the chain of ``sizes`` can move (NOTE [ coverage ]); ``blocks`` for the lists left out."""
    resident: dict[int, tuple[int, str]] = {}
    movable = 0
    for i in range(1, chain.length):
        size = int(chain.saved[i - 1])
        why = next((w for w, s in (("held", sizes.held), ("aliased", sizes.aliased), ("unmovable", sizes.unmovable)) if i in s), None)
        if why is None:
            movable += size
        else:
            resident[i] = (size, why)
    return Coverage(
        movable,
        step_peak(chain, sizes),
        int(chain.act[0]) + sizes.resident_bytes,
        int(chain.saved[-1]),
        resident,
        tuple(getattr(blocks, "left_out", ())),
        tuple(getattr(blocks, "lists", ())),
    )
