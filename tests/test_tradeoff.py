"""chainoffload.tradeoff on the three-stage chain (floors by hand) and on the ResNet-18 example.

The chain (tests/conftest.py): keep-all peak 192 B (at the start of B_3: a_0 10, the three units
105, g_2 30, g_3 40, bwd_tmp 7). Stage floor 162 B: B_3 alone needs a_0 10 + its input a_2 30 +
saved[3] 45 + g_3 40 + g_2 30 + bwd_tmp 7 (Chain.stage_memory_floor); the offload floor is 167 B
(bounds.offload_memory_floor: B_3 also needs all of unit 2, 35 B, not only a_2). Compute time 12 s.
"""

import json
import math

import pytest

import chainoffload as co
from chainoffload import Platform, Status
from chainoffload.bounds import offload_memory_floor
from chainoffload.examples import resnet18
from chainoffload.tradeoff import DEFAULT_TRADEOFF_METHODS, Tradeoff, sweep_memories, tradeoff

LINK = Platform(memory=0, bandwidth_d2h=25.0, bandwidth_h2d=25.0)


@pytest.fixture(scope="module")
def tiny_curve():
    from chainoffload.examples import tiny

    return tradeoff(tiny(), LINK, ["keep-all", "offload-all", "best", "rotor"], points=3, time_limit=2.0)


def test_floors_peak_and_sweep(chain3, tiny_curve):
    t = tiny_curve
    assert (t.stage_floor, t.offload_floor, t.keep_all_peak) == (162, 167, 192)
    assert t.stage_floor == chain3.stage_memory_floor() and t.offload_floor == offload_memory_floor(chain3)
    # Three points evenly from the stage floor to the keep-all peak, plus the offload floor.
    assert t.memories == (162, 167, 177, 192) == sweep_memories(chain3, 3)
    assert sweep_memories(chain3, 3, offload_floor=False) == (162, 177, 192)
    assert t.compute_time == 12.0 and t.chain_name == "tiny" and t.methods == ("keep-all", "offload-all", "best", "rotor")
    assert t.platform.memory == 192 and t.platform.bandwidth_d2h == 25.0
    assert t.remat == {"keep-all": False, "offload-all": False, "best": False, "rotor": True}


def test_points_are_the_solvers_figures(chain3, tiny_curve):
    t = tiny_curve
    for method, points in t.curves.items():
        assert [p.memory for p in points] == list(t.memories)
        for p in points:
            again = co.solve(chain3, LINK.with_memory(p.memory), method, **({"time_limit": 2.0} if method == "best" else {}))
            assert p.status == again.status and p.result is not None
            if p.feasible:
                assert p.makespan == again.makespan and p.overhead == pytest.approx(p.makespan / 12.0 - 1)
                assert p.peak_memory <= p.memory
            else:
                assert math.isinf(p.makespan) and math.isinf(p.overhead)
    # keep-all fits at its peak only, with no overhead; nothing pure fits below the offload floor.
    assert [p.status for p in t.curves["keep-all"]] == [Status.INFEASIBLE] * 3 + [Status.OPTIMAL]
    assert t.overheads("keep-all")[-1] == 0.0 and t.min_memory("keep-all") == 192
    assert not t.curves["offload-all"][0].feasible and not t.curves["best"][0].feasible
    assert t.curves["rotor"][0].feasible and t.min_memory("rotor") == 162


def test_lower_bound_binds_every_pure_offloading_point(tiny_curve):
    t = tiny_curve
    assert math.isinf(t.lower_bound[0])  # 162 B is below the offload floor
    for j, bound in enumerate(t.lower_bound[1:], start=1):
        assert bound >= t.compute_time
        for m in ("offload-all", "best", "keep-all"):
            p = t.curves[m][j]
            if p.feasible:
                assert p.makespan >= bound * (1 - 1e-12)
    assert t.lower_bound_overheads()[1:] == pytest.approx([b / 12.0 - 1 for b in t.lower_bound[1:]])


def test_json_round_trip(tmp_path, tiny_curve):
    data = tiny_curve.to_dict()
    text = json.dumps(data, allow_nan=False)  # no inf or nan: JSON other tools can read
    back = Tradeoff.from_dict(json.loads(text))
    assert back.to_dict() == data
    assert data["offload_memory_floor"] == 167 and data["stage_memory_floor"] == 162 and data["keep_all_peak"] == 192
    assert data["lower_bound"][0] is None and data["methods"]["keep-all"]["min_memory"] == 192
    assert data["methods"]["rotor"]["points"][0]["status"] in ("optimal", "feasible")
    assert "memory" not in data["platform"]
    with pytest.raises(ValueError, match="missing key 'memories'"):
        Tradeoff.from_dict({k: v for k, v in data.items() if k != "memories"})


def test_given_memories_and_default_methods(chain3):
    t = tradeoff(chain3, LINK, memories=[192, 170, 170.0], time_limit=1.0)
    assert t.memories == (170, 192) and t.methods == DEFAULT_TRADEOFF_METHODS


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"memories": [100]}, r"memories\[0\]: 100 B is below 162 B, the least any schedule of chain 'tiny' needs"),
        ({"memories": [170, 170.5]}, r"memories\[1\]: expected a whole number of bytes, got 170.5"),
        ({"memories": []}, "memories: expected at least one memory limit"),
        ({"methods": ["nope"]}, r"unknown method 'nope'; known: keep-all"),
        ({"methods": []}, "methods: expected at least one method name"),
        ({"points": 1}, "points: expected an integer >= 2, got 1"),
        ({"time_limit": 0}, r"time_limit: expected a finite number of seconds > 0 or None, got 0"),
        ({"time_limit": math.inf}, r"time_limit: expected a finite number of seconds > 0 or None, got inf"),
        ({"time_limit": True}, r"time_limit: expected a finite number of seconds > 0 or None, got True"),
    ],
)
def test_bad_input_names_the_field(chain3, kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        tradeoff(chain3, LINK, **{"methods": ["rotor"], **kwargs})


def test_unknown_method_in_a_result_query(tiny_curve):
    with pytest.raises(ValueError, match="method 'joint' was not swept; swept: keep-all, offload-all, best, rotor"):
        tiny_curve.overheads("joint")


def test_plot_reads(tmp_path):
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt
    from matplotlib.image import imread

    chain = resnet18()
    t = tradeoff(chain, Platform(memory=0, bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5), ["offload-all", "first-k", "rotor"], points=4)
    assert max(t.overheads("offload-all")[1:]) > 1.0  # offload-all explodes at 12 GB/s
    path = tmp_path / "t.png"
    fig = t.plot(str(path), dpi=50)
    assert imread(path).shape[:2] == (int(5.6 * 50), int(11 * 50))
    ax = fig.axes[0]
    assert ax.get_yscale() == "symlog"  # so that 800 % does not squash 5 %
    # The legend is outside the axes, on the right.
    fig.canvas.draw()
    legend_box = ax.get_legend().get_window_extent()
    assert legend_box.x0 >= ax.get_window_extent().x1
    labels = [x.get_text() for x in ax.get_legend().get_texts()]
    assert "rotor (recomputes)" in labels and "lower bound, pure offloading" in labels
    assert any(x.startswith("offload floor") for x in labels) and any(x.startswith("keep-all peak") for x in labels)
    xs = sorted(round(line.get_xdata()[0] * 2**30) for line in ax.lines if len(set(line.get_xdata())) == 1)
    assert xs == sorted([t.stage_floor, t.offload_floor, t.keep_all_peak])
    assert any("Overhead = simulated makespan" in x.get_text() for x in fig.texts)  # the caption
    plt.close(fig)
    with pytest.raises(ValueError, match="yscale: expected 'auto', 'symlog' or 'linear', got 'log2'"):
        t.plot(yscale="log2")


def test_cli_tradeoff(tmp_path, capsys, chain3):
    from chainoffload.cli import main

    path = tmp_path / "c.json"
    chain3.save(path)
    # No --memory: the sweep sets it.
    assert main(["tradeoff", str(path), "--bandwidth", "25", "--methods", "offload-all", "rotor", "--points", "3"]) == 0
    out = capsys.readouterr().out
    assert "stage floor    162 B: no schedule fits below (proven)" in out
    assert "offload floor  167 B: no schedule without recomputation fits below (proven)" in out
    assert "keep-all peak  192 B: everything fits, no overhead" in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["memory"])
    assert lines[head].split() == ["memory", "offload-all", "rotor", "lower", "bound"]
    assert [line.split()[0] for line in lines[head + 1 :]] == ["162", "167", "177", "192"]
    assert lines[head + 1].split()[2] == "-"  # 162 B: offload-all finds nothing, the bound is infinite

    png = tmp_path / "t.png"
    assert main(["tradeoff", str(path), "--bandwidth", "25", "--methods", "rotor", "--memories", "170,192", "--json", "-o", str(png)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["memories"] == [170, 192] and list(data["methods"]) == ["rotor"] and png.stat().st_size > 5000

    assert main(["tradeoff", str(path), "--memories", "100"]) == 2
    assert "memories[0]: 100 B is below 162 B" in capsys.readouterr().err
    assert main(["tradeoff", str(path), "--methods", "nope"]) == 2
    assert "unknown method 'nope'" in capsys.readouterr().err


def test_the_bound_never_rises_with_memory():
    # CP-SAT proves a better bound than the LP at some memories; a bound at a larger memory
    # holds at a smaller one (what fits in less fits in more), so the curve is non-increasing.
    from chainoffload.tradeoff import _monotone

    assert _monotone([math.inf, 5.0, 3.0, 4.0, 1.0]) == (math.inf, 5.0, 4.0, 4.0, 1.0)
    t = tradeoff(resnet18(), Platform(memory=0, bandwidth_d2h=50e9, bandwidth_h2d=50e9, latency=1e-5), ["offload-all", "best"], points=5, time_limit=1.0)
    finite = [b for b in t.lower_bound if math.isfinite(b)]
    assert finite == sorted(finite, reverse=True)


def test_options_reach_every_method(chain3):
    # keep=[2]: no schedule of the sweep offloads unit 2; a method that does not take keep= says so.
    t = tradeoff(chain3, LINK, ["offload-all", "best"], memories=[167, 192], time_limit=1.0, keep=[2])
    for m in t.methods:
        for p in t.curves[m]:
            if p.feasible:
                assert 2 not in p.result.schedule.offloaded_units
    with pytest.raises(ValueError, match="method 'rotor' does not take keep"):
        tradeoff(chain3, LINK, ["rotor"], memories=[192], keep=[2])


def _figures(t):
    """Every figure of a sweep but the runtimes: what must not depend on the machine."""
    data = t.to_dict()
    for entry in data["methods"].values():
        for p in entry["points"]:
            p.pop("runtime")
    return data


def test_the_default_sweep_reads_no_clock(monkeypatch):
    # NOTE [ a sweep without a clock ]: with no time limit, the same call gives the same table
    # whatever the clock says. The second sweep runs with a clock that jumps 1000 s at every
    # reading, as on a machine a million times slower: any decision taken by the clock (a start
    # skipped, a search cut short, a bound rung left out) would change a figure.
    import time

    chain = resnet18()
    link = Platform(memory=0, bandwidth_d2h=25e9, bandwidth_h2d=25e9, latency=1e-5)
    first = tradeoff(chain, link, points=3)
    assert first.time_limit is None and first.clocked == ()
    assert first.methods == DEFAULT_TRADEOFF_METHODS
    ticks = iter(range(10**9))
    monkeypatch.setattr(time, "perf_counter", lambda: 1000.0 * next(ticks))
    again = tradeoff(chain, link, points=3)
    monkeypatch.undo()
    assert _figures(again) == _figures(first)
    # best, by its work budget: a feasible schedule at every point at or above the offload floor.
    assert all(p.feasible for p in first.curves["best"] if p.memory >= first.offload_floor)


def test_a_time_limit_is_recorded_and_names_the_clocked_methods(chain3):
    t = tradeoff(chain3, LINK, ["offload-all", "best", "rotor"], memories=[192], time_limit=1.5)
    # Every method takes a time limit (rotor's estimate of its table included): all clocked.
    assert t.time_limit == 1.5 and t.clocked == ("offload-all", "best", "rotor")
    untimed = tradeoff(chain3, LINK, ["best", "cpsat"], memories=[192])
    # cpsat's own default is a wall clock (60 s): listed, even without a time limit.
    assert untimed.time_limit is None and untimed.clocked == ("cpsat",)
    data = json.loads(json.dumps(t.to_dict()))
    assert data["time_limit"] == 1.5 and data["clocked"] == ["offload-all", "best", "rotor"]
    assert Tradeoff.from_dict(data).to_dict() == data
    # A table written before these keys existed ran under a time limit: every method clocked.
    old = {k: v for k, v in data.items() if k not in ("time_limit", "clocked")}
    assert Tradeoff.from_dict(old).clocked == ("offload-all", "best", "rotor")


def test_cli_tradeoff_prints_the_same_table_twice(tmp_path, capsys, chain3):
    from chainoffload.cli import main

    path = tmp_path / "c.json"
    chain3.save(path)
    argv = ["tradeoff", str(path), "--bandwidth", "25", "--methods", "first-k", "best", "--points", "3"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert "stopped by     work budgets, no clock: the same figures on any machine\n" in first
    assert main(argv) == 0
    assert capsys.readouterr().out == first
    assert main(argv + ["--time-limit", "2"]) == 0
    assert "stopped by     a time limit of 2 s per run: figures may depend on the machine" in capsys.readouterr().out
    assert main(["tradeoff", str(path), "--methods", "cpsat", "--memories", "192"]) == 0
    assert "work budgets, no clock: the same figures on any machine, except cpsat (its own wall-clock limit)" in capsys.readouterr().out
    assert main(argv + ["--time-limit", "-1"]) == 2
    assert "time_limit: expected a finite number of seconds > 0 or None, got -1.0" in capsys.readouterr().err


# -- the recomputing policies users know, side by side with the methods that plan recomputation --


def test_default_methods_show_the_policies_users_know():
    assert {"offload-all", "first-k", "checkpoint-all", "sqrt-checkpoint", "rotor", "joint"} <= set(DEFAULT_TRADEOFF_METHODS)


def test_a_sweep_has_a_point_at_each_fixed_policys_peak():
    # At the memory checkpointing every block holds, the policy fits with no byte to spare; the
    # methods whose family holds it are never slower there (NOTE [ never lose to the family ]).
    from chainoffload.generators import transformer_chain
    from chainoffload.tradeoff import policy_peak

    chain = transformer_chain("bert", 8)
    link = Platform(memory=0, bandwidth_d2h=12e9, bandwidth_h2d=12e9, latency=1e-5)
    t = tradeoff(chain, link, ["checkpoint-all", "sqrt-checkpoint", "rotor", "joint"], points=3)
    assert set(t.policy_peaks) == {"checkpoint-all", "sqrt-checkpoint"}
    for name, peak in t.policy_peaks.items():
        assert peak == policy_peak(chain, name) == co.solve(chain, link.with_memory(peak), name).peak_memory
        assert peak in t.memories
        j = t.memories.index(peak)
        policy = t.curves[name][j]
        assert policy.feasible and (j == 0 or not t.curves[name][j - 1].feasible)
        for method in ("rotor", "joint"):
            assert t.curves[method][j].makespan <= policy.makespan, (name, method)
    assert sweep_memories(chain, 3, policies=["checkpoint-all"]) == tuple(
        sorted(set(sweep_memories(chain, 3)) | {t.policy_peaks["checkpoint-all"]}))
    with pytest.raises(ValueError, match="policy: 'rotor'"):
        sweep_memories(chain, 3, policies=["rotor"])
    # Given memories are not changed; the peaks are still reported.
    given = tradeoff(chain, link, ["checkpoint-all"], memories=[t.keep_all_peak])
    assert given.memories == (t.keep_all_peak,) and given.policy_peaks == {"checkpoint-all": t.policy_peaks["checkpoint-all"]}
    data = json.loads(json.dumps(t.to_dict()))
    assert data["policy_peaks"] == t.policy_peaks and Tradeoff.from_dict(data).to_dict() == data
    assert Tradeoff.from_dict({k: v for k, v in data.items() if k != "policy_peaks"}).policy_peaks == {}


def test_cli_tradeoff_names_the_policies_peaks(tmp_path, capsys):
    from chainoffload.cli import main
    from chainoffload.generators import transformer_chain
    from chainoffload.units import format_bytes

    chain = transformer_chain("llama", 8)
    path = tmp_path / "llama.json"
    chain.save(path)
    assert main(["tradeoff", str(path), "--bandwidth", "12GB/s", "--methods", "checkpoint-all", "sqrt-checkpoint", "rotor",
                 "--points", "2"]) == 0
    out = capsys.readouterr().out
    from chainoffload.tradeoff import policy_peak

    peak = format_bytes(policy_peak(chain, "checkpoint-all"))
    assert f"checkpoint-all peak   {peak}: what checkpointing every block (HF gradient_checkpointing_enable) holds" in out
    assert "sqrt-checkpoint peak  " in out
    lines = out.splitlines()
    head = next(i for i, line in enumerate(lines) if line.split()[:1] == ["memory"])
    assert lines[head].split() == ["memory", "checkpoint-all", "sqrt-checkpoint", "rotor", "lower", "bound"]
    row = next(line for line in lines[head + 1:] if line.strip().startswith(peak))
    cells = row.split()[2:]
    assert cells[0] != "-" and float(cells[2].rstrip("%")) <= float(cells[0].rstrip("%"))
