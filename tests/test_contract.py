"""The contract at the edges (issue 12's red-team cases): arithmetic that cannot wrap, numbers
that are numbers, user methods that fail, and a CLI whose every error is one line, exit 2,
no traceback, nothing written."""

import json
import math
import resource
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from chainoffload import (
    Chain,
    ChainError,
    Platform,
    PlatformError,
    Result,
    Schedule,
    ScheduleError,
    Status,
    Transfer,
    register,
    solve,
)
from chainoffload.cli import main
from chainoffload.examples import tiny
from chainoffload.solvers import judge


def run(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def one_line_exit_2(code, out, err, pattern):
    assert code == 2, err
    assert out == ""
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert pattern in err, err


def chain_dict(length=3, *, fwd=1.0, bwd=1.0, act=1, saved=1):
    return {
        "name": "c",
        "fwd": [fwd] * length,
        "bwd": [bwd] * length,
        "act": [1] + [act] * length,
        "saved": [saved] * length,
        "fwd_tmp": [0] * length,
        "bwd_tmp": [0] * length,
    }


def write(path, data):
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


# -- arithmetic that cannot wrap ----------------------------------------------------------------


def test_sizes_whose_memory_sums_overflow_int64_are_refused():
    # Each size is below 2**62, their sum is not: keep-all used to report 'optimal' with a
    # wrapped peak of 8e18 bytes where the true one is 1.2e19.
    data = chain_dict(6, act=10**17, saved=10**18)
    with pytest.raises(ChainError, match=r"chain\.saved: the sizes add up to 6600000000000000001 B .*2\^60"):
        Chain.from_dict(data)
    data = chain_dict(10, act=2 * 10**18, saved=2 * 10**18)
    with pytest.raises(ChainError, match=r"chain\.act: stage 1 has act=2000000000000000000; .*2\^60"):
        Chain.from_dict(data)


def test_sizes_just_within_the_bound_are_simulated_exactly():
    from chainoffload import keep_all_peak
    from chainoffload.chain import MAX_TOTAL_BYTES

    unit = MAX_TOTAL_BYTES // 8  # act and saved of 3 stages plus a_0: 7 units
    chain = Chain.from_dict(chain_dict(3, act=unit, saved=unit))
    # keep-all's peak is at the start of B_3: a_0, three units, g_3 and g_2.
    assert keep_all_peak(chain) == 1 + 3 * unit + 2 * unit


def test_cli_chain_overflow_is_one_line(capsys, tmp_path):
    path = write(tmp_path / "big.json", chain_dict(6, act=10**17, saved=10**18))
    one_line_exit_2(*run(capsys, "solve", path, "--memory", "9e18", "--method", "keep-all"), "chain.saved")


def test_every_method_counts_exactly_at_the_bound():
    """Sizes that add up to just under 2^60: every method's figures are the simulator's, and
    every feasible peak is within the limit (nothing wrapped on the way)."""
    from chainoffload import keep_all_peak, methods, simulate
    from chainoffload.chain import MAX_TOTAL_BYTES
    from chainoffload.platform import MAX_MEMORY

    u = (MAX_TOTAL_BYTES - 1) // 13  # 3 stages: 4 act, 3 saved, 3 fwd_tmp, 3 bwd_tmp
    chain = Chain([1.0] * 3, [2.0] * 3, [u] * 4, [u] * 3, [u] * 3, [u] * 3)
    peak = keep_all_peak(chain)
    # B_3's start: a_0, three units, g_3, g_2 and bwd_tmp_3.
    assert peak == 7 * u
    for memory in (peak - 1, MAX_MEMORY):
        platform = Platform(memory=memory, bandwidth_d2h=2.0 * u, bandwidth_h2d=2.0 * u)
        for name in methods():
            r = solve(chain, platform, name)
            assert r.status != Status.ERROR, (name, r.message)
            if r.feasible:
                tl = simulate(chain, platform, r.schedule)
                assert 0 < r.peak_memory == tl.peak_memory <= memory and r.makespan == tl.makespan


@pytest.mark.parametrize("memory", [2**70, 10**19])
def test_platform_memory_beyond_int64_is_refused(memory):
    with pytest.raises(PlatformError, match=r"platform\.memory: .* above"):
        Platform(memory=memory, bandwidth_d2h=1.0, bandwidth_h2d=1.0)


def test_the_largest_memory_limit_is_exact(capsys, tmp_path):
    chain = write(tmp_path / "c.json", chain_dict())
    code, out, err = run(capsys, "solve", chain, "--memory", str(2**63 - 1), "--method", "keep-all", "--json")
    assert code == 0 and json.loads(out)["status"] == "optimal", err
    one_line_exit_2(*run(capsys, "solve", chain, "--memory", str(2**63), "--method", "keep-all"), "--memory: 9223372036854775808 B is above")


def test_a_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    path = tmp_path / "bin.json"
    path.write_bytes(b"\xff\xfe{}")
    one_line_exit_2(*run(capsys, "solve", path, "--memory", "1KiB"), f"chain: cannot read '{path}': not UTF-8 text (byte 0)")


def test_cli_platform_memory_beyond_int64_is_one_line(capsys, tmp_path):
    chain = write(tmp_path / "c.json", chain_dict())
    plat = write(tmp_path / "p.json", f'{{"memory": {2**70}, "bandwidth_d2h": 1e9, "bandwidth_h2d": 1e9}}')
    one_line_exit_2(*run(capsys, "solve", chain, "--platform", plat, "--method", "keep-all"), "platform.memory")
    one_line_exit_2(*run(capsys, "solve", chain, "--memory", "1e19", "--method", "keep-all"), "--memory")


def test_times_whose_sum_is_infinite_are_refused():
    with pytest.raises(ChainError, match=r"chain\.fwd: .*sum"):
        Chain.from_dict(chain_dict(3, fwd=1e308))
    with pytest.raises(ChainError, match=r"chain\.fwd_nosave: .*sum"):
        Chain.from_dict({**chain_dict(3), "fwd_nosave": [1e308] * 3})


def test_judge_never_calls_a_non_finite_makespan_feasible(chain3):
    # A transfer of 20 B at 1e-307 B/s takes longer than float64 can count: the makespan is inf.
    platform = Platform(memory=10**6, bandwidth_d2h=1e-307, bandwidth_h2d=1e-307)
    sched = Schedule.from_units(3, [Transfer("offload", 1, 0, "end"), Transfer("prefetch", 1, 3, "end")])
    judged = judge(chain3, platform, Result("mine", Status.FEASIBLE, sched))
    assert judged.status == Status.ERROR and "not finite" in judged.message
    judged = judge(chain3, platform, Result("mine", Status.OPTIMAL, sched))
    assert judged.status == Status.ERROR


def test_simulate_cli_calls_a_non_finite_makespan_infeasible(capsys, tmp_path):
    chain = tmp_path / "c.json"
    tiny().save(chain)
    sched = tmp_path / "s.json"
    Schedule.from_units(3, [Transfer("offload", 1, 0, "end"), Transfer("prefetch", 1, 3, "end")]).save(sched)
    code, out, err = run(capsys, "simulate", chain, sched, "--memory", "1MB", "--bandwidth", "1e-307", "--json")
    assert code == 1, err
    data = json.loads(out)
    assert data["feasible"] is False and data["makespan"] is None


def test_all_zero_times_print_a_table(capsys, tmp_path):
    chain = write(tmp_path / "zero.json", chain_dict(3, fwd=0.0, bwd=0.0))
    out_path = tmp_path / "s.json"
    code, out, err = run(capsys, "solve", chain, "--memory", "1KiB", "--method", "keep-all", "--out", out_path)
    assert code == 0, err
    assert "makespan" in out and "Traceback" not in err
    assert out_path.exists()


@pytest.mark.parametrize("bandwidth", ["1e-300", "1e300"])
@pytest.mark.parametrize("method", ["keep-all", "lp"])
def test_extreme_bandwidths_still_solve(capsys, tmp_path, bandwidth, method):
    for name, data in (("zero", chain_dict(3, fwd=0.0, bwd=0.0)), ("one", chain_dict(3))):
        chain = write(tmp_path / f"{name}.json", data)
        code, out, err = run(capsys, "solve", chain, "--memory", "1KiB", "--bandwidth", bandwidth, "--method", method, "--json")
        assert code == 0, err
        res = json.loads(out)
        assert res["status"] == "optimal" and res["lower_bound"] <= res["makespan"]


def test_the_lp_bound_stays_a_bound_at_extreme_bandwidths():
    from chainoffload.bounds import lower_bound

    chain = tiny()
    for bw in (1e-300, 1e-30, 1e30, 1e300):
        platform = Platform(memory=170, bandwidth_d2h=bw, bandwidth_h2d=bw, latency=1e-3)
        bound = lower_bound(chain, platform)
        assert bound >= chain.compute_time
        result = solve(chain, platform, "cpsat", time_limit=10.0) if bw >= 1e30 else None
        if result is not None and result.feasible:
            assert bound <= result.makespan * (1 + 1e-9)


# -- JSON: numbers are numbers, unknown keys are errors, depth is bounded ----------------------


@pytest.mark.parametrize("bad", ["1.0", True, None, [1.0]])
@pytest.mark.parametrize("field", ["fwd", "bwd", "fwd_nosave"])
def test_times_must_be_json_numbers(field, bad):
    data = {**chain_dict(3), field: [1.0, bad, 1.0]}
    with pytest.raises(ChainError, match=rf"chain\.{field}: stage 2"):
        Chain.from_dict(data)


def test_numpy_times_are_still_numbers():
    c = Chain(np.ones(3), np.ones(3, dtype=np.float32), [1, 1, 1, 1], np.ones(3, dtype=np.int64))
    assert c.compute_time == 6.0


@pytest.mark.parametrize(
    "field, bad",
    [("memory", "1KiB"), ("memory", True), ("bandwidth_d2h", "1GB/s"), ("bandwidth_h2d", False), ("latency", "1us"), ("duplex", 1)],
)
def test_platform_fields_must_be_json_numbers(field, bad):
    data = {"memory": 1024, "bandwidth_d2h": 1e9, "bandwidth_h2d": 1e9, "latency": 0.0, "duplex": True, field: bad}
    with pytest.raises(PlatformError, match=rf"platform\.{field}"):
        Platform.from_dict(data)


def test_unknown_keys_inside_a_trigger_are_errors():
    data = {"compute": [["F", 1], ["B", 1]], "transfers": [{"kind": "offload", "unit": 1, "trigger": {"op": 0, "at": "end", "when": 3}}]}
    with pytest.raises(ScheduleError, match=r"schedule\.transfers\[0\]\.trigger: unknown field\(s\) when"):
        Schedule.from_dict(data)


@pytest.mark.parametrize("bad", [True, "1", 1.0])
def test_schedule_indices_must_be_integers(bad):
    data = {"compute": [["F", 1], ["B", 1]], "transfers": [{"kind": "offload", "unit": 1, "trigger": {"op": bad, "at": "end"}}]}
    with pytest.raises(ScheduleError, match=r"trigger\.op: expected an integer"):
        Schedule.from_dict(data)


@pytest.mark.parametrize("cls", [Chain, Platform, Schedule])
def test_deeply_nested_json_is_a_clean_error(cls):
    with pytest.raises(ValueError, match="nested too deeply"):
        cls.from_json("[" * 100_000 + "]" * 100_000)


def test_cli_deeply_nested_json_is_one_line(capsys, tmp_path):
    path = write(tmp_path / "deep.json", "[" * 100_000 + "]" * 100_000)
    one_line_exit_2(*run(capsys, "solve", path, "--memory", "1KiB"), "nested too deeply")


# -- user methods that fail ------------------------------------------------------------------------


def _user(name, func, **kw):
    register(name, func, "test method", replace=True, **kw)
    return name


def test_a_user_method_that_raises_gives_status_error(chain3):
    def boom(chain, platform):
        raise RuntimeError("the solver fell over")

    r = solve(chain3, Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0), _user("test-boom", boom))
    assert r.status == Status.ERROR and r.schedule is None
    assert "RuntimeError: the solver fell over" in r.message and math.isinf(r.makespan)


def test_a_user_method_that_returns_a_malformed_schedule_gives_status_error(chain3):
    def malformed(chain, platform):
        return Result("x", Status.FEASIBLE, Schedule((("F", 1), ("B", 1))))

    r = solve(chain3, Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0), _user("test-malformed", malformed))
    assert r.status == Status.ERROR and "schedule.compute" in r.message


def test_a_user_method_that_returns_no_result_gives_status_error(chain3):
    r = solve(chain3, Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0), _user("test-none", lambda c, p: None))
    assert r.status == Status.ERROR and "NoneType" in r.message


def test_a_non_remat_method_that_recomputes_gives_status_error(chain3):
    from chainoffload.solvers.remat_baselines import recompute_all

    platform = Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0)
    sched = recompute_all(chain3, platform).schedule
    assert sched.has_remat

    def sneaky(chain, platform):
        return Result("x", Status.FEASIBLE, sched)

    r = solve(chain3, platform, _user("test-sneaky", sneaky))
    assert r.status == Status.ERROR and "remat=True" in r.message
    r = solve(chain3, platform, _user("test-honest", sneaky, remat=True))
    assert r.feasible


def test_an_option_error_is_still_misuse(chain3):
    from chainoffload.solvers import OptionError

    with pytest.raises(OptionError, match="slots"):
        solve(chain3, Platform(memory=1000, bandwidth_d2h=1.0, bandwidth_h2d=1.0), "rotor", slots=0)


def test_cli_user_method_failures_are_one_line_exit_1(capsys, tmp_path):
    chain = tmp_path / "c.json"
    tiny().save(chain)

    def malformed(chain, platform):
        return Result("x", Status.FEASIBLE, Schedule((("F", 1), ("B", 1))))

    def boom(chain, platform):
        raise KeyError("oops")

    for name in (_user("test-cli-malformed", malformed), _user("test-cli-boom", boom)):
        out_path = tmp_path / f"{name}.json"
        code, out, err = run(capsys, "solve", chain, "--memory", "1KiB", "--method", name, "--out", out_path)
        assert code == 1 and "Traceback" not in err and "status" in out and "error" in out
        assert not out_path.exists()
        code, out, err = run(capsys, "solve", chain, "--memory", "1KiB", "--method", name, "--json")
        assert code == 1 and json.loads(out)["status"] == "error"


# -- every file written atomically; nothing written on an error ---------------------------------


def test_out_is_atomic_when_the_write_fails(capsys, tmp_path):
    """`ulimit -f 1`: the write fails part-way; the old schedule must survive untouched."""
    chain = tmp_path / "c.json"
    Chain.from_dict(chain_dict(200)).save(chain)
    out_path = tmp_path / "s.json"
    old = json.dumps(Schedule.keep_all(3).to_dict())
    out_path.write_text(old)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (1024, hard))
    try:
        code, out, err = run(capsys, "solve", chain, "--memory", "1MiB", "--method", "keep-all", "--out", out_path)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_line_exit_2(code, out, err, str(out_path))
    assert out_path.read_text() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "s.json"]


def test_example_out_is_atomic(capsys, tmp_path, monkeypatch):
    import chainoffload._jsonio as jsonio

    target = tmp_path / "e.json"
    target.write_text("old")

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonio.os, "fsync", failing_fsync)
    one_line_exit_2(*run(capsys, "example", "tiny", "-o", target), "No space left")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["e.json"]


def test_plot_out_is_atomic(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    import chainoffload._jsonio as jsonio

    chain, sched, target = tmp_path / "c.json", tmp_path / "s.json", tmp_path / "o.png"
    tiny().save(chain)
    Schedule.keep_all(3).save(sched)
    target.write_bytes(b"old")
    monkeypatch.setattr(jsonio.os, "fsync", lambda fd: (_ for _ in ()).throw(OSError(5, "Input/output error")))
    one_line_exit_2(*run(capsys, "plot", chain, sched, "--memory", "1KiB", "-o", target), "Input/output error")
    assert target.read_bytes() == b"old" and sorted(p.name for p in tmp_path.iterdir()) == ["c.json", "o.png", "s.json"]


def test_no_file_is_written_when_the_command_fails(capsys, tmp_path):
    chain = tmp_path / "c.json"
    tiny().save(chain)
    out_path = tmp_path / "s.json"
    one_line_exit_2(*run(capsys, "solve", chain, "--memory", "10", "--out", out_path), "platform.memory")
    assert not out_path.exists()


def test_unexpected_exceptions_are_one_line(capsys, tmp_path, monkeypatch):
    from chainoffload.cli import commands

    def broken(args, out):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(commands, "_cmd_methods", broken)  # build_parser looks it up there
    code, out, err = run(capsys, "methods")
    assert code == 2 and err.count("\n") == 1 and "ZeroDivisionError: a bug" in err and "Traceback" not in err


# -- SIGINT: within a second, exit 130, no partial output -------------------------------------


SIGINT_SCRIPT = textwrap.dedent(
    """
    import sys, time
    import numpy as np
    from chainoffload import Result, Status, register
    from numba import njit
    from chainoffload.cli import main

    @njit(nogil=True)  # as the project's kernels (chainoffload._kernels.config)
    def spin(n):
        acc = 0.0
        for i in range(n):
            acc += np.sqrt(i + 1.0)
        return acc

    def slow(chain, platform):
        spin(10)  # compile first, then one long Numba call
        print("in the kernel", file=sys.stderr, flush=True)
        spin(10**12)
        return Result("slow", Status.INFEASIBLE)

    register("slow", slow, "one very long Numba call")
    sys.exit(main(sys.argv[1:]))
    """
)


def test_sigint_during_a_numba_call_exits_130_within_a_second(tmp_path, ctrl_c_child):
    chain = tmp_path / "c.json"
    tiny().save(chain)
    out_path = tmp_path / "s.json"
    proc = subprocess.Popen(
        [sys.executable, "-c", SIGINT_SCRIPT, "solve", str(chain), "--memory", "1KiB", "--method", "slow", "--out", str(out_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_child,
    )
    try:
        line = proc.stderr.readline()
        assert "in the kernel" in line, line
        time.sleep(0.3)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert out == "" and "Traceback" not in err and "SystemError" not in err
    assert err.strip() == "chainoffload: interrupted"
    assert elapsed < 1.0 + 2.0  # the target is one second; the slack is for a loaded CI machine
    assert not out_path.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.json"]


def test_red_team_inputs_through_the_real_entry_point(tmp_path):
    """The same cases in a real process: no traceback and no warning reaches the terminal
    (in-process, pytest would keep a warning to itself)."""
    files = {
        "deep.json": "[" * 100_000 + "]" * 100_000,
        "overflow.json": json.dumps(chain_dict(6, act=10**17, saved=10**18)),
        "zero.json": json.dumps(chain_dict(3, fwd=0.0, bwd=0.0)),
        "c.json": json.dumps(chain_dict(3)),
        "p70.json": f'{{"memory": {2**70}, "bandwidth_d2h": 1e9, "bandwidth_h2d": 1e9}}',
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    cases = [
        (["solve", "deep.json", "--memory", "1KiB"], 2, "nested too deeply"),
        (["solve", "overflow.json", "--memory", "9e18", "--method", "keep-all"], 2, "chain.saved"),
        (["solve", "c.json", "--platform", "p70.json", "--method", "keep-all"], 2, "platform.memory"),
        (["solve", "zero.json", "--memory", "1KiB", "--method", "keep-all", "--out", "s.json"], 0, ""),
        (["solve", "c.json", "--memory", "1KiB", "--bandwidth", "1e300", "--method", "keep-all"], 0, ""),
    ]
    for argv, code, pattern in cases:
        proc = subprocess.run([sys.executable, "-m", "chainoffload", *argv], cwd=tmp_path, capture_output=True, text=True)
        assert proc.returncode == code, (argv, proc.stderr)
        assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == (1 if code == 2 else 0), (argv, proc.stderr)
        assert pattern in proc.stderr, (argv, proc.stderr)
        if code == 0:
            assert "makespan" in proc.stdout


@pytest.mark.parametrize(
    "field, values, pattern",
    [
        ("fwd", [1.0, 10**400, 1.0], r"chain\.fwd: stage 2 has fwd=1000000.*; times must be finite"),
        ("act", [1, 2**60 - 1, 2**60, 1], r"chain\.act: stage 2 has act=1152921504606846976; sizes must stay below 2\^60"),
        ("saved", [1, np.int64(-3), 1], r"chain\.saved: stage 2 has saved=-3; sizes must be >= 0"),
    ],
)
def test_edge_values_name_the_stage(field, values, pattern):
    # A huge int is no OverflowError traceback; 2^60 - 1 is below the bound, exactly.
    with pytest.raises(ChainError, match=pattern):
        Chain.from_dict({**chain_dict(3), field: values})


def test_the_kernels_release_the_gil():
    """The CLI's Ctrl-C relies on it: a kernel that held the GIL would keep the main thread from
    handling SIGINT until the kernel returns (NOTE [ cli contract ])."""
    from chainoffload._kernels.config import JIT_OPTIONS

    assert JIT_OPTIONS["nogil"] is True


def test_a_failing_lp_bound_degrades_to_the_trivial_one(chain3, monkeypatch):
    import chainoffload.bounds.fluid as bounds

    def fails(chain, platform, **options):
        raise RuntimeError("fluid_lp: the glop LP solver ended with status 'abnormal'")

    monkeypatch.setattr(bounds, "lower_bound", fails)
    monkeypatch.setattr("chainoffload.bounds.milp.unit_milp", fails)  # the rung above it fails too
    # offload-all's makespan (127 s) is above the trivial and volume bounds (12 s), so the
    # bound ladder reaches the LP rung (keep-all's makespan is the trivial bound: no LP asked).
    r = solve(chain3, Platform(memory=192, bandwidth_d2h=1.0, bandwidth_h2d=1.0), "offload-all")
    assert r.status == Status.FEASIBLE and r.lower_bound == chain3.compute_time and r.info["bound"] == "trivial"
    assert "abnormal" in r.info["lower_bound_note"] and "sum(fwd) + sum(bwd)" in r.info["lower_bound_note"]
