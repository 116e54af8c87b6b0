"""The CLI's output contract in real processes (issue 22): no file left behind on any exit but 0
and 1, whatever goes wrong with stdout or when Ctrl-C comes; --out refuses inputs, devices and
empty paths and writes files with the umask's mode; numbers that are floored, refused or
survived; tables that stay readable at a million stages; tradeoff's progress and flags."""

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from chainoffload import Chain, ChainError, Platform, PlatformError, Schedule, ScheduleError, Transfer
from chainoffload.examples import tiny
from chainoffload.schedule_file import ScheduleFile
from chainoffload.units import parse_bytes

ROOT = Path(__file__).resolve().parents[1]
# The tree under test, not whatever copy the environment installed (a worktree's tests must run
# its own code; cwd is the temporary folder, so it cannot provide it).
ENV = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "CHAINOFFLOAD_PROGRESS": ""}


def popen(tmp_path, *argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "chainoffload", *map(str, argv)], cwd=tmp_path, env=ENV, text=True, **kw)


def cli(tmp_path, *argv, stdout=subprocess.PIPE, **kw):
    proc = popen(tmp_path, *argv, stdout=stdout, stderr=subprocess.PIPE, **kw)
    out, err = proc.communicate(timeout=300)
    return proc.returncode, out or "", err


def one_line_exit_2(code, err, *patterns):
    assert code == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err and "internal error" not in err, err
    for pattern in patterns:
        assert pattern in err, err


def listing(folder):
    return sorted(p.name for p in Path(folder).iterdir())


@pytest.fixture
def work(tmp_path):
    tiny().save(tmp_path / "c.json")
    return tmp_path


SOLVE = ("solve", "c.json", "--memory", "200", "--bandwidth", "25", "--method", "keep-all")
# Two cheap methods, two memories: a tradeoff of a second or two.
TRADEOFF = ("tradeoff", "c.json", "--bandwidth", "25", "--methods", "keep-all", "offload-all", "--points", "2")


# -- 1. nothing written on a non-zero exit, whatever happens to stdout ------------------------


def _full_stdout(work, argv):
    with open("/dev/full", "w") as full:
        return cli(work, *argv, stdout=full)


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_stdout_on_a_full_device_leaves_no_file(work):
    code, _, err = _full_stdout(work, SOLVE + ("--out", "s.json"))
    one_line_exit_2(code, err, "cannot write to stdout: No space left on device")
    assert listing(work) == ["c.json"]
    # An existing target keeps its old content.
    (work / "s.json").write_text("old")
    code, _, err = _full_stdout(work, SOLVE + ("--out", "s.json"))
    assert code == 2 and (work / "s.json").read_text() == "old" and listing(work) == ["c.json", "s.json"]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_tradeoff_plot_with_stdout_on_a_full_device_leaves_no_file(work):
    pytest.importorskip("matplotlib")
    code, _, err = _full_stdout(work, TRADEOFF + ("-o", "t.png"))
    one_line_exit_2(code, err, "No space left on device")
    assert listing(work) == ["c.json"]


def _closed_stdout():
    os.close(1)


@pytest.mark.parametrize("argv", [SOLVE + ("--out", "s.json"), ("example", "tiny", "-o", "e.json")])
def test_closed_stdout_is_misuse_and_leaves_no_file(work, argv):
    """Decision: a closed stdout is refused before any work, even by a command with nothing to
    print; fd 1 would otherwise go to the next file opened."""
    proc = popen(work, *argv, stdout=None, stderr=subprocess.PIPE, preexec_fn=_closed_stdout)
    _, err = proc.communicate(timeout=300)
    one_line_exit_2(proc.returncode, err, "stdout is closed")
    assert listing(work) == ["c.json"]


@pytest.mark.parametrize(
    "argv, target",
    [(SOLVE + ("--out", "s.json"), "s.json"), (SOLVE + ("--json", "--out", "s.json"), "s.json"), (TRADEOFF + ("-o", "t.png"), "t.png")],
)
def test_a_reader_that_went_away_leaves_no_file(work, argv, target):
    if target.endswith(".png"):
        pytest.importorskip("matplotlib")
    proc = popen(work, *argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # before the child has even imported numpy: its write meets EPIPE
    err = proc.stderr.read()
    proc.wait(timeout=300)
    one_line_exit_2(proc.returncode, err, "cannot write to stdout: Broken pipe")
    assert "Exception ignored" not in err
    assert listing(work) == ["c.json"]


def _long_chain(path, length):
    Chain([1e-3] * length, [2e-3] * length, [1] * (length + 1), [1] * length, name="long").save(path)


def test_ctrl_c_while_stdout_is_a_slow_pipe_leaves_no_file(work, ctrl_c_child):
    """The schedule's JSON (about 200 KB) does not fit in a pipe nobody reads: the child blocks
    in its write of stdout with the file ready beside its target. Ctrl-C then: 130, no file."""
    _long_chain(work / "long.json", 5000)
    (work / "s.json").write_text("old")
    proc = popen(work, "solve", "long.json", "--memory", "1MB", "--method", "keep-all", "--json", "--out", "s.json",
                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=ctrl_c_child)
    try:
        deadline = time.monotonic() + 120
        while not [p for p in work.iterdir() if p.name.startswith(".s.json.")]:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        time.sleep(1.0)  # the temporary is filled, then stdout is written and blocks
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert err.strip().endswith("chainoffload: interrupted") and "Traceback" not in err
    # At most what the pipe held (none if a slow machine had not started the write yet): exit
    # 130 says it is incomplete.
    assert len(out) < 200_000
    assert (work / "s.json").read_text() == "old" and listing(work) == ["c.json", "long.json", "s.json"]


def test_a_ctrl_c_delivered_before_the_rename_wins_though_not_yet_handled(tmp_path):
    """The race behind the slow-pipe test's rare exit 0: the reader drains stdout right after the
    Ctrl-C, the worker asks for the rename before the main thread has raised KeyboardInterrupt.
    The wakeup pipe says a SIGINT was handled: the rename is refused, the file removed, and the
    worker waits to be ended. Both ways: the worker deciding alone, and the main thread serving."""
    import threading

    from chainoffload import cli as cli_module

    def fill(tmp):
        Path(tmp).write_text("new")

    for served in (False, True):
        for delivered in (False, True):
            folder = tmp_path / f"{served}-{delivered}"
            folder.mkdir()
            r, w = os.pipe()
            os.set_blocking(r, False)
            try:
                gate = cli_module._Gate(r, served=served)
                pending = [gate.start(str(folder / "s.json"))]
                pending[0].fill(fill)
                if delivered:
                    os.write(w, bytes([signal.SIGINT]))
                worker = threading.Thread(target=gate.finish, args=(pending, 0), daemon=True)
                worker.start()
                if served:
                    gate.serve(5.0)  # this (main) thread decides, as the CLI's does
                worker.join(2.0)
            finally:
                os.close(r)
                os.close(w)
            if delivered:
                assert worker.is_alive() and gate.code is None and listing(folder) == [], (served, delivered)
            else:
                assert not worker.is_alive() and gate.code == 0 and (folder / "s.json").read_text() == "new", (served, delivered)


QUEUED_SIGINT = textwrap.dedent(
    """
    import os, signal, sys, threading, time
    from pathlib import Path
    from chainoffload import cli

    folder = Path(sys.argv[1])
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
    gate = cli._Gate(r, served=True)
    pending = [gate.start(str(folder / "s.json"))]
    pending[0].fill(lambda tmp: Path(tmp).write_text("new"))
    # A SIGINT queued for the main thread, its handler not run yet (on a loaded machine: the
    # main thread waiting for a CPU), held in the kernel's queue here by blocking it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    worker = threading.Thread(target=gate.finish, args=(pending, 0), daemon=True)
    worker.start()
    gate.serve(30.0)  # the worker asks for its rename; this thread decides
    state = f"{gate.code} {sorted(p.name for p in folder.iterdir())}"
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        for _ in range(100):
            time.sleep(0.01)
    except KeyboardInterrupt:
        print("interrupted", state, flush=True)
        os._exit(130)
    print("not interrupted", state, flush=True)
    """
)


def test_a_ctrl_c_still_queued_in_the_kernel_stops_the_rename(tmp_path, ctrl_c_child):
    """A SIGINT the kernel has queued but whose handler has not run yet is in no pipe: the main
    thread, deciding with SIGINT blocked, sees it pending (NOTE [ cli contract ])."""
    proc = subprocess.run([sys.executable, "-c", QUEUED_SIGINT, str(tmp_path)], capture_output=True, text=True, timeout=60, env=ENV,
                          preexec_fn=ctrl_c_child)
    assert proc.returncode == 130, proc.stdout + proc.stderr
    assert proc.stdout == "interrupted None []\n"


# -- 2. targets ------------------------------------------------------------------------------


@pytest.fixture
def inputs(work):
    Schedule.keep_all(3).save(work / "s.json")
    Platform(memory=180, bandwidth_d2h=25.0, bandwidth_h2d=25.0).save(work / "p.json")
    (work / "sub").mkdir()
    os.link(work / "c.json", work / "hard.json")
    os.symlink("c.json", work / "link.json")
    return work


@pytest.mark.parametrize(
    "argv, named",
    [
        (("solve", "c.json", "--memory", "180", "--out", "c.json"), "is the chain file"),
        (("solve", "c.json", "--memory", "180", "--out", "sub/../c.json"), "sub/../c.json is the chain file"),
        (("solve", "c.json", "--memory", "180", "--out", "hard.json"), "is the chain file (c.json)"),
        (("solve", "c.json", "--memory", "180", "--out", "link.json"), "is the chain file (c.json)"),
        (("solve", "c.json", "--platform", "p.json", "--out", "p.json"), "is the --platform file"),
        (("plot", "c.json", "s.json", "--memory", "180", "-o", "s.json"), "is the schedule file"),
        (("plot", "c.json", "s.json", "--memory", "180", "-o", "c.json"), "is the chain file"),
    ],
)
def test_out_naming_an_input_is_refused(inputs, argv, named):
    before = {p.name: p.read_bytes() for p in inputs.iterdir() if p.is_file()}
    code, out, err = cli(inputs, *argv)
    one_line_exit_2(code, err, "--out: ", named, "would replace an input")
    assert out == "" and {p.name: p.read_bytes() for p in inputs.iterdir() if p.is_file()} == before


def test_out_that_is_a_device_or_a_folder_is_refused(inputs):
    code, _, err = cli(inputs, *SOLVE, "--out", os.devnull)
    one_line_exit_2(code, err, f"--out: {os.devnull} is a character device", "refusing to replace it")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)
    code, _, err = cli(inputs, "example", "tiny", "-o", "sub")
    one_line_exit_2(code, err, "--out: sub is a folder")
    assert (inputs / "sub").is_dir() and listing(inputs / "sub") == []


@pytest.mark.parametrize("argv", [SOLVE + ("--out", ""), ("example", "tiny", "-o", "")])
def test_an_empty_out_is_refused(work, argv):
    code, out, err = cli(work, *argv)
    one_line_exit_2(code, err, "--out: the path is empty")
    assert out == "" and listing(work) == ["c.json"]


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_new_file_gets_the_umask_mode(work, umask, mode):
    code, _, err = cli(work, *SOLVE, "--out", "s.json", umask=umask)
    assert code == 0, err
    assert stat.S_IMODE(os.stat(work / "s.json").st_mode) == mode


def test_a_replaced_file_keeps_its_mode_and_a_link_stays_a_link(work):
    target = work / "s.json"
    target.write_text("old")
    os.chmod(target, 0o640)
    os.symlink("s.json", work / "to-s.json")
    code, _, err = cli(work, *SOLVE, "--out", "to-s.json", umask=0o022)
    assert code == 0, err
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o640 and (work / "to-s.json").is_symlink()
    assert json.loads(target.read_text())["chain"]["name"] == "tiny"
    assert listing(work) == ["c.json", "s.json", "to-s.json"]


def test_library_saves_follow_the_umask_too(tmp_path):
    old = os.umask(0o027)
    try:
        tiny().save(tmp_path / "c.json")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "c.json").st_mode) == 0o640


# -- 3. numbers ------------------------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [("166.6", 166), ("166.9999", 166), ("0.5KiB", 512), ("1.0009kB", 1000), (166.9, 166), ("1e-3", 0)])
def test_fractions_of_a_byte_are_floored(text, expected):
    assert parse_bytes(text) == expected


def test_a_fractional_memory_limit_is_never_exceeded(work):
    # tiny's least pure-offloading peak is 167 B: 166.6 B was rounded up to it, and best
    # returned a schedule above the limit given; floored, there is none.
    code, out, err = cli(work, "solve", "c.json", "--memory", "166.6", "--bandwidth", "25", "--method", "best", "--json", "--out", "s.json")
    assert code == 1 and json.loads(out)["schedule"] is None and "166 B" in json.loads(out)["message"], err
    assert listing(work) == ["c.json"]
    code, out, err = cli(work, "solve", "c.json", "--memory", "167.9", "--bandwidth", "25", "--method", "best", "--json", "--out", "s.json")
    assert code == 0 and json.loads(out)["peak_memory"] == 167, err
    assert json.loads((work / "s.json").read_text())["platform"]["memory"] == 167


@pytest.mark.parametrize(
    "name, text, flag",
    [
        ("c.json", '{"fwd": [1.0], "bwd": [1.0], "act": [1, 1], "saved": [1], "fwd": [2.0]}', "chain"),
        ("p.json", '{"memory": 100, "bandwidth_d2h": 1.0, "bandwidth_h2d": 1.0, "memory": 200}', "platform"),
        ("s.json", '{"compute": [["F", 1], ["B", 1]], "transfers": [], "chain": {"name": "a", "name": "b"}}', "schedule"),
    ],
)
def test_duplicate_json_keys_are_errors_naming_the_key(tmp_path, name, text, flag):
    (tmp_path / name).write_text(text)
    key = {"c.json": "fwd", "p.json": "memory", "s.json": "name"}[name]
    Chain([1.0], [1.0], [1, 1], [1]).save(tmp_path / "one.json")
    argv = {
        "c.json": ("solve", "c.json", "--memory", "1KiB"),
        "p.json": ("solve", "one.json", "--platform", "p.json"),
        "s.json": ("simulate", "one.json", "s.json", "--memory", "1KiB"),
    }[name]
    code, out, err = cli(tmp_path, *argv)
    one_line_exit_2(code, err, f"{name}: {flag}: duplicate key '{key}'")
    cls = {"c.json": Chain, "p.json": Platform, "s.json": ScheduleFile}[name]
    with pytest.raises((ChainError, PlatformError, ScheduleError), match=f"duplicate key '{key}'"):
        cls.from_json(text)


def test_fwd_tmp_and_bwd_tmp_default_to_zeros():
    data = {"fwd": [1.0, 2.0], "bwd": [2.0, 3.0], "act": [1, 2, 3], "saved": [4, 5]}
    chain = Chain.from_dict(data)
    assert chain.fwd_tmp.tolist() == [0, 0] and chain.bwd_tmp.tolist() == [0, 0]
    given = Chain.from_dict({**data, "fwd_tmp": [6, 7], "bwd_tmp": [8, 9]})
    assert given.fwd_tmp.tolist() == [6, 7] and given.bwd_tmp.tolist() == [8, 9]
    assert Chain.from_dict({**data, "fwd_tmp": [0, 0]}) == chain
    with pytest.raises(ChainError, match="missing field.*saved"):
        Chain.from_dict({k: v for k, v in data.items() if k != "saved"})


def test_a_chain_file_without_temporaries_solves(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"fwd": [1.0, 2.0], "bwd": [2.0, 3.0], "act": [1, 2, 3], "saved": [4, 5]}))
    code, out, err = cli(tmp_path, "solve", "c.json", "--memory", "1KiB", "--method", "keep-all", "--json")
    assert code == 0 and json.loads(out)["peak_memory"] == 1 + 4 + 5 + 3 + 2, err


@pytest.mark.parametrize("method", ["best", "dp"])
def test_a_huge_time_limit_is_no_limit(work, method):
    code, out, err = cli(work, "solve", "c.json", "--memory", "180", "--bandwidth", "25", "--method", method, "--time-limit", "1e308", "--json")
    result = json.loads(out)
    assert code == 0 and result["status"] in ("optimal", "feasible"), (result["message"], err)


def test_a_latency_beyond_the_cpsat_grid_is_one_line(work):
    Schedule.keep_all(3).save(work / "s.json")
    code, out, err = cli(work, "verify", "c.json", "s.json", "--memory", "200", "--latency", "1e308", "--time-limit", "5")
    one_line_exit_2(code, err, "platform.latency", "latency 1e+308 s")
    assert out == ""


def test_a_fingerprint_mismatch_shows_where_they_differ():
    chain = tiny()
    own = chain.fingerprint()
    # The same first 20 hex digits: 12 digits would print two identical prefixes.
    other = own[:27] + ("0" if own[27] != "0" else "1") + own[28:]
    record = ScheduleFile(Schedule.keep_all(3), chain_name="other", fingerprint=other)
    with pytest.raises(ScheduleError) as info:
        record.check_chain(chain)
    message = str(info.value)
    shown = [part.split("...")[0] for part in message.split("fingerprint ")[1:]]
    assert len(shown) == 2 and shown[0] != shown[1] and shown[0] == other[: len(shown[0])] and shown[1] == own[: len(shown[1])]


# -- 4. tables at a million stages -----------------------------------------------------------


def test_units_text_runs_and_elision():
    from chainoffload.cli.tables import _units_text

    assert _units_text([]) == "0 units"
    assert _units_text([4]) == "1 unit: 4"
    assert _units_text([1, 2, 3, 5, 7, 8]) == "6 units: 1-3, 5, 7-8"
    text = _units_text(range(1, 2001, 2))
    assert text.startswith("1000 units: 1, 3, 5,") and text.endswith("1995, 1997, 1999")
    assert "... (989 more in 989 runs) ..." in text and len(text) < 120


def test_a_table_line_stays_short_and_json_keeps_everything(tmp_path):
    length = 20_000
    _long_chain(tmp_path / "long.json", length)
    odd = range(1, length, 2)
    transfers = []
    for u in odd:
        transfers += [Transfer("offload", u, u - 1, "end"), Transfer("prefetch", u, 2 * length - u - 1, "end")]
    ScheduleFile(Schedule.from_units(length, transfers)).save(tmp_path / "s.json")
    code, out, err = cli(tmp_path, "simulate", "long.json", "s.json", "--memory", "1GB", "--bandwidth", "1GB/s")
    assert code in (0, 1), err
    line = next(ln for ln in out.splitlines() if ln.startswith("offloaded"))
    assert f"in {len(odd)} units: 1, 3," in line and "more in" in line and len(line) < 200
    code, out, err = cli(tmp_path, "solve", "long.json", "--memory", "1GB", "--bandwidth", "1GB/s", "--method", "offload-all", "--json")
    offloads = [t["unit"] for t in json.loads(out)["schedule"]["transfers"] if t["kind"] == "offload"]
    assert code == 0 and sorted(offloads) == list(range(1, length)), err  # every unit but the last


# -- 5. tradeoff -----------------------------------------------------------------------------


def test_tradeoff_refuses_memory(work):
    for flag in ("--memory", "--memory=1GB"):
        argv = TRADEOFF + ((flag, "1GB") if flag == "--memory" else (flag,))
        code, out, err = cli(work, *argv)
        one_line_exit_2(code, err, "--memory: tradeoff does not take one ('1GB')", "--memories")
        assert out == ""


@pytest.mark.parametrize(
    "argv, flag",
    [
        (("solve", "c.json", "--mem", "200", "--bandwidth", "25"), "--mem"),
        (SOLVE + ("--lat", "10us"), "--lat"),
        (SOLVE + ("--time", "5"), "--time"),
        (TRADEOFF + ("--memori", "1GB"), "--memori"),
    ],
)
def test_a_shortened_flag_is_an_error_not_the_flag_it_starts(work, argv, flag):
    # argparse would take --mem as --memory and --memori as tradeoff's --memories.
    code, out, err = cli(work, *argv)
    one_line_exit_2(code, err, f"unrecognized arguments: {flag}")
    assert out == "" and listing(work) == ["c.json"]


def test_tradeoff_progress(work):
    code, out, err = cli(work, *TRADEOFF, "--progress")
    assert code == 0 and "tradeoff" in err and "6/6 [" in err and "keep-all" in out, err
    code, out, err = cli(work, *TRADEOFF)  # stderr is a pipe here: quiet unless asked
    assert code == 0 and err == "" and "keep-all" in out
    code, out, err = cli(work, *TRADEOFF, "--progress", "--json")  # one JSON object, no bars
    assert code == 0 and err == "" and json.loads(out)["memories"]
