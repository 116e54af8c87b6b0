"""The documentation site (issue 34): what its build generates, and the figures its pages quote.

* ``docs/_hooks.py`` generates, at build time, the NOTE index, the table of rooms and the results
  tables (each read from its ``benchmarks/results/`` file). Checked here: every NOTE the code
  cites is defined exactly once and is in the index; every module is a room; every include
  marker on a page names a file and a heading that exist, with a table under it.
* A figure a page quotes in its prose is the figure of its results file, as the file says it
  now (``RESULTS``); the script named in the file regenerates it. A stale figure fails here:
  update the sentence from the file.
* The README's results table quotes the same files.

``mkdocs build --strict`` itself runs in ``.ci/run`` (a broken link or a docstring griffe cannot
read fails the build there); the README's commands and quick starts, and what the command-line
guide says about the main job's output, are run by ``tests/test_readme.py``.
"""

import ast
import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = ROOT / "benchmarks" / "results"
README = (ROOT / "README.md").read_text()

_spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "_hooks.py")
hooks = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = hooks  # its dataclasses look their module up by name
_spec.loader.exec_module(hooks)


def page(name):
    """A docs page's Markdown source, whitespace collapsed (sentences wrap anywhere)."""
    return " ".join((DOCS / name).read_text().split())


# --- What the build generates --------------------------------------------------------------


def test_every_cited_note_is_defined_once_and_indexed():
    notes = hooks.notes()
    names = [n.name for n in notes]
    assert len(names) > 40, "the NOTE scan found too few blocks: did the header format change?"
    assert len(names) == len(set(names)), f"NOTEs defined twice: {sorted({n for n in names if names.count(n) > 1})}"
    undefined = {name: where for name, where in hooks.cited_notes().items() if name not in names}
    assert not undefined, f"NOTEs cited but defined nowhere (a renamed or deleted block?): {undefined}"
    index = hooks.notes_markdown()
    for note in notes:
        assert f"| `{note.name}` | `{note.path}:{note.line}` |" in index
        assert note.gist, f"NOTE [ {note.name} ] ({note.path}:{note.line}) has no text under its header"
        line = (ROOT / note.path).read_text().splitlines()[note.line - 1]
        assert f"NOTE [ {note.name} ]" in line


def test_the_note_scan_tells_a_block_from_a_citation(tmp_path):
    package = tmp_path / "chainoffload"
    package.mkdir()
    (package / "m.py").write_text(
        '"""Module.\n\nNOTE [ in a docstring ]\n-----------------------\nFirst sentence here. More.\n"""\n\n'
        "# NOTE [ a block ]\n# Why it is so. And more.\n\nx = 1  # NOTE [ a block ]: cited\n"
        "# NOTE [ in a docstring ]\ny = 2\n"
    )
    (tmp_path / "chainoffload_torch").mkdir()
    found = {(n.name, n.line, n.gist) for n in hooks.notes(tmp_path)}
    assert found == {("in a docstring", 3, "First sentence here."), ("a block", 8, "Why it is so.")}
    assert set(hooks.cited_notes(tmp_path)) == {"in a docstring", "a block"}


def test_every_module_is_a_room_with_its_imports():
    rooms = {r.module: r for r in hooks.rooms()}
    for package in hooks.PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            assert name in rooms, name
            if package == "chainoffload":
                assert rooms[name].layer, f"{name} has no layer in tests/test_imports.py's LAYERS"
    # Function-level imports count: the adapter's API imports the core's solver front door.
    assert "chainoffload" in rooms["chainoffload_torch.api"].imports or any(
        m.startswith("chainoffload.") for m in rooms["chainoffload_torch.api"].imports)
    # An import under `if TYPE_CHECKING:` never runs and is not counted, as tests/test_imports.py
    # does not count it: plot names Tradeoff in annotations only.
    assert "chainoffload.stalls" in rooms["chainoffload.plot"].imports
    assert "chainoffload.tradeoff" not in rooms["chainoffload.plot"].imports
    assert "chainoffload.chain" in rooms["chainoffload.simulate"].imports
    markdown = hooks.rooms_markdown()
    for name in rooms:  # inside its package's table, a module is named relative to the package
        package, _, rest = name.partition(".")
        assert (f"`.{rest}`" if rest else f"`{package}`") in markdown, name


def test_the_layer_arrows_are_the_import_maps():
    # The architecture page's arrows between layers: an arrow up is one tests/test_imports.py
    # allows by name (UPWARD_ALLOWED), and every edge is one the rooms table lists.
    allowed = next(ast.literal_eval(n.value) for n in ast.parse((ROOT / "tests" / "test_imports.py").read_text()).body
                   if isinstance(n, ast.Assign) and any(getattr(x, "id", None) == "UPWARD_ALLOWED" for x in n.targets))
    order = list(hooks.layers())
    rooms = {r.module: r for r in hooks.rooms()}
    arrows = hooks.layer_arrows()
    assert arrows and all(a != b for a, b, _ in arrows)
    for a, b, edges in arrows:
        for edge in edges:
            source, target = edge.split(" -> ")
            assert target in rooms[source].imports and rooms[source].layer == a
            if order.index(b) > order.index(a):
                assert (source, target) in allowed, f"{edge} points up ({a} -> {b}) and tests/test_imports.py does not allow it"
    assert "| from | to | direction | imports |" in hooks.arrows_markdown()


def includes():
    """Every include marker of every docs page: ``(page, file, heading)``."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        for m in hooks.INCLUDE.finditer(path.read_text()):
            found.append((path.relative_to(DOCS).as_posix(), m.group(1), m.group(2)))
    return found


def test_every_include_names_a_table_of_a_results_file():
    found = includes()
    assert len(found) >= 15
    for where, name, heading in found:
        assert (ROOT / name).is_file(), f"{where}: {name} does not exist"
        block = hooks.section((ROOT / name).read_text(), heading)
        assert block.startswith(("|", "```")) and len(block.splitlines()) >= 3, (where, name, heading)


def test_an_include_is_the_files_table_as_it_is_now(tmp_path):
    (tmp_path / "r.md").write_text("# R\n\n## Headline\n\ntext\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nafter\n")
    out = hooks.expand_includes('x\n<!-- include r.md "## Headline" -->\ny\n', root=tmp_path, page_depth=1)
    assert "| a | b |\n|---|---|\n| 1 | 2 |\n" in out and "after" not in out
    assert "](../results/files/r.md)" in out
    with pytest.raises(ValueError, match="no line starting with"):
        hooks.expand_includes('<!-- include r.md "## Gone" -->\n', root=tmp_path)


def test_every_results_file_gets_a_page():
    index = hooks.results_index()
    for path in hooks.results_files():
        assert f"[`{path.name}`]({path.name})" in index
        assert f"`benchmarks/results/{path.name}`" in hooks.results_page(path)


def test_the_docs_code_blocks_are_the_readmes_quick_starts():
    # The guides open with the README's quick starts; tests/test_readme.py runs them as written.
    readme = [b for b in re.findall(r"^```python\n(.*?)^```$", README, re.S | re.M)]
    for name in ("guides/training.md", "guides/solving.md", "guides/testing.md"):
        first = re.search(r"^```python\n(.*?)^```$", (DOCS / name).read_text(), re.S | re.M).group(1)
        assert first in readme, f"docs/{name}'s first code block is not one of the README's quick starts"


# --- Figures the pages quote from results files ----------------------------------------------


def md_table(text, heading):
    """The first Markdown table after ``heading``: a list of rows, each {column: cell}."""
    lines = text.split(heading, 1)[1].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[first:]:
        if not line.startswith("|"):
            break
        table.append([c.strip() for c in line.strip().strip("|").split("|")])
    return [dict(zip(table[0], row, strict=True)) for row in table[2:]]


def _pct(cell):
    return float(cell.rstrip("%"))


def _span(values):
    values = sorted(values)
    return f"{values[0]:.1f}-{values[-1]:.1f}"


def test_the_compare_figures_are_compare_md():
    text = (RESULTS / "compare.md").read_text()
    prose = page("results/index.md")
    command = re.search(r"^`(python benchmarks/compare.py[^`]*)`", text, re.M).group(1)
    assert f"`{command}`" in prose
    assert '<!-- include benchmarks/results/compare.md "## Headline" -->' in prose
    said = re.search(r"Of the (\d+) sweep points where CP-SAT \((\S+) s per point\) found a schedule \((\d+) of them proven "
                     r"optimal\), best's makespan equals CP-SAT's on (\d+)", text).groups()
    m = re.search(r"of the (\d+) sweep points where CP-SAT \((\S+) s per point\) found a schedule, `best`'s makespan equals "
                  r"CP-SAT's on (\d+), and on the (\d+) that CP-SAT proves optimal", prose)
    assert m and (m.group(1), m.group(2), m.group(4), m.group(3)) == said
    longer, worst = re.search(r"is longer on (\d+)(?:, by at most (\S+)%)?\.", text).groups()
    if longer == "0":
        assert "`best` is longer on none" in prose
    else:
        assert f"`best` is longer on {longer}, by at most {worst} %" in prose
    for name in ("offload-all", "first-k", "largest-first"):
        ratio, where = re.search(rf"- {name}: (\S+)x \(([^,]+),", text).groups()
        assert f"{ratio}x ({name}, {where})" in prose
    # "on the O that CP-SAT proves optimal best is optimal on S" and the networks where best is
    # behind: from the raw data.
    runs = json.loads((RESULTS / "compare.json").read_text())["runs"]
    optimal = same = 0
    behind = []
    for name, links in runs.items():
        for t in links.values():
            if "cpsat" not in t["methods"]:
                continue
            for b, c in zip(t["methods"]["best"]["points"], t["methods"]["cpsat"]["points"], strict=True):
                if b["makespan"] is None or c["makespan"] is None:
                    continue
                optimal += c["status"] == "optimal"
                same += c["status"] == "optimal" and abs(b["makespan"] / c["makespan"] - 1) <= 1e-9
                if b["makespan"] > c["makespan"] * (1 + 1e-9) and name not in behind:
                    behind.append(name)
    assert optimal == int(said[2])
    assert f"on the {optimal} that CP-SAT proves optimal `best` is optimal on {same};" in prose
    assert bool(behind) == (longer != "0")
    if behind:
        names = behind[0] if len(behind) == 1 else f"{', '.join(behind[:-1])} and {behind[-1]}"
        assert f"by at most {worst} %, on {names} (" in prose
    rows = md_table(text, "## Headline")
    shaved = [100 * (float(r["rotor"]) - float(r["joint"])) for r in rows]
    assert f"`joint` shaves a further {_span(shaved)} points off rotor's overhead" in prose
    # The README's results table quotes the policies' worst ratios.
    ratios = [re.search(rf"- {name}: (\S+)x", text).group(1) for name in ("offload-all", "first-k", "largest-first")]
    assert f"| up to {ratios[0]}x, {ratios[1]}x, {ratios[2]}x | `compare.md` |" in README


def test_a_row_of_the_results_table_is_a_fresh_run(monkeypatch):
    # resnet18's row (the smallest network), every method but cpsat (its own wall clock), run
    # again at that one memory, with best's default CP-SAT work as compare.py ran it (the suite's
    # smaller budget, NOTE [ tests and best's exact improver ], stops short of its optimum here).
    monkeypatch.delenv("CHAINOFFLOAD_CPSAT_WORK", raising=False)
    import chainoffload as co
    from chainoffload.networks import network
    from chainoffload.tradeoff import FIXED_REMAT_POLICIES, sweep_memories
    from chainoffload.units import format_bytes

    row = next(r for r in md_table((RESULTS / "compare.md").read_text(), "## Headline") if r["network"] == "resnet18")
    chain = network("resnet18")
    methods = [c for c in row if c not in ("network", "memory", "cpsat", "lower bound")]
    # compare.py's sweep is tradeoff's: the memory points and the peak of each fixed policy it ran
    # (sqrt-checkpoint and recompute-all run there without a column in the headline).
    ran = json.loads((RESULTS / "compare.json").read_text())["runs"]["resnet18"]["PCIe4"]["methods"]
    memories = sweep_memories(chain, 10, policies=[m for m in ran if m in FIXED_REMAT_POLICIES])
    memory = memories[len(memories) // 2]
    assert format_bytes(memory) == row["memory"]
    link = co.Platform(memory=0, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=10e-6)
    t = co.tradeoff(chain, link, methods, [memory])
    fresh = {m: f"{t.curves[m][0].makespan / chain.compute_time:.3f}" for m in methods}
    assert fresh == {m: row[m] for m in methods}
    bound = f"{t.lower_bound[0] / chain.compute_time:.3f}"
    # The table's bound is also CP-SAT's where it proved a stronger one (then its optimum).
    assert row["lower bound"] == bound or row["lower bound"] == row["cpsat"]


def test_the_random_chain_figures_are_relaxations_stronger_md():
    text = (RESULTS / "relaxations-stronger.md").read_text()
    prose = page("results/index.md")
    command = re.search(r"^    (python benchmarks/relaxations.py [^\n]*--shard 0 1)", text, re.M).group(1)
    assert "`" + command.split(" --shard")[0] + "`" in prose
    before = {r["method"]: r for r in md_table(text, "### Makespan / lower bound (")}
    n = re.search(r"### Makespan / lower bound \((\d+) instances\)", text).group(1)
    quoted = ", ".join(f"{m} {before[m]['mean']}" for m in ("offload-all", "largest-first", "first-k", "lp", "dp"))
    assert f"{quoted}, **best {before['best']['mean']}**" in prose
    versus = [r for r in md_table(text, "### Heuristics against each baseline") if r["heuristic"] == "best" and r["both feasible"] != "0"]
    assert f"({sum(int(r['worse than the baseline']) for r in versus)} of {len(versus)} x {n} comparisons)" in prose
    after = {r["method"]: r for r in md_table(text, "before and after the stronger bound")}
    short = next(r for r in md_table(text, "`best` / bound by chain length") if r["L"] == "5-12")
    assert (f"drops to **{after['best']['mean, after']}** (lp {after['lp']['mean, after']}, dp {after['dp']['mean, after']}; "
            f"{short['mean, after']} at L <= 12, where SCIP solves the relaxation to optimality on {short['unit MILP optimal']} "
            f"of {short['instances']} instances)") in prose
    stopped = sum(int(r["unit MILP stopped by its limit"]) for r in md_table(text, "`best` / bound by chain length"))
    assert f"ran out of its 5 s ({stopped} of the {n}:" in prose
    assert f"| `best` / proven lower bound, {n} random chains | {after['best']['mean, after']} on average |" in README


def test_the_cpsat_figures_are_cpsat_md():
    text = (RESULTS / "cpsat.md").read_text()
    prose = page("results/index.md")
    command = re.search(r"Command: `([^`]+)`", text).group(1)
    assert f"`{command}`, `benchmarks/results/cpsat.md`: proven optimal within" in prose
    start, end = re.search(r"load average (\S+) at the start, (\S+) at the end", text).groups()
    assert f"at load {start}-{end})" in prose
    for row in md_table(text, "### CP-SAT time to a proven answer"):
        assert re.search(rf"\b{row['proven optimal']}/{row['chains']}( chains)? at L = {row['L']}\b", prose), row
    means = []
    for row in md_table(text, "### Heuristics' gap to the proven optimum"):
        mean, median, worst = re.match(r"(\S+)% / (\S+)% / (\S+)%", row["best"]).groups()
        quoted = f"{mean} % at L = {row['L']} (median {median} %, max {worst} %"
        assert quoted in prose, f"the results page should quote best's gap at L = {row['L']} as: {quoted}"
        means.append((row["L"], mean))
    (l1, m1), (l2, m2) = means
    assert f"| `best` above CP-SAT's optimum, L = {l1} and {l2} | {m1} % and {m2} % on average |" in README
    # "no method beats it": on every chain CP-SAT proved optimal, no method's makespan is shorter.
    assert "no method beats it" in prose
    for row in md_table(text, "### Per chain"):
        if row["CP-SAT status"] == "optimal":
            found = [float(v) for k, v in row.items() if k in ("keep-all", "offload-all", "first-k", "largest-first", "lp", "dp", "best")
                     and v not in ("infeasible", "timeout", "error", "-")]
            assert min(found) >= float(row["makespan / compute"]) - 1e-4, row


def test_the_act_alone_figures_are_act_alone_md():
    text = " ".join((RESULTS / "act_alone.md").read_text().split())
    prose = page("results/index.md")
    instances, randoms = re.search(r"\* (\d+) instances \(.*?\); plus (\d+) random valid schedules", text).groups()
    below = re.search(r"Schedules below a stated bound \(any rung, any method or random schedule\): \*\*(\d+)\*\*", text).group(1)
    optimal, beaten, alone = re.search(r"CP-SAT `optimal` on (\d+) instances; beaten by a method's schedule \(beyond 3x its "
                                       r"rounding tolerance\): \*\*(\d+)\*\*; its optimum moves some a_i alone on (\d+)", text).groups()
    fastest = re.search(r"moves some a_i alone on (\d+) of \d+ instances", text).group(1)
    start, end = re.search(r"load average (\S+) before, (\S+) after", text).groups()
    assert below == beaten == "0"
    assert f"`benchmarks/results/act_alone.md`): on {instances} instances" in prose and f"and {randoms} random valid schedules" in prose
    assert f"CP-SAT proves the optimum on {optimal} instances and no method beats it; {alone} of those optima" in prose
    assert f"the fastest method's schedule does on {fastest} of the {instances} instances" in prose
    assert f"at load {start}-{end}," in prose


def test_the_remat_figures_are_remat_md():
    text = " ".join((RESULTS / "remat.md").read_text().split())
    prose = page("results/index.md")
    table = {r["platform"]: r for r in md_table((RESULTS / "remat.md").read_text(), "## Against the targets and the paper")}
    v100 = [table[f"V100 {bw} GB/s"]["both"].replace(" %", "") for bw in (12, 25, 64)]
    a100 = [table[f"A100 {bw} GB/s"]["both"].replace(" %", "") for bw in (12, 25, 64)]
    assert f"is {v100[0]} % on the paper's platform" in prose and f"{v100[1]} % at 25 GB/s and {v100[2]} % at 64 GB/s" in prose
    assert f"with A100 times {a100[0]} %, {a100[1]} % and {a100[2]} %" in prose
    joint, rotor = re.search(r"### V100 times, 12 GB/s .*?Median network: joint (\S+)x, rotor (\S+)x", text.split("## Claim 2", 1)[1]).groups()
    assert f"is {joint}x on the median network at V100 / 12 GB/s (rotor: {rotor}x) and up to {table['V100 12 GB/s']['best network']}" in prose
    slower, faster = re.search(r"On (\d+) points .*?is slower than main's .*? on \*\*(\d+)\*\* and faster on (\d+)", text).group(2, 3)
    points = re.search(r"On (\d+) points", text).group(1)
    alone = re.search(r"moves some a_i alone out of a whole unit .*? on (\d+) of these", text).group(1)
    assert f"is slower than the previous one-in-flight `joint` on {slower} of {points}" in prose
    took = re.search(r"Which candidate joint returned: best: (\d+),", text).group(1)
    assert f"was its answer on {took} of {points} points," in prose
    assert f"(faster on {faster}), and moves a_i alone out of a kept unit (`\"moves\": \"act\"`) on {alone} of them" in prose


def test_the_granularity_figure_is_granularity_md():
    helped, points = re.search(r"Switching helps on (\d+) of (\d+) points", (RESULTS / "granularity.md").read_text()).groups()
    assert f"helped on {helped} of {points} points" in page("results/index.md")


def test_the_best_determinism_figures_are_best_determinism_md():
    text = (RESULTS / "best_determinism.md").read_text()
    assert "with and without the load at every L: **yes**" in text
    prose = page("results/performance.md").split("## `best` without a clock", 1)[1].split("## ", 1)[0]
    for length in ("10,000", "100,000"):
        quiet, loaded = [r for r in md_table(text, "# best with default options") if r["L"] == length]
        assert quiet["schedule sha256"] == loaded["schedule sha256"] and quiet["makespan / compute"] == loaded["makespan / compute"]
        said = (f"{quiet['makespan / compute']}x compute after {quiet['evals']} evaluations, in {quiet['wall s']} s and "
                f"{loaded['wall s']} s of wall time ({quiet['CPU s']} s and {loaded['CPU s']} s of CPU")
        assert f"L = {length}" in prose and said in prose, f"the performance page should say, at L = {length}: {said}"


def test_the_adapter_figures_of_the_readme_are_the_files():
    rows = md_table((RESULTS / "offload_models.md").read_text(), "Each model: 1 line")
    equal = sum(r["losses, grads, weights"].startswith("torch.equal") for r in rows)
    refused = sum(r["bytes moved per step at 60 %"].startswith("refused") for r in rows)
    assert equal + refused == len(rows)
    assert f"| {len(rows)} HF and torchvision models, at 60 % | {equal} `torch.equal`, {refused} refused |" in README
    fuzz = (RESULTS / "torch_fuzz.md").read_text()
    models = re.search(r"Command: `python benchmarks/torch_fuzz.py --models (\d+)", fuzz).group(1)
    outcomes = {r["outcome"]: int(r["models"]) for r in md_table(fuzz, "Outcomes:")}
    assert sum(outcomes.values()) == int(models)
    # A silent difference is the one outcome that must never be recorded; a loud one-sided raise
    # (the fuzz now draws shapes that change per step, and a later shape may fit no plan at its
    # share of memory) breaks the promise too, and the README says how many.
    loud = outcomes["offloaded_only_raise"] + outcomes["plain_only_raise"]
    raises = "" if loud == 0 else f", {loud} loud raise" + ("s" if loud > 1 else "")
    assert outcomes["silent_difference"] == 0
    assert f"| {models} models, 0 silent differences{raises} |" in README
    # The run whose every trained model recomputes (--recompute-only): the README counts the
    # models that trained equal with a plan that recomputes in some step.
    only = (RESULTS / "torch_fuzz_recompute_only.md").read_text()
    outcomes = {r["outcome"]: int(r["models"]) for r in md_table(only, "Outcomes:")}
    trained = {r["trainings"]: int(r["models"]) for r in md_table(only, "Of the `equal` models")}
    recomputing = next(n for what, n in trained.items() if what.startswith("(a) equal, with a plan that recomputes"))
    loud = outcomes["offloaded_only_raise"] + outcomes["plain_only_raise"]
    assert outcomes["silent_difference"] == 0
    loud = "" if loud == 0 else f", {loud} loud"
    assert f"| fuzz, recomputing plans | {recomputing} equal, 0 silent{loud} |" in README


# --- The trade-off guide against benchmarks/results/readme_tradeoff.md -----------------------

TRADEOFF_RESULTS = RESULTS / "readme_tradeoff.md"


def recorded_tradeoffs():
    """Command line to what it printed, as benchmarks/readme_tradeoff.py recorded them."""
    text = TRADEOFF_RESULTS.read_text()
    return {m.group(1): m.group(2) for m in re.finditer(r"^`([^`\n]+)`\n\n```\n(.*?)\n```$", text, re.S | re.M)}


def table_rows(output):
    """A tradeoff table: {memory label: {column: cell}} and the key/value lines above it."""
    lines = output.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["memory"])
    columns = lines[head].replace("lower bound", "lower-bound").split()
    table = {}
    for line in lines[head + 1:]:
        cells = line.split()
        if len(cells) != len(columns) + 1:  # "1.95 GiB" is two words; "wrote ..." ends the table
            continue
        table[" ".join(cells[:2])] = dict(zip(columns[1:], cells[2:], strict=True))
    return lines[:head], table


def test_the_tradeoff_commands_are_the_recorded_ones():
    spec = importlib.util.spec_from_file_location("readme_tradeoff", ROOT / "benchmarks" / "readme_tradeoff.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    commands = script.readme_commands((DOCS / "guides" / "budget.md").read_text())
    assert [c for c in commands if " tradeoff " in c] == list(recorded_tradeoffs()), "re-run python benchmarks/readme_tradeoff.py"


def test_the_tradeoff_prose_is_the_tables():
    recorded = recorded_tradeoffs()
    head, r50 = table_rows(next(out for c, out in recorded.items() if "tradeoff resnet50.json" in c))
    _, gpt = table_rows(next(out for c, out in recorded.items() if "tradeoff gpt2_12.json" in c))
    prose = page("guides/budget.md").split("![GPT-2", 1)[1]
    floor = " ".join(next(line for line in head if line.startswith("offload floor")).split()[2:4]).rstrip(":")
    assert f"below the offload floor ({floor} for ResNet-50)" in prose
    labels = list(r50)

    def rows(lo, hi):
        return [r50[m] for m in labels[labels.index(lo):labels.index(hi) + 1]]

    # The gap between best and the bound, as a share of best's makespan, over two ranges of rows.
    m = re.search(r"for ResNet-50, (\S+) % of the makespan from (\S+ GiB) to (\S+ GiB) and (\S+) % from (\S+ GiB) to (\S+ GiB)", prose)
    assert m, "the gap sentence changed: update this test"
    for span, lo, hi in (m.group(1, 2, 3), m.group(4, 5, 6)):
        gaps = [100 * (1 - (1 + _pct(r["lower-bound"]) / 100) / (1 + _pct(r["best"]) / 100)) for r in rows(lo, hi)]
        assert span == _span(gaps), f"{lo} to {hi}: page {span} %, table {_span(gaps)} %"
    m = re.search(r"From (\S+ GiB) to (\S+ GiB), rematerialization .*? costs (\S+) % where `best` costs (\S+) %", prose)
    assert m, "the rematerialization sentence changed: update this test"
    lo, hi = m.group(1, 2)
    assert m.group(3) == _span(_pct(r[k]) for r in rows(lo, hi) for k in ("rotor", "joint"))
    assert m.group(4) == _span(_pct(r["best"]) for r in rows(lo, hi))
    m = re.search(r"GPT-2 at (\S+ GiB): `best` hides every copy, (\S+) %, where `rotor` costs (\S+) %", prose)
    assert m and gpt[m.group(1)]["best"] == m.group(2) + "%" == "0.0%" and gpt[m.group(1)]["rotor"] == m.group(3) + "%"


def test_no_page_quotes_a_table_it_should_include():
    # A results table pasted into a page goes stale; the include marker reads it at build time.
    for name in ("results/index.md", "results/torch.md", "results/performance.md", "guides/budget.md"):
        text = (DOCS / name).read_text()
        assert "| resnet18 | 1.09 GiB |" not in text and "1.95 GiB       843.7%" not in text, name


def test_sphinx_roles_show_as_code():
    html = 'see :class:<code>~chainoffload.Timeline</code> and :func:<code>chainoffload.solve</code>, <code>x</code>'
    assert hooks.plain_roles(html) == "see <code>Timeline</code> and <code>chainoffload.solve</code>, <code>x</code>"


def test_the_hooks_file_is_the_one_mkdocs_runs():
    config = (ROOT / "mkdocs.yml").read_text()
    assert "hooks:\n  - docs/_hooks.py" in config and "docstring_style: numpy" in config
    assert {"on_files", "on_page_markdown", "on_page_content"} <= {n.name for n in ast.parse((DOCS / "_hooks.py").read_text()).body
                                                 if isinstance(n, ast.FunctionDef)}


def test_best_is_within_1_percent_of_every_proven_optimum_and_the_bound_within_3():
    """Issue 33: wherever a results file has a proven optimum (best's own status, or cpsat's), best is
    within 1 % above it and its bound within 3 % below it (compare.json: the sweep's lower-bound row;
    best_optimum.json: best's bound)."""
    seen = 0
    for name, links in json.loads((RESULTS / "compare.json").read_text())["runs"].items():
        for label, t in links.items():
            ms = t["methods"]
            for i, b in enumerate(ms["best"]["points"]):
                proven = [p["makespan"] for p in (b, ms.get("cpsat", {"points": [{}] * (i + 1)})["points"][i])
                          if p.get("status") == "optimal"]
                if not proven:
                    continue
                opt, seen = min(proven), seen + 1
                assert b["makespan"] <= opt * 1.01, (name, label, t["memories"][i], b["makespan"], opt)
                assert t["lower_bound"][i] >= opt * 0.97, (name, label, t["memories"][i], t["lower_bound"][i], opt)
    for key, row in json.loads((RESULTS / "best_optimum.json").read_text())["points"].items():
        proven = [r["makespan"] for r in (row["best"], row.get("cpsat") or {}) if r.get("status") == "optimal"]
        if not proven:
            continue
        opt, seen = min(proven), seen + 1
        assert row["best"]["makespan"] <= opt * 1.01 and row["best"]["bound"] >= opt * 0.97, key
    assert seen > 50
