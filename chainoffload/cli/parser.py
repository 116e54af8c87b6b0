"""The command line's argument parsing: one-line errors, each flag once, the platform flags.

:func:`add_platform_flags` gives a subcommand the platform's flags and :func:`load_platform`
builds the platform from them, the schedule file's and ``--platform``'s (the commands and their
own flags are :func:`chainoffload.cli.commands.build_parser`'s).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from ..platform import Platform, PlatformError
from ..units import parse_bandwidth, parse_bytes, parse_seconds
from .contract import EXIT_CODES, CliError

#: Used when neither --platform, a schedule file nor --bandwidth* gives one: an effective PCIe 3.0 x16 link.
DEFAULT_BANDWIDTH = "12GB/s"

_EPILOG = "exit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in EXIT_CODES.items())


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

