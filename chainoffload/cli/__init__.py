"""The command line: ``chainoffload solve | simulate | verify | plot | tradeoff | methods | example``.

It sits at the top of the import graph (model -> schedule -> simulate -> solvers -> cli), in
rooms with one job each: :mod:`~chainoffload.cli.contract` (the output contract: one-line
errors, exit codes, atomic files, Ctrl-C and SIGTERM), :mod:`~chainoffload.cli.parser`
(argument parsing and the platform flags), :mod:`~chainoffload.cli.tables` (the text tables)
and :mod:`~chainoffload.cli.commands` (the seven commands and their flags). Here: :func:`main`,
which runs a command in a worker thread while the main thread watches for Ctrl-C
(``NOTE [ cli contract ]``), and :func:`console`, the console script.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Sequence

from .commands import build_parser
from .contract import (
    _STOP_CODES,
    EXIT_CODES,
    CliError,
    Output,
    _error,
    _Gate,
    _interrupted,
    _run,
    _Terminated,
    _unwatch,
    _watch_sigint,
)
from .parser import add_platform_flags, load_platform

__all__ = ["main", "console", "build_parser", "add_platform_flags", "load_platform", "CliError", "Output", "EXIT_CODES"]


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chainoffload`` console script. Returns the exit code.

    Exit codes are :data:`EXIT_CODES`. On Ctrl-C (from the main thread) the process ends at
    once with ``os._exit(130)`` (``NOTE [ cli contract ]``).
    """
    if sys.stderr is None:
        # Started with stderr closed: nowhere to say anything, but fd 2 must not be handed to a
        # file we open (a library writing to fd 2 would write into it).
        sys.stderr = open(os.devnull, "w")
    if sys.stdout is None:  # started with `>&-` (NOTE [ cli contract ])
        return _error(CliError("stdout is closed: give the command somewhere to print (e.g. >/dev/null)"))
    if threading.current_thread() is not threading.main_thread():
        # Signals reach only the main thread: nothing to wait for interruptibly.
        gate = _Gate()
        try:
            args = build_parser().parse_args(argv)
        except CliError as exc:
            return _error(exc)
        return _run(args, gate)
    box: dict[str, int] = {}
    worker = None
    watch = _watch_sigint()
    gate = _Gate(watch[0] if watch else None, served=True, watched=watch[3] if watch else frozenset())
    try:
        try:
            args = build_parser().parse_args(argv)
        except CliError as exc:
            return _error(exc)

        def work() -> None:
            # SIGINT goes to the main thread alone (NOTE [ cli contract ]); threads the
            # command starts (OR-Tools' workers) inherit the mask.
            signal.pthread_sigmask(signal.SIG_BLOCK, set(_STOP_CODES))
            try:
                box.update(code=_run(args, gate))
            finally:
                gate.wake()

        worker = threading.Thread(target=work, name="chainoffload", daemon=True)
        worker.start()
        while worker.is_alive():
            gate.serve(0.05)
        if _ENDING:
            # The command is done: a signal from now on changes nothing (NOTE [ cli contract ]).
            for s in _STOP_CODES:
                signal.signal(s, signal.SIG_IGN)
    except KeyboardInterrupt as exc:
        _interrupted(gate, signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT)
    finally:
        _unwatch(watch)
    return box.get("code", 2)


# Set by console(): the process ends with main(), so main may ignore the stop signals once the
# command is decided (a library caller's handlers are left alone).
_ENDING = False


def console() -> None:
    """Entry point of the ``chainoffload`` console script and of ``python -m chainoffload``:
    :func:`main`, then exit with its code. A SIGINT or SIGTERM that comes once the command is
    done (its file renamed into place) is ignored: the process never dies by the signal with
    the new file in place (``NOTE [ cli contract ]``)."""
    global _ENDING
    _ENDING = True
    try:
        code = main()
    except KeyboardInterrupt:  # before main's handling began (nothing read or written yet)
        code = 130
    for s in _STOP_CODES:
        try:
            signal.signal(s, signal.SIG_IGN)
        except (ValueError, OSError):  # pragma: no cover - not the main thread
            pass
    sys.exit(code)

