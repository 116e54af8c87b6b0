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
KeyboardInterrupt at once rather than after the search's time limit.
"""

from __future__ import annotations

import contextlib
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


def run_stoppable(search: Callable[[], T], stop: Callable[[], None]) -> T:
    """Run ``search()``, ending it with ``stop()`` on Ctrl-C; return what it returns.

    In the main thread with Python's own SIGINT handler, the search runs in a helper thread (with
    SIGINT blocked, so the signal is the main thread's) while the main thread waits in short,
    interruptible waits: on KeyboardInterrupt it calls ``stop()``, waits for the search to
    return, and raises KeyboardInterrupt. Anywhere else (the command line's worker, a thread
    of the caller's) the search runs here, registered with :func:`stoppable`.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        with stoppable(stop):
            return search()
    box: dict[str, object] = {}

    def work() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            box["value"] = search()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread, raised there
            box["error"] = exc

    helper = threading.Thread(target=work, name="chainoffload-search", daemon=True)
    with stoppable(stop):
        helper.start()
        try:
            while helper.is_alive():
                helper.join(0.05)
        except KeyboardInterrupt:
            _call(stop)
            helper.join()
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
