"""The plots of `compare`: bars per model and series, and predicted against measured.

Every plot has linear axes from zero, so a bar twice as tall is twice the figure (log axes
floored near the data made 4,244 against 4,600 us look like a 15x gap). A series is one
(strategy, rule set) pair, so every rule set of a sweep keeps its bars; the onnxruntime
baselines are series of their own on the measured plot. Bars of predicted figures say
"predicted" in their title; measured bars carry the p25-p75 range as error bars. The scatter
puts each target measured on this machine in its own panel, with the y = x line (a perfect
cost model) and Spearman's rho (does the model rank programs as the machine does?), models
told apart by colour and strategies by marker.

The figure builders return matplotlib figures, so a test can read their artists and labels;
`write_plots` saves them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from . import compare_stats as stats

MARKERS = "osD^vP*Xh<>"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def series(rows: list[dict]) -> list[tuple[str, str]]:
    """The (strategy, rule set) pairs of the ok rows, in the rows' order."""
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        if row["status"] == "ok":
            seen.setdefault((row["strategy"], row["rules"]), None)
    return list(seen)


def series_label(strategy: str, rules: str, rule_sets: set[str]) -> str:
    """"eqsat-greedy", or "eqsat-greedy [mine]" when the sweep has several rule sets;
    onnxruntime's levels by name."""
    if strategy.startswith("ort-"):
        return "onnxruntime " + strategy.removeprefix("ort-").replace("-", "_").upper()
    return f"{strategy} [{rules}]" if len(rule_sets) > 1 else strategy


def _value(rows, model, strategy, rules, target, metric) -> float:
    for r in rows:
        if (r["model"], r["strategy"], r["rules"], r["target"]) == (model, strategy, rules,
                                                                   target):
            value = r.get(metric)
            return float(value) if value is not None else math.nan
    return math.nan


def bar_figure(rows: list[dict], metric: str, title: str, ylabel: str, measured: bool = False):
    """Bars of `metric` per model, one bar per series, one panel per target. `measured` keeps
    the measured rows only (onnxruntime's included) and draws their p25-p75 as error bars."""
    plt = _pyplot()
    ok = [r for r in rows if r["status"] == "ok" and r.get(metric) is not None]
    pairs = series(ok)
    rule_sets = {rules for strategy, rules in pairs if not strategy.startswith("ort-")}
    models = sorted({r["model"] for r in ok})
    targets = sorted({r["target"] for r in ok})
    fig, axes = plt.subplots(1, max(1, len(targets)), figsize=(5 * max(1, len(targets)), 4),
                             squeeze=False)
    width = 0.8 / max(1, len(pairs))
    for ax, target in zip(axes[0], targets):
        for i, (strategy, rules) in enumerate(pairs):
            values = [_value(ok, m, strategy, rules, target, metric) for m in models]
            if all(math.isnan(v) for v in values):
                continue
            errors = None
            if measured:
                low = [_value(ok, m, strategy, rules, target, "measured_p25_ms") for m in models]
                high = [_value(ok, m, strategy, rules, target, "measured_p75_ms") for m in models]
                errors = [np.subtract(values, low), np.subtract(high, values)]
            ax.bar(np.arange(len(models)) + i * width, values, width, yerr=errors, capsize=2,
                   label=series_label(strategy, rules, rule_sets))
        ax.set_xticks(np.arange(len(models)) + width * (len(pairs) - 1) / 2)
        ax.set_xticklabels([m.removesuffix(".onnx") for m in models], rotation=30, ha="right",
                           fontsize=8)
        ax.set_title(f"{title}: {target}", fontsize=10)
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
    # one legend for all panels, below them, where it hides no bar
    legend: dict[str, Any] = {}
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    columns = max(1, min(len(legend), 2 * len(axes[0])))
    lines = -(-len(legend) // columns)
    fig.set_figheight(4 + 0.22 * lines)
    if legend:
        fig.legend(list(legend.values()), list(legend), loc="lower center", fontsize=7,
                   ncol=columns, frameon=False)
    fig.tight_layout(rect=(0, 0.22 * lines / fig.get_figheight(), 1, 1))
    return fig


def scatter_figure(rows: list[dict]):
    """Predicted against measured (both in us), one panel per measured target, with y = x and
    Spearman's rho; None when no row was measured."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    plt = _pyplot()
    by_target = stats.prediction_points(rows)
    if not by_target:
        return None
    models = sorted({r["model"] for points in by_target.values() for _, _, r in points})
    strategies = list(dict.fromkeys(r["strategy"] for points in by_target.values()
                                    for _, _, r in points))
    colours = plt.get_cmap("tab10")
    fig, axes = plt.subplots(1, len(by_target), figsize=(7 * len(by_target), 5),
                             squeeze=False)
    for ax, (target, points) in zip(axes[0], sorted(by_target.items())):
        for predicted, measured, row in points:
            spread = [[measured - row["measured_p25_ms"] * 1e3],
                      [row["measured_p75_ms"] * 1e3 - measured]]
            ax.errorbar(predicted, measured, yerr=spread, markersize=6, capsize=2,
                        color=colours(models.index(row["model"]) % 10), linestyle="",
                        marker=MARKERS[strategies.index(row["strategy"]) % len(MARKERS)])
        top = 1.05 * max(max(p, r["measured_p75_ms"] * 1e3) for p, _, r in points)
        ax.plot([0, top], [0, top], "--", color="grey", linewidth=1, label="y = x")
        ax.set_xlim(0, top)
        ax.set_ylim(0, top)
        ax.set_aspect("equal")
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_locator(MaxNLocator(5))
        rho = stats.spearman([(p, m) for p, m, _ in points])
        ax.set_title(f"{target}: Spearman's ρ = "
                     + (f"{rho:.2f}" if rho is not None else "undefined")
                     + f" (n = {len(points)})", fontsize=10)
        ax.set_xlabel(f"predicted (us, {target} cost model)")
        ax.set_ylabel("measured on this machine (us, median, p25-p75)")
        handles = [Line2D([], [], linestyle="--", color="grey", label="y = x")]
        handles += [Line2D([], [], linestyle="", marker="o", color=colours(i % 10),
                           label=m.removesuffix(".onnx")) for i, m in enumerate(models)]
        handles += [Line2D([], [], linestyle="", marker=MARKERS[i % len(MARKERS)],
                           color="black", label=s) for i, s in enumerate(strategies)]
        ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1),
                  borderaxespad=0)
    fig.tight_layout()
    return fig


def write_plots(rows: list[dict], plots: Path) -> list[Path]:
    """Write the plots of `rows` into `plots`; the paths written."""
    plt = _pyplot()
    plots.mkdir(parents=True, exist_ok=True)
    if not any(r["status"] == "ok" for r in rows):
        return []
    figures = {
        "predicted_cost.png": bar_figure(rows, "predicted_us", "predicted cost (cost model)",
                                         "predicted microseconds"),
        "kernels.png": bar_figure(rows, "kernels", "kernels", "kernels that run"),
        "compile_time.png": bar_figure(rows, "t_compile", "compile time", "seconds"),
    }
    if any(r.get("measured_ms") is not None for r in rows):
        figures["measured_time.png"] = bar_figure(
            rows, "measured_ms", "measured on this machine (median, p25-p75)", "milliseconds",
            measured=True)
    scatter = scatter_figure(rows)
    if scatter is not None:
        figures["predicted_vs_measured.png"] = scatter
    written = []
    for name, fig in figures.items():
        fig.savefig(plots / name, dpi=100)
        plt.close(fig)
        written.append(plots / name)
    return written
