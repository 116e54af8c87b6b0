"""The trade-off figures of the guide "Choosing a memory budget" (``docs/guides/budget.md``): run
the commands of its section "On a chain" as written and record what they print.

    python benchmarks/readme_tradeoff.py   # writes benchmarks/results/readme_tradeoff.md and docs/tradeoff-*.png

A whole sweep takes tens of seconds of CPU (the bound ladder and ``joint`` at each of 11
memories), too long for the fast test profile, so the guide shows the table this file records (read
when the site is built), ``tests/test_docs.py`` holds the guide's prose figures to it, and re-runs one row of each sweep fresh (``--memories`` at that row's limit), which
ties the file to the code. The commands are read from the guide itself, so the file cannot
record other commands than the ones a reader runs. Every figure but the runtimes is the same
on any machine (NOTE [ a sweep without a clock ] in ``chainoffload/tradeoff.py``); the load and
wall time of the run are recorded anyway.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guides" / "budget.md"
OUT = ROOT / "benchmarks" / "results" / "readme_tradeoff.md"
SECTION = "## On a chain: `chainoffload tradeoff`"


def readme_commands(text: str) -> list[str]:
    """The chainoffload commands of the guide's trade-off section, in order."""
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```bash\n(.*?)^```$", section, re.S | re.M).group(1)
    return [line.strip() for line in block.splitlines() if line.strip()]


def run(command: str, cwd: Path) -> str:
    """One guide line (``.venv/bin/chainoffload ...``) with this tree's package; its stdout."""
    argv = command.split()
    if argv[0] != ".venv/bin/chainoffload":
        raise SystemExit(f"readme_tradeoff: not a chainoffload command: {command}")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}
    proc = subprocess.run([sys.executable, "-m", "chainoffload", *argv[1:]], cwd=cwd, env=env, text=True, capture_output=True)
    if proc.returncode != 0:
        raise SystemExit(f"readme_tradeoff: {command} failed:\n{proc.stderr}")
    return proc.stdout


def main() -> int:
    commands = readme_commands(GUIDE.read_text())
    load0, t0, cpu0 = os.getloadavg()[0], time.perf_counter(), os.times()
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        # The section runs on the main job's chain file.
        run(".venv/bin/chainoffload example resnet50 -o resnet50.json", cwd)
        for command in commands:
            out = run(command, cwd)
            if " tradeoff " not in command:  # `example ... -o` writes a file and prints nothing
                continue
            lines += [f"`{command}`", "", "```", out.rstrip("\n"), "```", ""]
            m = re.search(r"-o (\S+\.png)", command)
            if m:
                shutil.copy(cwd / m.group(1), ROOT / "docs" / m.group(1))
    cpu = os.times()
    seconds = (cpu.children_user + cpu.children_system) - (cpu0.children_user + cpu0.children_system)
    head = [
        "# The trade-off figures of the guide \"Choosing a memory budget\"",
        "",
        f"`python benchmarks/readme_tradeoff.py`, {time.strftime('%Y-%m-%d %H:%M')} UTC: the commands of "
        "docs/guides/budget.md's section \"On a chain\", as written, in a fresh folder (after `chainoffload example resnet50 -o "
        "resnet50.json`). Every figure but the runtimes is the same on any machine (no method reads a clock: NOTE [ a "
        f"sweep without a clock ]); this run: {time.perf_counter() - t0:.0f} s of wall time, {seconds:.0f} s of CPU, "
        f"1-minute load average {load0:.1f} at the start and {os.getloadavg()[0]:.1f} at the end, {os.cpu_count()} CPU "
        "cores shared. The guide shows this file's table; `tests/test_docs.py` checks its prose against this file "
        "and re-runs a row of each sweep.",
        "",
    ]
    OUT.write_text("\n".join(head + lines))
    print(OUT.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
