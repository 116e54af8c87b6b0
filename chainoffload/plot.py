"""Pictures of a schedule: a Gantt chart of compute and transfer channels over the memory curve.

``gantt_data`` needs nothing beyond the core; ``plot_timeline`` needs matplotlib
(``pip install chainoffload[plot]``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .simulate import Timeline

__all__ = ["gantt_data", "plot_timeline"]

_COLORS = {"F": "#4C72B0", "Fck": "#8172B2", "Fn": "#64B5CD", "B": "#DD8452", "O": "#55A868", "P": "#C44E52"}


def gantt_data(timeline: "Timeline") -> dict[str, list[tuple[str, float, float]]]:
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
        lane = ("D2H" if tr.kind == "offload" else "H2D") if duplex else "D2H+H2D"
        lanes[lane].append((schedule.transfer_name(t), float(timeline.transfer_start[t]), float(timeline.transfer_end[t])))
    return lanes


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


def plot_timeline(
    timeline: "Timeline",
    path: str | None = None,
    *,
    title: str | None = None,
    width: float = 12.0,
    height: float = 6.0,
    dpi: int = 100,
    labels: bool = True,
) -> Any:
    """Draw ``timeline`` and return the matplotlib Figure; write a PNG to ``path`` if given.

    Parameters
    ----------
    timeline
        From :func:`chainoffload.simulate`.
    path
        Where to write the image (format from the extension); ``None`` only returns the figure.
    title
        Defaults to the chain's name, the makespan and the verdict.
    width, height, dpi
        Figure size in inches and resolution; the PNG is ``width * dpi`` by ``height * dpi`` pixels.
    labels
        Write op names inside bars wide enough to hold them.
    """
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install chainoffload[plot]") from None

    lanes = gantt_data(timeline)
    t_scale, t_unit = _time_unit(max(timeline.makespan, 1e-12))
    b_scale, b_unit = _byte_unit(max(timeline.peak_memory, timeline.platform.memory if timeline.platform.memory < 2**60 else 0, 1))
    fig, (ax_g, ax_m) = plt.subplots(
        2, 1, figsize=(width, height), dpi=dpi, sharex=True, gridspec_kw={"height_ratios": [1.2, 1.0]}
    )
    names = list(lanes)
    span = max(timeline.makespan, 1e-12) * t_scale
    for row, lane in enumerate(names):
        y = len(names) - 1 - row
        for name, start, end in lanes[lane]:
            kind = name.split("_")[0]
            s, e = start * t_scale, end * t_scale
            ax_g.barh(y, max(e - s, span * 1e-4), left=s, height=0.7, color=_COLORS.get(kind, "#999999"), edgecolor="white", linewidth=0.5)
            if labels and (e - s) > span * 0.025:
                ax_g.text((s + e) / 2, y, name, ha="center", va="center", fontsize=7, color="white")
    ax_g.set_yticks(range(len(names)))
    ax_g.set_yticklabels(list(reversed(names)))
    ax_g.set_xlim(0, span * 1.01)
    ax_g.legend(
        handles=[
            Patch(color=_COLORS["F"], label="forward F_i"),
            Patch(color=_COLORS["B"], label="backward B_i"),
            Patch(color=_COLORS["Fck"], label="recompute (Fck / Fn)"),
            Patch(color=_COLORS["O"], label="offload O_i (D2H)"),
            Patch(color=_COLORS["P"], label="prefetch P_i (H2D)"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
        frameon=False,
    )
    if title is None:
        verdict = "feasible" if timeline.feasible else f"INFEASIBLE ({timeline.violation.rule}: {timeline.violation.op})"
        title = (
            f"{timeline.chain.name}: makespan {timeline.makespan * t_scale:.3g} {t_unit} "
            f"(+{100 * timeline.overhead:.1f}% over compute), {verdict}"
        )
    ax_g.set_title(title, fontsize=10)

    # One value per instant (what holds after it): the frees-then-allocations order inside an
    # instant would otherwise draw dips that last no time.
    mt, mb = np.asarray(timeline.memory_time), np.asarray(timeline.memory_bytes)
    last = np.r_[mt[1:] != mt[:-1], True] if mt.size else np.zeros(0, dtype=bool)
    mt, mb = mt[last], mb[last]
    times = np.concatenate(([0.0], mt, [timeline.makespan])) * t_scale
    mem = np.concatenate(([0], mb, [mb[-1] if mb.size else 0])) / b_scale
    ax_m.step(times, mem, where="post", color="#333333", linewidth=1.2, label="GPU memory in use")
    ax_m.fill_between(times, mem, step="post", color="#333333", alpha=0.12)
    limit = timeline.platform.memory
    if limit < 2**60:
        ax_m.axhline(limit / b_scale, color="#C44E52", linestyle="--", linewidth=1.2, label=f"limit {limit / b_scale:.3g} {b_unit}")
    ax_m.axhline(timeline.peak_memory / b_scale, color="#4C72B0", linestyle=":", linewidth=1.0, label=f"peak {timeline.peak_memory / b_scale:.3g} {b_unit}")
    ax_m.set_ylabel(f"memory ({b_unit})")
    ax_m.set_xlabel(f"time ({t_unit})")
    ax_m.set_ylim(0, max(mem.max() if mem.size else 0, limit / b_scale if limit < 2**60 else 0) * 1.08 + 1e-9)
    ax_m.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax_m.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=dpi)
        plt.close(fig)
    return fig
