import json
import subprocess
import sys

import pytest

from chainoffload.cli import main
from chainoffload.examples import tiny


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path, capsys):
    chain = tmp_path / "tiny.json"
    assert run(capsys, "example", "tiny", "-o", str(chain))[0] == 0
    return tmp_path, chain


def test_example_list_and_write(capsys, tmp_path):
    code, out, _ = run(capsys, "example")
    assert code == 0 and "resnet18" in out and "tiny" in out
    code, out, _ = run(capsys, "example", "resnet18")
    assert code == 0 and json.loads(out)["name"].startswith("resnet18")


def test_methods(capsys):
    code, out, _ = run(capsys, "methods", "--json")
    data = json.loads(out)
    assert code == 0 and "keep-all" in data["methods"] and data["default"] in data["methods"]
    code, out, _ = run(capsys, "methods")
    assert "largest-first" in out and "*" in out


def test_solve_json_and_simulate_agree(capsys, files):
    tmp, chain = files
    sched = tmp / "s.json"
    code, out, _ = run(capsys, "solve", str(chain), "--memory", "300B", "--bandwidth", "25B/s", "--method", "keep-all", "--json", "--out", str(sched))
    assert code == 0
    res = json.loads(out)
    assert set(res) >= {"method", "status", "makespan", "lower_bound", "peak_memory", "offloaded_bytes", "runtime", "schedule"}
    assert res["status"] == "optimal" and res["makespan"] == 12.0 and res["peak_memory"] == 192
    code, out, _ = run(capsys, "simulate", str(chain), str(sched), "--memory", "191", "--bandwidth", "25", "--json")
    sim = json.loads(out)
    assert code == 1 and sim["feasible"] is False and sim["violation"]["rule"] == "memory"
    assert sim["makespan"] == 12.0 and sim["peak_memory"] == 192
    code, out, _ = run(capsys, "simulate", str(chain), str(sched), "--memory", "192")
    assert code == 0 and "feasible      yes" in out and "compute idle  never (every copy is hidden behind compute)" in out


def test_solve_table(capsys, files):
    _, chain = files
    code, out, _ = run(capsys, "solve", str(chain), "--memory", "191", "--method", "keep-all")
    assert code == 1 and "infeasible" in out and "min memory" in out


def test_platform_file_and_overrides(capsys, files, tmp_path):
    _, chain = files
    plat = tmp_path / "p.json"
    plat.write_text(json.dumps({"memory": 1024, "bandwidth_d2h": 1e9, "bandwidth_h2d": 1e9, "latency": 1e-6, "duplex": True}))
    code, out, _ = run(capsys, "solve", str(chain), "--platform", str(plat), "--half-duplex", "--method", "keep-all", "--json")
    assert code == 0 and json.loads(out)["status"] == "optimal"


@pytest.mark.parametrize(
    "argv, pattern",
    [
        (["solve", "{chain}"], "--memory is required"),
        (["solve", "{chain}", "--memory", "lots"], "--memory: 'lots' is not a size"),
        (["solve", "{chain}", "--memory", "100"], "platform.memory: 100 B is below 162 B"),
        (["solve", "{chain}", "--memory", "1GB", "--method", "nope"], "unknown method 'nope'"),
        (["solve", "{chain}", "--memory", "1GB", "--bandwidth", "warp"], "--bandwidth: 'warp' is not a bandwidth"),
        (["solve", "{tmp}/missing.json", "--memory", "1GB"], "cannot read"),
        (["solve", "{bad}", "--memory", "1GB"], "chain.saved: stage 1 has saved=1 < act=20"),
        (["simulate", "{chain}", "{chain}", "--memory", "1GB"], "schedule: unknown field"),
        (["frobnicate"], "invalid choice"),
        (["solve"], "the following arguments are required"),
        (["solve", "{chain}", "--memory", "1GB", "--method", "keep-all", "--option", "zz=1"], "does not take zz"),
        (["solve", "{chain}", "--memory", "1GB", "--option", "zz"], "--option: expected KEY=VALUE"),
    ],
)
def test_errors_are_one_line_exit_2(capsys, files, argv, pattern):
    tmp, chain = files
    bad = tmp / "bad.json"
    data = json.loads(chain.read_text())
    data["saved"][0] = 1
    bad.write_text(json.dumps(data))
    argv = [a.format(chain=chain, tmp=tmp, bad=bad) for a in argv]
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert err.count("\n") == 1 and "Traceback" not in err
    assert pattern in err


def test_console_script_subprocess(tmp_path):
    """The installed entry point: one line on stderr, exit 2, no traceback."""
    proc = subprocess.run(
        [sys.executable, "-m", "chainoffload.cli", "solve", str(tmp_path / "nope.json"), "--memory", "1GB"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def test_solve_min_memory_reports_the_bisection_and_the_floor(capsys, files):
    _, chain = files
    code, out, _ = run(capsys, "solve", str(chain), "--memory", "300B", "--bandwidth", "25B/s", "--method", "largest-first", "--min-memory", "--json")
    assert code == 0
    res = json.loads(out)
    from chainoffload import Chain, Platform, solve
    from chainoffload.bounds import offload_memory_floor

    c = Chain.load(str(chain))
    assert res["memory_floor"] == offload_memory_floor(c)
    assert res["memory_floor"] <= res["min_memory"] <= 192
    platform = Platform(memory=res["min_memory"], bandwidth_d2h=25.0, bandwidth_h2d=25.0)
    assert solve(c, platform, "largest-first").feasible
    code, out, _ = run(capsys, "solve", str(chain), "--memory", "300B", "--bandwidth", "25B/s", "--method", "largest-first", "--min-memory")
    assert code == 0 and "least memory" in out and "memory floor" in out


def test_every_subcommand_is_defined_in_cli():
    """verify and plot are registered explicitly (a broken module must not silently lose its command)."""
    from chainoffload.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) == {"solve", "simulate", "verify", "plot", "tradeoff", "methods", "example"}


def test_nothing_below_the_cli_imports_it():
    """Layers go model -> schedule -> simulate -> solvers -> cli/plot/verify: only the entry
    point imports the CLI."""
    import ast
    import pathlib

    import chainoffload

    root = pathlib.Path(chainoffload.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "__main__.py" or path.parent.name == "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
                if (node.module or "").endswith("cli") or (node.level and node.module is None and "cli" in names):
                    offenders.append(str(path.relative_to(root)))
            elif isinstance(node, ast.Import) and any(a.name.endswith(".cli") for a in node.names):
                offenders.append(str(path.relative_to(root)))
    assert offenders == []


def test_methods_and_help_do_not_import_numba():
    # NOTE [ lazy kernels ]: listing the methods never pays Numba's import.
    import subprocess
    import sys

    code = (
        "import sys; from chainoffload.cli import main; main(['methods']); "
        "sys.exit(1 if 'numba' in sys.modules else 0)"
    )
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


def test_cold_cache_runs_interpreted_and_says_so(tmp_path):
    # NOTE [ lazy kernels ]: on an empty Numba cache the CLI runs a short chain with the
    # interpreted kernels (the background compile is turned off here) and says so on stderr.
    import json
    import os
    import subprocess
    import sys

    from chainoffload.examples import tiny

    tiny().save(tmp_path / "tiny.json")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "CHAINOFFLOAD_BACKGROUND_COMPILE": "0"}
    env.pop("CHAINOFFLOAD_COLD", None)
    cmd = [sys.executable, "-m", "chainoffload", "solve", str(tmp_path / "tiny.json"), "--memory", "180", "--bandwidth", "25"]
    out = subprocess.run(cmd + ["--json"], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["status"] in ("optimal", "feasible") and res["info"]["kernels"] == "interpreted"
    assert out.stderr == ""  # --json: silent
    # The README's main job adds --min-memory: its bisection (the keep-all replay included) runs
    # interpreted too, so stderr is one line that says so, never also "compiling" (issue 22).
    out = subprocess.run(cmd + ["--min-memory", "--out", str(tmp_path / "s.json")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stderr.splitlines() == ["chainoffload: solver kernels not compiled yet: this run interprets them"], out.stderr
    # simulate (and plot) make the simulator ready the same way: nothing compiled in process
    sim = [sys.executable, "-m", "chainoffload", "simulate", str(tmp_path / "tiny.json"), str(tmp_path / "s.json")]
    out = subprocess.run(sim, env=env, capture_output=True, text=True)
    assert out.returncode == 0 and "interprets them" in out.stderr, out.stderr
    assert not list((tmp_path / "cache").rglob("*.nbi"))  # no kernel compiled (and cached) by these runs


def test_prepare_inside_an_interpreted_prepare_stays_interpreted():
    # NOTE [ lazy kernels ]: one decision per command; a nested prepare() (minimum_memory's
    # solves inside the CLI's) neither compiles nor switches the interpreter off on its way out.
    from chainoffload import _compile
    from chainoffload._kernels import INTERPRETED

    INTERPRETED[0] = True
    try:
        with _compile.prepare("best", 10**6) as inner:  # long: alone, it would compile
            assert inner.kernels == "interpreted" and inner.seconds == 0.0
        assert INTERPRETED[0]
    finally:
        INTERPRETED[0] = False


# -- issue 33: the smaller edge cases of the command line ------------------------------------


@pytest.mark.parametrize(
    "flags, pattern",
    [
        (["--memory", "1KiB", "--memory", "2KiB"], "--memory: given twice; give each flag once"),
        (["--memory=1KiB", "--memory", "2KiB"], "--memory: given twice"),
        (["--memory", "1KiB", "--json", "--json"], "--json: given twice"),
        (["--memory", "1KiB", "--duplex", "--half-duplex"], "--half-duplex: given after --duplex, which sets the same"),
        (["--memory", "1KiB", "--method", "first-k"], "--method: given twice"),
    ],
)
def test_a_flag_given_twice_is_an_error(tmp_path, capsys, flags, pattern):
    """It silently took the last value; --option, which is meant to repeat, still repeats."""
    tiny().save(tmp_path / "c.json")
    code = main(["solve", str(tmp_path / "c.json"), "--method", "keep-all", *flags])
    err = capsys.readouterr().err
    assert code == 2 and pattern in err and err.count("\n") == 1


def test_option_may_repeat(tmp_path, capsys):
    tiny().save(tmp_path / "c.json")
    code = main(["solve", str(tmp_path / "c.json"), "--memory", "1KiB", "--method", "best", "--option", "relaxations=false",
                 "--option", "first_fit=true", "--json"])
    out, err = capsys.readouterr()
    assert code == 0 and err == "" and json.loads(out)["status"] in ("optimal", "feasible")


def test_out_ending_in_a_separator_is_refused(tmp_path, capsys):
    """`--out newdir/` wrote a file named newdir."""
    tiny().save(tmp_path / "c.json")
    code = main(["solve", str(tmp_path / "c.json"), "--memory", "1KiB", "--method", "keep-all", "--out", str(tmp_path / "newdir") + "/"])
    err = capsys.readouterr().err
    assert code == 2 and "names a folder" in err and "newdir/schedule.json" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


@pytest.mark.parametrize("flag, value", [("--bandwidth", "1e400"), ("--bandwidth-h2d", "1e300TB/s"), ("--memory", "1e400")])
def test_a_number_that_overflows_is_refused_naming_the_flag(tmp_path, capsys, flag, value):
    """--bandwidth 1e400 was taken as an infinitely fast link while --memory 1e400 was refused."""
    tiny().save(tmp_path / "c.json")
    argv = ["solve", str(tmp_path / "c.json"), "--method", "keep-all", flag, value]
    if flag != "--memory":
        argv += ["--memory", "1KiB"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and f"{flag}: {value!r}" in err, err


def test_lower_case_b_in_a_bandwidth_is_bits():
    """'Gb/s' was read as gigabytes: 8 times the link."""
    from chainoffload.units import parse_bandwidth

    assert parse_bandwidth("100Gb/s") == 12.5e9 and parse_bandwidth("100Gbps") == 12.5e9
    assert parse_bandwidth("100GB/s") == 100e9 and parse_bandwidth("8Kib/s") == 1024.0
    assert parse_bandwidth("inf") == float("inf")
