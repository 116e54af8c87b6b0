"""offload() side by side with Hugging Face's ``gradient_checkpointing_enable()``, on CPU.

Three Hugging Face models built from configs (random weights, no download): Llama-like
(``LlamaForCausalLM``, 8 layers), BERT-like (``BertForMaskedLM``, 8 layers, dropout 0.1) and
T5-like (``T5ForConditionalGeneration``, 8 + 8 blocks, dropout 0.1), each trained four ways in
one process, the steps interleaved (round robin, so that the machine's load falls on all alike):

(a) plain training;
(b) ``model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})``
    (checkpoint every block);
(c) ``ct.offload(model, batch, memory=M_ck)``, where ``M_ck`` is the memory that checkpointing
    every block holds: the simulated peak, on the model's own profile (the chain of a keep-all
    ``offload()``), of the schedule that does what ``gradient_checkpointing_enable()`` does --
    every block run without saving and recomputed before its backward, the code before the
    first block (the embeddings, when the chain makes it a stage) kept, the last stage (the
    last block with the head and the loss) run once (NOTE [ the last stage is not recomputed ]
    in chainoffload/solvers/remat_baselines.py) -- plus the bytes resident outside the chain;
(d) ``ct.offload(model, batch, memory=(M_ck + keep-all peak) / 2)``;
(e) ``ct.offload(model, batch)`` (the keep-all peak: nothing moved or recomputed, so the
    executor stays passive): the same work as plain training, a control whose gap to (a) is the
    run's noise;
(f) ``ct.offload(model, batch, memory=M_ck, method="rotor")``: recomputation alone at (c)'s
    memory, a schedule of checkpointing's own family (rotor never loses to checkpoint-all), so
    its gap to (b) is the executor's against ``torch.utils.checkpoint`` on the same kind of
    schedule, and its gap to (c) what moving bytes costs where (c) moves some.

For each: the median step time (forward, the model's loss, backward; no optimizer step, so every
step computes the same gradients) of ``--steps`` steps after ``--warmup``, the simulated step
time, every one on the same profile (the probe's: two profiles of one model on a loaded CPU
differ by up to 45 %, so makespans from two profiles are not compared): the keep-all compute
time for plain training, the checkpointing schedule's makespan for (b) (on the profile less the
executor's host work per recomputation, which offload()'s chain charges on CPU: NOTE [ what a
recomputation costs the executor ] in chainoffload_torch/_recompute.py), the plan's schedule
simulated on the probe's chain for (c) and (d), its copies counted inline with compute as
``offload()`` predicts on CPU (``Plan.overlap``, ``Timeline.serial_makespan``); what the plan does per block (from
``handle.decisions()``), and whether the gradients are ``torch.equal`` to plain training's
(the same seed before every forward).

    python benchmarks/checkpointing.py [--steps 7] [--warmup 2] [--width 256] [--rounds 1] [name ...]

``--rounds R`` runs it all R times, each round on fresh deep copies of the model (offload()
profiling and planning anew), and takes the medians over every round's steps: two copies of one
model trained alike measure up to 2 % apart on this machine (where their storages lie), which
one round cannot tell from a difference between the runs.

``--width`` sets the hidden size (the feed-forward sizes scale with it; 8 layers, the same
batch): the executor's host work per recomputation is about fixed, the blocks' compute grows
with the width, so the width shows which share of the step that work is. Also the thread's CPU
time of each step (the load of other sessions moves it far less than wall time). Writes
``benchmarks/results/checkpointing.md`` (``checkpointing_wW.md`` at another width) when every
model runs (no names given).
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import chainoffload as co  # noqa: E402
import chainoffload_torch as ct  # noqa: E402
from chainoffload.solvers.remat_baselines import checkpoint_all_schedule  # noqa: E402
from chainoffload.tradeoff import policy_peak  # noqa: E402
from chainoffload.units import format_bytes  # noqa: E402
from chainoffload_torch.plans import step_time  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
MODELS = ("llama", "bert", "t5")
VARIANTS = (
    "plain", "HF checkpointing", "offload() at checkpointing's memory", "offload() halfway to keep-all",
    "offload() at the keep-all peak", "offload(method='rotor') at checkpointing's memory",
)


def build(name: str, width: int = 256) -> tuple[nn.Module, dict]:
    """Model ``name`` of :data:`MODELS` from its config (seeded, in training mode) and its batch.

    ``width`` is the hidden size (a multiple of 64: one attention head per 64); the feed-forward
    sizes scale with it, the layers, sequence and batch stay. 256 is the results file's model."""
    import transformers as tf

    if width < 64 or width % 64:
        raise ValueError(f"width: {width} is not a positive multiple of 64")
    heads, scale = width // 64, width / 256
    torch.manual_seed(0)
    if name == "llama":
        config = tf.LlamaConfig(
            hidden_size=width, intermediate_size=round(688 * scale), num_attention_heads=heads,
            num_key_value_heads=heads, num_hidden_layers=8,
            vocab_size=1024, max_position_embeddings=256, use_cache=False,
        )
        model = tf.LlamaForCausalLM(config)
        ids = torch.randint(0, 1024, (2, 128))
        batch = {"input_ids": ids, "labels": ids}
    elif name == "bert":
        config = tf.BertConfig(
            hidden_size=width, intermediate_size=4 * width, num_attention_heads=heads, num_hidden_layers=8, vocab_size=1024,
            max_position_embeddings=256, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
        )
        model = tf.BertForMaskedLM(config)
        ids = torch.randint(0, 1024, (2, 128))
        batch = {"input_ids": ids, "labels": ids}
    elif name == "t5":
        config = tf.T5Config(
            d_model=width, d_ff=4 * width, d_kv=64, num_heads=heads, num_layers=8, num_decoder_layers=8, vocab_size=1024,
            dropout_rate=0.1, use_cache=False, decoder_start_token_id=0, pad_token_id=0,
        )
        model = tf.T5ForConditionalGeneration(config)
        batch = {"input_ids": torch.randint(1, 1024, (2, 128)), "labels": torch.randint(1, 1024, (2, 64))}
    else:
        raise ValueError(f"name: {name!r} is not one of {', '.join(MODELS)}")
    model.train()
    return model, batch


def step(model: nn.Module, batch: dict, seed: int) -> tuple[float, float]:
    """One training step (forward, loss, backward), gradients zeroed before: its wall seconds
    and the seconds of CPU the thread spent (``time.thread_time``: one thread computes, so the
    other sessions of a shared machine move it far less than the wall time)."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)  # the same dropout masks in every variant
    c0, t0 = time.thread_time(), time.perf_counter()
    model(**batch).loss.backward()
    return time.perf_counter() - t0, time.thread_time() - c0


def plan_summary(handle: object) -> str:
    """What the plan does, counted over its blocks: recomputed, offloaded, kept."""
    rows = handle.decisions()
    recomputed = [r for r in rows if r["decision"].startswith("recompute")]
    times = sum(int(r["decision"].split("(", 1)[1].split(" ", 1)[0]) for r in recomputed)
    offloaded = [r for r in rows if "offload" in r["decision"]]
    ckpt = [r for r in rows if "checkpoint" in r["decision"]]
    return (
        f"{handle.plan.result.method}: {len(recomputed)} of {len(rows)} blocks recomputed ({times} recomputations), "
        f"{len(ckpt)} checkpoints, {len(offloaded)} offloaded ({format_bytes(handle.plan.offloaded_bytes)} per step)"
    )


def run(name: str, steps: int, warmup: int, width: int = 256, rounds: int = 1) -> list[dict]:
    base, batch = build(name, width)
    # The model's own profile: a keep-all plan's chain (nothing offloaded), its link and the
    # bytes resident outside the chain (a whole step's memory is the chain's plus those).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        probe = ct.offload(copy.deepcopy(base), batch)
    plan = probe.plan
    chain, link, resident, keep_all = plan.chain, plan.platform, plan.resident_bytes, plan.keep_all_peak
    prefix = bool(probe.blocks.prefix)
    # The code between an unlinked block and the next as a stage of its own (T5's encoder
    # final_layer_norm and dropout, then the decoder's embeddings): HF's checkpointing wraps
    # the blocks alone, so that code runs once and keeps what it saves.
    tails = {probe.blocks.stage_of(b) + 1 for b in probe.blocks.tails}
    probe.remove()
    # What HF's checkpointing does on this chain: the prefix stage (embeddings) and the tails
    # kept, every block but the last run without saving and recomputed before its backward.
    whole = ({1} if prefix else set()) | tails
    ck_schedule = checkpoint_all_schedule(chain.length, whole=whole)
    unlimited = link.with_memory(2**62)
    # HF's checkpointing on the profile without the executor's host work per recomputation,
    # which offload()'s chain carries on CPU (NOTE [ what a recomputation costs the executor ]
    # in chainoffload_torch/_recompute.py): that work is the executor's, not HF's.
    ck = co.simulate(chain.replace(fwd_nosave=chain.fwd), unlimited, ck_schedule)
    # The same schedule on offload()'s own chain (that host work charged), the family member
    # offload() compares its plans with (NOTE [ checkpointing what the executor can recompute ]
    # in chainoffload_torch/plans.py): the gap of (c) to it is the planner's, the rest the charge.
    ck_charged = co.simulate(chain, unlimited, ck_schedule).makespan
    ck_chain_peak = int(ck.peak_memory)
    core_peak = policy_peak(chain, "checkpoint-all")
    memory_ck = ck_chain_peak + resident
    memory_half = (memory_ck + keep_all) // 2
    seconds: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    equal = {v: True for v in VARIANTS}
    refused: dict[str, str] = {}
    plans: dict[str, list[str]] = {v: [] for v in VARIANTS}  # per round, what the plan does
    sims: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for _ in range(rounds):
        # Fresh copies every round: two copies of one model, trained alike, differ by up to 2 %
        # on this machine (where their storages lie), and each round's offload() profiles anew.
        models = {v: copy.deepcopy(base) for v in VARIANTS}
        models["HF checkpointing"].gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        handles = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for v, memory, method in (
                (VARIANTS[2], memory_ck, None), (VARIANTS[3], memory_half, None), (VARIANTS[4], None, None),
                (VARIANTS[5], memory_ck, "rotor"),
            ):
                if v in refused:
                    continue
                try:
                    handles[v] = ct.offload(models[v], batch, memory=memory, method=method)
                except ValueError as err:  # the row says so, with offload()'s reason
                    if "no schedule fits" not in str(err):
                        raise
                    refused[v] = str(err).split("; least memory known to work", 1)[0]
        running = [v for v in VARIANTS if v not in refused]
        for s in range(warmup):
            for v in running:
                step(models[v], batch, s)
        for s in range(steps):
            for v in running:
                wall, thread = step(models[v], batch, 100 + s)
                seconds[v].append(wall)
                cpu[v].append(thread)
            for v in running[1:]:
                equal[v] &= all(
                    (p.grad is None) == (q.grad is None) and (p.grad is None or torch.equal(p.grad, q.grad))
                    for p, q in zip(models[v].parameters(), models["plain"].parameters(), strict=True)
                )
        for v, h in handles.items():
            # The plan's schedule on the probe's profile (the same stages: the layout is the model's),
            # its step as the adapter predicts it: on CPU its copies inline with compute (Plan.overlap).
            same = h.plan.chain.length == chain.length
            sims[v].append(step_time(co.simulate(chain, unlimited, h.plan.schedule), h.plan.overlap) if same else h.plan.makespan)
            plans[v].append(plan_summary(h))
            h.remove()
    simulated = {VARIANTS[0]: chain.compute_time, VARIANTS[1]: ck.makespan}
    simulated.update({v: statistics.median(x) for v, x in sims.items() if x})
    memory = {
        VARIANTS[0]: keep_all, VARIANTS[1]: memory_ck, VARIANTS[2]: memory_ck, VARIANTS[3]: memory_half,
        VARIANTS[4]: keep_all, VARIANTS[5]: memory_ck,
    }
    kept = ", ".join(x for x in ("the prefix stage" if prefix else "", f"{len(tails)} code-after-block stage(s)" if tails else "") if x)
    ck_does = f"every block but the last recomputed once ({chain.length} stages{', ' + kept + ' kept' if kept else ''})"
    if core_peak != ck_chain_peak:
        ck_does += f"; the core's checkpoint-all, which also recomputes the stages kept here, holds {format_bytes(core_peak + resident)}"
    does = {VARIANTS[0]: "keeps everything", VARIANTS[1]: ck_does}
    rows = []
    for v in VARIANTS:
        if plans[v]:
            # The plan of each round (profiles differ), with the rounds that made it.
            made = {d: [i + 1 for i, x in enumerate(plans[v]) if x == d] for d in dict.fromkeys(plans[v])}
            does[v] = "; ".join(
                d if len(made) == 1 else f"{d} (round{'s' if len(i) > 1 else ''} {', '.join(map(str, i))})"
                for d, i in made.items()
            )
        if v in refused:
            does[v] = f"REFUSED: {refused[v]}"
        rows.append({
            "model": name, "variant": v, "memory": memory[v], "keep_all": keep_all,
            "measured": statistics.median(seconds[v]) if seconds[v] else None, "simulated": simulated.get(v),
            "cpu": statistics.median(cpu[v]) if cpu[v] else None,
            "does": does[v], "equal": None if v == "plain" or v in refused else equal[v],
            "ck_charged": ck_charged,
        })
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | run | memory (share of keep-all) | measured step (median) | simulated step | vs HF checkpointing "
        "(measured / simulated) | thread CPU (median), vs HF checkpointing | what it does | grads vs plain |",
        "|---|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in rows:
        ref = next(x for x in rows if x["model"] == r["model"] and x["variant"] == VARIANTS[1])
        equal = "-" if r["equal"] is None else ("torch.equal" if r["equal"] else "NOT EQUAL")
        if r["measured"] is None:
            times = "- | - | - | -"
        else:
            times = (
                f"{1000 * r['measured']:.1f} ms | {1000 * r['simulated']:.1f} ms | "
                f"{r['measured'] / ref['measured']:.3f} / {r['simulated'] / ref['simulated']:.3f} | "
                f"{1000 * r['cpu']:.1f} ms, {r['cpu'] / ref['cpu']:.3f}"
            )
        lines.append(
            f"| {r['model']} | {r['variant']} | {format_bytes(r['memory'])} ({100 * r['memory'] / r['keep_all']:.0f} %) | "
            f"{times} | {r['does']} | {equal} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[dict]) -> list[str]:
    """Per model: is offload() no slower than checkpointing at (c), faster at (d), measured and simulated."""
    out = []
    for name in dict.fromkeys(r["model"] for r in rows):
        by = {r["variant"]: r for r in rows if r["model"] == name}
        ck, c, d = by[VARIANTS[1]], by[VARIANTS[2]], by[VARIANTS[3]]
        if c["measured"] is None or d["measured"] is None:
            out.append(f"- {name}: offload() refused " + " and ".join(
                x["variant"].removeprefix("offload() ") for x in (c, d) if x["measured"] is None) + " (the table says why).")
            continue
        text = (
            f"- {name}: at checkpointing's memory offload() takes {c['measured'] / ck['measured']:.3f}x checkpointing's "
            f"measured step ({c['cpu'] / ck['cpu']:.3f}x its thread CPU time, {c['simulated'] / ck['simulated']:.3f}x "
            f"simulated); halfway to keep-all {d['measured'] / ck['measured']:.3f}x measured ({d['cpu'] / ck['cpu']:.3f}x "
            f"thread CPU, {d['simulated'] / ck['simulated']:.3f}x simulated)."
            f" On offload()'s own chain, which charges the executor's host work per recomputation, checkpointing's "
            f"schedule simulates {1000 * c['ck_charged']:.1f} ms: the plan at its memory {c['simulated'] / c['ck_charged']:.3f}x that."
        )
        e, plain = by.get(VARIANTS[4]), by[VARIANTS[0]]
        if e is not None and e["measured"] is not None:
            text += (
                f" Control: offload() at the keep-all peak, plain training's work, measured {e['measured'] / plain['measured']:.3f}x "
                "plain training's step (the noise of this run; simulated 1.000x)."
            )
        f = by.get(VARIANTS[5])
        if f is not None and f["measured"] is not None:
            text += (
                f" Recomputation alone at checkpointing's memory (method='rotor', a schedule of its family): "
                f"{f['measured'] / ck['measured']:.3f}x checkpointing's measured step ({f['cpu'] / ck['cpu']:.3f}x thread CPU, "
                f"{f['simulated'] / ck['simulated']:.3f}x simulated)"
            )
            if c["does"] != f["does"]:
                text += f"; offload()'s own plan there {c['measured'] / f['measured']:.3f}x its measured step ({c['simulated'] / f['simulated']:.3f}x simulated)"
            text += "."
        out.append(text)
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="name", help=f"models (default: all): {', '.join(MODELS)}")
    parser.add_argument("--steps", type=int, default=7, help="timed steps per run (default 7)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per run first (default 2)")
    parser.add_argument("--width", type=int, default=256, help="hidden size, a multiple of 64 (default 256)")
    parser.add_argument(
        "--rounds", type=int, default=1,
        help="rounds, each on fresh copies of the model with offload() run anew (default 1); medians over all",
    )
    opts = parser.parse_args(argv)
    if opts.width < 64 or opts.width % 64:
        parser.error(f"--width: {opts.width} is not a positive multiple of 64")
    for n in opts.names:
        if n not in MODELS:
            parser.error(f"name: {n!r} is not one of {', '.join(MODELS)}")
    if opts.steps < 1 or opts.warmup < 0 or opts.rounds < 1:
        parser.error(f"--steps, --warmup, --rounds: {opts.steps}, {opts.warmup}, {opts.rounds} must be >= 1, >= 0, >= 1")
    torch.set_num_threads(1)
    load = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    rows = []
    for name in opts.names or MODELS:
        rows += run(name, opts.steps, opts.warmup, opts.width, opts.rounds)
        print(f"{name}: done", flush=True)
    end = open("/proc/loadavg").read().split()[:3] if os.path.exists("/proc/loadavg") else ["?"]
    text = "\n".join([
        table(rows), "", "Verdicts:", "", *verdicts(rows), "",
        f"Median of {opts.steps} steps after {opts.warmup} warm-up steps per run"
        + (f" in each of {opts.rounds} rounds (fresh copies of the model, offload() run anew; the simulated step the "
           "median of the rounds')" if opts.rounds > 1 else "")
        + f", the runs of a model interleaved step by step; hidden size {opts.width}; CPU, torch.set_num_threads(1), torch {torch.__version__}; load average (/proc/loadavg) "
        f"{' '.join(load)} at the start, {' '.join(end)} at the end.",
    ])
    print(text)
    if not opts.names:
        RESULTS.mkdir(exist_ok=True)
        wide = "" if opts.width == 256 else f" --width {opts.width}"
        rounds = "" if opts.rounds == 1 else f" --rounds {opts.rounds}"
        command = f"python benchmarks/checkpointing.py --steps {opts.steps} --warmup {opts.warmup}{wide}{rounds}"
        out = "checkpointing.md" if opts.width == 256 else f"checkpointing_w{opts.width}.md"
        (RESULTS / out).write_text(f"`{command}`\n\n{text}\n")
    return 0 if all(r["equal"] is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
