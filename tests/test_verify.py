"""`verify` and `chainoffload verify`: feasibility by the simulator, gap against CP-SAT."""

import json

import pytest

from chainoffload import Platform, Schedule, Transfer, solve
from chainoffload.cli import main
from chainoffload.examples import tiny
from chainoffload.verify import verify

PLATFORM = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0)


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def slow_schedule():
    # Offload unit 1 at the end of F_1 and make F_2 wait for it (1 s lost); prefetch at the end
    # of B_3. The optimum, 12.8 s, moves a_1 alone (20 of unit 1's 25 B) and lets F_2 run over
    # the copy: B_2 waits 0.8 s for it instead of 1 s (the brute-force oracle agrees).
    return Schedule.from_units(3, [Transfer("offload", 1, 0, "end", before=1), Transfer("prefetch", 1, 3, "end")])


def test_verify_feasible_schedule_has_a_gap_to_the_optimum():
    chain = tiny()
    schedule = slow_schedule()
    report = verify(chain, PLATFORM, schedule, time_limit=10.0)
    assert report["feasible"] and report["violation"] is None
    assert report["cpsat_status"] == "optimal" and report["gap_reference"] == "optimum"
    assert report["optimum"] <= report["makespan"]
    assert report["gap"] == pytest.approx(report["makespan"] / report["optimum"] - 1.0)
    assert report["makespan"] == pytest.approx(14.0) and report["optimum"] == pytest.approx(12.8, abs=1e-4)
    assert report["gap"] == pytest.approx(1.2 / 12.8, abs=1e-4)


def test_verify_the_optimum_has_gap_zero():
    chain = tiny()
    best = solve(chain, PLATFORM, "cpsat", time_limit=10.0)
    report = verify(chain, PLATFORM, best.schedule, time_limit=10.0)
    assert report["feasible"] and report["gap"] == pytest.approx(0.0, abs=1e-9)


def test_verify_infeasible_schedule():
    report = verify(tiny(), PLATFORM, Schedule.keep_all(3), time_limit=10.0)
    assert not report["feasible"] and report["violation"]["rule"] == "memory"
    assert report["gap"] is None and report["optimum"] is not None


def test_cli_verify_json_and_table(capsys, tmp_path):
    chain_path, sched_path = tmp_path / "c.json", tmp_path / "s.json"
    tiny().save(str(chain_path))
    slow_schedule().save(str(sched_path))
    code, out, err = run(capsys, "verify", str(chain_path), str(sched_path), "--memory", "180", "--bandwidth", "25B/s", "--time-limit", "10", "--json")
    assert code == 0, err
    data = json.loads(out)
    assert data["feasible"] and data["cpsat_status"] == "optimal" and data["gap"] >= 0
    code, out, err = run(capsys, "verify", str(chain_path), str(sched_path), "--memory", "180", "--bandwidth", "25B/s", "--time-limit", "10")
    assert code == 0 and "gap" in out and "optimum" in out and "feasible" in out


@pytest.mark.parametrize(
    "extra,match",
    [
        (["--time-limit", "0"], "--time-limit: 0.0 must be"),
        (["--workers", "0"], "--workers: 0 must be"),
        (["--memory", "10"], "platform.memory: 10 B is below"),
    ],
)
def test_cli_verify_errors_are_one_line_exit_2(capsys, tmp_path, extra, match):
    chain_path, sched_path = tmp_path / "c.json", tmp_path / "s.json"
    tiny().save(str(chain_path))
    slow_schedule().save(str(sched_path))
    argv = ["verify", str(chain_path), str(sched_path), "--bandwidth", "25B/s"]
    if "--memory" not in extra:
        argv += ["--memory", "180"]
    code, out, err = run(capsys, *argv, *extra)
    assert code == 2 and out == ""
    assert match in err and err.count("\n") == 1


def test_cli_verify_malformed_schedule(capsys, tmp_path):
    chain_path, sched_path = tmp_path / "c.json", tmp_path / "s.json"
    tiny().save(str(chain_path))
    sched_path.write_text(json.dumps({"compute": [["F", 1]], "transfers": []}))
    code, _, err = run(capsys, "verify", str(chain_path), str(sched_path), "--memory", "180")
    assert code == 2 and "schedule.compute" in err
