"""The command line: ``chainoffload solve | simulate | verify | plot | tradeoff | methods | example``.

Every subcommand is defined here, at the top of the import graph (model -> schedule -> simulate
-> solvers -> cli); the modules that do the work (:mod:`chainoffload.verify`,
:mod:`chainoffload.plot`) are imported inside the command functions, so matplotlib stays
optional and a broken module fails loudly when its command runs instead of silently losing it.

The contract, for people and scripts alike (``NOTE [ cli contract ]``): an error is one line on
stderr and exit code 2, without a traceback; no file is written on any exit code but 0 and 1;
``--json`` prints exactly one JSON object on stdout; every file is written atomically; Ctrl-C
ends any command within a second with exit code 130 and no file written. A command function
therefore never prints or writes itself: it computes everything, then hands its stdout text and
its file to an :class:`Output`, which the CLI writes only once the command has returned.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ._jsonio import PendingWrite, TargetError, check_target
from .chain import Chain
from .platform import Platform, PlatformError
from .schedule_file import ScheduleFile
from .units import format_bytes, format_percent, format_seconds, parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["main", "console", "build_parser", "add_platform_flags", "load_platform", "CliError", "Output", "EXIT_CODES"]

#: Used when neither --platform, a schedule file nor --bandwidth* gives one: an effective PCIe 3.0 x16 link.
DEFAULT_BANDWIDTH = "12GB/s"

#: What the exit code says (also in ``chainoffload --help``).
EXIT_CODES = {
    0: "success; for solve, a schedule was found; for simulate and verify, the schedule is feasible",
    1: "solve found no schedule (status infeasible, timeout or error); simulate or verify: the schedule is infeasible",
    2: "misuse: bad arguments or input files, a schedule made for another chain, or stdout that cannot be written (one line on stderr, nothing written)",
    130: "interrupted (Ctrl-C, SIGINT): nothing written",
    143: "terminated (SIGTERM, e.g. kill or a job scheduler): nothing written",
}

#: The signals that stop a command, and the exit code of each (128 + the signal's number, as a
#: shell reports a process the signal killed): handled alike (NOTE [ cli contract ]).
_STOP_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}

_EPILOG = "exit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES.items())

# NOTE [ cli contract ]
# * One line, exit 2, no traceback: CliError, ValueError (every model error subclasses it),
#   OSError and ImportError (a missing extra) are printed as one line; any other exception is a
#   bug, printed as one line too (CHAINOFFLOAD_DEBUG=1 shows its traceback).
# * No file is left behind on any exit but 0 and 1. Commands record their stdout and their file
#   in an Output, written only after the command returned without error, in the one order in
#   which a failure can still be undone: (1) the file, whole and flushed to disk, in a private
#   folder beside its target (PendingWrite); (2) stdout, whole and flushed; (3) the rename over
#   the target, the only step that cannot be taken back, and the last that can fail; (4) the
#   notes on stderr, whose failure is ignored (the work is done, and there is nowhere left to
#   report it). A failure at (1) or (2) (a full disk, stdout on /dev/full, a reader that went
#   away: EPIPE, as Python ignores SIGPIPE) removes the temporary and exits 2. A command writes
#   one file at most: undoing a second rename would need the first file's old content.
# * Stdout closed (`>&-`) is misuse, refused before any work, whatever the command: fd 1 would
#   otherwise be handed to the next file opened, and what a library prints would land in it.
# * Ctrl-C: the command runs in a worker thread while the main thread waits in short,
#   interruptible waits. Python runs signal handlers only in the main thread, between bytecodes,
#   so a SIGINT that arrives during a long Numba call (the kernels release the GIL: nogil=True)
#   or an OR-Tools solve is handled at once, instead of after the call returns (tens of
#   seconds) or inside it (numba's dispatcher then raised SystemError). The main thread then
#   removes the temporaries (_Gate) and exits with os._exit(130): the worker cannot be stopped,
#   and nothing it would still do matters. Creating a temporary and renaming it happen under
#   _Gate's lock, which the main thread takes and never gives back, so after an interrupt the
#   worker can neither create nor rename anything; a Ctrl-C that comes once the rename is done
#   is too late to undo the command and exits with the command's own code. "Comes" is when the
#   signal is sent, not when the main thread gets round to it: on a loaded machine that can be
#   tens of ms later (its 50 ms wait, a scheduler slice), long enough for a slow reader that
#   resumes reading to let the worker finish stdout and rename (seen: exit 0 and the file in
#   place after a Ctrl-C sent while stdout was blocked). The kernel queues a SIGINT for a
#   thread at once, but its C handler runs only when that thread next gets a CPU. So the worker
#   (and every thread it starts) blocks SIGINT, which the kernel then queues for the main
#   thread alone, and the rename is decided in the main thread (_Gate.decide) with SIGINT
#   blocked there too: a SIGINT sent before is then either still queued (signal.sigpending
#   shows it) or its C handler has run, writing the signal's number to the pipe that
#   signal.set_wakeup_fd names. Either stops the rename; the main thread's handler then exits
#   130 with the temporaries removed. (When the worker read that pipe itself, a SIGINT queued
#   for a main thread still waiting for a CPU was in neither place: exit 0 in 1 run of 15
#   beside two spinning processes.) Stdout is written
#   outside the lock (a slow reader must not hold Ctrl-C back), so what a reader had already
#   received before a Ctrl-C stays received: exit 130 says it is incomplete.
#   Before `main` runs, while Python imports numpy and Numba (about a second), Ctrl-C is still
#   Python's own: a KeyboardInterrupt traceback and death by SIGINT (130 in a shell); nothing
#   has been read or written by then.
# * SIGTERM (kill, a job scheduler, a CI timeout) is handled as SIGINT is, by the same main
#   thread, pipe and mask, and exits 143 (128 + 15, what a shell shows for a process SIGTERM
#   killed) with the temporaries removed; without a handler it killed the process and left the
#   private folder beside the target. A SIGTERM that the parent ignores stays ignored.
# * After the rename the command is done: a signal then never kills the process (it died by
#   SIGINT with the new file in place when the KeyboardInterrupt came after main returned). The
#   console entry (`console`) ignores both signals from the moment main has decided until the
#   process exits, and exits with the command's own code.
# * OR-Tools' solvers would install C handlers of their own for SIGINT during a search (CP-SAT
#   aborted the process, SCIP swallowed the Ctrl-C): chainoffload/_interrupt.py turns them off
#   and stops a running search through its API when the main thread handles the signal.


class CliError(Exception):
    """A usage error with a one-line message (exit code 2)."""


class _Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread as Ctrl-C's KeyboardInterrupt is (exit 143)."""


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Terminated


def _raise_for(signum: int) -> None:
    raise _Terminated if signum == signal.SIGTERM else KeyboardInterrupt


class Output:
    """What a command leaves behind, written by :func:`main` only once the command has returned.

    Commands call :meth:`print` for stdout, :meth:`note` for stderr lines and :meth:`file` for
    the file to write; nothing reaches the terminal or the disk before the command is done.
    """

    def __init__(self) -> None:
        self.text: list[str] = []
        self.notes: list[str] = []
        self.files: list[tuple[str, Callable[[str], None]]] = []

    def print(self, *parts: Any) -> None:
        """A line of stdout, as ``print`` would write it."""
        self.text.append(" ".join(str(p) for p in parts) + "\n")

    def note(self, line: str) -> None:
        """A line of stderr (``chainoffload: `` is prepended)."""
        self.notes.append(f"chainoffload: {line}\n")

    def file(self, path: str, content: str | Callable[[str], None]) -> None:
        """Write ``path`` atomically: ``content`` is the text, or ``content(tmp)`` creates the
        file at the temporary path ``tmp`` (for writers that take a path, like matplotlib's)."""
        if self.files:  # NOTE [ cli contract ]: a second file could not be rolled back
            raise RuntimeError(f"Output.file: a command writes one file; {self.files[0][0]} is already recorded")
        if isinstance(content, str):
            text = content

            def content(tmp: str) -> None:
                with open(tmp, "w", encoding="utf-8") as fh:
                    fh.write(text)

        self.files.append((path, content))

    def json(self, obj: Any) -> None:
        """One JSON object on stdout: non-finite numbers become ``null`` (strict JSON)."""
        self.print(json.dumps(_json_safe(obj), allow_nan=False))

    def commit(self, gate: _Gate, code: int) -> None:
        """Write it all in the order of ``NOTE [ cli contract ]``: file beside its target,
        stdout, rename, notes."""
        pending: list[PendingWrite] = []
        try:
            for path, write in self.files:
                pending.append(gate.start(path))
                pending[-1].fill(write)
            _write_stdout("".join(self.text))
            gate.finish(pending, code)
        except BaseException:
            for p in pending:
                p.discard()
            raise
        try:
            sys.stderr.write("".join(self.notes))
            sys.stderr.flush()
        except (OSError, ValueError):
            pass


class _Gate:
    """What the worker and the main thread share about the files on disk (``NOTE [ cli contract ]``).

    The worker creates each temporary (:meth:`start`) under the lock and asks for the rename
    (:meth:`finish`); the main thread, serving the worker (:meth:`serve`), decides it with SIGINT
    blocked (:meth:`decide`). On Ctrl-C the main thread takes the lock for good
    (:meth:`interrupt`), so either the rename is done and the command's code stands, or nothing
    is in place and every temporary is removed.
    """

    def __init__(self, signals: int | None = None, *, served: bool = False, watched: frozenset[int] = frozenset({signal.SIGINT})) -> None:
        self._lock = threading.Lock()
        self._pending: list[PendingWrite] = []
        self.code: int | None = None  # set once the files are in place
        self.closed = False
        # Read end of the pipe signal.set_wakeup_fd writes delivered signals to (main's).
        self._signals = signals
        self._watched = watched  # the signals whose handlers raise in the main thread
        self._came: int | None = None  # the first of them delivered
        # served: a main thread runs serve() while the worker works, and decides the rename.
        self._served = served
        self._wake = threading.Event()  # a rename asked for, or the worker done
        self._request: tuple[list[PendingWrite], int] | None = None
        self._decided = threading.Event()
        self._outcome: bool | BaseException = False  # stopped, or what the rename raised

    def start(self, path: str) -> PendingWrite:
        with self._lock:
            pending = PendingWrite(path)
            self._pending.append(pending)
            return pending

    def finish(self, pending: list[PendingWrite], code: int) -> None:
        """Have the files renamed into place, unless a Ctrl-C came before: then they are removed
        and this waits for the main thread, which exits 130 (``NOTE [ cli contract ]``)."""
        if self._served:
            self._request = (pending, code)
            self._wake.set()
            self._decided.wait()
            outcome = self._outcome
        else:
            outcome = self.decide(pending, code)
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome:
            threading.Event().wait()  # the main thread's handler ends the process

    def decide(self, pending: list[PendingWrite], code: int) -> bool:
        """Rename ``pending`` into place and record ``code``, or remove them if a SIGINT came
        first; whether it did. In the main thread, a SIGINT that comes meanwhile (the kernel hands
        it to another thread, numpy's BLAS workers, while this one blocks it) only sets a flag,
        and its KeyboardInterrupt is raised once the decision is whole."""
        if self._signals is None or threading.current_thread() is not threading.main_thread():
            return self._decide(pending, code)  # no Ctrl-C to watch (SIGINT ignored), or none here
        came: list[int] = []
        watched = sorted(self._watched)
        previous = {s: signal.signal(s, lambda signum, frame: came.append(signum)) for s in watched}
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, set(watched))
        try:
            return self._decide(pending, code)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            for s, handler in previous.items():
                signal.signal(s, handler)
            if came and previous[came[0]] in (signal.default_int_handler, _on_sigterm):
                _raise_for(came[0])

    def _decide(self, pending: list[PendingWrite], code: int) -> bool:
        with self._lock:
            stop = self.signal_delivered() is not None
            for p in pending:
                p.discard() if stop else p.commit()
            if not stop:
                self.code = code
        return stop

    def serve(self, timeout: float) -> None:
        """Main thread: wait up to ``timeout`` s for the worker to ask for its rename (or end), and
        decide the rename if it asked. Interruptible: a Ctrl-C raises KeyboardInterrupt here."""
        if not self._wake.wait(timeout):
            return
        self._wake.clear()
        request, self._request = self._request, None
        if request is None:
            return
        try:
            self._outcome = self.decide(*request)
        except BaseException as exc:  # the rename failed: the worker reports it (exit 2)
            if isinstance(exc, KeyboardInterrupt):
                raise
            self._outcome = exc
        self._decided.set()

    def wake(self) -> None:
        """The worker is done: end the main thread's wait at once."""
        self._wake.set()

    def signal_delivered(self) -> int | None:
        """The first watched signal (SIGINT, SIGTERM) that has come, or ``None``: pending for
        this thread while it blocks them, or handled by the C handler, which wrote its number
        to the wakeup pipe (``None`` without one)."""
        if self._signals is None:
            return self._came
        if self._came is None:
            pending = signal.sigpending() & self._watched
            if pending:
                self._came = min(pending)
        while self._signals is not None and self._came is None:
            try:
                data = os.read(self._signals, 512)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self._signals = None
                break
            if not data:
                break
            for byte in data:
                if byte in self._watched:
                    self._came = byte
                    break
        return self._came

    def sigint_delivered(self) -> bool:
        """Whether a watched signal has come (:meth:`signal_delivered`)."""
        return self.signal_delivered() is not None

    def interrupt(self) -> int | None:
        """Stop all writing; the command's code if its files were already in place, else ``None``
        once every temporary is removed."""
        self._lock.acquire()  # waits for a mkdtemp or a rename (short); never released
        self.closed = True
        if self.code is not None:
            return self.code
        for p in self._pending:
            p.discard()
        return None


def _write_stdout(text: str) -> None:
    """Write and flush stdout; a failure is a :class:`CliError` (exit 2)."""
    if not text:
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except (OSError, ValueError) as exc:
        _drop_stdout()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CliError(f"cannot write to stdout: {reason}") from None


def _drop_stdout() -> None:
    """Point fd 1 at /dev/null, so that the flush at interpreter exit, which would meet the same
    error, does not print 'Exception ignored' and turn the exit code into 120."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (pytest's capture): nothing is flushed at exit
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _json_safe(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # A shortened flag is an error, never the longer flag it starts (``--mem`` for
        # ``--memory``, ``--time`` for ``--time-limit``): scripts keep meaning what they say
        # when a flag is added later.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, exit 2, as every other error
        raise CliError(f"{message} (see `{self.prog} --help`)")

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:
        # A flag given twice took the last value silently (`--memory 4GiB ... --memory 6GiB`,
        # a script that appended its own flag to a user's): an error, unless the flag is meant
        # to be repeated (--option). Each parser checks its own flags, a subcommand's parser
        # the words after the subcommand.
        argv = list(sys.argv[1:] if args is None else args)
        seen: dict[str, str] = {}
        for token in argv:
            if token == "--":
                break
            action = self._single_flags().get(token.partition("=")[0] if token.startswith("--") else token)
            if action is None:
                continue
            flag = token.partition("=")[0]
            if action in seen:
                again = "given twice" if seen[action] == flag else f"given after {seen[action]}, which sets the same"
                self.error(f"{flag}: {again}; give each flag once")
            seen[action] = flag
        return super().parse_known_args(argv, namespace)

    def _single_flags(self) -> dict[str, str]:
        """Each option string of a flag that may be given once, to the flag's destination (so
        that ``-o`` and ``--out`` count as one; ``--duplex`` and ``--half-duplex`` too)."""
        once = (argparse._StoreAction, argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)
        return {opt: a.dest for a in self._actions if type(a) in once for opt in a.option_strings}


def add_platform_flags(parser: argparse.ArgumentParser, *, recorded: bool = False, memory: bool = True) -> None:
    """Add the platform flags to a subcommand's parser.

    ``recorded``: the command reads a schedule file, whose recorded platform the flags override.
    ``memory=False``: the command sets the memory itself; ``--memory`` is still parsed (hidden),
    so that the command can refuse it by name and say what to use instead.
    """
    g = parser.add_argument_group(
        "platform",
        "the schedule file's recorded platform, then --platform, then each flag, the later overriding the earlier field by field"
        if recorded
        else "--platform, then each flag overriding its field",
    )
    g.add_argument("--platform", metavar="PLATFORM.json", help="platform JSON; the flags below override its fields")
    g.add_argument("--memory", help="GPU memory for activations, e.g. 6GiB, 900MB, 123456" if memory else argparse.SUPPRESS)
    g.add_argument("--bandwidth", help=f"both directions, e.g. 12GB/s, 16GiB/s (default {DEFAULT_BANDWIDTH})")
    g.add_argument("--bandwidth-d2h", help="device-to-host bandwidth")
    g.add_argument("--bandwidth-h2d", help="host-to-device bandwidth")
    g.add_argument("--latency", help="per-transfer latency, e.g. 10us, 0.2ms (default 0)")
    duplex = g.add_mutually_exclusive_group()
    duplex.add_argument("--half-duplex", dest="duplex", action="store_false", default=None, help="one shared channel for both directions")
    duplex.add_argument("--duplex", dest="duplex", action="store_true", default=None, help="two independent channels (the default)")


# Platform fields each flag sets, to name the flag in an error about that field.
_FLAG_FIELDS = (
    ("memory", "memory", parse_bytes),
    ("bandwidth", ("bandwidth_d2h", "bandwidth_h2d"), parse_bandwidth),
    ("bandwidth_d2h", "bandwidth_d2h", parse_bandwidth),
    ("bandwidth_h2d", "bandwidth_h2d", parse_bandwidth),
    ("latency", "latency", parse_seconds),
)


def load_platform(args: argparse.Namespace, recorded: Platform | None = None) -> Platform:
    """Build the platform: ``recorded`` (a schedule file's), then ``--platform``, then the flags.

    Each later source overrides the earlier ones field by field.
    """
    data: dict[str, Any] = {} if recorded is None else recorded.to_dict()
    if getattr(args, "platform", None):
        data.update(Platform.load(args.platform).to_dict())
    by_flag: dict[str, str] = {}
    for attr, fields, parse in _FLAG_FIELDS:
        text = getattr(args, attr, None)
        if text is None:
            continue
        flag = "--" + attr.replace("_", "-")
        value = parse(text, field=flag)
        for field in (fields,) if isinstance(fields, str) else fields:
            data[field] = value
            by_flag[field] = flag
    if getattr(args, "duplex", None) is not None:
        data["duplex"] = bool(args.duplex)
    if "memory" not in data:
        raise CliError("--memory is required (or --platform PLATFORM.json)")
    default_bw = parse_bandwidth(DEFAULT_BANDWIDTH)
    data.setdefault("bandwidth_d2h", default_bw)
    data.setdefault("bandwidth_h2d", default_bw)
    try:
        return Platform.from_dict(data)
    except PlatformError as exc:
        field = str(exc).partition(":")[0].removeprefix("platform.")
        if field in by_flag:
            raise CliError(f"{by_flag[field]}: {str(exc).partition(': ')[2]}") from None
        raise


def _platform_source(args: argparse.Namespace, record: ScheduleFile) -> str:
    """Where the platform came from, for the table: '' unless the schedule file's was used."""
    if record.platform is None:
        return ""
    flags = [a for a in ("platform", "memory", "bandwidth", "bandwidth_d2h", "bandwidth_h2d", "latency") if getattr(args, a, None) is not None]
    if getattr(args, "duplex", None) is not None:
        flags.append("duplex")
    return f"  (recorded in {args.schedule}" + (", overridden by " + ", ".join("--" + f.replace("_", "-") for f in flags) if flags else "") + ")"


def _instance_rows(chain: Chain, platform: Platform, source: str = "") -> list[tuple[str, str]]:
    return [
        ("chain", f"{chain.name} ({chain.length} stages, compute {format_seconds(chain.compute_time)})"),
        ("platform", platform.describe() + source),
    ]


def _idle_text(timeline: Any) -> str:
    """Where compute waits, by cause (see :func:`chainoffload.stalls`), for the tables.

    From :func:`chainoffload.stalls.stall_summary`'s arrays: building a Stall object per stall
    took seconds per 10^5 stages, after a solve that had kept its time limit.
    """
    from .stalls import stall_summary

    _ops, durations, transfers = stall_summary(timeline)
    if not transfers.shape[0]:
        return "never (every copy is hidden behind compute)"
    schedule = timeline.schedule
    is_offload = schedule.arrays()[2][transfers] == 0

    def names(mask: np.ndarray) -> str:
        seen: list[int] = []
        for t in transfers[mask].tolist():  # the first 7 distinct ones, in time order
            if t not in seen:
                seen.append(t)
                if len(seen) > 6:
                    break
        return ", ".join(schedule.transfer_name(t) for t in seen[:6]) + (", ..." if len(seen) > 6 else "")

    idle = sum(durations.tolist())
    parts = []
    for mask, what in ((is_offload, "for offloads to free memory"), (~is_offload, "for prefetches to arrive")):
        total = sum(durations[mask].tolist())
        if total > 0:
            parts.append(f"{format_seconds(total)} {what} ({names(mask)})")
    count = int(transfers.shape[0])
    share = f" ({format_percent(idle / timeline.makespan)} of the makespan)" if timeline.makespan > 0 else ""
    return f"{format_seconds(idle)}{share} in {count} stall{'' if count == 1 else 's'}: " + "; ".join(parts)


def _units_text(units: Sequence[int], runs_shown: int = 12) -> str:
    """'4 units: 1, 6, 9-10': the stages as runs of consecutive ones, for a table.

    Past ``runs_shown`` runs the middle ones are left out with a count: a line must stay a line
    at a million stages (``--json`` has every stage).
    """
    units = sorted(int(u) for u in units)
    if not units:
        return "0 units"
    runs: list[list[int]] = []
    for u in units:
        if runs and u == runs[-1][1] + 1:
            runs[-1][1] = u
        else:
            runs.append([u, u])
    words = [str(a) if a == b else f"{a}-{b}" for a, b in runs]
    if len(runs) > runs_shown:
        head, tail = runs_shown - 4, 3
        hidden = runs[head:-tail]
        count = sum(b - a + 1 for a, b in hidden)
        words = words[:head] + [f"... ({count} more in {len(hidden)} runs) ..."] + words[-tail:]
    return f"{len(units)} unit{'' if len(units) == 1 else 's'}: " + ", ".join(words)


def _table(out: Output, rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.print(f"{key:<{width}}  {value}")


def _over_compute(makespan: float, compute: float) -> str:
    """'(+x% over compute)', or what stands for it when compute takes no time."""
    if not math.isfinite(makespan):
        return ""
    if compute > 0:
        return f"  (+{100 * (makespan / compute - 1):.2f}% over compute)"
    return "  (compute takes no time)" if makespan == 0 else "  (all of it waiting: compute takes no time)"


def _load_schedule(args: argparse.Namespace, chain: Chain) -> tuple[ScheduleFile, Platform]:
    """The schedule file of ``args.schedule``, checked against ``chain``, and its platform."""
    record = ScheduleFile.load(args.schedule)
    record.check_chain(chain)
    return record, load_platform(args, record.platform)


def _cmd_solve(args: argparse.Namespace, out: Output) -> int:
    import contextlib

    with contextlib.ExitStack() as stack:
        return _solve_command(args, out, stack)


def _solve_command(args: argparse.Namespace, out: Output, stack: Any) -> int:
    import time

    from ._cost import file_read_seconds, report_seconds
    from .solvers import DEFAULT_METHOD, check_time_limit, solve

    # NOTE [ clock ] (chainoffload/_cost.py): the limit counts reading the input too, so a
    # limit that reading alone would overrun is refused before anything is read.
    started = time.perf_counter()
    if args.time_limit is not None:
        check_time_limit(args.time_limit)
        need = file_read_seconds(args.chain, getattr(args, "platform", None))
        if args.time_limit < need:
            size = sum(os.path.getsize(p) for p in (args.chain, args.platform) if p and os.path.isfile(p))
            raise CliError(
                f"--time-limit {args.time_limit:g}: reading the input ({format_bytes(size)}) is estimated to take "
                f"{need:.1f} s here, more than the limit, which counts reading; give at least --time-limit {math.ceil(need)}"
            )
    chain = Chain.load(args.chain)
    platform = load_platform(args)
    options: dict[str, Any] = {}
    for item in args.option or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--option: expected KEY=VALUE, got {item!r}")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            options[key.replace("-", "_")] = value
    # The kernels are made ready here, inside the command's clock: loading them from the cache
    # and the imports took 1-2 s of a loaded machine that the limit did not count (issue 33:
    # --time-limit 1 ran 2.0-2.7 s inside main()). A one-off compile still does not count, as
    # in solve() (NOTE [ lazy kernels ]); solve()'s own prepare() then finds them ready.
    from ._compile import prepare

    ready = stack.enter_context(prepare(args.method or DEFAULT_METHOD, chain.length))
    if args.time_limit is not None:
        # What reading and loading took counts; the table printed after the solve is kept room for.
        spent = time.perf_counter() - started - ready.seconds
        options["time_limit"] = max(args.time_limit - spent - report_seconds(chain.length), 1e-3)
        if args.min_memory:
            # One limit for the whole command: the solve gets half, the bisection what is left.
            options["time_limit"] *= 0.5
    finish = None if args.time_limit is None else started + ready.seconds + args.time_limit - report_seconds(chain.length)
    result = solve(chain, platform, args.method, **options)
    if ready.seconds > 0 and not result.info.get("compile_time"):
        result = result.replace(info={**result.info, "compile_time": ready.seconds})
    least = floor = search = None
    if args.min_memory:
        from .bounds import offload_memory_floor
        from .solvers import memory_search

        options.pop("time_limit", None)
        rest = None if finish is None else max(finish - time.perf_counter(), 1e-3)
        search = memory_search(chain, platform, args.method, time_limit=rest, **options)
        least = search.memory
        floor = offload_memory_floor(chain)
    code = 0 if result.feasible else 1
    if args.out:
        if result.feasible:
            record = ScheduleFile.from_result(chain, platform, result)
            out.file(args.out, record.to_json() + "\n")
        else:
            out.note(f"no schedule written to {args.out}: method {result.method!r} found none ({result.status})")
    if args.json:
        data = result.to_dict()
        if args.min_memory:
            data.update(min_memory=least, memory_floor=floor, min_memory_converged=search.converged)
        out.json(data)
        return code
    rows = _instance_rows(chain, platform) + [
        ("method", result.method + ("" if args.method else f" (default: {DEFAULT_METHOD})")),
        ("status", str(result.status)),
    ]
    if result.feasible:
        rows += [
            ("makespan", format_seconds(result.makespan) + _over_compute(result.makespan, chain.compute_time)),
            ("lower bound", f"{format_seconds(result.lower_bound)}  (gap {100 * result.gap:.2f}%; {result.info.get('bound', 'method')} bound)"),
            ("compute idle", _idle_text(result.timeline)),
            ("peak memory", f"{format_bytes(result.peak_memory)} of {format_bytes(platform.memory)}"),
            ("offloaded", f"{format_bytes(result.offloaded_bytes)} in {_units_text(result.schedule.offloaded_units)}"),
        ]
    else:
        if result.min_memory is not None:
            rows.append(("min memory", f"{format_bytes(result.min_memory)} ({result.min_memory} B) for this method"))
        if result.message:
            rows.append(("message", result.message))
    if args.min_memory:
        rows += [
            ("least memory", _least_text(search)),
            ("memory floor", f"{format_bytes(floor)} ({floor} B): no offloading schedule fits below (proven)"),
        ]
    rows.append(("runtime", format_seconds(result.runtime)))
    if result.info.get("compile_time"):
        rows.append(("compile", f"{format_seconds(result.info['compile_time'])} (first call: Numba kernels compiled and cached)"))
    if args.out and result.feasible:
        rows.append(("schedule", f"written to {args.out} (with the chain's fingerprint, the platform and these figures)"))
    _table(out, rows)
    return code


def _least_text(search: Any) -> str:
    """The ``least memory`` row of ``solve --min-memory`` from a :class:`~chainoffload.solvers.MemorySearch`."""
    if search.memory is None:
        if search.stopped:
            return f"unknown: the time limit ended the bisection after {search.solves} solve(s) with no schedule found"
        return "none up to keep-all"
    text = f"{format_bytes(search.memory)} ({search.memory} B) for this method, by bisection"
    if not search.converged:
        text += (f"; the time limit stopped it after {search.solves} solve(s): the least lies above "
                 f"{format_bytes(search.below)} ({search.below} B)")
    return text


def _recorded_row(record: ScheduleFile) -> list[tuple[str, str]]:
    if record.method is None:
        return []
    figures = [f"{record.method} ({record.status})"]
    if record.makespan is not None:
        figures.append(f"makespan {format_seconds(record.makespan)}")
    if record.lower_bound is not None:
        figures.append(f"lower bound {format_seconds(record.lower_bound)}")
    return [("solved by", ", ".join(figures))]


def _simulator_ready(chain: Chain) -> Any:
    """The simulator's kernels made ready as for a solve: a short chain on a cold Numba cache
    runs them interpreted while they compile in the background (NOTE [ lazy kernels ])."""
    from ._compile import prepare

    return prepare("simulate", chain.length)


def _cmd_simulate(args: argparse.Namespace, out: Output) -> int:
    from .simulate import simulate

    chain = Chain.load(args.chain)
    with _simulator_ready(chain):
        record, platform = _load_schedule(args, chain)
        schedule = record.schedule
        timeline = simulate(chain, platform, schedule)
    summary = timeline.summary()
    if timeline.feasible and not math.isfinite(timeline.makespan):
        # No rule is broken, but the iteration never ends: a transfer or the times overflow.
        summary["feasible"] = False
        summary["violation"] = {
            "rule": "makespan",
            "op": schedule.op_name(len(schedule.compute) - 1),
            "time": None,
            "bytes": 0,
            "message": f"the makespan is not finite ({timeline.makespan!r}): times or transfer times overflow float64",
        }
    feasible = bool(summary["feasible"])
    if args.json:
        out.json(summary)
        return 0 if feasible else 1
    v = summary["violation"]
    rows = _instance_rows(chain, platform, _platform_source(args, record)) + _recorded_row(record) + [
        ("feasible", "yes" if v is None else f"no: {v['rule']} rule broken by {v['op']}"),
        ("makespan", format_seconds(timeline.makespan) + _over_compute(timeline.makespan, chain.compute_time)),
        ("compute idle", _idle_text(timeline)),
        ("peak memory", f"{format_bytes(timeline.peak_memory)} of {format_bytes(platform.memory)}"),
        ("offloaded", f"{format_bytes(timeline.offloaded_bytes)} in {_units_text(schedule.offloaded_units)}"),
    ]
    if v is not None:
        rows.append(("violation", v["message"]))
    _table(out, rows)
    return 0 if feasible else 1


def _cmd_verify(args: argparse.Namespace, out: Output) -> int:
    from .verify import verify

    if not args.time_limit > 0 or not math.isfinite(args.time_limit):
        raise CliError(f"--time-limit: {args.time_limit!r} must be a number of seconds > 0")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers: {args.workers!r} must be an integer >= 1")
    chain = Chain.load(args.chain)
    record, platform = _load_schedule(args, chain)
    report = verify(chain, platform, record.schedule, time_limit=args.time_limit, workers=args.workers)
    code = 0 if report["feasible"] and report["makespan"] is not None else 1
    if args.json:
        out.json(report)
        return code
    v = report["violation"]
    rows = _instance_rows(chain, platform, _platform_source(args, record)) + _recorded_row(record) + [
        ("feasible", "yes" if code == 0 else "no: the makespan is not finite" if v is None else f"no: {v['rule']} rule broken by {v['op']}"),
        ("makespan", format_seconds(report["makespan"]) if report["makespan"] is not None else "-"),
        ("peak memory", f"{format_bytes(report['peak_memory'])} of {format_bytes(platform.memory)}"),
    ]
    if v is not None:
        rows.append(("violation", v["message"]))
    rows.append(("cpsat", f"{report['cpsat_status']} in {format_seconds(report['cpsat_runtime'])}"))
    if report["optimum"] is not None:
        rows.append(("optimum" if report["cpsat_status"] == "optimal" else "best found", format_seconds(report["optimum"])))
    if report["lower_bound"] is not None:
        rows.append(("lower bound", f"{format_seconds(report['lower_bound'])}  ({report['lower_bound_rung']} bound)"))
    if report["cpsat_bound"] is not None and report["cpsat_status"] != "optimal":
        rows.append(("cpsat bound", format_seconds(report["cpsat_bound"])))
    if report["gap"] is not None:
        rows.append(("gap", f"{100 * report['gap']:.3f}% over the {report['gap_reference'].replace('_', ' ')}"))
    if report["message"]:
        rows.append(("message", report["message"]))
    _table(out, rows)
    return code


def _recorded_bound_holds(record: ScheduleFile, platform: Platform, timeline: Any) -> bool:
    """Whether ``record``'s lower bound is the problem bound of what ``plot`` draws: the file
    names the chain by fingerprint (checked on loading), no flag changed its platform, and its
    schedule replays to the makespan it records."""
    return (
        record.lower_bound is not None
        and record.fingerprint is not None
        and record.platform == platform
        and timeline.feasible
        and record.makespan == timeline.makespan
    )


def _cmd_plot(args: argparse.Namespace, out: Output) -> int:
    from .plot import plot_timeline
    from .simulate import simulate

    chain = Chain.load(args.chain)
    with _simulator_ready(chain):
        record, platform = _load_schedule(args, chain)
        schedule = record.schedule
        timeline = simulate(chain, platform, schedule)
    bound = None
    if not args.no_bound:
        if schedule.has_remat:
            bound = chain.compute_time  # every schedule runs each F and B at least once
        elif _recorded_bound_holds(record, platform, timeline):
            # The file's bound is the one solve printed for this very chain (fingerprint
            # checked), platform and makespan: the ladder would climb to it again, its MILP rung
            # costing ~2 s of CPU (half the README's main job on a cold start, issue 22).
            # `verify` recomputes every bound a file records.
            bound = min(record.lower_bound, timeline.makespan)
        else:
            from .bounds import problem_bound

            # The problem's bound, the figure solve printed for this schedule (NOTE [ bound ladder ]).
            bound = problem_bound(chain, platform, target=timeline.makespan if timeline.feasible else math.inf).value
            if timeline.feasible and math.isfinite(timeline.makespan):
                bound = min(bound, timeline.makespan)
    method = args.method or record.method
    # Drawn at the temporary path when the output is written (the extension picks the format).
    out.file(
        args.out,
        lambda tmp: plot_timeline(
            timeline, tmp, width=args.width, height=args.height, dpi=args.dpi, lower_bound=bound,
            method=method, stalls=not args.no_stalls, title=args.title,
        ),
    )
    out.print(
        f"wrote {args.out}: makespan {format_seconds(timeline.makespan)}"
        + ("" if bound is None else f", lower bound {format_seconds(bound)}")
        + f"; compute idle {_idle_text(timeline)}"
    )
    return 0


def _cmd_tradeoff(args: argparse.Namespace, out: Output) -> int:
    from .tradeoff import tradeoff

    if args.memory is not None:
        raise CliError(
            f"--memory: tradeoff does not take one ({args.memory!r}): it sweeps the memory itself; "
            "give the limits to try with --memories M1,M2,..."
        )
    chain = Chain.load(args.chain)
    if args.platform is None:
        args.memory = "0"  # the sweep sets the memory; only the link matters here
    link = load_platform(args)
    memories = None
    if args.memories:
        memories = [parse_bytes(m.strip(), field="--memories") for m in args.memories.split(",") if m.strip()]
    curve = tradeoff(chain, link, args.methods, memories, points=args.points, time_limit=args.time_limit)
    if args.out:
        out.file(args.out, lambda tmp: curve.plot(tmp, width=args.width, height=args.height, dpi=args.dpi))
    if args.json:
        out.json(curve.to_dict())
        return 0
    rows = [
        ("chain", f"{chain.name} ({chain.length} stages, compute {format_seconds(chain.compute_time)})"),
        ("link", link.describe(memory=False)),
        ("stage floor", f"{format_bytes(curve.stage_floor)}: no schedule fits below (proven)"),
        ("offload floor", f"{format_bytes(curve.offload_floor)}: no schedule without recomputation fits below (proven)"),
        ("keep-all peak", f"{format_bytes(curve.keep_all_peak)}: everything fits, no overhead"),
    ]
    for name, peak in curve.policy_peaks.items():
        rows.append((f"{name} peak", f"{format_bytes(peak)}: what {_POLICY_WORDS.get(name, name + ' holds')}"))
    rows.append(("stopped by", _sweep_stop(curve)))
    _table(out, rows)
    out.print("\noverhead over compute at each memory ('-': no schedule found; lower bound: pure offloading)")
    cols = list(curve.methods) + ["lower bound"]
    cells = [[format_bytes(m)] for m in curve.memories]
    for j in range(len(curve.memories)):
        for m in curve.methods:
            p = curve.curves[m][j]
            cells[j].append(f"{100 * p.overhead:.1f}%" if p.feasible else "-")
        lb = curve.lower_bound_overheads()[j]
        cells[j].append(f"{100 * lb:.1f}%" if math.isfinite(lb) else "-")
    header = ["memory"] + cols
    widths = [max(len(h), *(len(r[c]) for r in cells)) for c, h in enumerate(header)]
    out.print("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)))
    for r in cells:
        out.print("  ".join(x.rjust(w) for x, w in zip(r, widths, strict=True)))
    if args.out:
        out.print(f"wrote {args.out}")
    return 0


# How the tradeoff table names each fixed recomputing policy's peak.
_POLICY_WORDS = {
    "checkpoint-all": "checkpointing every block (HF gradient_checkpointing_enable) holds",
    "sqrt-checkpoint": "sqrt checkpointing holds",
    "recompute-all": "recomputing everything from the input holds (the least of any sequence)",
}


def _sweep_stop(curve: Any) -> str:
    """What stopped the sweep's runs, and so whether its figures are the machine's
    (NOTE [ a sweep without a clock ] in ``chainoffload/tradeoff.py``)."""
    if curve.time_limit is not None:
        return f"a time limit of {curve.time_limit:g} s per run: figures may depend on the machine"
    text = "work budgets, no clock: the same figures on any machine"
    if curve.clocked:
        text += f", except {', '.join(curve.clocked)} (its own wall-clock limit)"
    return text


def _cmd_methods(args: argparse.Namespace, out: Output) -> int:
    from .solvers import DEFAULT_METHOD, methods

    listing = methods()
    if args.json:
        out.json({"default": DEFAULT_METHOD, "methods": listing})
        return 0
    width = max(len(n) for n in listing)
    for name, summary in listing.items():
        mark = "*" if name == DEFAULT_METHOD else " "
        out.print(f"{mark} {name:<{width}}  {summary}")
    out.print("(* the default method)")
    return 0


def _cmd_example(args: argparse.Namespace, out: Output) -> int:
    from .examples import example, example_names

    if args.name is None or args.list:
        names = example_names()
        width = max(len(n) for n in names)
        for name, desc in names.items():
            out.print(f"{name:<{width}}  {desc}")
        return 0
    chain = example(args.name)
    if args.out:
        out.file(args.out, chain.to_json() + "\n")
        out.note(f"wrote {args.out}: {chain.name}, {chain.length} stages")
    else:
        out.print(chain.to_json())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(
        prog="chainoffload",
        description="Offloading schedules for training deep networks in less GPU memory.",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    def command(name: str, help: str, func: Callable[[argparse.Namespace, Output], int]) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help, epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = command("solve", "compute a schedule for a chain under a memory limit", _cmd_solve)
    p.add_argument("chain", metavar="CHAIN.json")
    add_platform_flags(p)
    p.add_argument("--method", default=None, help="a method of `chainoffload methods` (default: the starred one)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds the whole command may take, reading and bound included (every method); with --min-memory the bisection shares it (the solve gets half, the bisection's solves what is left)")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="a method option (repeatable)")
    p.add_argument("--min-memory", action="store_true", help="also find the least memory this method needs (bisection) and the proven floor; within --time-limit, if given (the answer then says when the limit stopped the bisection)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal")
    p.add_argument("--out", metavar="SCHEDULE.json", help="write the schedule here, with the chain's fingerprint, the platform and the figures")

    p = command("simulate", "replay a schedule and report feasibility, makespan and peak memory", _cmd_simulate)
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p, recorded=True)
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command("verify", "check a schedule by the simulator and its optimality gap by CP-SAT", _cmd_verify)
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p, recorded=True)
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds CP-SAT may search (default 60)")
    p.add_argument("--workers", type=int, default=None, help="CP-SAT search workers (default: every core)")
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command(
        "plot",
        "draw a schedule: Gantt chart of compute and transfers over the memory curve, stalls explained. Every "
        "interval in which compute idles is shaded and labelled with the copy it waits for (an offload that must "
        "free memory, or a prefetch that must arrive), with an arrow from that copy to the op it holds back; the "
        "title gives the platform, the makespan, the lower bound and the share of idle time per cause",
        _cmd_plot,
    )
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p, recorded=True)
    p.add_argument(
        "-o", "--out", required=True, metavar="OUT",
        help="file to write: PNG, SVG or PDF, or .html for an interactive chart (self-contained; hover for each op's and copy's figures)",
    )
    p.add_argument("--method", help="the method that made the schedule, for the title (default: the one the schedule file records)")
    p.add_argument("--title", help="replace the title")
    p.add_argument("--no-bound", action="store_true", help="leave the lower bound out (it costs one LP solve for offloading schedules)")
    p.add_argument("--no-stalls", action="store_true", help="do not shade the stalls nor draw the wait arrows")
    p.add_argument("--width", type=float, default=12.0, help="inches, for images (default 12)")
    p.add_argument("--height", type=float, default=6.0, help="inches, for images (default 6)")
    p.add_argument("--dpi", type=int, default=100, help="dots per inch, for images (default 100)")

    p = command(
        "tradeoff",
        "overhead against memory per method, from the proven floor to the keep-all peak: run methods at memory "
        "limits from the least any schedule needs to what keeping every activation needs, and print (or plot, or "
        "give as JSON) each method's overhead over compute, with the proven floors, the keep-all peak and the "
        "pure-offloading lower bound; the sweep sets the memory (--memory is refused; --memories picks the limits)",
        _cmd_tradeoff,
    )
    p.add_argument("chain", metavar="CHAIN.json")
    add_platform_flags(p, memory=False)
    p.add_argument("--methods", nargs="+", metavar="NAME", help="methods to run (default: offload-all first-k largest-first best rotor joint)")
    p.add_argument("--points", type=int, default=10, help="memory limits evenly from the stage floor to the keep-all peak, plus the offload floor (default 10)")
    p.add_argument("--memories", metavar="M1,M2,...", help="these memory limits instead, e.g. 2GiB,3GiB,4.5GiB")
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        help="seconds per run, for methods that take a time limit; the figures may then depend on the machine "
        "(default: none: every method stops by its own work budget, so the same command prints the same table "
        "on any machine, apart from cpsat, which keeps its own 60 s)",
    )
    p.add_argument("-o", "--out", metavar="OUT.png", help="also draw the curves (PNG, SVG or PDF by extension)")
    p.add_argument("--json", action="store_true", help="print the table as one JSON object")
    p.add_argument("--progress", action="store_true", help="show progress on stderr even when it is not a terminal (it is shown on a terminal)")
    p.add_argument("--width", type=float, default=11.0, help="inches (default 11)")
    p.add_argument("--height", type=float, default=5.6, help="inches (default 5.6)")
    p.add_argument("--dpi", type=int, default=100, help="dots per inch (default 100)")

    p = command("methods", "list the registered methods", _cmd_methods)
    p.add_argument("--json", action="store_true", help="print one JSON object")

    p = command("example", "write a shipped example or network chain as JSON (no NAME: list them)", _cmd_example)
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--list", action="store_true", help="list the examples")
    p.add_argument("-o", "--out", metavar="CHAIN.json", help="write to this file instead of stdout")
    return parser


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


def _watch_sigint() -> tuple[int, int, int, frozenset[int], Any] | None:
    """A pipe that the C signal handler writes each delivered signal's number to
    (``signal.set_wakeup_fd``), so that the worker can tell a Ctrl-C or a SIGTERM has come
    before the main thread handles it (``NOTE [ cli contract ]``): ``(read end, write end,
    previous wakeup fd, the signals watched, SIGTERM's previous handler)``, or ``None`` when
    neither is watched or a pipe cannot be made. SIGINT is watched when its handler is Python's
    default (a KeyboardInterrupt follows the byte); SIGTERM when it has the default action
    (death), which this replaces by a handler that raises in the main thread."""
    watched = set()
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        watched.add(signal.SIGINT)
    if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        watched.add(signal.SIGTERM)
    if not watched:
        return None
    try:
        r, w = os.pipe()
    except OSError:
        return None
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except (ValueError, OSError):
        os.close(r)
        os.close(w)
        return None
    term = signal.signal(signal.SIGTERM, _on_sigterm) if signal.SIGTERM in watched else None
    return r, w, old, frozenset(watched), term


def _unwatch(watch: tuple[int, int, int] | None) -> None:
    """Put back the wakeup fd :func:`_watch_sigint` replaced and close its pipe."""
    if watch is None:
        return
    r, w, old, watched, term = watch
    if signal.SIGTERM in watched and signal.getsignal(signal.SIGTERM) is _on_sigterm:
        signal.signal(signal.SIGTERM, term)
    try:
        signal.set_wakeup_fd(old)
    except (ValueError, OSError):
        signal.set_wakeup_fd(-1)
    os.close(r)
    os.close(w)


def _run(args: argparse.Namespace, gate: _Gate) -> int:
    """Run the command, then write its output; return the exit code (errors: one line, 2)."""
    out = Output()
    try:
        _configure(args)
        _check_out(args)
        code = int(args.func(args, out) or 0)
        out.commit(gate, code)
        return code
    except (CliError, ValueError, OSError, ImportError) as exc:
        return _error(exc, gate=gate)
    except Exception as exc:  # a bug: still one line (NOTE [ cli contract ])
        if os.environ.get("CHAINOFFLOAD_DEBUG"):
            raise
        return _error(exc, f"internal error {type(exc).__name__}: ", " (CHAINOFFLOAD_DEBUG=1 shows the traceback)", gate=gate)


# The inputs a command reads, by the attribute argparse gives them, and how to name them.
_INPUTS = (("chain", "the chain file"), ("schedule", "the schedule file"), ("platform", "the --platform file"))


def _check_out(args: argparse.Namespace) -> None:
    """Refuse an ``--out`` that could not be written, or whose writing would destroy something,
    before any work is done (the write checks the target again)."""
    path = getattr(args, "out", None)
    if path is None:
        return
    if path == "":
        raise CliError("--out: the path is empty; name the file to write")
    if path.endswith(("/", os.sep)):
        # It wrote a file named like the folder (`--out newdir/` made `newdir`): a path that
        # ends in a separator names a folder, and --out names the file itself.
        raise CliError(f"--out: {path} names a folder (it ends with {path[-1]!r}); name the file to write, e.g. {path}schedule.json")
    try:
        check_target(path)
    except TargetError as exc:
        raise CliError(f"--out: {exc.strerror}") from None
    for attr, what in _INPUTS:
        source = getattr(args, attr, None)
        if source and _same_file(path, source):
            named = "" if os.path.abspath(path) == os.path.abspath(source) else f" ({source})"
            raise CliError(f"--out: {path} is {what}{named}; writing it would replace an input")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): compare the paths, links resolved
        return os.path.realpath(a) == os.path.realpath(b)


def _configure(args: argparse.Namespace) -> None:
    from ._compile import configure as configure_cold
    from ._progress import configure

    # A cold Numba cache: short chains run interpreted while the kernels compile in the
    # background (NOTE [ lazy kernels ]); CHAINOFFLOAD_COLD=compile waits for the compile.
    configure_cold(os.environ.get("CHAINOFFLOAD_COLD") or "interpret")
    # Progress on stderr: automatic (a terminal), forced by --progress, never with --json.
    configure(False if getattr(args, "json", False) else (True if getattr(args, "progress", False) else None))


def _interrupted(gate: _Gate, signum: int = signal.SIGINT) -> None:
    """Ctrl-C or SIGTERM: end the process now with exit 130 or 143 and no file in place, unless
    the command's file was already renamed into place (then its own code: it is done)."""
    for s in _STOP_CODES:
        signal.signal(s, signal.SIG_IGN)
    code = gate.interrupt()
    if code is not None:
        os._exit(code)
    from ._interrupt import stop_all

    stop_all()  # a native search still running ends through its own API
    try:  # stdout is left alone: a flush could block behind a slow reader
        sys.stderr.write("chainoffload: " + ("terminated\n" if signum == signal.SIGTERM else "interrupted\n"))
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    os._exit(_STOP_CODES[signum])


def _error(exc: BaseException, prefix: str = "", suffix: str = "", *, gate: _Gate | None = None) -> int:
    if gate is not None and gate.closed:
        threading.Event().wait()  # interrupted: the main thread is ending the process; say nothing
    try:
        print(f"chainoffload: error: {prefix}{_one_line(exc)}{suffix}", file=sys.stderr, flush=True)
    except (OSError, ValueError):
        pass
    return 2


def _one_line(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, OSError) and exc.strerror:  # not "[Errno 27] ...": the words say it
        text = exc.strerror + (f": {exc.filename}" if exc.filename else "")
    return " ".join(text.split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
