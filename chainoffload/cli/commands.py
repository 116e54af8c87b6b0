"""The command line's seven commands, and the parser that names each with its flags.

Every subcommand is defined here (:func:`build_parser`); the modules that do the work
(:mod:`chainoffload.verify`, :mod:`chainoffload.plot`) are imported inside the command
functions, so matplotlib stays optional and a broken module fails loudly when its command runs
instead of silently losing it. A command computes everything, then hands its stdout text and its
file to an :class:`~chainoffload.cli.contract.Output` (``NOTE [ cli contract ]``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from typing import Any

from ..chain import Chain
from ..platform import Platform
from ..schedule_file import ScheduleFile
from ..units import format_bytes, format_seconds, parse_bytes
from .contract import CliError, Output
from .parser import _EPILOG, _Parser, add_platform_flags, load_platform
from .tables import (
    _POLICY_WORDS,
    _idle_text,
    _instance_rows,
    _least_text,
    _over_compute,
    _platform_source,
    _recorded_row,
    _sweep_stop,
    _table,
    _units_text,
)


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

    from .._cost import file_read_seconds, report_seconds
    from ..solvers import DEFAULT_METHOD, check_time_limit, solve

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
    from .._compile import prepare

    ready = stack.enter_context(prepare(args.method or DEFAULT_METHOD, chain.length))
    spent, left = 0.0, math.inf
    if args.time_limit is not None:
        # What reading and loading took counts; the table printed after the solve is kept room for.
        spent = time.perf_counter() - started - ready.seconds
        left = args.time_limit - spent - report_seconds(chain.length)
        options["time_limit"] = max(left, 1e-3)
        if args.min_memory:
            # One limit for the whole command: the solve gets half, the bisection what is left.
            options["time_limit"] *= 0.5
    finish = None if args.time_limit is None else started + ready.seconds + args.time_limit - report_seconds(chain.length)
    result = solve(chain, platform, args.method, **options)
    if left <= 0 and not result.feasible:
        # Under contention, reading and loading the kernels can take the whole limit; the
        # method's own message then speaks of a sliver of time the user never chose.
        out.note(
            f"--time-limit {args.time_limit:g}: reading the input and loading the solver kernels took "
            f"{spent:.2f} s of it on this machine now (it may be busy), leaving no time for the search; "
            f"give a longer limit (--time-limit {max(math.ceil(2 * spent), math.ceil(args.time_limit) + 1)} or more) or none"
        )
    if ready.seconds > 0 and not result.info.get("compile_time"):
        result = result.replace(info={**result.info, "compile_time": ready.seconds})
    least = floor = search = None
    if args.min_memory:
        from ..bounds import offload_memory_floor
        from ..solvers import memory_search

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



def _simulator_ready(chain: Chain) -> Any:
    """The simulator's kernels made ready as for a solve: a short chain on a cold Numba cache
    runs them interpreted while they compile in the background (NOTE [ lazy kernels ])."""
    from .._compile import prepare

    return prepare("simulate", chain.length)


def _cmd_simulate(args: argparse.Namespace, out: Output) -> int:
    from ..simulate import simulate

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
    from ..verify import verify

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
    from ..plot import plot_timeline
    from ..simulate import simulate

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
            from ..bounds import problem_bound

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
    from ..tradeoff import tradeoff

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



def _cmd_methods(args: argparse.Namespace, out: Output) -> int:
    from ..solvers import DEFAULT_METHOD, methods

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
    from ..examples import example, example_names

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
