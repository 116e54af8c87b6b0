"""What ``ct.offload()`` costs, in training steps of the model it profiles, and where it goes.

    python benchmarks/offload_time.py [--repeats 3] [--threads 1] [--quick] [--cold-cache] [name ...]

For each model, in one process: a plain training step (``model(**batch).loss.backward()``, or
cross entropy for a tensor model; gradients set to None before each, as ``zero_grad`` does),
the median of 3 after 2 warm-up steps; then ``handle = ct.offload(model, batch, memory=0.6)``
(0.8 for the HF ResNet, which nothing fits at 0.6: ``offload_models.md``), its wall time split
by phase, and ``handle.remove()``. That pair is repeated ``--repeats`` times; the table gives
the median of the ratios offload() / step (each ratio of one pair, so a load change between
pairs does not enter it) and of the phase times.

Phases (each wraps the function named, in this process only; nothing in the library is timed
by itself): block discovery (``find_blocks_warm``, one forward with autograd; ``find_blocks``,
one without, in code before it), link (``measure_link``, host copies), probe (code that has
``profiler._probe``: one forward before the steps; then the first step was the probe; since
5017c8f a forward alone again, inside the profile),
profiling steps (``profiler.measure_chain`` less a probe inside it; the re-measure with the
stem as stage 1 when it pays is counted apart as "second profile" where the code has one),
solve (``plans.solve_for``), other (the rest: hooks, checks, warnings). The model calls
offload() makes are counted too: forwards with autograd, forwards without, backwards.

Numba kernels are made ready first by one offload() of a small model; that first call's extra
time over a second one is the "cold" row (with ``--cold-cache`` on an empty Numba cache, else
loading the cached kernels). The machine is shared: the load average is written with every
row. Writes ``benchmarks/results/offload_time.md`` (``--quick``: the tiny models only, to
``offload_time-quick.md``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

if "--cold-cache" in sys.argv:  # before numba is imported
    os.environ["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")

# --src PATH: the library from another checkout (an earlier revision, for before / after).
_src = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv[:-1] else str(Path(__file__).resolve().parents[1])
sys.path.insert(0, _src)
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload_torch as ct  # noqa: E402
import chainoffload_torch.api as ct_api  # noqa: E402
import chainoffload_torch.plans as ct_plans  # noqa: E402
import chainoffload_torch.profiler as ct_profiler  # noqa: E402

try:  # the links measured in this process: in _link since the profiler's room was split (issue 34)
    import chainoffload_torch._link as ct_link  # noqa: E402
except ModuleNotFoundError:  # --src: an earlier revision, the cache in the profiler
    ct_link = ct_profiler
from _common import library, write_report  # noqa: E402
from torch_models import ResidualMLP, ResNet, _transformers, gpt2, hf_family  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FRACTION = 0.6
TINY = ("gpt2", "llama", "mistral", "bert", "t5", "resnet", "resnet50-layout")
LARGER = ("gpt2-256x6", "gpt2-256x24", "mistral-6m")
PHASES = ("blocks", "link", "probe", "profile", "second profile", "solve", "other")


def build(name: str) -> tuple[nn.Module, object, str]:
    """(model, sample, how a plain step reads the loss)."""
    torch.manual_seed(0)
    if name == "resnet50-layout":  # torchvision's ResNet-50 layout, narrow: its stem is stage 1
        return ResNet([3, 4, 6, 3], width=4, classes=5), (torch.randn(2, 3, 32, 32), torch.tensor([1, 4])), "xent"
    if name.startswith("gpt2-256x"):  # the GPT-2 of width 256
        layers = int(name.removeprefix("gpt2-256x"))
        ids = torch.randint(0, 8192, (4, 256))
        return gpt2(layers, 256, 4, 8192, 256), {"input_ids": ids, "labels": ids}, "hf"
    if name == "mistral-6m":  # a Mistral of about 6 M parameters (the 6.4 M one)
        tf = _transformers()
        config = tf.MistralConfig(
            num_hidden_layers=6, hidden_size=256, intermediate_size=688, num_attention_heads=8, num_key_value_heads=2,
            vocab_size=4000, max_position_embeddings=256, use_cache=False,
        )
        ids = torch.randint(0, 4000, (4, 256))
        return tf.MistralForCausalLM(config), {"input_ids": ids, "labels": ids}, "hf"
    model, batch = hf_family(name)
    return model, batch, "hf"


def plain_step(model: nn.Module, sample: object, kind: str) -> None:
    for p in model.parameters():
        p.grad = None
    if kind == "hf":
        model(**sample).loss.backward()
    else:
        x, y = sample
        nn.functional.cross_entropy(model(x), y).backward()


def step_time(model: nn.Module, sample: object, kind: str, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        plain_step(model, sample, kind)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Phases:
    """Wall time spent in the library functions of :data:`PHASES`, patched in for one call."""

    def __init__(self) -> None:
        self.spent = dict.fromkeys(PHASES, 0.0)
        self.depth_probe = 0.0
        self.profiles = 0
        self._saved: list[tuple[object, str, object]] = []

    def _wrap(self, module: object, attr: str, phase: str) -> None:
        fn = getattr(module, attr)
        self._saved.append((module, attr, fn))

        def timed(*a, **kw):
            t = time.perf_counter()
            probe_before = self.spent["probe"]
            try:
                return fn(*a, **kw)
            finally:
                spent = time.perf_counter() - t
                if phase == "profile":
                    # the probe runs inside the profile: count it once, under its own name
                    spent -= self.spent["probe"] - probe_before
                    self.profiles += 1
                    self.spent["profile" if self.profiles == 1 else "second profile"] += spent
                else:
                    self.spent[phase] += spent

        setattr(module, attr, timed)

    def __enter__(self) -> Phases:
        self._wrap(ct_api, "find_blocks_warm" if hasattr(ct_api, "find_blocks_warm") else "find_blocks", "blocks")
        # the link: measured on every call before, once per process since (link_of)
        self._wrap(ct_api, "link_of" if hasattr(ct_api, "link_of") else "measure_link", "link")
        if hasattr(ct_profiler, "_probe"):
            self._wrap(ct_profiler, "_probe", "probe")
        self._wrap(ct_plans, "measure_chain", "profile")
        self._wrap(ct_plans, "solve_for", "solve")
        return self

    def __exit__(self, *exc: object) -> None:
        for module, attr, fn in reversed(self._saved):
            setattr(module, attr, fn)


class Calls:
    """Forwards (with and without autograd) and backwards of the model, counted on its root."""

    def __init__(self, model: nn.Module) -> None:
        self.grad = self.nograd = self.backward = 0
        self.model = model

    def _pre(self, module: nn.Module, args: tuple) -> None:
        if torch.is_grad_enabled():
            self.grad += 1
        else:
            self.nograd += 1

    def _post(self, module: nn.Module, args: tuple, out: object) -> None:
        if not torch.is_grad_enabled():
            return
        loss = out.get("loss") if isinstance(out, dict) else getattr(out, "loss", None)
        t = loss if isinstance(loss, torch.Tensor) else out if isinstance(out, torch.Tensor) else None
        if t is not None and t.requires_grad:
            t.register_hook(self._grad)

    def _grad(self, g: torch.Tensor) -> None:
        self.backward += 1

    def __enter__(self) -> Calls:
        self._hooks = [self.model.register_forward_pre_hook(self._pre), self.model.register_forward_hook(self._post)]
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self._hooks:
            h.remove()


def timed_offload(model: nn.Module, sample: object, memory: float) -> tuple[float, dict, Calls]:
    # What a process's first offload() pays: the link is measured, not taken from the cache.
    getattr(ct_link, "_LINKS", {}).clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Phases() as phases, Calls(model) as calls:
            t = time.perf_counter()
            handle = ct.offload(model, sample, memory=memory)
            total = time.perf_counter() - t
    handle.remove()
    spent = dict(phases.spent)
    spent["other"] = max(0.0, total - sum(spent.values()))
    return total, spent, calls


def warm_kernels() -> tuple[float, float]:
    """(first offload() of a small model in this process, a second one): the first loads or
    compiles the solver's kernels."""
    torch.manual_seed(0)
    model, x = ResidualMLP(d=32, layers=8), torch.randn(16, 8)
    out = []
    for _ in range(2):
        t = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ct.offload(model, x, memory=FRACTION).remove()
        out.append(time.perf_counter() - t)
    return out[0], out[1]


def run(name: str, repeats: int) -> dict:
    model, sample, kind = build(name)
    memory = 0.8 if name == "resnet" else FRACTION
    params = sum(p.numel() for p in model.parameters())
    call = sample if kind == "hf" else sample[0]
    load = [os.getloadavg()[0]]
    for _ in range(2):
        plain_step(model, sample, kind)  # warm-up
    ratios, steps, totals, spent_all = [], [], [], []
    calls = None
    for _ in range(repeats):
        step = step_time(model, sample, kind)
        total, spent, calls = timed_offload(model, call, memory)
        ratios.append(total / step)
        steps.append(step)
        totals.append(total)
        spent_all.append(spent)
    load.append(os.getloadavg()[0])
    med = {k: statistics.median(s[k] for s in spent_all) for k in PHASES}
    step = statistics.median(steps)
    return {
        "model": name,
        "params": params,
        "memory": memory,
        "step": step,
        "offload": statistics.median(totals),
        "ratio": statistics.median(ratios),
        "ratios": ratios,
        "phases": {k: v / step for k, v in med.items()},
        "calls": (calls.grad, calls.nograd, calls.backward),
        "load": load,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help=f"models (default: {' '.join(TINY + LARGER)})")
    ap.add_argument("--repeats", type=int, default=3, help="offload() calls per model (default 3)")
    ap.add_argument("--quick", action="store_true", help="the tiny models only")
    ap.add_argument("--cold-cache", action="store_true", help="an empty Numba cache for the cold row")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--src", default=None, help="import the library from this checkout (default: this one)")
    ap.add_argument("--out", type=Path, default=None, help="the report (default results/offload_time[-quick].md)")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error(f"--repeats: {a.repeats} must be >= 1")
    if a.threads < 1:
        ap.error(f"--threads: {a.threads} must be >= 1")
    names = a.names or list(TINY if a.quick else TINY + LARGER)
    # One thread by default: on a shared machine, a descheduled OpenMP worker stalls every
    # parallel op at its barrier (a tiny GPT-2 step measured 0.05 to 3.5 s with 2 threads at
    # load 6); the ratio to a step of the same process is what is reported.
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    load0 = os.getloadavg()
    cold, warm = warm_kernels()
    rows = []
    for name in names:
        rows.append(run(name, a.repeats))
        r = rows[-1]
        print(f"{name}: step {r['step'] * 1e3:.1f} ms, offload {r['offload']:.2f} s = {r['ratio']:.2f} steps", file=sys.stderr)
    load1 = os.getloadavg()
    exceptions = "; ".join(f"{r['model']} at {r['memory']}" for r in rows if r["memory"] != FRACTION)
    lines = [
        "# offload() time in training steps",
        "",
        f"`python benchmarks/offload_time.py {' '.join(sys.argv[1:])}`".replace(" `", "`"),
        f"library: {library(ct.__file__, _src)}",
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs; "
        f"load average {load0[0]:.2f} / {load0[1]:.2f} / {load0[2]:.2f} at the start, "
        f"{load1[0]:.2f} / {load1[1]:.2f} / {load1[2]:.2f} at the end; {time.perf_counter() - t0:.0f} s in all.",
        "",
        f"Kernels: the first offload() in the process took {cold:.2f} s, a second {warm:.2f} s: "
        f"{cold - warm:.2f} s to {'compile the solver kernels (empty Numba cache)' if a.cold_cache else 'load (or compile) the solver kernels'}, "
        "excluded below.",
        "",
        f"`ct.offload(model, batch, memory={FRACTION})` ({exceptions or 'every model'}),"
        f" {a.repeats} calls per model, each after a plain step timed as the median of 3. Ratio: offload() wall over"
        " one plain training step, median of the calls (the ratios of each call in brackets). Phases in steps"
        " (medians). Calls: the model's forwards with autograd / without / backwards in one offload().",
        "",
        "| model | params | step | offload() | steps | blocks | link | probe | profile | second profile | solve | other | calls | load |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ph = r["phases"]
        each = ", ".join(f"{x:.2f}" for x in r["ratios"])
        lines.append(
            f"| {r['model']} | {r['params'] / 1e6:.2f} M | {r['step'] * 1e3:.1f} ms | {r['offload']:.2f} s | "
            f"**{r['ratio']:.2f}** ({each}) | "
            + " | ".join(f"{ph[k]:.2f}" for k in PHASES)
            + f" | {'/'.join(map(str, r['calls']))} | {r['load'][0]:.1f}-{r['load'][1]:.1f} |"
        )
    worst = max(rows, key=lambda r: r["ratio"])
    lines += ["", f"Most: {worst['model']}, {worst['ratio']:.2f} steps."]
    out = a.out or RESULTS / ("offload_time-quick.md" if a.quick else "offload_time.md")
    write_report(lines, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
