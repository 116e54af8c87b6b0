"""What several benchmarks share: the mid-memory random instance, writing a report, which code
a before / after run measured, and the mutants of the mutation benchmarks.

Child processes of the benchmarks import this module by putting ``BENCH`` on ``sys.path``
(it needs only ``chainoffload``'s public names, so it also runs against an older revision).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parent)


def mid_instance(length: int):
    """The scaling instance of ``length`` stages: ``(chain, platform)``.

    A random chain (:func:`chainoffload.generators.random_chain`, seed 1000 + L), memory halfway
    between the offload floor and the keep-all peak, both links at half the balance rate (the
    bytes of every unit over the compute time), latency 10 us, duplex.
    """
    import chainoffload as co
    from chainoffload.bounds import offload_memory_floor
    from chainoffload.generators import random_chain

    chain = random_chain(1000 + length, length)
    floor, peak = offload_memory_floor(chain), co.keep_all_peak(chain)
    bw = 0.5 * float(chain.saved.sum()) / chain.compute_time
    platform = co.Platform(memory=int(floor + 0.5 * (peak - floor)), bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-5)
    return chain, platform


def write_report(lines: list[str], out: Path) -> str:
    """Join ``lines``, print them, write them to ``out`` (folders made) and say so on stderr."""
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(f"wrote {out}", file=sys.stderr)
    return text


@dataclasses.dataclass(frozen=True)
class Mutation:
    """One single-rule mutant: text edits to one file of a temporary copy of the package."""

    name: str
    rule: str
    file: str
    edits: tuple[tuple[str, str], ...]


def library(package_file: str, src: str) -> str:
    """Which code a benchmark measured: this checkout's commit (and whether the library has
    uncommitted changes), or ``src``, the folder ``--src`` named, when ``package_file`` (an
    imported package's ``__file__``) lies outside this checkout."""
    root = Path(package_file).resolve().parent.parent
    if root != Path(BENCH).parent:
        return f"`--src {src}`"
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "chainoffload", "chainoffload_torch"], capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "this checkout"
    return f"this checkout at {rev}" + (" with uncommitted changes" if dirty else "")


def mutate(text: str, mutation: Mutation) -> str:
    """``text`` (the source of ``mutation.file``) with the mutation applied; each edit must match once."""
    for old, new in mutation.edits:
        found = text.count(old)
        if found != 1:
            raise SystemExit(f"mutation {mutation.name!r}: its text occurs {found} times in {mutation.file}, expected once")
        text = text.replace(old, new)
    return text
