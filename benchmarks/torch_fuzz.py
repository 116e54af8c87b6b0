"""Differential fuzzing, the long run: N random block models trained plain and offloaded.

Model k is drawn by :func:`chainoffload_torch.testing.draw_model` from ``random.Random(f"{seed}:{k}")``
(the generator behind the Hypothesis strategy ``random_models``), with a budget (1.0 one time
in five, else a fraction in [0.4, 0.95]) and a solver drawn from the same generator, then
:func:`~chainoffload_torch.testing.differential_check` trains it 3 SGD steps plain and offloaded
and compares losses, gradients and parameters bitwise. Each result is one JSON line in
``<out>.jsonl``, so a run resumes where it stopped and shards (``--shard i/n``, model k goes to
shard ``k % n``) can run in parallel and be merged by a last call with ``--report``. The first
failures (``--shrink``, 25 by default) are shrunk to a smaller description with the same outcome.
``--recompute`` draws methods that recompute at budgets above the model's floor;
``--recompute-only`` budgets below its floor of pure offloading, so that every model that trains
does so with a plan that recomputes (NOTE [ budgets only a recomputing plan meets ]).

    python benchmarks/torch_fuzz.py --models 5000 --seed 0                 # one process
    python benchmarks/torch_fuzz.py --models 5000 --shard 0/2 &            # or two shards,
    python benchmarks/torch_fuzz.py --models 5000 --shard 1/2; wait        # then
    python benchmarks/torch_fuzz.py --models 5000 --report                 # the table

The table (``benchmarks/results/torch_fuzz.md``): the command, torch's version, wall time and
rate, counts per outcome, per feature, and every failure with its (shrunk) description.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

# Deterministic cuBLAS, so that a difference on CUDA is the adapter's, not the kernels'.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402

from _common import write_report  # noqa: E402
from chainoffload_torch.testing import (  # noqa: E402
    FAILURES,
    FEATURES,
    OUTCOMES,
    ModelCase,
    ModelSpec,
    _train_both,
    differential_check,
    draw_model,
)

RESULTS = Path(__file__).resolve().parent / "results"
#: Solvers drawn per model: the fast size-only ones, and the default search users get.
METHODS = ("largest-first", "first-k", "offload-all", None)
#: With --recompute: the methods that recompute (rotor; joint, which also offloads; recompute-all,
#: the most recomputations) and offload()'s own choice among best, rotor and joint.
REMAT_METHODS = ("rotor", "joint", "recompute-all", None)
STEPS = 3


#: With --recompute: the budgets drawn, as shares of the keep-all peak (NOTE [ budgets a
#: recomputing plan can meet ]).
REMAT_LOW, REMAT_HIGH = 0.15, 0.95


#: With --recompute-only, where the model's floor of any schedule is at or above its floor of pure
#: offloading (no budget fits offloading alone): the methods that recompute at any budget below
#: the keep-all peak (NOTE [ budgets only a recomputing plan meets ]).
FORCED_METHODS = ("rotor", "recompute-all")
#: The steps of Probe.bracket's bisection: it stops within 1/BISECTIONS of the range searched.
BISECTIONS = 16
#: The methods of REMAT_METHODS that may also choose a plan that recomputes nothing.
OFFLOADING_METHODS = ("joint", None)


def trial(
    seed: int, k: int, features: frozenset[str] = frozenset(FEATURES), recompute: bool = False, device: str = "cpu",
    only: bool = False,
) -> tuple[ModelCase, float, str | None]:
    """Model ``k`` of the run seeded ``seed``: its case, budget and method (independent of
    every other model, so shards and resumed runs draw exactly the same). ``recompute``: a
    method of :data:`REMAT_METHODS` and a budget between the model's floor of any schedule and
    0.95 of its keep-all peak (NOTE [ budgets a recomputing plan can meet ]), ``device`` where
    that floor is measured. ``only``: a budget below the model's floor of pure offloading, so
    that every plan that fits recomputes, or a method that recomputes at any budget where no
    such budget exists (NOTE [ budgets only a recomputing plan meets ])."""
    rng = random.Random(f"{seed}:{k}")
    case = draw_model(rng, features=features)
    if only:
        drawn, method, forced = rng.random(), rng.choice(REMAT_METHODS), rng.choice(FORCED_METHODS)
        memory, method = below_offload_floor(case, drawn, method, forced, device)
        return case, memory, method
    if recompute:
        drawn = rng.uniform(REMAT_LOW, REMAT_HIGH)
        return case, above_floor(case, drawn, device), rng.choice(REMAT_METHODS)
    memory = 1.0 if rng.random() < 0.2 else round(rng.uniform(0.4, 0.95), 2)
    method = rng.choice(METHODS)
    return case, memory, method


# NOTE [ budgets a recomputing plan can meet ]
# The recomputing run drew its budget in [0.15, 0.95] of the keep-all peak whatever the model:
# on models 0-299 of seed 43 (trial() and differential_check as run() calls them, CPU), 74 were
# refused, 29 of them "below any schedule's floor" (no schedule of any kind fits; the model never
# reaches a recomputing plan), and 50 trained equal under a plan that recomputes. The draw is
# now placed above the model's own floor (the same 300: 40 refused, none below the floor, 145
# equal, 67 of them recomputing, no failure; 115 both_raised either way): a probe
# (offload() at the whole keep-all peak, on a copy built from the spec, under the check's own
# seeding, removed at once) gives the chain's floor of any schedule plus what stays resident
# outside it, as a share of the step's keep-all peak, and the drawn number maps linearly from
# [0.15, 0.95] onto [that share, 0.95] (rounded up to the hundredth, so never below it). The
# generator is drawn from exactly as before, so model k and its method are the same, and a
# model whose probe raises keeps its draw as it was (the check itself then says what offload()
# does). What it costs: one more profile per model. What stays: a budget between that floor and
# what the executor can carry out (stages it cannot recompute, NOTE [ one call chooses ] in
# plans.py) is still refused up front; those refusals say the adapter's limits, not the draw's.


@contextlib.contextmanager
def _probed(case: ModelCase, device: str, method: str):
    """offload() of a copy of ``case`` built from its spec, at the whole keep-all peak, under the
    check's own seeding (NOTE [ budgets a recomputing plan can meet ]); removed on leaving. Raises
    what offload() raises."""
    import warnings

    from chainoffload_torch import offload
    from chainoffload_torch.testing import _Globals

    dev = torch.device(device)
    cuda = [dev.index or 0] if dev.type == "cuda" else []
    handle = None
    try:
        with torch.random.fork_rng(devices=cuda), _Globals(case.spec.seed), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = case.build(dev)
            torch.manual_seed(case.spec.seed)
            handle = offload(model, case.batch(dev, 0), memory=1.0, method=method, repeats=1, warmup=0)
            yield handle
    finally:
        if handle is not None:
            handle.remove()


def above_floor(case: ModelCase, drawn: float, device: str = "cpu") -> float:
    """``drawn`` (in [REMAT_LOW, REMAT_HIGH]) moved onto [the model's floor share, REMAT_HIGH]
    (NOTE [ budgets a recomputing plan can meet ])."""
    import math

    from chainoffload_torch._coverage import step_peak

    try:
        with _probed(case, device, "best") as handle:
            plan = handle.plan
            floor = plan.chain.stage_memory_floor() + plan.sizes.resident_bytes
            share = floor / step_peak(plan.chain, plan.sizes)
    except Exception:  # noqa: BLE001 - the check says what offload() does with such a model
        return round(drawn, 2)
    low = min(max(REMAT_LOW, math.ceil(100 * share) / 100), REMAT_HIGH)
    return round(low + (drawn - REMAT_LOW) * (REMAT_HIGH - low) / (REMAT_HIGH - REMAT_LOW), 2)


# NOTE [ budgets only a recomputing plan meets ]
# --recompute drew budgets above the model's floor of any schedule; of the equal models, fewer
# than half trained with a plan that recomputes (seed 43: 1113 of 2435), as offload()'s choice,
# joint and the fallbacks met those budgets by offloading alone. --recompute-only draws, for
# model k, the same model as --recompute (draw_model first, from the same generator), then a
# number u in [0, 1), a method of REMAT_METHODS and one of FORCED_METHODS, always all three, so
# that what is drawn does not depend on the probe. The probe (Probe.of: offload() at the keep-all
# peak, method rotor so the chain is priced for recomputation as for every method drawn here, the
# check's seeding, on a copy, removed at once) gives, in bytes of the step, the adapter's floor
# of any schedule S (stage_floor + resident), the proven floor of pure offloading O
# (offload_memory_floor + resident: below it no schedule that recomputes nothing fits,
# docs/model.md) and the keep-all peak P (step_peak), and solves as offload() solves (solve_for
# with the planner's link, options, keep, blocks and their unsafe ones). The top T is min(O, P)
# for rotor and recompute-all; for joint and offload()'s choice, which may also pick a plan that
# recomputes nothing, min(max(O, B), P) with B above the largest budget seen not to fit best's plan
# (a bisection to 1/16 of [S, P]: a solve of best takes up to a second here; the adapter's S counts more
# than the core's proven floor: on models 0-38 of seed 43, S >= O in 8 of 13 probed, so O alone
# left those methods no budget). For the drawn method, M is the least budget in [S, T) at which
# its plan fits (bisection to 1/16 of [S, T); offload()'s choice there is rotor's or joint's, best
# not fitting, so its M is the lower of theirs, with no solve of best); the budget is
# b = M + floor(u (T - M)), given as the fraction
# (b + 1/2) / P so that Budget.bytes_for gives back exactly b. Below T no plan that recomputes
# nothing fits (offload()'s choice cannot take best's; joint's own search may still find one
# below B, which the table's per-step counts would show). Where no such M exists, the forced
# method takes over, with M its least budget in [S, 0.95 P] and b drawn the same way: rotor and
# recompute-all recompute at any budget below P.
# Drawing at least M, not S, keeps the budgets the executor cannot carry out (a recomputation of
# a stage it cannot call again, a unit joint would move that must stay) out of the run: on models
# 0-29 of seed 43, drawing from S refused 10 of the 18 models plain PyTorch trains, from M none.
# A model whose probe raises gets 0.15 + 0.8 u of P and the forced method (the check then says
# what offload() does). What stays: a model plain PyTorch cannot train is both_raised whatever
# the plan (about 40 % of the draws); a model whose later shapes (varying_shapes) have other
# floors is planned per shape at the same fraction; fitting is assumed monotone in the budget,
# and the check's own profile (its times) may choose otherwise than the probe's. Measured on
# models 0-399 of seed 43 (two shards, CPU, load average 6-7): 246 equal, every one recomputing in
# some step and 71 of them moving bytes in a step they recompute in; 153 both_raised, 1 refused
# (model 84: the profile's own draws made an in-place error), no failure; 0.6 CPU s per model.


def below_offload_floor(case: ModelCase, drawn: float, method: str | None, forced: str, device: str = "cpu") -> tuple[float, str | None]:
    """The budget (a fraction of the keep-all peak) and the method for ``drawn`` in [0, 1)
    (NOTE [ budgets only a recomputing plan meets ])."""
    probe = Probe.of(case, device)
    if probe is None:
        return round(REMAT_LOW + drawn * (REMAT_HIGH - REMAT_LOW), 2), forced
    top = min(probe.pure_offload, probe.peak)
    if method in OFFLOADING_METHODS:
        # The adapter's own floor of pure offloading: its floor of any schedule counts more
        # than the core's proven one (held units, the saving forward), so best's least budget
        # is the bound where offload()'s choice could keep from recomputing.
        best = probe.bracket("best", probe.peak)
        top = min(max(top, best[0] + 1 if best is not None else probe.peak), probe.peak)
    least = probe.least(method, top)
    if least is None:
        method, top = forced, max(probe.stage + 1, int(REMAT_HIGH * probe.peak) + 1)
        least = probe.least(method, top)
    low = probe.stage if least is None else least
    budget = low + int(drawn * max(0, top - low))
    return min(1.0, (budget + 0.5) / probe.peak), method


@dataclasses.dataclass
class Probe:
    """What offload() plans for a case's first batch, to place budgets (NOTE [ budgets only a
    recomputing plan meets ]): the step's floor of any schedule the adapter may run (``stage``),
    the proven floor of pure offloading (``pure_offload``) and the keep-all peak (``peak``), in
    bytes, and a way to ask whether a method's plan fits a budget, as offload() solves it."""

    stage: int
    pure_offload: int
    peak: int
    solve: Any

    @classmethod
    def of(cls, case: ModelCase, device: str = "cpu") -> Probe | None:
        """``None`` where offload() raises on ``case`` at its keep-all peak."""
        import warnings

        import chainoffload as co
        from chainoffload.bounds import offload_memory_floor
        from chainoffload_torch._coverage import step_peak
        from chainoffload_torch.plans import _Unsafe, solve_for, stage_floor

        try:
            # A method that recomputes: the chain is priced for recomputation, as offload()
            # prices it for every method drawn here (None included).
            with _probed(case, device, "rotor") as handle:
                plan, planner = handle.plan, handle._planner
                chain, sizes, resident = plan.chain, plan.sizes, plan.sizes.resident_bytes
                keep = co.solvers.check_keep(chain, planner.keep)
                # As _Planner.plan's: what its profile saw unsafe to recompute, inputs written included.
                blocks = _Unsafe(
                    handle._instrument.blocks, dict(planner.unsafe), prefix_watched=True, inputs=dict(planner.inputs_written),
                )
        except Exception:  # noqa: BLE001 - the check says what offload() does with such a model
            return None

        def solve(method: str | None, budget: int) -> bool:
            platform = planner.link.with_memory(max(0, budget - resident))
            # Whether a plan fits, not how fast: the CP-SAT improvers of best and joint only
            # shorten a plan that fits (seconds per bisection step otherwise).
            options = {**planner.options, "cpsat_work": 0} if method in (None, "best", "joint") else planner.options
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    solve_for(chain, platform, method, keep, sizes, options, plan.key, blocks=blocks, overlap=planner.overlap)
            except ValueError:
                return False
            return True

        return cls(stage_floor(chain, sizes) + resident, offload_memory_floor(chain) + resident, step_peak(chain, sizes), solve)

    def bracket(self, method: str | None, top: int) -> tuple[int, int] | None:
        """``(lo, hi)``: ``method``'s plan fits at ``hi`` in [stage, top) and not at ``lo`` nor,
        fitting taken as monotone in the budget, below it (``stage - 1`` where nothing below
        ``hi`` was tried), ``hi - lo`` within 1/BISECTIONS of the range; ``None`` where it does not
        fit at ``top - 1``. Bisection: a solve of best takes up to a second on these chains."""
        lo, hi = self.stage - 1, top - 1
        if hi <= lo or not self.solve(method, hi):
            return None
        tol = max(1, (hi - lo) // BISECTIONS)
        while hi - lo > tol:
            mid = (lo + hi) // 2
            if self.solve(method, mid):
                hi = mid
            else:
                lo = mid
        return lo, hi

    def least(self, method: str | None, top: int) -> int | None:
        """A budget in [stage, top) at which ``method``'s plan fits, within 1/BISECTIONS of the
        range above the least one (:meth:`bracket`); offload()'s choice (``None``) below best's
        least budget is rotor's or joint's, whichever fits lower (no solve of best)."""
        if method is None:
            found = [x for x in (self.least("rotor", top), self.least("joint", top)) if x is not None]
            return min(found) if found else None
        found = self.bracket(method, top)
        return None if found is None else found[1]


def _check(spec: ModelSpec, memory: float, method: str | None, device: str) -> str:
    return differential_check(ModelCase(spec), memory=memory, method=method, steps=STEPS, device=device).kind


def shrink(spec: ModelSpec, memory: float, method: str | None, device: str, kind: str, budget: int = 150) -> ModelSpec:
    """A smaller description with the same outcome ``kind``: greedy passes that drop hooks,
    between-block ops, casts, the loop's features, shares, skips and masks, and ops of blocks (each block keeps at
    least one op; the block count stays, as the chain's length matters to the plan)."""
    tries = [0]

    def keeps(candidate: ModelSpec) -> bool:
        tries[0] += 1
        try:
            return _check(candidate, memory, method, device) == kind
        except ValueError:  # an invalid candidate (a skip op without its source)
            return False

    def candidates(s: ModelSpec):
        for i in range(len(s.hooks)):
            yield dataclasses.replace(s, hooks=s.hooks[:i] + s.hooks[i + 1:])
        for i in range(len(s.between)):
            yield dataclasses.replace(s, between=s.between[:i] + s.between[i + 1:])
        for i in range(len(s.hidden_casts)):
            yield dataclasses.replace(s, hidden_casts=s.hidden_casts[:i] + s.hidden_casts[i + 1:])
        # The loop's features (NOTE [ the loops the fuzz draws ] in chainoffload_torch/testing.py).
        for i in range(len(s.draws)):
            yield dataclasses.replace(s, draws=s.draws[:i] + s.draws[i + 1:])
        for i in range(len(s.data_writes)):
            yield dataclasses.replace(s, data_writes=s.data_writes[:i] + s.data_writes[i + 1:])
        if s.optimizer != "sgd":
            yield dataclasses.replace(s, optimizer="sgd")
        if s.batches:
            yield dataclasses.replace(s, batches=())
        if s.forwards > 1:
            yield dataclasses.replace(s, forwards=1)
        for i, b in enumerate(s.blocks):
            alts = []
            if b.share is not None:
                alts.append(dataclasses.replace(b, share=None))
            if b.skip_from is not None:
                alts.append(dataclasses.replace(b, skip_from=None, ops=tuple(o for o in b.ops if o != "skip") or ("linear",)))
            if b.emits_mask:
                alts.append(dataclasses.replace(b, emits_mask=False))
            if b.ops != ("linear",):
                alts.append(dataclasses.replace(b, ops=("linear",)))
            if len(b.ops) > 1:
                alts += [dataclasses.replace(b, ops=b.ops[:j] + b.ops[j + 1:]) for j in range(len(b.ops))]
            for alt in alts:
                yield dataclasses.replace(s, blocks=s.blocks[:i] + (alt,) + s.blocks[i + 1:])
        if s.dtype != "float32":
            yield dataclasses.replace(s, dtype="float32")
        if s.batch > 1:
            yield dataclasses.replace(s, batch=1)

    improved = True
    while improved and tries[0] < budget:
        improved = False
        for cand in candidates(spec):
            if tries[0] >= budget:
                break
            if keeps(cand):
                spec, improved = cand, True
                break
    return spec


def plain_control(case: ModelCase, device: str) -> str:
    """The outcome of training ``case`` plain twice, side by side (``equal`` or a difference)."""
    dev = torch.device(device)
    with torch.random.fork_rng(devices=[dev.index or 0] if dev.type == "cuda" else []):
        a, b = case.build(dev), case.build(dev)
        return _train_both(case, a, b, case.batch(dev), case.spec.seed, STEPS, 0.05, None, ()).kind


def _jsonl(out: Path) -> Path:
    return out.with_suffix(".jsonl")


def load(out: Path, seed: int) -> dict[int, dict]:
    """The results already recorded for ``seed`` (the last line of each model wins)."""
    done: dict[int, dict] = {}
    path = _jsonl(out)
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                if row["seed"] == seed:
                    done[row["k"]] = row
    return done


def run(args: argparse.Namespace) -> None:
    done = load(args.out, args.seed)
    index, count = args.shard
    todo = [k for k in range(args.models) if k % count == index and k not in done]
    path = _jsonl(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    shrunk = 0
    with path.open("a") as f:
        for n, k in enumerate(todo, start=1):
            case, memory, method = trial(args.seed, k, args.features, args.recompute, args.device, args.recompute_only)
            start = time.perf_counter()
            result = differential_check(case, memory=memory, method=method, steps=STEPS, device=args.device)
            row = {
                "seed": args.seed,
                "k": k,
                "kind": result.kind,
                "detail": result.detail,
                "memory": memory,
                "method": method,
                "units": list(result.offloaded_units),
                "recomputations": result.recomputations,
                "moved": result.moved_bytes,
                "steps": [list(x) for x in result.steps],
                "features": sorted(case.features),
                "seconds": round(time.perf_counter() - start, 4),
                "spec": repr(case.spec),
            }
            if result.kind == "silent_difference" and args.device != "cpu":
                # A GPU kernel without a deterministic implementation differs from run to run by
                # itself: the same model trained plain twice tells it from the adapter's fault.
                row["plain_vs_plain"] = plain_control(case, args.device)
            if result.kind in FAILURES and shrunk < args.shrink:
                shrunk += 1
                row["shrunk"] = repr(shrink(case.spec, memory, method, args.device, result.kind))
            f.write(json.dumps(row) + "\n")
            f.flush()
            if n % 50 == 0 or n == len(todo):
                rate = n / (time.perf_counter() - t0)
                print(f"{n}/{len(todo)} models, {rate:.2f} models/s", file=sys.stderr)


def report(args: argparse.Namespace, command: str) -> None:
    rows = [r for k, r in sorted(load(args.out, args.seed).items()) if k < args.models]
    counts = collections.Counter(r["kind"] for r in rows)
    check_seconds = sum(r["seconds"] for r in rows)
    lines = [
        "# Differential fuzzing: offloaded training against plain autograd",
        "",
        f"Command: `{command}`  ",
        f"torch {torch.__version__}, device {args.device}, {torch.get_num_threads()} intra-op thread(s); "
        f"{len(rows)} of {args.models} models (seed {args.seed}), {STEPS} SGD steps each"
        + (f", features off: {', '.join(sorted(args.without))}" if args.without else "") + ".  ",
        f"Time in checks: {check_seconds:.1f} s ({len(rows) / max(check_seconds, 1e-9):.2f} models/s"
        + (f"; wall time of this call {args.wall:.1f} s" if args.wall is not None else "")
        + "); failures are shrunk after their check (not counted in the rate).",
        "",
        "Outcomes: `equal` (every loss, gradient and parameter `torch.equal` after every step), `both_raised`, "
        "`refused` (offload() raised up front on a model plain PyTorch trains) keep the promise; "
        "`silent_difference`, `offloaded_only_raise`, `plain_only_raise` break it.",
        "",
        "| outcome | models |",
        "|---|---:|",
    ]
    lines += [f"| {k} | {counts.get(k, 0)} |" for k in OUTCOMES]
    if any("recomputations" in r for r in rows):
        equal = [r for r in rows if r["kind"] == "equal"]
        remat = [r for r in equal if r.get("recomputations")]
        by = collections.Counter(str(r["method"]) for r in remat)
        lines += [
            "",
            f"Of the `equal` models, {len(remat)} trained with a plan that recomputes "
            f"({sum(r['recomputations'] for r in remat)} forward ops run again per step in all; by method: "
            + ", ".join(f"{m} {n}" for m, n in sorted(by.items())) + ").",
        ]
    if any("steps" in r for r in rows):
        # A plan that recomputes in some step (the last one may run another shape's plan, or
        # skip the block the plan recomputes), and one that also moves bytes in that step.
        equal = [r for r in rows if r["kind"] == "equal"]
        remat = [r for r in equal if any(ops for ops, _ in r.get("steps", ()))]
        joint = [r for r in remat if any(ops and moved for ops, moved in r.get("steps", ()))]
        lines += [
            "",
            "| trainings | models |",
            "|---|---:|",
            f"| (a) equal, with a plan that recomputes in some step (the sentence above: in the last step) | {len(remat)} |",
            f"| (b) of (a), the plan also moved bytes to the host in a step it recomputed in (joint) | {len(joint)} |",
            f"| equal, with a plan that recomputes nothing | {len(equal) - len(remat)} |",
            f"| silent differences | {counts.get('silent_difference', 0)} |",
            f"| loud one-sided raises | {counts.get('offloaded_only_raise', 0) + counts.get('plain_only_raise', 0)} |",
            f"| refused by offload() up front | {counts.get('refused', 0)} |",
            f"| both raised (plain PyTorch cannot train the model) | {counts.get('both_raised', 0)} |",
            "",
            "(b) by method drawn: " + (", ".join(
                f"{m} {n}" for m, n in sorted(collections.Counter(str(r["method"]) for r in joint).items())) or "none") + ".",
        ]
    lines += ["", "Per feature (a model counts under every feature it uses):", ""]
    lines.append("| feature | models | " + " | ".join(OUTCOMES) + " |")
    lines.append("|---|---:|" + "---:|" * len(OUTCOMES))
    for feat in FEATURES:
        sub = [r for r in rows if feat in r["features"]]
        c = collections.Counter(r["kind"] for r in sub)
        lines.append(f"| {feat} | {len(sub)} | " + " | ".join(str(c.get(k, 0)) for k in OUTCOMES) + " |")
    failures = [r for r in rows if r["kind"] in FAILURES]
    lines += ["", f"## Failures ({len(failures)})", ""]
    for r in failures:
        lines += [
            f"### model {r['k']}: {r['kind']} (memory={r['memory']}, method={r['method']!r}, offloaded units {r['units']})",
            "",
            r["detail"] + (f" (plain against itself: {r['plain_vs_plain']})" if "plain_vs_plain" in r else ""),
            "",
            "Features: " + (", ".join(r["features"]) or "none"),
            "",
            "```python",
            r.get("shrunk", r["spec"]) + ("  # shrunk" if "shrunk" in r else ""),
            "```",
            "",
        ]
    write_report(lines, args.out)


def _shard(text: str) -> tuple[int, int]:
    i, _, n = text.partition("/")
    index, count = int(i), int(n)
    if not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard: {text!r} must be i/n with 0 <= i < n")
    return index, count


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=5000, help="models to draw (default 5000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS / "torch_fuzz.md", help="the table; results go to <out>.jsonl")
    parser.add_argument("--shard", type=_shard, default=(0, 1), help="i/n: run models k with k %% n == i")
    parser.add_argument("--report", action="store_true", help="only write the table from <out>.jsonl")
    parser.add_argument("--shrink", type=int, default=25, help="shrink the first SHRINK failures (default 25; 0: none)")
    parser.add_argument("--without", nargs="*", default=[], choices=FEATURES, metavar="FEATURE", help="features switched off")
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1 is fastest for these tiny models)")
    parser.add_argument(
        "--recompute", action="store_true",
        help="plans that recompute: rotor, joint, recompute-all or offload()'s choice, at 15-95 %% of the keep-all "
        "peak, without late hooks (a pre-hook added after offload() on a recomputed block is refused at the step)",
    )
    parser.add_argument(
        "--recompute-only", action="store_true",
        help="as --recompute, at a budget below the model's floor of pure offloading (every plan that fits "
        "recomputes), or rotor / recompute-all where that floor is the floor of any schedule",
    )
    args = parser.parse_args(argv)
    args.recompute = args.recompute or args.recompute_only
    args.features = frozenset(FEATURES) - set(args.without) - ({"late_hooks"} if args.recompute else set())
    torch.set_num_threads(args.threads)
    if args.device != "cpu":
        torch.use_deterministic_algorithms(True, warn_only=True)
    command = "python benchmarks/torch_fuzz.py " + " ".join(sys.argv[1:] if argv is None else argv)
    t0 = time.perf_counter()
    if not args.report:
        run(args)
    args.wall = time.perf_counter() - t0 if not args.report else None
    if args.shard == (0, 1) or args.report:
        report(args, command)


if __name__ == "__main__":
    main()
