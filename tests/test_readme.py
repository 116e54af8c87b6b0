"""The README is checked (issue 21): its main job runs as written, and every figure it quotes
from it (makespan, bound, gap, idle time, peak, bytes, least memory, floor) is what a fresh run
prints. Runtimes are the machine's and are left out by rule (the ``runtime`` row). The Python
API example runs as written too. A figure that goes stale fails here: refresh the README from
the output this test shows."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}
# Rows whose figure depends on the machine (excluded by rule).
MACHINE_ROWS = ("runtime", "compile")


def blocks(text, lang):
    """The fenced code blocks of ``lang`` ('' for plain ones), with their offsets."""
    return [(m.start(), m.group(1)) for m in re.finditer(r"^```" + lang + r"\n(.*?)^```$", text, re.S | re.M)]


def main_job():
    """The main job's command line and the output block quoted right after it."""
    (at, command), = [(i, b) for i, b in blocks(README, "bash") if "chainoffload solve resnet50.json" in b and "example resnet50" in b]
    quoted = next(b for i, b in blocks(README, "") if i > at)
    return command.strip(), quoted


def run_line(line, cwd):
    """Run one README shell line (``&&``-joined commands) with this tree's chainoffload."""
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


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("readme")
    command, quoted = main_job()
    outputs = run_line(command, cwd)
    return dict(command=command, quoted=quoted, outputs=outputs, cwd=cwd)


def test_setup_and_main_job_are_two_commands():
    bash = [b for _, b in blocks(README.split("## Fresh machine: two commands", 1)[1].split("\n## ", 1)[0], "bash")]
    assert len(bash) == 2 and "pip install" in bash[0] and "chainoffload" not in bash[0].replace("'.[torch,dev]'", "")
    assert "pip" not in bash[1] and "chainoffload solve" in bash[1]
    # The PyTorch section comes right after the front door.
    headings = re.findall(r"^## (.*)$", README, re.M)
    assert headings[headings.index("Fresh machine: two commands") + 1].startswith("Training with offloading in PyTorch")


def test_solve_prints_what_the_readme_quotes(ran):
    solve_out = next(o for o in ran["outputs"] if o.startswith("chain ") and "method" in o)
    got, quoted = rows(solve_out), rows(ran["quoted"])
    assert list(got) == list(quoted)
    stale = {k: (quoted[k], got[k]) for k in quoted if k not in MACHINE_ROWS and quoted[k] != got[k]}
    assert not stale, f"README figures differ from a fresh run (README, run): {stale}\nfresh output:\n{solve_out}"


def test_the_prose_figures_of_the_main_job(ran):
    solve = rows(next(o for o in ran["outputs"] if "method" in o))
    plot_out = ran["outputs"][-1]
    bound = re.match(r"(\S+ ms)", solve["lower bound"]).group(1)
    gap = re.search(r"gap (\S+)%", solve["lower bound"]).group(1)
    compute = float(re.search(r"compute (\S+) ms", solve["chain"]).group(1))
    prose = README.split("and `plot` draws `schedule.png`", 1)[1].split("## ", 1)[0]
    m = re.search(r"the lower bound in the title \((\S+ ms), the figure `solve`", prose)
    assert m and m.group(1) == bound
    assert re.search(r"lower bound (\S+ ms);", plot_out).group(1) == bound  # plot prints solve's bound
    ratio = float(re.search(r"beats (\S+)x the compute", prose).group(1))
    assert ratio == round(float(bound.split()[0]) / compute, 2)
    assert re.search(r"`best` is within (\S+) % of it", prose).group(1) == gap
    idle = re.search(r"Compute is idle\s+(\d+) % of the time", prose).group(1)
    assert f"({idle}% of the makespan)" in solve["compute idle"]


def test_the_python_api_example_runs(tmp_path):
    (_, code), = [(i, b) for i, b in blocks(README, "python") if "co.solve(chain, platform)" in b and "resnet18" in b]
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=ENV, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    status, makespan, bound, peak = proc.stdout.split()
    assert status in ("feasible", "optimal") and float(bound) <= float(makespan) and int(peak) <= int(1.34 * 2**30)
    assert (tmp_path / "schedule.json").exists()


def test_the_schedule_file_example_is_the_main_jobs(ran):
    import json

    written = json.loads((ran["cwd"] / "schedule.json").read_text())
    (_, quoted), = [(i, b) for i, b in blocks(README, "json") if '"solver": {"method": "best"' in b]
    for key in ("platform", "solver"):
        line = next(l for l in quoted.splitlines() if l.lstrip().startswith(f'"{key}"'))
        raw = line.strip().rstrip(",")
        raw = raw[:-1] if raw.endswith("}}") else raw  # the last line closes the file's object too
        assert json.loads("{" + raw + "}")[key] == written[key]
    assert f'"fingerprint": "{written["chain"]["fingerprint"][:15]}..."' in quoted
