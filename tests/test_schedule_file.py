"""Self-describing schedule files (issue 15): the chain's fingerprint, the recorded platform, the
solver's figures, and the exit codes a script can use."""

import hashlib
import json
import re
import struct

import pytest

from chainoffload import (
    Chain,
    Platform,
    Result,
    Schedule,
    ScheduleError,
    ScheduleFile,
    Status,
    register,
    solve,
)
from chainoffload.cli import EXIT_CODES, build_parser, main
from chainoffload.examples import tiny

PLATFORM = Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=20.0, latency=0.01, duplex=False)


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_exit_2(code, out, err, pattern):
    assert code == 2 and out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    assert pattern in err, err


# -- the fingerprint -----------------------------------------------------------------------------


def test_fingerprint_is_sha256_of_the_documented_encoding():
    chain = tiny()
    digest = hashlib.sha256(b"chainoffload.chain.v1\n")
    for name, fmt in (("fwd", "d"), ("bwd", "d"), ("fwd_nosave", "d"), ("act", "q"), ("saved", "q"), ("fwd_tmp", "q"), ("bwd_tmp", "q")):
        values = getattr(chain, name).tolist()
        digest.update(f"{name} {len(values)}\n".encode())
        digest.update(struct.pack(f"<{len(values)}{fmt}", *values))
    assert chain.fingerprint() == "sha256:" + digest.hexdigest()
    # Pinned: the same on every machine and in every process.
    assert chain.fingerprint() == "sha256:cd9a76a47a85c12709adbaea813349e69d8b2f3d6bdb458d646573ba6355d4e3"


def test_fingerprint_follows_the_numbers_not_the_name(tmp_path):
    chain = tiny()
    path = tmp_path / "c.json"
    chain.save(path)
    assert Chain.load(path).fingerprint() == chain.fingerprint()
    assert chain.replace(name="other").fingerprint() == chain.fingerprint()
    assert chain.replace(fwd_nosave=chain.fwd.tolist()).fingerprint() == chain.fingerprint()
    assert chain.replace(fwd=[1.0, 2.0, -0.0]).fingerprint() == chain.replace(fwd=[1.0, 2.0, 0.0]).fingerprint()
    for change in (dict(fwd=[1.0, 2.0, 1.0 + 2**-52]), dict(saved=[25, 35, 46]), dict(bwd_tmp=[7, 7, 8]), dict(fwd_nosave=[1.0, 2.0, 0.5])):
        assert chain.replace(**change).fingerprint() != chain.fingerprint(), change


# -- the file --------------------------------------------------------------------------------------


def _solved(chain=None, platform=PLATFORM, method="cpsat"):
    chain = chain or tiny()
    return chain, platform, solve(chain, platform, method)


def test_schedule_file_round_trip(tmp_path):
    chain, platform, result = _solved()
    record = ScheduleFile.from_result(chain, platform, result)
    path = tmp_path / "s.json"
    record.save(path)
    data = json.loads(path.read_text())
    assert data["chain"] == {"name": "tiny", "fingerprint": chain.fingerprint()}
    assert data["platform"] == platform.to_dict()
    assert data["solver"] == {
        "method": "cpsat",
        "status": result.status.value,
        "makespan": result.makespan,
        "lower_bound": result.lower_bound,
        "peak_memory": result.peak_memory,
    }
    back = ScheduleFile.load(path)
    assert back == record and back.platform == platform and back.schedule == result.schedule
    # A bare Schedule still reads the file (and leaves the metadata to ScheduleFile).
    assert Schedule.load(path) == result.schedule


def test_old_files_still_load(tmp_path):
    path = tmp_path / "old.json"
    Schedule.keep_all(3).save(path)
    record = ScheduleFile.load(path)
    assert record.schedule == Schedule.keep_all(3)
    assert (record.fingerprint, record.platform, record.method, record.makespan) == (None, None, None, None)
    record.check_chain(tiny())  # nothing recorded, nothing to refuse
    assert json.loads(record.to_json()) == Schedule.keep_all(3).to_dict()


@pytest.mark.parametrize(
    "extra, pattern",
    [
        ({"chain": {"name": "x", "fingerprint": "sha256:abc"}}, r"schedule\.chain\.fingerprint: 'sha256:abc' is not"),
        ({"chain": {"name": "x", "hash": "y"}}, r"schedule\.chain: unknown field\(s\) hash"),
        ({"chain": {"name": 3}}, r"schedule\.chain\.name: expected a string"),
        ({"chain": "tiny"}, r"schedule\.chain: expected a JSON object"),
        ({"platform": {"memory": "1KiB", "bandwidth_d2h": 1.0, "bandwidth_h2d": 1.0}}, r"schedule\.platform\.memory: '1KiB' is a string"),
        ({"platform": {"memory": 1, "bandwidth_d2h": 1.0, "bandwidth_h2d": 1.0, "speed": 2}}, r"schedule\.platform: unknown field"),
        ({"solver": {"method": "x", "status": "great"}}, r"schedule\.solver\.status: 'great' is not one of"),
        ({"solver": {"method": "x", "makespan": "12"}}, r"schedule\.solver\.makespan: '12' must be null or a finite number"),
        ({"solver": {"method": "x", "peak_memory": 1.5}}, r"schedule\.solver\.peak_memory: 1\.5 must be null or an integer"),
        ({"solver": {"method": True}}, r"schedule\.solver\.method: expected a string"),
        ({"solver": {"method": "x", "gap": 0}}, r"schedule\.solver: unknown field\(s\) gap"),
        ({"solved_by": "me"}, r"schedule: unknown field\(s\) solved_by"),
    ],
)
def test_metadata_is_parsed_strictly(extra, pattern):
    data = {**Schedule.keep_all(3).to_dict(), **extra}
    with pytest.raises(ScheduleError, match=pattern):
        ScheduleFile.from_dict(data)


def test_check_chain_refuses_another_chain():
    chain, platform, result = _solved()
    record = ScheduleFile.from_result(chain, platform, result)
    record.check_chain(chain.replace(name="renamed"))
    with pytest.raises(ScheduleError, match=r"schedule: made for chain 'tiny' \(fingerprint sha256:cd9a76a47a85\.\.\.\), not for chain 'tiny' \(fingerprint sha256:"):
        record.check_chain(chain.replace(saved=[25, 35, 46]))


def test_from_result_needs_a_schedule(chain3):
    r = solve(chain3, PLATFORM.with_memory(170), "keep-all")
    with pytest.raises(ValueError, match="found no schedule"):
        ScheduleFile.from_result(chain3, PLATFORM, r)


# -- the command line: recorded platform, fingerprint refusal, exit codes ------------------------


@pytest.fixture
def solved(tmp_path, capsys):
    chain = tmp_path / "c.json"
    tiny().save(chain)
    sched = tmp_path / "s.json"
    code, out, err = run(
        capsys, "solve", chain, "--memory", "180", "--bandwidth-d2h", "25", "--bandwidth-h2d", "20", "--latency", "10ms",
        "--half-duplex", "--method", "cpsat", "--json", "--out", sched,
    )
    assert code == 0, err
    return chain, sched, json.loads(out)


def test_simulate_replays_on_the_recorded_platform(capsys, solved):
    chain, sched, res = solved
    code, out, err = run(capsys, "simulate", chain, sched, "--json")
    assert code == 0, err
    sim = json.loads(out)
    assert sim["feasible"] and sim["makespan"] == res["makespan"] and sim["peak_memory"] == res["peak_memory"]
    code, out, _ = run(capsys, "simulate", chain, sched)
    assert code == 0 and f"recorded in {sched}" in out
    # 13.010 s: a_1 alone (20 B) comes back in 1 s + 10 ms (the brute-force optimum too);
    # the whole unit 1 (25 B) took 1.25 s + 10 ms, CP-SAT's optimum before it modelled a_i alone.
    assert re.search(r"^solved by +cpsat \(optimal\), makespan 13\.010 s", out, re.M)
    assert "180 B, D2H 25 B/s, H2D 20 B/s, latency 10.000 ms, half duplex" in out


def test_flags_override_recorded_fields_one_by_one(capsys, solved):
    chain, sched, res = solved
    # A smaller memory: the same schedule no longer fits (exit 1); the recorded link is kept.
    code, out, _ = run(capsys, "simulate", chain, sched, "--memory", str(res["peak_memory"] - 1), "--json")
    sim = json.loads(out)
    assert code == 1 and not sim["feasible"] and sim["makespan"] == res["makespan"]
    # A faster link: the makespan can only drop; the recorded memory still holds.
    code, out, _ = run(capsys, "simulate", chain, sched, "--bandwidth", "1e9", "--duplex", "--latency", "0", "--json")
    sim = json.loads(out)
    assert code == 0 and sim["makespan"] < res["makespan"]
    code, out, _ = run(capsys, "simulate", chain, sched, "--memory", "1KiB")
    assert "overridden by --memory" in out


def test_plot_and_verify_use_the_recorded_platform(capsys, solved, tmp_path):
    pytest.importorskip("matplotlib")
    chain, sched, res = solved
    png = tmp_path / "o.png"
    code, out, err = run(capsys, "plot", chain, sched, "-o", png)
    assert code == 0 and png.stat().st_size > 5000, err
    code, out, err = run(capsys, "verify", chain, sched, "--time-limit", "10", "--json")
    assert code == 0, err
    assert json.loads(out)["makespan"] == res["makespan"]


@pytest.mark.parametrize("command", ["simulate", "plot", "verify"])
def test_a_schedule_for_another_chain_is_refused(capsys, solved, tmp_path, command):
    _, sched, _ = solved
    other = tmp_path / "other.json"
    tiny().replace(fwd=[1.0, 2.0, 1.5]).save(other)
    extra = ["-o", str(tmp_path / "x.png")] if command == "plot" else []
    one_line_exit_2(*run(capsys, command, other, sched, *extra), "schedule: made for chain 'tiny'")
    assert not (tmp_path / "x.png").exists()


def test_old_schedule_files_still_work_with_flags(capsys, tmp_path):
    chain, sched = tmp_path / "c.json", tmp_path / "old.json"
    tiny().save(chain)
    Schedule.keep_all(3).save(sched)
    code, out, _ = run(capsys, "simulate", chain, sched, "--memory", "192", "--json")
    assert code == 0 and json.loads(out)["makespan"] == 12.0
    one_line_exit_2(*run(capsys, "simulate", chain, sched), "--memory is required")


def test_exit_codes(capsys, tmp_path):
    chain = tmp_path / "c.json"
    tiny().save(chain)
    sched = tmp_path / "s.json"
    # solve: 0 with a schedule, 1 without one (infeasible, timeout, error)
    assert run(capsys, "solve", chain, "--memory", "192", "--method", "keep-all", "--out", sched)[0] == 0
    code, out, err = run(capsys, "solve", chain, "--memory", "191", "--method", "keep-all", "--out", tmp_path / "none.json")
    assert code == 1 and "infeasible" in out and "no schedule written" in err and not (tmp_path / "none.json").exists()
    register("test-timeout", lambda c, p: Result("t", Status.TIMEOUT), "times out", replace=True)
    assert run(capsys, "solve", chain, "--memory", "192", "--method", "test-timeout")[0] == 1
    # simulate and verify: 0 feasible, 1 infeasible, 2 misuse
    assert run(capsys, "simulate", chain, sched)[0] == 0
    assert run(capsys, "simulate", chain, sched, "--memory", "191")[0] == 1
    assert run(capsys, "simulate", chain, sched, "--memory", "10")[0] == 1  # below the floor, still only a replay
    assert run(capsys, "simulate", chain, sched, "--memory", "lots")[0] == 2
    assert run(capsys, "verify", chain, sched, "--time-limit", "5")[0] == 0
    assert run(capsys, "verify", chain, sched, "--time-limit", "5", "--memory", "191")[0] == 1
    assert run(capsys, "verify", chain, sched, "--time-limit", "5", "--memory", "10")[0] == 2


def test_exit_codes_are_in_help(capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["simulate", "--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for code in EXIT_CODES:
        assert f"  {code} " in text
    assert "the schedule is infeasible" in text
