"""Native searches (CP-SAT, SCIP, GLOP) and Ctrl-C: Python's signal, stopped through their APIs.

OR-Tools' solvers install C handlers of their own for SIGINT unless told not to: CP-SAT's
(``catch_sigint_signal``, on by default) and SCIP's (``misc/catchctrlc``, on by default). Both
replace Python's handler for the length of a search, process-wide, whatever thread runs it.
What that did to the command line (issue 33):

* CP-SAT: a SIGINT that came while its handler was being installed or removed called an
  empty ``std::function``: "terminate called after throwing an instance of
  'std::bad_function_call'", SIGABRT, exit 134 (5 of 6 trials on vgg16);
* SCIP: the SIGINT stopped the MILP early, as if its time limit had run out; the partial dual
  bound was kept as the stated bound (it varied with the moment of the Ctrl-C), Python never saw
  the signal, and the command went on to exit 0 with its file written.

So every search here runs with the solver's own handler off: SIGINT stays Python's, and the
command line's main thread turns it into exit 130 (``NOTE [ cli contract ]`` in
``chainoffload/cli/contract.py``). A search also says how to stop it (:func:`stoppable`), so
that whoever handles the signal can end it through the solver's own API
(``CpSolver.stop_search``) instead of leaving it to run: :func:`stop_all` does that for the
command line, and :func:`run_stoppable` for a library caller in the main thread, who then gets
KeyboardInterrupt at once rather than after the search's time limit; both call the stop again
until the search ends (``NOTE [ a stop that came too early ]``).
"""

from __future__ import annotations

import contextlib
import contextvars
import signal
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

__all__ = ["SCIP_NO_CTRL_C", "interrupted", "run_stoppable", "solve_proto", "stop_all", "stoppable"]

T = TypeVar("T")

#: SCIP's parameter text that leaves SIGINT to Python (its default catches it and stops the
#: search as if its limit ran out, which made the stated bound depend on when a Ctrl-C came).
SCIP_NO_CTRL_C = "misc/catchctrlc = FALSE\n"

_lock = threading.Lock()
_active: dict[int, Callable[[], None]] = {}
_stopped = threading.Event()


@contextlib.contextmanager
def stoppable(stop: Callable[[], None]) -> Iterator[None]:
    """Register ``stop`` (a solver's own way to end its search) while the block runs.

    If :func:`stop_all` was already called (the process is being interrupted), ``stop`` is
    called at once, so a search started after the signal ends too.
    """
    key = id(stop)
    with _lock:
        _active[key] = stop
        late = _stopped.is_set()
    if late:
        _call(stop)
    try:
        yield
    finally:
        with _lock:
            _active.pop(key, None)


def stop_all() -> int:
    """Stop every registered search, and every one started from now on; how many were running."""
    with _lock:
        _stopped.set()
        stops = list(_active.values())
    for stop in stops:
        _call(stop)
    return len(stops)


def interrupted() -> bool:
    """Whether :func:`stop_all` was called: a search that returned since may have been cut short
    by it, and what it proved then depends on the moment of the signal."""
    return _stopped.is_set()


def _call(stop: Callable[[], None]) -> None:
    with contextlib.suppress(Exception):  # a search that has just ended: nothing left to stop
        stop()


# NOTE [ a stop that came too early ]
# -----------------------------------
# A solver's stop reaches only a search that has begun: ``CpSolver.stop_search`` does nothing
# until ``solve`` has made its wrapper (ortools 9.15: ``if self.__solve_wrapper``), and
# ``interrupt_solve`` likewise. So a Ctrl-C that came after the search was registered but before
# it began, the helper thread just started (a loaded machine widens that window to tens of
# milliseconds), was answered by one stop() that ended nothing: the caller then waited for
# the search's whole work before its KeyboardInterrupt (8 s at vgg19 in
# tests/test_cpsat_bound.py), and the command line's worker for its whole search. Now whoever
# waits on the search calls stop() again at every poll (POLL seconds) until the search returns;
# stop() on a search that has ended does nothing. The search always runs in a helper thread
# (SIGINT blocked there), so its caller is free to do that: the main thread on
# KeyboardInterrupt, any other thread once stop_all() was called.

#: Seconds between two looks at a running search (a Ctrl-C, or stop_all()).
POLL = 0.05


def run_stoppable(search: Callable[[], T], stop: Callable[[], None]) -> T:
    """Run ``search()``, ending it with ``stop()`` on Ctrl-C or :func:`stop_all`; return what it returns.

    The search runs in a helper thread (with SIGINT blocked, so the signal is the main
    thread's; in the caller's context variables) while the caller waits in short,
    interruptible waits, registered with :func:`stoppable`. In the main thread, on
    KeyboardInterrupt (Python's SIGINT handler, or any exception the wait raises) it stops the
    search, waits for it to return, and raises; in any thread, once :func:`stop_all` was called,
    it stops the search and returns what the search returned. Either way ``stop()`` is called
    again at every poll until the search returns (NOTE [ a stop that came too early ]).
    """
    box: dict[str, object] = {}
    context = contextvars.copy_context()

    def work() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            box["value"] = context.run(search)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            box["error"] = exc

    helper = threading.Thread(target=work, name="chainoffload-search", daemon=True)
    with stoppable(stop):
        try:
            helper.start()
            while helper.is_alive():
                if _stopped.is_set():
                    _call(stop)
                helper.join(POLL)
        except BaseException:
            # KeyboardInterrupt in the wait (or in start(), the helper possibly running already).
            while helper.is_alive():
                _call(stop)
                helper.join(POLL)
            raise
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]


# NOTE [ MPSolver and the GIL ]
# pywraplp.Solver.SolveWithProto holds the GIL for the whole solve (measured: a Python thread
# beside a 2 s SCIP solve ran once), so the command line's main thread could not turn a Ctrl-C
# into exit 130 before SCIP returned, seconds later. model_builder's ModelSolverHelper runs the
# same request (MPSolver's proto path, the same parameters) with the GIL released. It takes the
# model from a file only: the serialized MPModelProto goes through an anonymous in-memory file
# (memfd), never the disk. SCIP in this OR-Tools build supports no interruption
# (interrupt_solve returns, the solve goes on to its limit), so a Ctrl-C in a library caller's
# main thread still waits for SCIP's own time limit; GLOP and PDLP stop at once.
_SOLVER_NAMES = {"SCIP_MIXED_INTEGER_PROGRAMMING": "scip", "CBC_MIXED_INTEGER_PROGRAMMING": "cbc",
                 "GLOP_LINEAR_PROGRAMMING": "glop", "PDLP_LINEAR_PROGRAMMING": "pdlp"}


def solve_proto(request, response) -> None:
    """Solve an OR-Tools ``MPModelRequest`` into ``response`` (an ``MPSolutionResponse``), as
    ``pywraplp.Solver.SolveWithProto`` does, but with the GIL released and stoppable on Ctrl-C
    (``NOTE [ MPSolver and the GIL ]``)."""
    import os

    from ortools.linear_solver import linear_solver_pb2 as pb

    name = _SOLVER_NAMES.get(pb.MPModelRequest.SolverType.Name(request.solver_type))
    helper = builder = None
    if name is not None and hasattr(os, "memfd_create"):
        try:
            from ortools.linear_solver.python import model_builder_helper as mbh

            fd = os.memfd_create("chainoffload-model")
            try:
                os.write(fd, request.model.SerializeToString())
                builder = mbh.ModelBuilderHelper()
                loaded = builder.read_model_from_proto_file(f"/proc/self/fd/{fd}")
            finally:
                os.close(fd)
            helper = mbh.ModelSolverHelper(name) if loaded else None
        except (ImportError, OSError, AttributeError):
            helper = None
    if helper is None or not helper.solver_is_supported():
        from ortools.linear_solver import pywraplp

        pywraplp.Solver.SolveWithProto(request, response)
        return
    if request.HasField("solver_time_limit_seconds"):
        helper.set_time_limit_in_seconds(request.solver_time_limit_seconds)
    if request.solver_specific_parameters:
        helper.set_solver_specific_parameters(request.solver_specific_parameters)
    run_stoppable(lambda: helper.solve(builder), helper.interrupt_solve)
    response.Clear()
    if helper.has_response():
        response.CopyFrom(helper.response())
    else:  # pragma: no cover - the helper always answers
        response.status = pb.MPSOLVER_ABNORMAL
