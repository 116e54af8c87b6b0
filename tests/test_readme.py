"""The README is the front door (issue 34): short, its two commands and its three quick starts
run as written, and what the command-line guide (``docs/guides/cli.md``) says about the main
job's output is what a fresh run of the README's main job prints.

Every figure the guide quotes from the run (makespan, bound, gap, idle time, peak, bytes, least
memory, floor, the stalls the plot explains) is checked against a fresh run; runtimes are the
machine's and are left out by rule (the ``runtime`` row). A figure that goes stale fails here:
refresh the guide from the output this test shows. The figures the site's results pages quote
from ``benchmarks/results/`` are checked by ``tests/test_docs.py``.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
CLI_GUIDE = (ROOT / "docs" / "guides" / "cli.md").read_text()
BUDGET_GUIDE = (ROOT / "docs" / "guides" / "budget.md").read_text()
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}
# Rows whose figure depends on the machine (excluded by rule).
MACHINE_ROWS = ("runtime", "compile")


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# The main job is parsed as benchmarks/cold_start.py parses it, so both run the same command.
sys.path.insert(0, str(ROOT / "benchmarks"))
cold_start = _load("cold_start", ROOT / "benchmarks" / "cold_start.py")
sys.path.pop(0)


def blocks(text, lang):
    """The fenced code blocks of ``lang`` ('' for plain ones), with their offsets: fences are
    paired in order, so a closing fence never opens a block."""
    found = []
    for m in re.finditer(r"^```(\w*)\n(.*?)^```$", text, re.S | re.M):
        if m.group(1) == lang:
            found.append((m.start(), m.group(2)))
    return found


def section(text, heading):
    """The text under ``## heading`` up to the next ``## ``."""
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def run_line(line, cwd):
    """Run one shell line (``&&``-joined chainoffload commands) with this tree's chainoffload."""
    outputs = []
    for command in line.split(" && "):
        argv = command.split()
        assert argv[0] == ".venv/bin/chainoffload", f"not a chainoffload command: {command}"
        proc = subprocess.run([sys.executable, "-m", "chainoffload", *argv[1:]], cwd=cwd, env=ENV, text=True,
                              capture_output=True, timeout=600)
        assert proc.returncode == 0, f"{command}\n{proc.stderr}"
        outputs.append(proc.stdout)
    return outputs


def rows(table):
    """A printed key/value table as {key: value}."""
    out = {}
    for line in table.strip().splitlines():
        key, _, value = line.partition("  ")
        out[key.strip()] = value.strip()
    return out


# --- The front door ------------------------------------------------------------------------


def test_the_readme_is_a_front_door():
    lines = README.splitlines()
    assert len(lines) <= 300, f"README.md is {len(lines)} lines: move the rest to the site (docs/)"
    long = [f"{i}: {line}" for i, line in enumerate(lines, 1) if len(line) > 100]
    assert not long, "README lines over 100 characters:\n" + "\n".join(long)
    headings = re.findall(r"^## (.*)$", README, re.M)
    assert headings[:4] == ["Two commands on a fresh machine", "Quick start: train a Hugging Face model in a memory budget",
                            "Quick start: solve, bound, optimum", "Quick start: test your own solver"]
    # Every relative link leads to a file of the repository (and a heading of it, when named).
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), f"the README links to {target}, which does not exist"
    for target, anchor in re.findall(r"\]\(([^)#\s]+\.md)#([^)]+)\)", README):
        slugs = [re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                 for h in re.findall(r"^#+ (.*)$", (ROOT / target).read_text(), re.M)]
        assert anchor in slugs, f"the README links to {target}#{anchor}, a heading it does not have"


def test_two_commands_set_up_and_run_the_main_job_and_the_tests():
    bash = [b for _, b in blocks(section(README, "Two commands on a fresh machine"), "bash")]
    assert len(bash) == 2
    setup, tests = bash
    ci = (ROOT / ".ci" / "run").read_text()
    # The set-up is .ci/run's: the same torch, then the package with the same extras.
    assert "python3 -m venv .venv" in setup and "pip install torch==2.13.0" in setup and "install -e '.[torch,dev]'" in setup
    assert "pip install --quiet torch==2.13.0" in ci and "-e '.[torch,dev" in ci
    job = cold_start.main_job(README)
    assert job.startswith(".venv/bin/chainoffload example resnet50") and "chainoffload solve resnet50.json" in job
    assert " ".join(setup.replace("\\\n", " ").split()).endswith(job), "the main job must end the first command"
    # The test command is exactly the one .ci/run runs.
    assert tests.strip() == ".venv/bin/python -m pytest -q"
    assert re.search(r"^\.venv/bin/python -m pytest -q \|\| status=\$\?$", ci, re.M)


# --- The main job, run as written; what the command-line guide says about its output ---------


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme")
    command = cold_start.main_job(README)
    outputs = run_line(command, cwd)
    return dict(command=command, outputs=outputs, cwd=cwd)


def guide_output():
    """The output block the guide quotes right after its main job command."""
    (at, _), = [(i, b) for i, b in blocks(CLI_GUIDE, "bash") if "chainoffload solve resnet50.json" in b]
    return next(b for i, b in blocks(CLI_GUIDE, "") if i > at)


def guide_prose():
    return " ".join(CLI_GUIDE.split("and `plot` draws `schedule.png`", 1)[1].split("\n## ", 1)[0].split())


def test_the_guide_runs_the_readmes_main_job():
    assert cold_start.main_job(CLI_GUIDE) == cold_start.main_job(README)


def test_solve_prints_what_the_guide_quotes(ran):
    solve_out = next(o for o in ran["outputs"] if o.startswith("chain ") and "method" in o)
    got, quoted = rows(solve_out), rows(guide_output())
    assert list(got) == list(quoted)
    stale = {k: (quoted[k], got[k]) for k in quoted if k not in MACHINE_ROWS and quoted[k] != got[k]}
    assert not stale, f"docs/guides/cli.md's figures differ from a fresh run (guide, run): {stale}\nfresh output:\n{solve_out}"


def test_the_prose_figures_of_the_main_job(ran):
    solve = rows(next(o for o in ran["outputs"] if "method" in o))
    plot_out = ran["outputs"][-1]
    bound = re.match(r"(\S+ ms)", solve["lower bound"]).group(1)
    gap = re.search(r"gap (\S+)%", solve["lower bound"]).group(1)
    compute = float(re.search(r"compute (\S+) ms", solve["chain"]).group(1))
    prose = guide_prose()
    m = re.search(r"the lower bound in the title \((\S+ ms), the figure `solve`", prose)
    assert m and m.group(1) == bound
    assert re.search(r"lower bound (\S+ ms);", plot_out).group(1) == bound  # plot prints solve's bound
    ratio = float(re.search(r"beats (\S+)x the compute", prose).group(1))
    assert ratio == round(float(bound.split()[0]) / compute, 2)
    assert re.search(r"`best` is within (\S+) % of it", prose).group(1) == gap
    idle = re.search(r"Compute is idle (\d+) % of the time", prose).group(1)
    assert f"({idle}% of the makespan)" in solve["compute idle"]


def test_the_stalls_the_plot_prose_names(ran):
    # "Each of the 13 offloaded units moves its a_i alone ... compute waits for the offloads O_3,
    # ... to free memory (green; at F_10, ...), then in the backward pass for the prefetches
    # P_14, ... to arrive": the main job's schedule and its stalls.
    import chainoffload as co
    from chainoffload.schedule_file import ScheduleFile

    chain = co.Chain.load(str(ran["cwd"] / "resnet50.json"))
    record = ScheduleFile.load(str(ran["cwd"] / "schedule.json"))
    found = co.stalls(co.simulate(chain, record.platform, record.schedule))

    def said(names):
        return ", ".join(names[:-1]) + " and " + names[-1]

    offloads = [s for s in found if s.cause == "offload"]
    prefetches = [s for s in found if s.cause == "prefetch"]
    assert len(offloads) + len(prefetches) == len(found)
    assert all(s.op_name.startswith("B_") for s in prefetches)
    prose = guide_prose()
    moved = [t for t in record.schedule.transfers if t.kind == "offload"]
    assert all(t.moves == "act" for t in moved)
    assert f"Each of the {len(moved)} offloaded units moves its a_i alone" in prose
    assert (f"compute waits for the offloads {said([s.transfer_name for s in offloads])} to free memory "
            f"(green; at {said([s.op_name for s in offloads])})") in prose
    assert f"in the backward pass for the prefetches {said([s.transfer_name for s in prefetches])} to arrive (red)" in prose


def test_the_schedule_file_example_is_the_main_jobs(ran):
    written = json.loads((ran["cwd"] / "schedule.json").read_text())
    (_, quoted), = [(i, b) for i, b in blocks(CLI_GUIDE, "json") if '"solver": {"method": "best"' in b]
    for key in ("platform", "solver"):
        line = next(li for li in quoted.splitlines() if li.lstrip().startswith(f'"{key}"'))
        raw = line.strip().rstrip(",")
        raw = raw[:-1] if raw.endswith("}}") else raw  # the last line closes the file's object too
        assert json.loads("{" + raw + "}")[key] == written[key]
    assert f'"fingerprint": "{written["chain"]["fingerprint"][:15]}..."' in quoted


# --- The trade-off guide's sweeps (recorded in benchmarks/results/readme_tradeoff.md, whose
# --- prose figures tests/test_docs.py checks): one row of each, run fresh in the main job's folder.


def _fresh_row(cwd, command, label, chain_name, methods=None):
    """Re-run ``command`` (a tradeoff line of the guide) at the one memory of row ``label``."""
    from chainoffload.networks import network
    from chainoffload.tradeoff import sweep_memories
    from chainoffload.units import format_bytes

    memory, = [m for m in sweep_memories(network(chain_name), 10) if format_bytes(m) == label]
    argv = re.sub(r" -o \S+", "", command) + f" --memories {memory}" + (f" --methods {' '.join(methods)}" if methods else "")
    return run_line(argv, cwd)[0]


def _recorded(name):
    docs = _load("test_docs_for_readme", ROOT / "tests" / "test_docs.py")
    return docs, next((c, out) for c, out in docs.recorded_tradeoffs().items() if f"tradeoff {name}.json" in c)


def test_a_row_of_the_resnet50_tradeoff_is_a_fresh_run(ran):
    # The middle row of the sweep (3.10 GiB), every default method, run again at its one memory.
    docs, (command, recorded) = _recorded("resnet50")
    head, table = docs.table_rows(recorded)
    label = list(table)[len(table) // 2]
    fresh_head, fresh = docs.table_rows(_fresh_row(ran["cwd"], command, label, "resnet50"))
    assert fresh_head == head
    assert fresh[label] == table[label], f"row {label}: recorded {table[label]}, fresh {fresh[label]}"


def test_the_gpt2_row_the_guide_quotes_is_a_fresh_run(ran):
    # The GPT-2 row quoted in the guide's prose, best and rotor only, run again at its one memory.
    docs, (command, recorded) = _recorded("gpt2_12")
    _, table = docs.table_rows(recorded)
    label = re.search(r"GPT-2 at (\S+ GiB):", " ".join(BUDGET_GUIDE.split())).group(1)
    run_line(".venv/bin/chainoffload example gpt2_12 -o gpt2_12.json", ran["cwd"])
    _, fresh = docs.table_rows(_fresh_row(ran["cwd"], command, label, "gpt2_12", ["best", "rotor"]))
    for column in ("best", "rotor", "lower-bound"):
        assert fresh[label][column] == table[label][column], f"{label} {column}: recorded {table[label][column]}, fresh {fresh[label][column]}"


# --- The three quick starts, run as written --------------------------------------------------


def quick_start(heading, which=0):
    """The ``which``-th Python block of a quick start: the quick start itself (0), or what
    continues it (the ML quick start's model below its pure-offloading floor, 1)."""
    found = blocks(section(README, heading), "python")
    assert len(found) == (2 if heading.startswith("Quick start: train") else 1), heading
    return found[which][1]


def test_the_ml_quick_start_trains_with_offloading(tmp_path):
    code = quick_start("Quick start: train a Hugging Face model in a memory budget")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    offloaded = int(re.search(r"^offloaded per step: (\d+) B$", proc.stdout, re.M).group(1))
    predicted = int(re.search(r"^predicted peak: (\d+) B$", proc.stdout, re.M).group(1))
    assert offloaded > 0, "the quick start's budget must make it offload:\n" + proc.stdout
    assert re.search(r"^\| 1 \| transformer\.h\.0 \|.*\| offload \|", proc.stdout, re.M), proc.stdout
    assert predicted > 0 and "RuntimeWarning" not in proc.stderr, proc.stderr
    # On CPU there is no device allocator to measure a peak; on a GPU, the allocator's.
    import torch

    measured = re.search(r"^measured peak: (\S+)$", proc.stdout, re.M).group(1)
    assert measured.isdigit() if torch.cuda.is_available() else measured == "None"


def test_the_ml_quick_start_trains_below_the_pure_offloading_floor_by_recomputing(tmp_path):
    heading = "Quick start: train a Hugging Face model in a memory budget"
    code, more = quick_start(heading), quick_start(heading, 1)
    memory = re.search(r"ct\.offload\(model, batch, memory=([\d.]+)\)", more).group(1)
    # What the README says of that memory: offloading alone is refused there.
    refused = f"""
try:
    ct.offload(model, batch, memory={memory}, method="best")
except ValueError as err:
    print("best refused:", "no schedule fits" in str(err))
"""
    proc = subprocess.run(
        [sys.executable, "-c", code + more + refused], cwd=tmp_path, env=ENV, text=True, capture_output=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    assert "best refused: True" in proc.stdout, proc.stdout
    recomputed = re.findall(r"^\| \d+ \| transformer\.h\.\d+ \|[^|]*\|[^|]*\| recompute \(", proc.stdout, re.M)
    assert recomputed, "below the pure-offloading floor the plan must recompute:\n" + proc.stdout


def test_the_research_quick_start_solves_bounds_and_proves(tmp_path):
    code = quick_start("Quick start: solve, bound, optimum")
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    best = re.search(r"^best  (\w+): (\S+) ms$", proc.stdout, re.M)
    # The bound's name is a rung's ("unit MILP", ...) or "best's own" where best's CP-SAT
    # improver proved its schedule optimal: a name of several words.
    bound = re.search(r"^bound (\S+) ms \((.+)\)$", proc.stdout, re.M)
    exact = re.search(r"^cpsat (\w+): (\S+) ms$", proc.stdout, re.M)
    assert best and bound and exact, proc.stdout
    # CP-SAT proves this optimum in about 9 s at load 7; a machine loaded past its 30 s still has
    # its warm start (best's schedule) and the bound below both.
    assert best.group(1) in ("feasible", "optimal") and exact.group(1) in ("optimal", "feasible")
    assert float(bound.group(1)) <= float(exact.group(2)) <= float(best.group(2))
    if best.group(1) == "optimal":  # proven: its bound is its makespan, and CP-SAT cannot beat it
        assert bound.group(1) == best.group(2)
    assert (tmp_path / "schedule.json").exists()


def test_the_solver_author_quick_start_passes(tmp_path):
    code = quick_start("Quick start: test your own solver")
    (tmp_path / "test_mine.py").write_text(code)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_mine.py"], cwd=tmp_path,
                          env=ENV, text=True, capture_output=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
