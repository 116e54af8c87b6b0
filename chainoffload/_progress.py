"""Progress on stderr for long work (``best``, ``cpsat``, ``minimum_memory``, the benchmarks).

Private. One switch for the whole process, :func:`configure`: ``None`` (the default) shows
progress when stderr is a terminal, ``True`` always (the CLI's ``--progress``), ``False`` never
(the CLI's ``--json``). Bars are drawn by ``tqdm`` (a core dependency: pure Python, no
dependencies of its own, and the issue asks for a maintained library rather than hand-written
bars); a bar that is off is a no-op object with the same methods, so callers never test.

Use::

    from chainoffload._progress import progress

    with progress("best", total=time_limit, unit="s") as bar:
        ...
        bar.update(1)                  # count something done
        bar.set(elapsed)               # or set the position (e.g. seconds of a budget)
        bar.note(makespan="1.234 s")   # short fields after the bar
    # or without a bar: note_once("compiling solver kernels, once: ~10 s")

A ``total`` of ``None`` draws a counter without a bar. Nested bars are allowed (tqdm stacks
them); the inner ones are left on screen only while they run.
"""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["configure", "enabled", "progress", "note_once", "Progress"]

_MODE: list[bool | None] = [None]
_NOTED: set[str] = set()


def configure(enabled: bool | None) -> None:
    """Turn progress on (``True``), off (``False``) or back to automatic (``None``: on when stderr is a terminal)."""
    if enabled not in (None, True, False):
        raise ValueError(f"progress: expected True, False or None, got {enabled!r}")
    _MODE[0] = enabled


def enabled() -> bool:
    """Whether progress is shown now (see :func:`configure`)."""
    mode = _MODE[0]
    if mode is not None:
        return mode
    if os.environ.get("CHAINOFFLOAD_PROGRESS", "") in ("0", "1"):
        return os.environ["CHAINOFFLOAD_PROGRESS"] == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class Progress:
    """A progress bar on stderr, or nothing when progress is off (same methods either way)."""

    def __init__(self, desc: str, total: float | None = None, unit: str = "it", leave: bool = False) -> None:
        self._bar = None
        self._pos = 0.0
        if enabled():
            from tqdm.auto import tqdm

            self._bar = tqdm(
                total=total,
                desc=desc,
                unit=unit,
                leave=leave,
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.2,
                bar_format=None if total is not None else "{desc}: {n_fmt} {unit} [{elapsed}{postfix}]",
            )

    def update(self, n: float = 1) -> None:
        """Advance by ``n``."""
        if self._bar is not None:
            self._pos += n
            self._bar.update(n)

    def set(self, position: float) -> None:
        """Move to ``position`` (clamped to the total; never backwards)."""
        if self._bar is not None:
            total = self._bar.total
            position = min(position, total) if total is not None else position
            if position > self._pos:
                self._bar.update(position - self._pos)
                self._pos = position

    def note(self, **fields: Any) -> None:
        """Show short ``key=value`` fields after the bar."""
        if self._bar is not None:
            self._bar.set_postfix(fields, refresh=False)

    def close(self) -> None:
        """Remove the bar (it is also closed on leaving a ``with`` block)."""
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(desc: str, total: float | None = None, unit: str = "it", leave: bool = False) -> Progress:
    """A :class:`Progress` bar named ``desc`` up to ``total`` (``None``: a counter), in ``unit``."""
    return Progress(desc, total, unit, leave)


def note_once(line: str) -> None:
    """Print ``line`` on stderr once per process, whether or not bars are on (unless progress is
    turned off with :func:`configure`); for one-off news such as a first compile."""
    if _MODE[0] is False or line in _NOTED:
        return
    _NOTED.add(line)
    print(f"chainoffload: {line}", file=sys.stderr, flush=True)
