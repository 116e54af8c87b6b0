"""Regenerate ``chainoffload/networks/*.json``: real networks as chains, traced on the meta device.

    python benchmarks/networks/build.py                      # every network, roofline times
    python benchmarks/networks/build.py --only resnet18      # one network
    python benchmarks/networks/build.py --times measured.json  # per-stage times measured on a GPU
    python benchmarks/networks/build.py --out /tmp/nets      # somewhere else (tests do this)

Sizes come from :mod:`network_trace` (exact, by tracing one training iteration with PyTorch on
``device="meta"``); times from its A100 roofline unless ``--times`` gives measured ones. The
networks are defined in :mod:`network_models`. Writes one ``<name>.json`` per network (docs/model.md's chain
format, loadable with ``Chain.load``), its V100-era twin ``<name>-v100.json`` (the same sizes, times
from the V100 roofline: the GPU of the NeurIPS 2021 paper, fp32 without TF32), ``catalog.json``
(description, stage labels, FLOPs and where the times come from), and the summary table of
``README.md`` between its markers.

``--times`` takes a JSON object mapping network names to ``{"fwd": [L seconds], "bwd": [L
seconds], "fwd_nosave": [L] (optional), "source": "what measured them" (optional)}`` — e.g.
written from ``chainoffload_torch``'s profiler on a GPU; networks it does not name keep the
roofline times. Lengths must match the network's stages.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:  # network_models, network_trace beside this file
    sys.path.insert(0, str(HERE))
if str(REPO) not in sys.path:
    sys.path.insert(1, str(REPO))

try:
    import torch  # noqa: E402
except ImportError:  # pragma: no cover - depends on the environment
    raise SystemExit("build.py traces the networks with PyTorch: pip install 'chainoffload[torch]'") from None

import network_models as models  # noqa: E402
import network_trace as measure  # noqa: E402
from chainoffload import Chain, keep_all_peak  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402

DEFAULT_OUT = REPO / "chainoffload" / "networks"
TABLE_START = "<!-- table:start (written by benchmarks/networks/build.py) -->"
TABLE_END = "<!-- table:end -->"


class BuildError(ValueError):
    """Bad builder input (a ``--times`` file, an unknown network); the message names the field."""


def load_times(path: str | Path) -> dict[str, dict[str, Any]]:
    """Read a ``--times`` file (see module doc) and check its shape, not yet its lengths."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise BuildError(f"--times: cannot read {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise BuildError(f"--times: {path}: malformed JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict):
        raise BuildError(f"--times: {path}: expected an object mapping network names to times, got {type(data).__name__}")
    unknown = sorted(set(data) - set(models.BUILDERS))
    if unknown:
        raise BuildError(f"--times: unknown network(s) {', '.join(unknown)}; known: {', '.join(models.BUILDERS)}")
    for name, entry in data.items():
        if not isinstance(entry, dict) or "fwd" not in entry or "bwd" not in entry:
            raise BuildError(f"--times: {name}: expected an object with 'fwd' and 'bwd' lists")
        extra = sorted(set(entry) - {"fwd", "bwd", "fwd_nosave", "source"})
        if extra:
            raise BuildError(f"--times: {name}: unknown field(s) {', '.join(extra)}")
    return data


def build(name: str, times: dict[str, Any] | None = None) -> tuple[Chain, dict[str, Any], Chain]:
    """Trace network ``name`` and return its chain, its catalog entry and its V100-era twin.

    Parameters
    ----------
    name
        A key of :data:`models.BUILDERS`.
    times
        Optional measured ``{"fwd": [...], "bwd": [...], "fwd_nosave": [...], "source": str}``
        replacing the roofline times (of the main chain; the twin keeps the V100 roofline).
    """
    if name not in models.BUILDERS:
        raise BuildError(f"build: unknown network {name!r}; known: {', '.join(models.BUILDERS)}")
    torch.manual_seed(0)  # nothing random is read on meta, but keep construction reproducible
    with torch.device("meta"):
        staged = models.BUILDERS[name]()
    staged.stages = [(label, module.to(dtype=staged.dtype).train()) for label, module in staged.stages]
    act0, figures = measure.measure(staged, measure.A100_SXM4_40GB, also=(measure.V100_SXM2_16GB,))
    for i, f in enumerate(figures, start=1):
        if f.retained != f.saved:
            # the model's unit i is everything F_i leaves alive; a mismatch means the pack hook
            # missed a storage (or saw one F_i did not make) and saved[] would be wrong
            raise RuntimeError(
                f"{name}: stage {i} ({f.label}): pack hook saw {f.saved} B but F_i left {f.retained} B alive"
            )
    fwd = [f.fwd for f in figures]
    bwd = [f.bwd for f in figures]
    nosave = None
    source = measure.A100_SXM4_40GB.describe()
    if times is not None:
        length = len(figures)
        for key in ("fwd", "bwd", "fwd_nosave"):
            if key in times and (not isinstance(times[key], list) or len(times[key]) != length):
                got = len(times[key]) if isinstance(times[key], list) else type(times[key]).__name__
                raise BuildError(f"--times: {name}.{key}: expected a list of {length} seconds (one per stage), got {got}")
        fwd, bwd = [float(t) for t in times["fwd"]], [float(t) for t in times["bwd"]]
        nosave = [float(t) for t in times["fwd_nosave"]] if "fwd_nosave" in times else None
        source = "measured: " + str(times.get("source", "per-stage times given to build.py --times"))
    sizes = dict(
        act=[act0] + [f.act for f in figures],
        saved=[f.saved for f in figures],
        fwd_tmp=[f.fwd_tmp for f in figures],
        bwd_tmp=[f.bwd_tmp for f in figures],
    )
    chain = Chain(fwd=fwd, bwd=bwd, fwd_nosave=nosave, name=name, **sizes)
    v100 = Chain(fwd=[f.also[0][0] for f in figures], bwd=[f.also[0][1] for f in figures], name=f"{name}-v100", **sizes)
    entry = {
        "description": staged.description,
        "input": {"shape": list(staged.input_shape), "dtype": str(staged.input_dtype).removeprefix("torch.")},
        "parameters": models.param_count(staged),
        "times": source,
        "times_v100": measure.V100_SXM2_16GB.describe(),
        "stages": [f.label for f in figures],
        "fwd_flops": [int(f.fwd_flops) for f in figures],
        "bwd_flops": [int(f.bwd_flops) for f in figures],
    }
    return chain, entry, v100


def summary_row(name: str, chain: Chain, v100: Chain | None) -> str:
    """One Markdown row: name, L, compute time (and the V100 twin's), keep-all peak, floor."""
    twin = "" if v100 is None else f"{v100.compute_time * 1e3:.2f}"
    return (
        f"| {name} | {chain.length} | {chain.compute_time * 1e3:.2f} | {twin} | {format_bytes(keep_all_peak(chain))} "
        f"| {format_bytes(chain.stage_memory_floor())} |"
    )


def summary_table(chains: dict[str, Chain], v100: dict[str, Chain]) -> str:
    """The README table over ``chains`` (in catalog order) and their V100-era twins."""
    head = [
        "| network | L | sum(fwd)+sum(bwd) (ms) | V100 twin (ms) | keep-all peak | floor (`stage_memory_floor`) |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    return "\n".join(head + [summary_row(n, c, v100.get(n)) for n, c in chains.items()])


def write_readme_table(readme: Path, table: str) -> None:
    """Replace the table between the markers of ``readme`` (which must have them)."""
    text = readme.read_text(encoding="utf-8")
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise BuildError(f"{readme}: table markers not found; add {TABLE_START!r} and {TABLE_END!r}")
    text = text[: start + len(TABLE_START)] + "\n" + table + "\n" + text[end:]
    readme.write_text(text, encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    """Command line entry point (see the module doc); returns the exit status, 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"networks to build (default all: {', '.join(models.BUILDERS)})")
    parser.add_argument("--times", metavar="JSON", help="per-stage times measured on a GPU (see module doc)")
    parser.add_argument("--out", metavar="DIR", default=str(DEFAULT_OUT), help="output directory (default: the package's)")
    args = parser.parse_args(argv)
    try:
        names = args.only or list(models.BUILDERS)
        unknown = sorted(set(names) - set(models.BUILDERS))
        if unknown:
            raise BuildError(f"--only: unknown network(s) {', '.join(unknown)}; known: {', '.join(models.BUILDERS)}")
        times = load_times(args.times) if args.times else {}
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        catalog_path = out / "catalog.json"
        catalog: dict[str, Any] = json.loads(catalog_path.read_text(encoding="utf-8")) if catalog_path.exists() else {}
        for name in names:
            chain, entry, v100 = build(name, times.get(name))
            chain.save(out / f"{name}.json")
            v100.save(out / f"{name}-v100.json")
            catalog[name] = entry
            print(summary_row(name, chain, v100), flush=True)
        # catalog order is BUILDERS order whatever subset was rebuilt, so files diff cleanly
        ordered = {n: catalog[n] for n in models.BUILDERS if n in catalog}
        catalog_path.write_text(json.dumps(ordered, indent=1) + "\n", encoding="utf-8")
        readme = out / "README.md"
        if readme.exists():
            chains = {n: Chain.load(out / f"{n}.json") for n in ordered if (out / f"{n}.json").exists()}
            twins = {n: Chain.load(out / f"{n}-v100.json") for n in chains if (out / f"{n}-v100.json").exists()}
            write_readme_table(readme, summary_table(chains, twins))
    except BuildError as exc:
        print(f"build: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
