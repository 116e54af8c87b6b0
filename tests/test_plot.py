import pytest

from chainoffload import Platform, Schedule, Transfer, simulate
from chainoffload.cli import main
from chainoffload.plot import gantt_data

pytest.importorskip("matplotlib")


@pytest.fixture
def timeline(chain3):
    s = Schedule.from_units(
        3,
        [
            Transfer("offload", 1, 0, "end"),
            Transfer("offload", 2, 1, "end"),
            Transfer("prefetch", 1, 3, "end", before=4),
            Transfer("prefetch", 2, 2, "end"),
        ],
    )
    return simulate(chain3, Platform(memory=10**6, bandwidth_d2h=25.0, bandwidth_h2d=25.0), s)


def test_gantt_bars_equal_the_schedule(timeline):
    lanes = gantt_data(timeline)
    assert [b[0] for b in lanes["compute"]] == ["F_1", "F_2", "F_3", "B_3", "B_2", "B_1"]
    assert [b[0] for b in lanes["D2H"]] == ["O_1", "O_2"]
    assert [b[0] for b in lanes["H2D"]] == ["P_1", "P_2"]
    for name, start, end in lanes["D2H"] + lanes["H2D"]:
        t = [timeline.schedule.transfer_name(i) for i in range(4)].index(name)
        assert (start, end) == (timeline.transfer_start[t], timeline.transfer_end[t])


def test_half_duplex_has_one_lane(chain3, timeline):
    shared = simulate(chain3, timeline.platform.replace(duplex=False), timeline.schedule)
    lanes = gantt_data(shared)
    assert set(lanes) == {"compute", "D2H+H2D"} and len(lanes["D2H+H2D"]) == 4


def test_png_has_the_expected_size(tmp_path, timeline):
    from matplotlib.image import imread

    path = tmp_path / "t.png"
    timeline.plot(str(path), width=8, height=4, dpi=50)
    assert path.stat().st_size > 5000
    assert imread(path).shape[:2] == (200, 400)


def test_cli_plot(tmp_path, capsys, chain3, timeline):
    chain_path, sched_path, out = tmp_path / "c.json", tmp_path / "s.json", tmp_path / "o.png"
    chain3.save(chain_path)
    timeline.schedule.save(sched_path)
    assert main(["plot", str(chain_path), str(sched_path), "--memory", "1MB", "--bandwidth", "25", "-o", str(out)]) == 0
    assert out.stat().st_size > 5000
