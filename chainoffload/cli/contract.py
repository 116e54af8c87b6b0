"""The command line's output contract: one-line errors, exit codes, atomic files, Ctrl-C and SIGTERM.

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
from collections.abc import Callable
from typing import Any

from .._jsonio import PendingWrite, TargetError, check_target

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
    from .._compile import configure as configure_cold
    from .._progress import configure

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
    from .._interrupt import stop_all

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

