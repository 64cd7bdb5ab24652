"""The paper's figures as PNG files (matplotlib, no display needed): tokens per target call
(Figure 4), speedup and operations against gamma (Figure 5, Theorem 3.11), and the table
drivers' measured-vs-predicted and alpha charts."""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import numpy as np


def _axes(figsize=(6, 4)):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt.subplots(figsize=figsize)


def _save(fig, ax, path: str) -> str:
    import matplotlib.pyplot as plt
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def tokens_per_call(path: str, histogram: Sequence[int], alpha: float, gamma: int,
                    title: str = "") -> str:
    """Measured distribution of tokens per target call beside the i.i.d. prediction
    alpha^(k-1) (1 - alpha) for k <= gamma, alpha^gamma for a clean sweep (Figure 4)."""
    hist = np.asarray(histogram, float)
    k = np.arange(1, gamma + 2)
    geometric = np.where(k <= gamma, alpha ** (k - 1) * (1 - alpha), alpha ** gamma)
    fig, ax = _axes()
    ax.bar(k - 0.2, hist / max(hist.sum(), 1), width=0.4, label="measured")
    ax.bar(k + 0.2, geometric, width=0.4, label=f"i.i.d. prediction, alpha={alpha:.2f}")
    ax.set_xlabel("tokens per target call")
    ax.set_ylabel("fraction of target calls")
    ax.set_title(title or f"Tokens per target call, gamma={gamma} (paper Fig. 4)")
    return _save(fig, ax, path)


def _curves(rows: Sequence[Dict], keys: Dict[str, str]) -> Dict[str, tuple]:
    gammas = [r["gamma"] for r in rows]
    return {label: (gammas, [r[key] for r in rows]) for label, key in keys.items()}


def speedup_vs_gamma(path: str, rows: Sequence[Dict], title: str = "") -> str:
    """rows: {gamma, speedup_measured, speedup_predicted, speedup_predicted_paper} (Figure 5)."""
    return lines(path, _curves(rows, {"measured": "speedup_measured",
                                      "eq. (5), measured v": "speedup_predicted",
                                      "eq. (5), v = 1 (paper)": "speedup_predicted_paper"}),
                 "gamma", "walltime speedup over plain decoding",
                 title or "Speedup vs gamma (paper Fig. 5)", baseline=1.0)


def operations_vs_gamma(path: str, rows: Sequence[Dict], title: str = "") -> str:
    """rows: {gamma, operations_measured, operations_predicted} (Theorem 3.11)."""
    return lines(path, _curves(rows, {"measured": "operations_measured",
                                      "Theorem 3.11": "operations_predicted"}),
                 "gamma", "arithmetic operations / plain decoding",
                 title or "Operations vs gamma (Theorem 3.11)", baseline=1.0)


def grouped_bars(path: str, labels: Sequence[str], series: Dict[str, Sequence[Optional[float]]],
                 ylabel: str, title: str, errors: Optional[Dict[str, Sequence[float]]] = None,
                 baseline: Optional[float] = None) -> str:
    """One group of bars per label (a table cell), one bar per series; None values are
    left out (e.g. a paper figure the paper does not report)."""
    fig, ax = _axes(figsize=(max(6, 1.1 * len(labels) + 2), 4))
    x = np.arange(len(labels))
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        vals = np.array([np.nan if v is None else v for v in values], float)
        err = None if not errors or name not in errors else np.asarray(errors[name], float)
        ax.bar(x + (i - (len(series) - 1) / 2) * width, vals, width=width, label=name, yerr=err,
               capsize=3 if err is not None else 0)
    if baseline is not None:
        ax.axhline(baseline, color="gray", lw=0.8)
    top = np.nanmax([np.nan if v is None else v for vs in series.values() for v in vs] + [0.0])
    ax.set_ylim(0, 1.4 * top if top > 0 else 1)  # room for the legend above the bars
    ax.set_xticks(x)
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, ax, path)


def lines(path: str, series: Dict[str, tuple], xlabel: str, ylabel: str, title: str,
          baseline: Optional[float] = None) -> str:
    """One line per series {name: (xs, ys)}; integer x ticks."""
    fig, ax = _axes()
    for (name, (xs, ys)), style in zip(series.items(), ["o-", "s--", "^:", "d-.", "v-", "x--"] * 4):
        ax.plot(xs, ys, style, label=name)
    if baseline is not None:
        ax.axhline(baseline, color="gray", lw=0.8)
    ax.set_xticks(sorted({x for xs, _ in series.values() for x in xs}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return _save(fig, ax, path)
