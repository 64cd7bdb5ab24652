"""`gamma_sweep` (paper Figure 5, Theorem 3.11): for each gamma, per example at batch 1,
the walltime of speculative decoding against plain decoding (interleaved), and the
arithmetic-operations factor; measured beside eq. (5) (measured v and v = 1) and
Theorem 3.11, and the best gamma each way."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Sequence

import gin

from speculative_t5 import analysis, plots
from speculative_t5.alpha import alpha_of, overlap_sums
from speculative_t5.paper import grid
from speculative_t5.paper.cells import Cell
from speculative_t5.rundir import RunDir


def _check_gammas(gammas) -> List[int]:
    gammas = list(gammas)
    if not gammas or any(not isinstance(g, int) or g < 1 for g in gammas) \
            or len(set(gammas)) != len(gammas):
        raise ValueError(f"gamma_sweep_cell.gammas must be distinct ints >= 1, got {gammas!r}")
    return sorted(gammas)


@gin.configurable(denylist=["cell", "run"])
def gamma_sweep_cell(cell: Cell, run: RunDir, gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
                     timing_rounds: int = 20, quiet: bool = False) -> Dict:
    """Measure the examples not yet in `run` at every gamma, then summarize the cell."""
    gammas = _check_gammas(gammas)
    todo = grid.todo(cell, run)
    if todo:
        _measure(cell, run, todo, gammas, timing_rounds, quiet)
    return summarize(cell, run, gammas)


def _measure(cell: Cell, run: RunDir, todo: List, gammas: List[int], timing_rounds: int,
             quiet: bool) -> None:
    target, draft, _ = cell.load_models()
    costs = grid.step_costs(run, target, draft, gammas, grid.median_width(cell),
                            cell.max_decode_len, timing_rounds)
    costs["c_hat"] = (analysis.decode_macs_per_token(draft.config)
                      / analysis.decode_macs_per_token(target.config))
    grid.save_timing(run, costs)
    variants = {"plain": {}, **{str(g): {"draft": draft, "gamma": g} for g in gammas}}
    for i, ex, x, runs in grid.timed_examples(cell, run, todo, target, variants, costs, quiet):
        plain, t_plain = runs.pop("plain")
        rec = {"index": i, "width": int(x.shape[1]),
               "seconds": {"plain": round(t_plain, 6), **{g: round(t, 6) for g, (_, t) in runs.items()}},
               "plain_length": int(plain.lengths[0]),
               "spec_length": {g: int(r.lengths[0]) for g, (r, _) in runs.items()},
               "target_calls": {g: int(r.stats["target_calls"][0]) for g, (r, _) in runs.items()},
               "draft_calls": {g: int(r.stats["draft_calls"][0]) for g, (r, _) in runs.items()}}
        rec.update(overlap_sums(target, draft, x, plain.tokens, grid.sampling_of(cell))[0])
        run.append({"id": ex["id"], **rec})


def summarize(cell: Cell, run: RunDir, gammas: List[int]) -> Dict[str, Any]:
    """Per-gamma rows (the cell's summary and plots); returns the cell's best-gamma row."""
    recs = grid.in_cell_order(cell, run.records())
    with open(os.path.join(run.path, "timing.json")) as f:
        costs = json.load(f)
    missing = [g for g in gammas if str(g) not in recs[0]["seconds"]]
    if missing:
        raise ValueError(f"{run.path} was measured for other gammas (no {missing}); use "
                         "another --output_dir")
    c_hat = costs["c_hat"]
    alpha = alpha_of(recs)
    a, c = alpha["alpha"], costs["c"]
    t_plain = sum(r["seconds"]["plain"] for r in recs)
    rows = []
    for g in gammas:
        k = str(g)
        calls = sum(r["target_calls"][k] for r in recs)
        tokens = sum(r["spec_length"][k] for r in recs)
        v = costs["v"][k]
        rows.append({"gamma": g, "v": v, "tokens_per_target_call": tokens / max(calls, 1),
                     "tokens_per_call_predicted": analysis.expected_tokens_per_call(a, g),
                     "speedup_measured": t_plain / sum(r["seconds"][k] for r in recs),
                     "speedup_predicted": analysis.walltime_improvement(a, g, c, v),
                     "speedup_predicted_paper": analysis.walltime_improvement(a, g, c),
                     "operations_measured": (calls * (g + 1) + c_hat * sum(
                         r["draft_calls"][k] for r in recs)) / max(tokens, 1),
                     "operations_predicted": analysis.operations_factor(a, g, c_hat)})
    run.write_summary(rows)
    plots.speedup_vs_gamma(os.path.join(run.path, "speedup_vs_gamma.png"), rows,
                           f"{cell.name}: speedup vs gamma, alpha={a:.2f} (paper Fig. 5)")
    plots.operations_vs_gamma(os.path.join(run.path, "operations_vs_gamma.png"), rows,
                              f"{cell.name}: operations vs gamma, c_hat={c_hat:.3f} (Thm 3.11)")

    def best(key):
        return max(rows, key=lambda r: r[key])
    labels = cell.labels()
    labels.pop("gamma")
    return dict(labels, **alpha, c=c, c_hat=c_hat,
                best_gamma_measured=best("speedup_measured")["gamma"],
                best_speedup_measured=best("speedup_measured")["speedup_measured"],
                best_gamma_predicted=best("speedup_predicted")["gamma"],
                best_gamma_predicted_paper=best("speedup_predicted_paper")["gamma"],
                cell_gamma=cell.gamma, compile_seconds=costs["compile_seconds"],
                curve=([r["gamma"] for r in rows], [r["speedup_measured"] for r in rows]))


def finish(top: RunDir, rows: List[Dict[str, Any]]) -> None:
    """One best-gamma row per cell, and every cell's measured curve on one chart."""
    curves = {r["cell"]: r.pop("curve") for r in rows}
    top.write_summary(rows)
    plots.lines(os.path.join(top.path, "speedup_vs_gamma.png"), curves, "gamma",
                "measured walltime speedup", "Speedup vs gamma, every cell (paper Fig. 5)",
                baseline=1.0)
