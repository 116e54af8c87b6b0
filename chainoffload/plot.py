"""Pictures: a Gantt chart that explains a schedule's time, and the memory / overhead trade-off.

* :func:`gantt_data` (core only): the bars of each lane.
* :func:`plot_timeline` (matplotlib, ``pip install chainoffload[plot]``): compute and transfer
  lanes over the memory curve, with every stall shaded and labelled with its cause (see
  :func:`chainoffload.stalls`), an arrow from each copy to the op it holds back, and the
  platform and lower bound in the title. A path ending in ``.html`` gives
  :func:`plot_timeline_html` instead.
* :func:`plot_timeline_html` (Plotly): the same chart as one self-contained, interactive HTML
  file (no network needed to open it) where hovering shows each op's and copy's start, end,
  bytes and the memory in use.
* :func:`plot_tradeoff` (matplotlib): overhead against memory per method from
  :func:`chainoffload.tradeoff`, with the proven floors, the keep-all peak and the lower bound.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from .stalls import stalls as find_stalls
from .units import format_bytes, format_percent, format_seconds

if TYPE_CHECKING:
    from .simulate import Timeline
    from .tradeoff import Tradeoff

__all__ = ["gantt_data", "plot_timeline", "plot_timeline_html", "plot_tradeoff"]

_COLORS = {"F": "#4C72B0", "Fck": "#8172B2", "Fn": "#64B5CD", "B": "#DD8452", "O": "#55A868", "P": "#C44E52"}
#: Stall shading by cause: waiting for an offload (to free memory) or for a prefetch (to arrive).
_STALL_COLORS = {"offload": "#2E7D32", "prefetch": "#B71C1C"}
_STALL_LABELS = {
    "offload": "idle: waiting for O_i to free memory",
    "prefetch": "idle: waiting for P_j to arrive",
}


def gantt_data(timeline: Timeline) -> dict[str, list[tuple[str, float, float]]]:
    """Bars of each lane: ``{"compute": [...], "D2H": [...], "H2D": [...]}`` (``"D2H+H2D"`` when half duplex).

    Each bar is ``(name, start, end)`` in seconds, e.g. ``("F_3", 0.01, 0.012)`` or ``("O_2", ...)``.
    Transfers are listed in the order of the schedule's transfer list.
    """
    schedule = timeline.schedule
    lanes: dict[str, list[tuple[str, float, float]]] = {"compute": []}
    for k in range(len(schedule.compute)):
        lanes["compute"].append((schedule.op_name(k), float(timeline.op_start[k]), float(timeline.op_end[k])))
    duplex = timeline.platform.duplex
    if duplex:
        lanes["D2H"], lanes["H2D"] = [], []
    else:
        lanes["D2H+H2D"] = []
    for t, tr in enumerate(schedule.transfers):
        lanes[_lane_of(tr.kind, duplex)].append(
            (schedule.transfer_name(t), float(timeline.transfer_start[t]), float(timeline.transfer_end[t]))
        )
    return lanes


def _lane_of(kind: str, duplex: bool) -> str:
    return ("D2H" if kind == "offload" else "H2D") if duplex else "D2H+H2D"


def _time_unit(makespan: float) -> tuple[float, str]:
    if makespan >= 10:
        return 1.0, "s"
    if makespan >= 1e-2:
        return 1e3, "ms"
    return 1e6, "us"


def _byte_unit(peak: float) -> tuple[float, str]:
    for factor, name in ((1024**3, "GiB"), (1024**2, "MiB"), (1024, "KiB")):
        if peak >= factor:
            return float(factor), name
    return 1.0, "B"


def _matplotlib() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install chainoffload[plot]") from None
    return plt


# -- what the title and the hover texts say ----------------------------------------------------


def _stall_totals(found: Sequence[Any]) -> dict[str, float]:
    totals = {cause: 0.0 for cause in _STALL_COLORS}
    for s in found:
        totals[s.cause] += s.duration
    return totals


def _title_lines(timeline: Timeline, lower_bound: float | None, found: Sequence[Any], method: str | None = None) -> list[str]:
    """Headline (makespan, overhead, bound, verdict) and the platform and idle-time line."""
    makespan = timeline.makespan
    who = f"{timeline.chain.name}" + (f" ({method})" if method else "")
    head = f"{who}: makespan {format_seconds(makespan)} (+{100 * timeline.overhead:.1f}% over compute)"
    if lower_bound is not None and math.isfinite(lower_bound) and lower_bound > 0:
        head += f", lower bound {format_seconds(lower_bound)} (gap {100 * (makespan / lower_bound - 1):.1f}%)"
    v = timeline.violation
    head += ", feasible" if v is None else f", INFEASIBLE ({v.rule} rule broken by {v.op})"
    line = timeline.platform.describe()
    totals = _stall_totals(found)
    idle = sum(totals.values())
    if makespan > 0 and idle > 0:
        parts = [f"{format_percent(totals[c] / makespan)} for {'offloads' if c == 'offload' else 'prefetches'}" for c in totals if totals[c] > 0]
        line += f"; compute idle {format_percent(idle / makespan)} of the time: " + ", ".join(parts)
    elif makespan > 0:
        line += "; compute never idles"
    return [head, line]


def _op_bytes(timeline: Timeline, kind: str, stage: int) -> str:
    """What a compute op allocates and frees, in docs/model.md's terms, for hover texts."""
    c = timeline.chain
    i = stage - 1
    if kind == "F":
        return f"keeps unit {stage}: {format_bytes(int(c.saved[i]))}; transient {format_bytes(int(c.fwd_tmp[i]))}"
    if kind in ("Fck", "Fn"):
        return f"makes a_{stage}: {format_bytes(int(c.act[stage]))}; transient {format_bytes(int(c.fwd_tmp[i]))}"
    return (
        f"makes g_{stage - 1}: {format_bytes(int(c.act[stage - 1]))}; transient {format_bytes(int(c.bwd_tmp[i]))}; "
        f"frees unit {stage}: {format_bytes(int(c.saved[i]))}"
    )


def _memory_curve(timeline: Timeline) -> tuple[np.ndarray, np.ndarray]:
    """The memory step function with one value per instant (what holds after it).

    The frees-then-allocations order inside an instant would otherwise draw dips that last
    no time.
    """
    mt, mb = np.asarray(timeline.memory_time, dtype=float), np.asarray(timeline.memory_bytes)
    last = np.r_[mt[1:] != mt[:-1], True] if mt.size else np.zeros(0, dtype=bool)
    return mt[last], mb[last]


def _memory_during(mt: np.ndarray, mb: np.ndarray, start: float, end: float) -> tuple[int, int]:
    """Memory in use just after ``start`` and the most in use during [start, end)."""
    if not mt.size:
        return 0, 0
    q0 = int(np.searchsorted(mt, start, side="right")) - 1
    at_start = int(mb[q0]) if q0 >= 0 else 0
    q1 = int(np.searchsorted(mt, end, side="left"))
    peak = int(mb[max(q0, 0) : max(q1, q0 + 1)].max()) if q1 > q0 + 1 else at_start
    return at_start, max(peak, at_start)


# -- labels that fit ---------------------------------------------------------------------------


def _labels(
    bars: Sequence[tuple[str, float, float]], fits: Callable[[str, float], bool], gap: float = 0.0
) -> list[tuple[float, str]]:
    """Labels for a lane's bars: one per bar wide enough, else one per run of narrow bars.

    A run of back-to-back narrow bars of one kind (``F_3``, ``F_4``, ... ``F_17``, no idle time
    longer than ``gap`` between them) gets one label, ``F_3..F_17`` or ``F 3-17``, when the run
    is wide enough for it, so that even 100 forward ops of a long chain stay readable; what
    still does not fit is left unlabelled.
    """
    out: list[tuple[float, str]] = []
    run: list[tuple[str, float, float]] = []

    def flush() -> None:
        if not run:
            return
        if len(run) == 1:
            name, s, e = run[0]
            if fits(name, e - s):
                out.append(((s + e) / 2, name))
        else:
            kind = run[0][0].split("_")[0]
            first, last = run[0][0].split("_")[-1], run[-1][0].split("_")[-1]
            s, e = run[0][1], run[-1][2]
            for text in (f"{kind}_{first}..{kind}_{last}", f"{kind} {first}-{last}"):
                if fits(text, e - s):
                    out.append(((s + e) / 2, text))
                    break
        run.clear()

    for name, s, e in sorted(bars, key=lambda b: b[1]):
        if fits(name, e - s):
            flush()
            out.append(((s + e) / 2, name))
            continue
        if run and (run[-1][0].split("_")[0] != name.split("_")[0] or s - run[-1][2] > gap):
            flush()
        run.append((name, s, e))
    flush()
    return out


# -- the Gantt chart ---------------------------------------------------------------------------


def plot_timeline(
    timeline: Timeline,
    path: str | None = None,
    *,
    title: str | None = None,
    width: float = 12.0,
    height: float = 6.0,
    dpi: int = 100,
    labels: bool = True,
    lower_bound: float | None = None,
    method: str | None = None,
    stalls: bool = True,
) -> Any:
    """Draw ``timeline`` and return the matplotlib Figure; write an image to ``path`` if given.

    The top panel has one lane for compute and one per transfer channel; the bottom panel the
    GPU memory in use against the limit. Every interval in which compute idles is shaded and
    labelled with the copy it waits for (hatched green: an offload that must free memory;
    hatched red: a prefetch that must arrive), and an arrow runs from the end of that copy to
    the op it holds back (see :func:`chainoffload.stalls`).

    Parameters
    ----------
    timeline
        From :func:`chainoffload.simulate`.
    path
        Where to write the image (format from the extension: PNG, SVG, PDF); ``None`` only
        returns the figure. A path ending in ``.html`` writes the interactive chart of
        :func:`plot_timeline_html` and returns the Plotly figure.
    title
        Replaces the default title: the chain's name, the makespan and overhead, the lower
        bound and gap (when ``lower_bound`` is given), the verdict, the platform and the share
        of time compute idles, per cause.
    width, height, dpi
        Figure size in inches and resolution; the PNG is ``width * dpi`` by ``height * dpi`` pixels.
    labels
        Write op names inside bars wide enough to hold them, and one name per run of narrow
        bars (``F 3-17``) where a run is wide enough.
    lower_bound
        A proven lower bound on the makespan in seconds (e.g. ``Result.lower_bound``), shown in
        the title with the gap; ``None`` leaves it out.
    method
        The method that made the schedule, shown in the title; ``None`` leaves it out.
    stalls
        Shade the stalls and draw the wait arrows.
    """
    if path is not None and str(path).lower().endswith(".html"):
        return plot_timeline_html(timeline, path, title=title, lower_bound=lower_bound, method=method, stalls=stalls)
    plt = _matplotlib()
    from matplotlib.patches import Patch

    found = find_stalls(timeline) if stalls else []
    lanes = gantt_data(timeline)
    t_scale, t_unit = _time_unit(max(timeline.makespan, 1e-12))
    limit = timeline.platform.memory
    has_limit = limit < 2**60
    b_scale, b_unit = _byte_unit(max(timeline.peak_memory, limit if has_limit else 0, 1))
    fig, (ax_g, ax_m) = plt.subplots(
        2, 1, figsize=(width, height), dpi=dpi, sharex=True, gridspec_kw={"height_ratios": [1.2, 1.0]}
    )
    # Fixed margins (legends outside on the right): the axes' width in inches is then known,
    # which is what deciding whether a label fits needs.
    left, right = 0.08, 0.78
    fig.subplots_adjust(left=left, right=right, top=0.88, bottom=0.09, hspace=0.12)
    names = list(lanes)
    row_of = {lane: len(names) - 1 - r for r, lane in enumerate(names)}
    span = max(timeline.makespan, 1e-12) * t_scale
    axis_inches = width * (right - left)
    fontsize = 7 if len(timeline.schedule.compute) <= 60 else 6

    def fits(text: str, w: float) -> bool:
        # ~0.6 em per character, in the axis's data units, with a little padding.
        return w / span * axis_inches * 72 >= (0.62 * len(text) + 0.6) * fontsize

    for lane in names:
        y = row_of[lane]
        for name, start, end in lanes[lane]:
            kind = name.split("_")[0]
            s, e = start * t_scale, end * t_scale
            ax_g.barh(y, max(e - s, span * 1e-4), left=s, height=0.7, color=_COLORS.get(kind, "#999999"), edgecolor="white", linewidth=0.4)
        if labels:
            for x, text in _labels(lanes[lane], lambda txt, w: fits(txt, w * t_scale), gap=timeline.makespan * 1e-6):
                ax_g.text(x * t_scale, y, text, ha="center", va="center", fontsize=fontsize, color="white", clip_on=True)

    y_compute = row_of["compute"]
    duplex = timeline.platform.duplex
    for st in found:
        s, e = st.start * t_scale, st.end * t_scale
        color = _STALL_COLORS[st.cause]
        ax_g.barh(y_compute, e - s, left=s, height=0.7, facecolor="none", edgecolor=color, hatch="////", linewidth=0.0)
        ax_g.axvspan(s, e, color=color, alpha=0.06, linewidth=0)
        if labels:
            # The longest of these that fits: which op waits for which copy.
            for text in (f"{st.op_name} waits for {st.transfer_name}", f"wait {st.transfer_name}", st.transfer_name):
                if fits(text, e - s):
                    ax_g.text((s + e) / 2, y_compute + 0.5, text, ha="center", va="bottom", fontsize=fontsize, color=color, clip_on=True)
                    break
        # The arrow: from the end of the copy, on its lane, to the start of the op it releases.
        tr = timeline.schedule.transfers[st.transfer]
        y_copy = row_of[_lane_of(tr.kind, duplex)]
        ax_g.annotate(
            "",
            xy=(e, y_compute - 0.36),
            xytext=(float(timeline.transfer_end[st.transfer]) * t_scale, y_copy + 0.36),
            arrowprops={"arrowstyle": "-|>", "color": color, "lw": 0.9, "shrinkA": 0, "shrinkB": 0, "mutation_scale": 7},
        )
    ax_g.set_yticks(range(len(names)))
    ax_g.set_yticklabels(list(reversed(names)))
    ax_g.set_ylim(-0.6, len(names) - 0.4 + (0.45 if found and labels else 0.0))
    ax_g.set_xlim(0, span * 1.01)
    handles = [
        Patch(color=_COLORS["F"], label="forward F_i"),
        Patch(color=_COLORS["B"], label="backward B_i"),
    ]
    if timeline.schedule.has_remat:
        handles.append(Patch(color=_COLORS["Fck"], label="recompute (Fck / Fn)"))
    handles += [Patch(color=_COLORS["O"], label="offload O_i (D2H)"), Patch(color=_COLORS["P"], label="prefetch P_i (H2D)")]
    for cause in sorted({st.cause for st in found}):
        handles.append(Patch(facecolor="none", edgecolor=_STALL_COLORS[cause], hatch="////", label=_STALL_LABELS[cause]))
    if found:
        handles.append(Patch(color="none", label="arrow: copy -> op it holds back"))
    ax_g.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    lines = _title_lines(timeline, lower_bound, found, method) if title is None else [title]
    fig.suptitle("\n".join(lines), fontsize=9.5, x=(left + right) / 2)

    mt, mb = _memory_curve(timeline)
    times = np.concatenate(([0.0], mt, [timeline.makespan])) * t_scale
    mem = np.concatenate(([0], mb, [mb[-1] if mb.size else 0])) / b_scale
    ax_m.step(times, mem, where="post", color="#333333", linewidth=1.2, label="GPU memory in use")
    ax_m.fill_between(times, mem, step="post", color="#333333", alpha=0.12)
    for st in found:
        ax_m.axvspan(st.start * t_scale, st.end * t_scale, color=_STALL_COLORS[st.cause], alpha=0.06, linewidth=0)
    if has_limit:
        ax_m.axhline(limit / b_scale, color="#C44E52", linestyle="--", linewidth=1.2, label=f"limit {limit / b_scale:.3g} {b_unit}")
    ax_m.axhline(timeline.peak_memory / b_scale, color="#4C72B0", linestyle=":", linewidth=1.0, label=f"peak {timeline.peak_memory / b_scale:.3g} {b_unit}")
    ax_m.set_ylabel(f"memory ({b_unit})")
    ax_m.set_xlabel(f"time ({t_unit})")
    ax_m.set_ylim(0, max(mem.max() if mem.size else 0, limit / b_scale if has_limit else 0) * 1.08 + 1e-9)
    ax_m.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    ax_m.grid(axis="y", alpha=0.3)
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig


def plot_timeline_html(
    timeline: Timeline,
    path: str | None = None,
    *,
    title: str | None = None,
    lower_bound: float | None = None,
    method: str | None = None,
    stalls: bool = True,
    height: int = 720,
    max_arrows: int = 400,
) -> Any:
    """The Gantt chart as an interactive Plotly figure; write one self-contained HTML file to ``path``.

    Hovering a bar shows the op or copy, its start, end and duration, its bytes (what a forward
    keeps, what a backward makes and frees, what a copy moves) and the GPU memory in use at its
    start and at most during it; hovering a stall shows what it waits for. The file carries
    Plotly's JavaScript inline, so it opens without a network.

    Parameters
    ----------
    timeline
        From :func:`chainoffload.simulate`.
    path
        An ``.html`` file to write; ``None`` only returns the figure.
    title, lower_bound, method, stalls
        As for :func:`plot_timeline`.
    height
        Pixels.
    max_arrows
        Draw at most this many wait arrows (the stalls themselves are always shaded).

    Returns
    -------
    plotly.graph_objects.Figure
    """
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError:
        raise ImportError("the interactive chart needs plotly: pip install chainoffload[plot]") from None

    found = find_stalls(timeline) if stalls else []
    schedule, chain = timeline.schedule, timeline.chain
    lanes = list(gantt_data(timeline))
    row_of = {lane: len(lanes) - 1 - r for r, lane in enumerate(lanes)}
    duplex = timeline.platform.duplex
    t_scale, t_unit = _time_unit(max(timeline.makespan, 1e-12))
    limit = timeline.platform.memory
    has_limit = limit < 2**60
    b_scale, b_unit = _byte_unit(max(timeline.peak_memory, limit if has_limit else 0, 1))
    mt, mb = _memory_curve(timeline)

    hover = (
        "<b>%{customdata[0]}</b><br>"
        f"start %{{customdata[1]:.4g}} {t_unit}, end %{{customdata[2]:.4g}} {t_unit} "
        f"(%{{customdata[3]:.4g}} {t_unit})<br>"
        "%{customdata[4]}<br>"
        "memory in use: %{customdata[5]} at its start, at most %{customdata[6]} during it<extra></extra>"
    )
    bars: dict[str, dict[str, list]] = {}

    def add(key: str, lane: str, name: str, start: float, end: float, detail: str) -> None:
        at, peak = _memory_during(mt, mb, start, end)
        b = bars.setdefault(key, {"x": [], "base": [], "y": [], "customdata": []})
        b["x"].append((end - start) * t_scale)
        b["base"].append(start * t_scale)
        b["y"].append(row_of[lane])
        b["customdata"].append([name, start * t_scale, end * t_scale, (end - start) * t_scale, detail, format_bytes(at), format_bytes(peak)])

    for k, (kind, stage) in enumerate(schedule.compute):
        key = "Fck" if kind in ("Fck", "Fn") else kind
        add(key, "compute", schedule.op_name(k), float(timeline.op_start[k]), float(timeline.op_end[k]), _op_bytes(timeline, kind, stage))
    moved = schedule.transfer_bytes(chain)
    for t, tr in enumerate(schedule.transfers):
        trigger = f"{tr.at} of {schedule.op_name(tr.op)}"
        what = f"a_{tr.unit} alone" if tr.moves == "act" else f"unit {tr.unit}"
        detail = f"copies {what}: {format_bytes(int(moved[t]))}; triggered at the {trigger}"
        if tr.before is not None:
            detail += f"; {schedule.op_name(tr.before)} waits for it"
        key = "O" if tr.kind == "offload" else "P"
        add(key, _lane_of(tr.kind, duplex), schedule.transfer_name(t), float(timeline.transfer_start[t]), float(timeline.transfer_end[t]), detail)

    legend = {"F": "forward F_i", "B": "backward B_i", "Fck": "recompute (Fck / Fn)", "O": "offload O_i (D2H)", "P": "prefetch P_i (H2D)"}
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.55, 0.45], vertical_spacing=0.07)
    for key in ("F", "Fck", "B", "O", "P"):
        if key not in bars:
            continue
        b = bars[key]
        fig.add_trace(
            go.Bar(
                x=b["x"], base=b["base"], y=b["y"], customdata=b["customdata"], orientation="h", width=0.7,
                marker={"color": _COLORS[key], "line": {"color": "white", "width": 0.5}},
                name=legend[key], hovertemplate=hover,
                # Names inside the bars; uniformtext hides those that do not fit until zoomed in.
                text=[c[0] for c in b["customdata"]], textposition="inside", insidetextanchor="middle", textangle=0,
                textfont={"color": "white"},
            ),
            row=1, col=1,
        )
    y_compute = row_of["compute"]
    for cause in _STALL_COLORS:
        mine = [s for s in found if s.cause == cause]
        if not mine:
            continue
        color = _STALL_COLORS[cause]
        fig.add_trace(
            go.Bar(
                x=[s.duration * t_scale for s in mine], base=[s.start * t_scale for s in mine], y=[y_compute] * len(mine),
                orientation="h", width=0.7, name=_STALL_LABELS[cause],
                marker={"color": "rgba(0,0,0,0)", "line": {"color": color, "width": 1}, "pattern": {"shape": "/", "fgcolor": color, "solidity": 0.35}},
                customdata=[[s.message] for s in mine], hovertemplate="%{customdata[0]}<extra></extra>",
            ),
            row=1, col=1,
        )
    for s in found[:max_arrows]:
        tr = schedule.transfers[s.transfer]
        fig.add_annotation(
            x=s.end * t_scale, y=y_compute - 0.36, ax=float(timeline.transfer_end[s.transfer]) * t_scale,
            ay=row_of[_lane_of(tr.kind, duplex)] + 0.36, xref="x", yref="y", axref="x", ayref="y",
            showarrow=True, arrowhead=2, arrowsize=1, arrowwidth=1, arrowcolor=_STALL_COLORS[s.cause], text="",
        )

    times = np.concatenate(([0.0], mt, [timeline.makespan])) * t_scale
    mem = np.concatenate(([0], mb, [mb[-1] if mb.size else 0])) / b_scale
    fig.add_trace(
        go.Scatter(
            x=times, y=mem, mode="lines", line={"shape": "hv", "color": "#333333", "width": 1.4}, fill="tozeroy",
            fillcolor="rgba(51,51,51,0.12)", name="GPU memory in use",
            hovertemplate=f"%{{x:.4g}} {t_unit}: %{{y:.4g}} {b_unit} in use<extra></extra>",
        ),
        row=2, col=1,
    )
    end = timeline.makespan * t_scale
    if has_limit:
        fig.add_trace(
            go.Scatter(x=[0, end], y=[limit / b_scale] * 2, mode="lines", line={"color": "#C44E52", "dash": "dash"},
                       name=f"limit {limit / b_scale:.3g} {b_unit}", hoverinfo="skip"),
            row=2, col=1,
        )
    fig.add_trace(
        go.Scatter(x=[0, end], y=[timeline.peak_memory / b_scale] * 2, mode="lines", line={"color": "#4C72B0", "dash": "dot"},
                   name=f"peak {timeline.peak_memory / b_scale:.3g} {b_unit}", hoverinfo="skip"),
        row=2, col=1,
    )
    lines = _title_lines(timeline, lower_bound, found, method) if title is None else [title]
    fig.update_layout(
        title={"text": "<br>".join(lines), "font": {"size": 14}},
        barmode="overlay", height=height, template="plotly_white", hovermode="closest",
        uniformtext={"minsize": 9, "mode": "hide"},
        legend={"x": 1.01, "y": 1.0, "xanchor": "left"}, margin={"l": 70, "r": 20, "t": 80, "b": 50},
    )
    fig.update_yaxes(tickvals=list(row_of.values()), ticktext=list(row_of), range=[-0.6, len(lanes) - 0.4], row=1, col=1)
    fig.update_yaxes(title_text=f"memory ({b_unit})", rangemode="tozero", row=2, col=1)
    fig.update_xaxes(title_text=f"time ({t_unit})", row=2, col=1)
    if path is not None:
        # include_plotlyjs=True inlines plotly.js: the file opens offline (no CDN).
        fig.write_html(str(path), include_plotlyjs=True, full_html=True, config={"displaylogo": False})
    return fig


# -- the trade-off curve -----------------------------------------------------------------------

# One look per method, chosen so that methods whose curves coincide stay visible: a large
# hollow marker drawn under a small filled one, and different line styles (best, cpsat and dp
# often share every point; so do first-k and largest-first, and rotor and joint at low memory).
_METHOD_STYLES: dict[str, dict[str, Any]] = {
    "keep-all": {"color": "#000000", "marker": "*", "markersize": 10, "linestyle": "none", "zorder": 6},
    "offload-all": {"color": "#7F7F7F", "marker": "v", "markersize": 5, "linestyle": "-", "zorder": 3},
    "first-k": {"color": "#BCBD22", "marker": "s", "markersize": 8, "fillstyle": "none", "linestyle": "-", "linewidth": 2.2, "zorder": 2},
    "largest-first": {"color": "#8C564B", "marker": "D", "markersize": 3.5, "linestyle": ":", "linewidth": 1.6, "zorder": 4},
    "lp": {"color": "#9467BD", "marker": "P", "markersize": 5, "linestyle": "-.", "zorder": 4},
    "dp": {"color": "#17BECF", "marker": "x", "markersize": 6, "linestyle": "--", "zorder": 5},
    "best": {"color": "#1F77B4", "marker": "o", "markersize": 4, "linestyle": "-", "linewidth": 1.8, "zorder": 6},
    "cpsat": {"color": "#D62728", "marker": "o", "markersize": 9, "fillstyle": "none", "linestyle": "-", "linewidth": 3.5, "alpha": 0.45, "zorder": 2},
    "rotor": {"color": "#FF7F0E", "marker": "^", "markersize": 8, "fillstyle": "none", "linestyle": "--", "linewidth": 2.0, "zorder": 3},
    "checkpoint-all": {"color": "#AD494A", "marker": "d", "markersize": 6, "linestyle": "--", "linewidth": 1.6, "zorder": 4},
    "sqrt-checkpoint": {"color": "#E377C2", "marker": "h", "markersize": 5, "linestyle": "-.", "zorder": 4},
    "recompute-all": {"color": "#393B79", "marker": ">", "markersize": 5, "linestyle": ":", "zorder": 4},
    "joint": {"color": "#2CA02C", "marker": "o", "markersize": 3.5, "linestyle": "-", "linewidth": 1.4, "zorder": 5},
}
_EXTRA_MARKERS = "os^vD<>pPXh*"


def _method_style(name: str, index: int, remat: bool) -> dict[str, Any]:
    if name in _METHOD_STYLES:
        return dict(_METHOD_STYLES[name])
    import matplotlib

    return {
        "color": matplotlib.colormaps["tab20"](index % 20),
        "marker": _EXTRA_MARKERS[index % len(_EXTRA_MARKERS)],
        "markersize": 5,
        "linestyle": "--" if remat else "-",
        "zorder": 4,
    }


def plot_tradeoff(
    tradeoff: Tradeoff,
    path: str | None = None,
    *,
    title: str | None = None,
    caption: bool = True,
    yscale: str = "auto",
    linthresh: float = 10.0,
    width: float = 11.0,
    height: float = 5.6,
    dpi: int = 100,
) -> Any:
    """Draw overhead against memory per method and return the matplotlib Figure.

    Each method is one line (dashed: it recomputes); a gap is a memory at which it found no
    schedule. Drawn with them: the pure-offloading lower bound (no offloading schedule lies in
    the grey area under it), the two proven floors (the least memory of any schedule, and of
    any pure-offloading schedule: between them only recomputation fits) and the keep-all peak
    (no overhead). A legend outside the axes and a short caption below say how to read it.

    Parameters
    ----------
    tradeoff
        From :func:`chainoffload.tradeoff`.
    path
        Where to write the image (PNG, SVG or PDF by extension); ``None`` only returns the figure.
    title
        Defaults to the chain's name and the link.
    caption
        Write the two-line reading guide under the axes.
    yscale
        ``"symlog"`` (linear up to ``linthresh`` percent, logarithmic above: the baselines
        whose overhead explodes no longer squash the rest), ``"linear"``, or ``"auto"``
        (symlog when some overhead exceeds 100 %).
    linthresh
        Percent at which ``symlog`` turns logarithmic.
    width, height, dpi
        Figure size in inches and resolution.
    """
    if yscale not in ("auto", "symlog", "linear"):
        raise ValueError(f"yscale: expected 'auto', 'symlog' or 'linear', got {yscale!r}")
    if not (isinstance(linthresh, (int, float)) and linthresh > 0):
        raise ValueError(f"linthresh: expected a percentage > 0, got {linthresh!r}")
    plt = _matplotlib()
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    tr = tradeoff
    b_scale, b_unit = _byte_unit(max(max(tr.memories), tr.keep_all_peak, 1))
    mem = np.array(tr.memories, dtype=float) / b_scale
    fig, ax = plt.subplots(figsize=(width, height), dpi=dpi)
    left, right, bottom = 0.07, 0.73, 0.2 if caption else 0.1
    fig.subplots_adjust(left=left, right=right, top=0.9, bottom=bottom)

    ymax = 0.0
    for i, m in enumerate(tr.methods):
        y = 100 * tr.overheads(m)
        style = _method_style(m, i, tr.remat[m])
        label = m + (" (recomputes)" if tr.remat[m] else "")
        if np.all(np.isnan(y)):
            label += ": never fits"
        elif np.isnan(y).any():
            label += f": from {tr.min_memory(m) / b_scale:.3g} {b_unit}"
        ax.plot(mem, y, label=label, **style)
        if np.isfinite(y).any():
            ymax = max(ymax, float(np.nanmax(y)))
    lb = 100 * tr.lower_bound_overheads()
    lb = np.where(np.isfinite(lb), lb, np.nan)
    if np.isfinite(lb).any():
        ax.fill_between(mem, 0, lb, where=np.isfinite(lb), color="#999999", alpha=0.3, linewidth=0, zorder=1,
                        label="below the bound: no pure offloading")
        ax.plot(mem, lb, color="#333333", linestyle=(0, (1, 1)), linewidth=1.4, zorder=1, label="lower bound, pure offloading")
    ax.axvspan(tr.stage_floor / b_scale, tr.offload_floor / b_scale, color="#FFE9A8", alpha=0.45, linewidth=0, zorder=0,
               label="only recomputation fits")
    ax.axvline(tr.stage_floor / b_scale, color="#555555", linestyle=":", linewidth=1.2, zorder=1,
               label=f"stage floor {tr.stage_floor / b_scale:.3g} {b_unit}")
    ax.axvline(tr.offload_floor / b_scale, color="#555555", linestyle="--", linewidth=1.2, zorder=1,
               label=f"offload floor {tr.offload_floor / b_scale:.3g} {b_unit}")
    ax.axvline(tr.keep_all_peak / b_scale, color="#2CA02C", linestyle="-.", linewidth=1.2, zorder=1,
               label=f"keep-all peak {tr.keep_all_peak / b_scale:.3g} {b_unit}")

    use_symlog = yscale == "symlog" or (yscale == "auto" and ymax > 100)
    top = max(ymax, float(np.nanmax(lb)) if np.isfinite(lb).any() else 0.0, 1.0)
    if use_symlog:
        ax.set_yscale("symlog", linthresh=linthresh, linscale=1.0)
        ticks = [t for t in (0, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000) if t <= top * 1.3]
        ticks = [t for t in ticks if t == 0 or t >= linthresh / 5]
        ax.yaxis.set_major_locator(FixedLocator(ticks))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_ylim(0, top * 1.35)
    else:
        ax.set_ylim(0, top * 1.08)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))
    ax.set_xlabel(f"GPU memory for activations ({b_unit})")
    ax.set_ylabel("overhead over compute")
    span = (max(tr.keep_all_peak, max(tr.memories)) - min(tr.stage_floor, min(tr.memories))) / b_scale
    ax.set_xlim(min(tr.stage_floor, min(tr.memories)) / b_scale - 0.03 * span, max(tr.keep_all_peak, max(tr.memories)) / b_scale + 0.03 * span)
    ax.grid(alpha=0.3, which="major")
    ax.set_title(title or f"{tr.chain_name}: overhead against memory ({tr.platform.describe(memory=False)})", fontsize=10)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7.5, frameon=False)
    if caption:
        text = (
            "Overhead = simulated makespan / (sum fwd + sum bwd) - 1; a gap in a line: the method finds no schedule at that memory."
            + (f" The y axis is linear up to {linthresh:g}% and logarithmic above." if use_symlog else "")
            + " Grey: below the proven lower bound of pure offloading. Yellow: between the stage floor (nothing fits below)"
            " and the offload floor (nothing fits below without recomputation). Where methods coincide, a large hollow"
            " marker sits under a small filled one."
        )
        # ~0.5 em per character of 7.5 pt text across the figure's width.
        text = "\n".join(textwrap.wrap(text, width=int(width * 72 * (1 - left) / (0.5 * 7.5))))
        fig.text(left, 0.015, text, fontsize=7.5, va="bottom", ha="left", color="#333333")
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig
