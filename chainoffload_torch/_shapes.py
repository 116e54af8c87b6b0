"""Comparing the keys of calls (:func:`~chainoffload_torch._tree.call_key`) for plan reuse.

A key is ``(training, autocast, args, kwargs)`` where ``args`` is ``("seq", items)`` and
``kwargs`` ``("map", ((name, item), ...))``; a tensor is ``("tensor", shape, dtype, device,
requires_grad)``; a plain argument is its value. NOTE [ one plan for many shapes ] in api.py
says what these comparisons decide.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

__all__ = ["dominates", "leaves", "numbers_apart", "same_layout", "strip_numbers", "volume"]

Path = tuple


def _is_tensor(k: Any) -> bool:
    return isinstance(k, tuple) and len(k) == 5 and k[0] == "tensor"


def _is_number(k: Any) -> bool:
    return isinstance(k, (int, float)) and not isinstance(k, bool)


def leaves(key: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every leaf of ``key`` (a tensor's tuple, a plain value) with its path."""
    if isinstance(key, tuple) and key and key[0] == "seq" and len(key) == 2:
        for i, v in enumerate(key[1]):
            yield from leaves(v, path + (i,))
    elif isinstance(key, tuple) and key and key[0] == "map" and len(key) == 2:
        for name, v in key[1]:
            yield from leaves(v, path + (name,))
    elif isinstance(key, tuple) and not _is_tensor(key) and path == ():
        for i, v in enumerate(key):  # the top level: (training, autocast, args, kwargs)
            yield from leaves(v, (i,))
    else:
        yield path, key


def _shape(key: Any) -> Any:
    """The structure of ``key`` with its leaves left out."""
    return [p for p, _ in leaves(key)]


def strip_numbers(key: Any, paths: frozenset | set) -> Any:
    """``key`` with the numbers at ``paths`` replaced by ``"*"`` (arguments known not to change
    what is saved)."""
    if not paths:
        return key

    def walk(k: Any, path: Path) -> Any:
        if isinstance(k, tuple) and k and k[0] == "seq" and len(k) == 2:
            return ("seq", tuple(walk(v, path + (i,)) for i, v in enumerate(k[1])))
        if isinstance(k, tuple) and k and k[0] == "map" and len(k) == 2:
            return ("map", tuple((name, walk(v, path + (name,))) for name, v in k[1]))
        if isinstance(k, tuple) and not _is_tensor(k) and path == ():
            return tuple(walk(v, (i,)) for i, v in enumerate(k))
        return "*" if path in paths and _is_number(k) else k

    return walk(key, ())


def numbers_apart(a: Any, b: Any) -> set[Path] | None:
    """The paths where ``a`` and ``b`` hold different numbers, if that is all they differ in
    (the same tensors, the same other values); ``None`` otherwise."""
    la, lb = list(leaves(a)), list(leaves(b))
    if [p for p, _ in la] != [p for p, _ in lb]:
        return None
    apart = set()
    for (path, x), (_, y) in zip(la, lb, strict=True):
        if x == y:
            continue
        if _is_number(x) and _is_number(y):
            apart.add(path)
        else:
            return None
    return apart


def dominates(big: Any, small: Any) -> bool:
    """Whether every tensor of ``small`` is at most as large as ``big``'s, dimension by
    dimension (same dtypes, devices, ranks), with everything else equal, and some smaller."""
    lb, ls = list(leaves(big)), list(leaves(small))
    if [p for p, _ in lb] != [p for p, _ in ls]:
        return False
    smaller = False
    for (_, x), (_, y) in zip(lb, ls, strict=True):
        if _is_tensor(x) and _is_tensor(y):
            if x[2:] != y[2:] or len(x[1]) != len(y[1]) or any(d < e for d, e in zip(x[1], y[1], strict=True)):
                return False
            smaller = smaller or x[1] != y[1]
        elif x != y:
            return False
    return smaller


def same_layout(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` differ only in the lengths of their tensors' dimensions (same
    ranks, dtypes, devices, everything else equal): calls of one model at other batch sizes or
    sequence lengths."""
    la, lb = list(leaves(a)), list(leaves(b))
    if [p for p, _ in la] != [p for p, _ in lb]:
        return False
    for (_, x), (_, y) in zip(la, lb, strict=True):
        if _is_tensor(x) and _is_tensor(y):
            if x[2:] != y[2:] or len(x[1]) != len(y[1]):
                return False
        elif x != y:
            return False
    return True


def volume(key: Any) -> int:
    """The number of elements of the key's tensors."""
    total = 0
    for _, x in leaves(key):
        if _is_tensor(x):
            n = 1
            for d in x[1]:
                n *= int(d)
            total += n
    return total
