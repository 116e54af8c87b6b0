"""The command line: ``chainoffload solve | simulate | verify | plot | methods | example``.

Every subcommand is defined here, at the top of the import graph (model -> schedule -> simulate
-> solvers -> cli); the modules that do the work (:mod:`chainoffload.verify`,
:mod:`chainoffload.plot`) are imported inside the command functions, so matplotlib stays
optional and a broken module fails loudly when its command runs instead of silently losing it.

Errors go to stderr as one line and exit with code 2, without a traceback, for people and
scripts alike. ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any, Sequence

from .chain import Chain
from .platform import Platform
from .schedule import Schedule
from .units import format_bytes, format_seconds, parse_bandwidth, parse_bytes, parse_seconds

__all__ = ["main", "build_parser", "add_platform_flags", "load_platform", "CliError"]

#: Used when neither --platform nor --bandwidth* is given: an effective PCIe 3.0 x16 link.
DEFAULT_BANDWIDTH = "12GB/s"


class CliError(Exception):
    """A usage error with a one-line message (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as every other error
        raise CliError(f"{message} (see `{self.prog} --help`)")


def add_platform_flags(parser: argparse.ArgumentParser) -> None:
    """Add the platform flags (README, "Command line") to a subcommand's parser."""
    g = parser.add_argument_group("platform")
    g.add_argument("--platform", metavar="PLATFORM.json", help="platform JSON; the flags below override its fields")
    g.add_argument("--memory", help="GPU memory for activations, e.g. 6GiB, 900MB, 123456")
    g.add_argument("--bandwidth", help=f"both directions, e.g. 12GB/s, 16GiB/s (default {DEFAULT_BANDWIDTH})")
    g.add_argument("--bandwidth-d2h", help="device-to-host bandwidth")
    g.add_argument("--bandwidth-h2d", help="host-to-device bandwidth")
    g.add_argument("--latency", help="per-transfer latency, e.g. 10us, 0.2ms (default 0)")
    g.add_argument("--half-duplex", action="store_true", help="one shared channel for both directions")


def load_platform(args: argparse.Namespace) -> Platform:
    """Build the platform from ``--platform`` and the flags (flags win)."""
    data: dict[str, Any] = {}
    if args.platform:
        data = Platform.load(args.platform).to_dict()
    if args.memory is not None:
        data["memory"] = parse_bytes(args.memory, field="--memory")
    if "memory" not in data:
        raise CliError("--memory is required (or --platform PLATFORM.json)")
    if args.bandwidth is not None:
        bw = parse_bandwidth(args.bandwidth, field="--bandwidth")
        data["bandwidth_d2h"] = data["bandwidth_h2d"] = bw
    if args.bandwidth_d2h is not None:
        data["bandwidth_d2h"] = parse_bandwidth(args.bandwidth_d2h, field="--bandwidth-d2h")
    if args.bandwidth_h2d is not None:
        data["bandwidth_h2d"] = parse_bandwidth(args.bandwidth_h2d, field="--bandwidth-h2d")
    default_bw = parse_bandwidth(DEFAULT_BANDWIDTH)
    data.setdefault("bandwidth_d2h", default_bw)
    data.setdefault("bandwidth_h2d", default_bw)
    if args.latency is not None:
        data["latency"] = parse_seconds(args.latency, field="--latency")
    if args.half_duplex:
        data["duplex"] = False
    return Platform.from_dict(data)


def _fmt_bw(bw: float) -> str:
    return "inf" if math.isinf(bw) else f"{bw / 1e9:.3g} GB/s"


def _platform_line(p: Platform) -> str:
    duplex = "duplex" if p.duplex else "half duplex"
    if p.bandwidth_d2h == p.bandwidth_h2d:
        bw = _fmt_bw(p.bandwidth_d2h)
    else:
        bw = f"D2H {_fmt_bw(p.bandwidth_d2h)}, H2D {_fmt_bw(p.bandwidth_h2d)}"
    return f"{format_bytes(p.memory)}, {bw}, latency {format_seconds(p.latency)}, {duplex}"


def _instance_rows(chain: Chain, platform: Platform) -> list[tuple[str, str]]:
    return [
        ("chain", f"{chain.name} ({chain.length} stages, compute {format_seconds(chain.compute_time)})"),
        ("platform", _platform_line(platform)),
    ]


def _print_table(rows: Sequence[tuple[str, str]]) -> None:
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")


def _cmd_solve(args: argparse.Namespace) -> int:
    from .solvers import DEFAULT_METHOD, solve

    chain = Chain.load(args.chain)
    platform = load_platform(args)
    options: dict[str, Any] = {}
    for item in args.option or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise CliError(f"--option: expected KEY=VALUE, got {item!r}")
        try:
            options[key.replace("-", "_")] = json.loads(value)
        except json.JSONDecodeError:
            options[key.replace("-", "_")] = value
    if args.time_limit is not None:
        options["time_limit"] = args.time_limit
    result = solve(chain, platform, args.method, **options)
    least = floor = None
    if args.min_memory:
        from .bounds import offload_memory_floor
        from .solvers import minimum_memory

        least = minimum_memory(chain, platform, args.method, **options)
        floor = offload_memory_floor(chain)
    if args.out:
        if result.schedule is None:
            raise CliError(f"--out: method {result.method!r} found no schedule ({result.status}); nothing written")
        result.schedule.save(args.out)
    if args.json:
        out = result.to_dict()
        if args.min_memory:
            out.update(min_memory=least, memory_floor=floor)
        print(json.dumps(out))
        return 0
    base = chain.compute_time
    rows = _instance_rows(chain, platform) + [
        ("method", result.method + ("" if args.method else f" (default: {DEFAULT_METHOD})")),
        ("status", str(result.status)),
    ]
    if result.feasible:
        rows += [
            ("makespan", f"{format_seconds(result.makespan)}  (+{100 * (result.makespan / base - 1):.2f}% over compute)"),
            ("lower bound", f"{format_seconds(result.lower_bound)}  (gap {100 * result.gap:.2f}%)"),
            ("peak memory", f"{format_bytes(result.peak_memory)} of {format_bytes(platform.memory)}"),
            (
                "offloaded",
                f"{format_bytes(result.offloaded_bytes)} in {len(result.schedule.offloaded_units)} units "
                f"{list(result.schedule.offloaded_units)}",
            ),
        ]
    else:
        if result.min_memory is not None:
            rows.append(("min memory", f"{format_bytes(result.min_memory)} ({result.min_memory} B) for this method"))
        if result.message:
            rows.append(("message", result.message))
    if args.min_memory:
        rows += [
            ("least memory", "none up to keep-all" if least is None else f"{format_bytes(least)} ({least} B) for this method, by bisection"),
            ("memory floor", f"{format_bytes(floor)} ({floor} B): no offloading schedule fits below (proven)"),
        ]
    rows.append(("runtime", format_seconds(result.runtime)))
    if args.out:
        rows.append(("schedule", f"written to {args.out}"))
    _print_table(rows)
    return 0


def _cmd_simulate(args: argparse.Namespace) -> int:
    from .simulate import simulate

    chain = Chain.load(args.chain)
    schedule = Schedule.load(args.schedule)
    platform = load_platform(args)
    timeline = simulate(chain, platform, schedule)
    if args.json:
        print(json.dumps(timeline.summary()))
        return 0
    v = timeline.violation
    rows = _instance_rows(chain, platform) + [
        ("feasible", "yes" if v is None else f"no: {v.rule} rule broken by {v.op}"),
        ("makespan", f"{format_seconds(timeline.makespan)}  (+{100 * timeline.overhead:.2f}% over compute)"),
        ("peak memory", f"{format_bytes(timeline.peak_memory)} of {format_bytes(platform.memory)}"),
        ("offloaded", f"{format_bytes(timeline.offloaded_bytes)} in units {list(schedule.offloaded_units)}"),
    ]
    if v is not None:
        rows.append(("violation", v.message))
    _print_table(rows)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .verify import verify

    if not args.time_limit > 0 or not math.isfinite(args.time_limit):
        raise CliError(f"--time-limit: {args.time_limit!r} must be a number of seconds > 0")
    if args.workers is not None and args.workers < 1:
        raise CliError(f"--workers: {args.workers!r} must be an integer >= 1")
    chain = Chain.load(args.chain)
    schedule = Schedule.load(args.schedule)
    platform = load_platform(args)
    report = verify(chain, platform, schedule, time_limit=args.time_limit, workers=args.workers)
    if args.json:
        print(json.dumps(report))
        return 0
    v = report["violation"]
    rows = _instance_rows(chain, platform) + [
        ("feasible", "yes" if v is None else f"no: {v['rule']} rule broken by {v['op']}"),
        ("makespan", format_seconds(report["makespan"]) if report["makespan"] is not None else "-"),
        ("peak memory", f"{format_bytes(report['peak_memory'])} of {format_bytes(platform.memory)}"),
    ]
    if v is not None:
        rows.append(("violation", v["message"]))
    rows.append(("cpsat", f"{report['cpsat_status']} in {format_seconds(report['cpsat_runtime'])}"))
    if report["optimum"] is not None:
        rows.append(("optimum" if report["cpsat_status"] == "optimal" else "best found", format_seconds(report["optimum"])))
    if report["lower_bound"] is not None:
        rows.append(("lower bound", format_seconds(report["lower_bound"])))
    if report["gap"] is not None:
        rows.append(("gap", f"{100 * report['gap']:.3f}% over the {report['gap_reference'].replace('_', ' ')}"))
    if report["message"]:
        rows.append(("message", report["message"]))
    _print_table(rows)
    return 0


def _cmd_plot(args: argparse.Namespace) -> int:
    from .plot import plot_timeline
    from .simulate import simulate

    chain = Chain.load(args.chain)
    schedule = Schedule.load(args.schedule)
    timeline = simulate(chain, load_platform(args), schedule)
    plot_timeline(timeline, args.out, width=args.width, height=args.height, dpi=args.dpi)
    print(f"wrote {args.out}")
    return 0


def _cmd_methods(args: argparse.Namespace) -> int:
    from .solvers import DEFAULT_METHOD, methods

    listing = methods()
    if args.json:
        print(json.dumps({"default": DEFAULT_METHOD, "methods": listing}))
        return 0
    width = max(len(n) for n in listing)
    for name, summary in listing.items():
        mark = "*" if name == DEFAULT_METHOD else " "
        print(f"{mark} {name:<{width}}  {summary}")
    print("(* the default method)")
    return 0


def _cmd_example(args: argparse.Namespace) -> int:
    from .examples import example, example_names

    if args.name is None or args.list:
        names = example_names()
        width = max(len(n) for n in names)
        for name, desc in names.items():
            print(f"{name:<{width}}  {desc}")
        return 0
    chain = example(args.name)
    if args.out:
        chain.save(args.out)
        print(f"wrote {args.out}: {chain.name}, {chain.length} stages", file=sys.stderr)
    else:
        print(chain.to_json())
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every subcommand."""
    parser = _Parser(prog="chainoffload", description="Offloading schedules for training deep networks in less GPU memory.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("solve", help="compute a schedule for a chain under a memory limit")
    p.add_argument("chain", metavar="CHAIN.json")
    add_platform_flags(p)
    p.add_argument("--method", default=None, help="a method of `chainoffload methods` (default: the starred one)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds, for methods that take a time limit")
    p.add_argument("--option", action="append", metavar="KEY=VALUE", help="a method option (repeatable)")
    p.add_argument("--min-memory", action="store_true", help="also find the least memory this method needs (bisection) and the proven floor")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--out", metavar="SCHEDULE.json", help="write the schedule here")
    p.set_defaults(func=_cmd_solve)

    p = sub.add_parser("simulate", help="replay a schedule and report feasibility, makespan and peak memory")
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_simulate)

    p = sub.add_parser("methods", help="list the registered methods")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_methods)

    p = sub.add_parser("example", help="write a shipped example or network chain as JSON (no NAME: list them)")
    p.add_argument("name", nargs="?", metavar="NAME")
    p.add_argument("--list", action="store_true", help="list the examples")
    p.add_argument("-o", "--out", metavar="CHAIN.json", help="write to this file instead of stdout")
    p.set_defaults(func=_cmd_example)

    p = sub.add_parser("verify", help="check a schedule by the simulator and its optimality gap by CP-SAT")
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p)
    p.add_argument("--time-limit", type=float, default=60.0, help="seconds CP-SAT may search (default 60)")
    p.add_argument("--workers", type=int, default=None, help="CP-SAT search workers (default: every core)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("plot", help="draw a schedule: Gantt chart of compute and transfers over the memory curve")
    p.add_argument("chain", metavar="CHAIN.json")
    p.add_argument("schedule", metavar="SCHEDULE.json")
    add_platform_flags(p)
    p.add_argument("-o", "--out", required=True, metavar="OUT.png", help="image to write (PNG, SVG or PDF by extension)")
    p.add_argument("--width", type=float, default=12.0, help="inches (default 12)")
    p.add_argument("--height", type=float, default=6.0, help="inches (default 6)")
    p.add_argument("--dpi", type=int, default=100, help="dots per inch (default 100)")
    p.set_defaults(func=_cmd_plot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``chainoffload`` console script. Returns the exit code."""
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"chainoffload: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except (ValueError, OSError) as exc:
        print(f"chainoffload: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("chainoffload: interrupted", file=sys.stderr)
        return 130


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
