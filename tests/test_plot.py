import html as html_lib
import os
import re
import shutil
import subprocess

import numpy as np
import pytest

from chainoffload import Platform, Schedule, Transfer, keep_all_peak, simulate
from chainoffload.cli import main
from chainoffload.plot import gantt_data, plot_timeline
from chainoffload.units import format_seconds

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
    # At 25 B/s: P_2 waits for O_2 ([3, 4.4]) and arrives at 5.8, B_3 idles 1.8 s; P_1, triggered at
    # the end of B_3 (7.8), arrives at 8.8, B_2 idles 1 s. The bound is the LP's.
    assert capsys.readouterr().out == (
        f"wrote {out}: makespan 14.800 s, lower bound 12.000 s; compute idle 2.800 s (19% of the makespan) in 2 stalls: "
        "2.800 s for prefetches to arrive (P_2, P_1)\n"
    )


def test_cli_plot_html_and_options(tmp_path, capsys, chain3, timeline):
    pytest.importorskip("plotly")
    chain_path, sched_path, out = tmp_path / "c.json", tmp_path / "s.json", tmp_path / "o.html"
    chain3.save(chain_path)
    timeline.schedule.save(sched_path)
    argv = ["plot", str(chain_path), str(sched_path), "--memory", "1MB", "--bandwidth", "25", "-o", str(out)]
    assert main(argv + ["--method", "by-hand", "--no-bound"]) == 0
    html = out.read_text()
    assert "tiny (by-hand): makespan 14.800 s" in html and "lower bound" not in html.split("tiny (by-hand)")[1][:200]
    assert capsys.readouterr().out.startswith(f"wrote {out}: makespan 14.800 s; compute idle")
    assert main(argv + ["--title", "my own title", "--no-stalls"]) == 0
    assert "my own title" in out.read_text() and "idle: waiting for" not in out.read_text()


# -- the chart that explains the time ----------------------------------------------------------


@pytest.fixture
def waiting(chain3):
    # Two stalls of known cause (tests/test_stalls.py): F_3 waits [3, 4] for O_1 (explicit), B_2
    # waits [7, 8] for P_1 (it reads unit 1).
    s = Schedule.from_units(3, [Transfer("offload", 1, 0, "end", before=2), Transfer("prefetch", 1, 3, "end")])
    return simulate(chain3, Platform(memory=10**6, bandwidth_d2h=25 / 3, bandwidth_h2d=25.0, latency=0.0), s)


def test_stalls_are_shaded_labelled_and_point_at_the_op(waiting):
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    fig = plot_timeline(waiting, lower_bound=12.0, method="mine", width=30)  # wide: the longest labels fit
    ax = fig.axes[0]
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch() == "////"]
    assert [(p.get_x(), p.get_x() + p.get_width()) for p in hatched] == [(3.0, 4.0), (7.0, 8.0)]
    texts = {t.get_text() for t in ax.texts}
    assert {"F_3 waits for O_1", "B_2 waits for P_1"} <= texts
    # One arrow per stall, from the end of the copy to the start of the op it holds back.
    arrows = [(a.xyann, a.xy) for a in ax.texts if hasattr(a, "arrow_patch") and a.arrow_patch is not None]
    assert [(round(src[0], 9), round(dst[0], 9)) for src, dst in arrows] == [(4.0, 4.0), (8.0, 8.0)]
    title = fig._suptitle.get_text()
    assert "tiny (mine): makespan 14.000 s (+16.7% over compute), lower bound 12.000 s (gap 16.7%), feasible" in title
    assert "976.56 KiB, D2H 8.33 B/s, H2D 25 B/s, latency 0.0 us, duplex" in title
    assert "compute idle 14% of the time: 7% for offloads, 7% for prefetches" in title
    plt.close(fig)


def test_labels_do_not_overlap_at_100_stages():
    import matplotlib.pyplot as plt

    from chainoffload import solve
    from chainoffload.generators import random_chain

    chain = random_chain(7, 100)
    memory = (co_floor(chain) + keep_all_peak(chain)) // 2
    result = solve(chain, Platform(memory=memory, bandwidth_d2h=2e9, bandwidth_h2d=2e9), "offload-all")
    assert result.feasible
    fig = plot_timeline(result.timeline)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if t.get_text() and not hasattr(t, "arrow_patch")]
    assert len(labels) >= 5
    boxes = [(t.get_position()[1], t.get_window_extent(renderer)) for t in labels]
    for i, (y1, b1) in enumerate(boxes):
        for y2, b2 in boxes[i + 1 :]:
            if y1 == y2:
                assert not b1.overlaps(b2), "two labels of one lane overlap"
    plt.close(fig)


def co_floor(chain):
    from chainoffload.bounds import offload_memory_floor

    return offload_memory_floor(chain)


def test_run_labels_group_narrow_bars():
    from chainoffload.plot import _labels

    bars = [("F_1", 0.0, 2.0), ("F_2", 2.0, 4.0), ("F_3", 4.0, 6.0), ("B_3", 6.0, 16.0), ("B_2", 17.0, 18.0)]

    def fits(text, width):
        return width >= len(text)  # one unit of width per character

    # F_1..F_3 are too narrow alone (2 < 3) and together too narrow for "F_1..F_3" (6 < 8).
    assert _labels(bars, fits) == [(3.0, "F 1-3"), (11.0, "B_3")]
    # A run ends at idle time: F_1 and F_2 are back to back, F_3 comes after a gap.
    gapped = [("F_1", 0.0, 2.5), ("F_2", 2.5, 5.0), ("F_3", 6.0, 7.0)]
    assert _labels(gapped, fits, gap=0.5) == [(2.5, "F 1-2")]
    assert _labels(gapped, fits, gap=2.0) == [(3.5, "F 1-3")]


# -- the interactive HTML ----------------------------------------------------------------------


def test_html_is_self_contained_and_hover_has_the_figures(tmp_path, waiting):
    pytest.importorskip("plotly")
    path = tmp_path / "t.html"
    fig = plot_timeline(waiting, str(path), lower_bound=12.0)
    html = path.read_text()
    # No script or stylesheet from the network: it opens offline.
    assert not re.search(r"<script[^>]+src=", html) and not re.search(r"<link[^>]+href=\"http", html)
    assert len(html) > 1_000_000  # plotly.js is inside
    names = {t.name for t in fig.data}
    assert {"forward F_i", "backward B_i", "offload O_i (D2H)", "prefetch P_i (H2D)"} <= names
    assert {"idle: waiting for O_i to free memory", "idle: waiting for P_j to arrive"} <= names
    fwd = next(t for t in fig.data if t.name == "forward F_i")
    # F_1 [0, 1]: keeps unit 1 (25 B) with 5 B transient; memory a_0 + 25 + 5 = 40 B, then 35 B
    # after its end (the transient freed), so at most 40 B during it.
    assert list(fwd.customdata[0]) == ["F_1", 0.0, 1.0, 1.0, "keeps unit 1: 25 B; transient 5 B", "40 B", "40 B"]
    assert "start %{customdata[1]:.4g} s" in fwd.hovertemplate and "memory in use" in fwd.hovertemplate
    off = next(t for t in fig.data if t.name == "offload O_i (D2H)")
    assert off.customdata[0][0] == "O_1" and "copies unit 1: 25 B; triggered at the end of F_1; F_3 waits for it" in off.customdata[0][4]
    assert len(fig.layout.annotations) == 2  # the wait arrows
    assert "lower bound 12.000 s" in fig.layout.title.text


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def test_html_renders_and_hovers_in_a_headless_browser(tmp_path, waiting):
    """A real browser opens the file offline, draws the bars and shows a hover label."""
    pytest.importorskip("plotly")
    browser = _chromium()
    if browser is None:
        why = "chromium not found: this check of the HTML needs a headless browser (Debian: apt-get install chromium)"
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{why}; .ci/run installs it, so CI must have it")  # no test skips in CI
        pytest.skip(why)
    from matplotlib.image import imread

    path = tmp_path / "t.html"
    plot_timeline(waiting, str(path))
    # Hover the bar of B_2 (trace 1 is the backward ops, point 1 is B_2) once the page is drawn.
    hook = (
        "<script>window.addEventListener('load', function () {"
        " var gd = document.getElementsByClassName('plotly-graph-div')[0];"
        " Plotly.Fx.hover(gd, [{curveNumber: 1, pointNumber: 1}], 'xy'); });</script></body>"
    )
    hovered = tmp_path / "hover.html"
    hovered.write_text(path.read_text().replace("</body>", hook))
    flags = [
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000", "--hide-scrollbars",
    ]
    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, "--window-size=1200,760", f"--screenshot={shot}", hovered.as_uri()],
                   capture_output=True, timeout=120, check=True)
    dom = subprocess.run([browser, *flags, "--dump-dom", hovered.as_uri()], capture_output=True, text=True, timeout=120, check=True).stdout
    assert 'class="main-svg"' in dom  # plotly.js ran, from the file itself
    hover = re.search(r'class="hovertext".*?data-unformatted="([^"]*)"', dom, re.S)
    assert hover is not None, "no hover label in the rendered page"
    text = html_lib.unescape(hover.group(1))
    assert "<b>B_2</b><br>start 8.000 s, end 12.00 s (4.000 s)<br>makes g_1: 20 B; transient 7 B; frees unit 2: 35 B" in text
    # B_2 starts at 8 with a_0, units 1 and 2, g_2 (made by B_3), then allocates g_1 and bwd_tmp:
    # 10 + 25 + 35 + 30 + 20 + 7 = 127 B.
    assert "memory in use: 127 B at its start, at most 127 B during it" in text
    image = imread(shot)[:, :, :3]

    def pixels(hex_color):
        rgb = np.array([int(hex_color[i : i + 2], 16) for i in (1, 3, 5)]) / 255
        return int((np.abs(image - rgb).max(axis=2) < 0.03).sum())

    # The bars are drawn: forward, backward, offload and prefetch colours each cover an area.
    for color in ("#4C72B0", "#DD8452", "#55A868", "#C44E52"):
        assert pixels(color) > 500, f"no {color} bars in the screenshot"


def test_cli_plot_takes_the_recorded_bound_only_where_it_holds(tmp_path, capsys, monkeypatch, chain3):
    # plot reuses the bound a schedule file records for its own chain, platform and makespan
    # (its MILP rung is half the README's main job on a cold start, issue 22); a flag that
    # changes the platform, or a file without the figures, makes it climb the ladder itself.
    import json

    import chainoffload.bounds as bounds

    chain_path, sched_path = tmp_path / "c.json", tmp_path / "s.json"
    chain3.save(chain_path)
    assert main(["solve", str(chain_path), "--memory", "170", "--bandwidth", "25", "--method", "dp", "--out", str(sched_path)]) == 0
    recorded = json.loads(sched_path.read_text())["solver"]["lower_bound"]
    climbed = []
    real = bounds.problem_bound
    monkeypatch.setattr(bounds, "problem_bound", lambda *a, **k: climbed.append(1) or real(*a, **k))
    capsys.readouterr()
    out = tmp_path / "o.svg"
    assert main(["plot", str(chain_path), str(sched_path), "-o", str(out)]) == 0
    assert climbed == [] and f"lower bound {format_seconds(recorded)};" in capsys.readouterr().out
    assert main(["plot", str(chain_path), str(sched_path), "--latency", "1ms", "-o", str(out)]) == 0
    assert climbed == [1]
    bare = json.loads(sched_path.read_text())
    del bare["solver"]["lower_bound"]
    sched_path.write_text(json.dumps(bare))
    capsys.readouterr()
    assert main(["plot", str(chain_path), str(sched_path), "-o", str(out)]) == 0
    assert climbed == [1, 1] and f"lower bound {format_seconds(recorded)};" in capsys.readouterr().out
