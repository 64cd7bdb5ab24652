"""`walltime_table` (paper Table 2): per example, batch 1, the warm walltime of plain
decoding (ours, cross-attention K/V cached; and T5X-style, recomputed every step) and of
speculative decoding, interleaved; per cell alpha, c, v, tokens per target call, measured
speedup beside eq. (5) as the paper writes it (v = 1) and with the measured v, and the
task metric of both decodes (identical for greedy)."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List

import gin
import numpy as np

from speculative_t5 import analysis, plots
from speculative_t5.alpha import alpha_of, overlap_sums
from speculative_t5.paper import grid
from speculative_t5.paper.cells import Cell
from speculative_t5.rundir import RunDir


@gin.configurable(denylist=["cell", "run"])
def walltime_cell(cell: Cell, run: RunDir, timing_rounds: int = 20, quiet: bool = False) -> Dict:
    """Measure the examples not yet in `run`, then summarize all of them (one table row)."""
    todo = grid.todo(cell, run)
    if todo:
        _measure(cell, run, todo, timing_rounds, quiet)
    return summarize(cell, run)


def _measure(cell: Cell, run: RunDir, todo: List, timing_rounds: int, quiet: bool) -> None:
    target, draft, vocab = cell.load_models()
    costs = grid.step_costs(run, target, draft, [cell.gamma], grid.median_width(cell),
                            cell.max_decode_len, timing_rounds)
    variants = {"plain": {}, "plain_t5x": {"recompute_cross_attention": True},
                "spec": {"draft": draft, "gamma": cell.gamma}}
    for i, ex, x, runs in grid.timed_examples(cell, run, todo, target, variants, costs, quiet):
        (plain, _), (t5x, _), (spec, _) = runs["plain"], runs["plain_t5x"], runs["spec"]
        s = spec.stats
        rec = {"index": i, "width": int(x.shape[1]),
               "seconds": {k: round(t, 6) for k, (_, t) in runs.items()},
               "plain_length": int(plain.lengths[0]), "spec_length": int(spec.lengths[0]),
               "identical": bool(np.array_equal(plain.tokens, spec.tokens)),
               "t5x_identical": bool(np.array_equal(plain.tokens, t5x.tokens)),
               "target_calls": int(s["target_calls"][0]), "draft_calls": int(s["draft_calls"][0]),
               "tokens_per_call_hist": s["tokens_per_call_hist"][0].tolist(),
               "plain_output": vocab.decode(plain.tokens[0]),
               "spec_output": vocab.decode(spec.tokens[0]), "reference": ex["reference"]}
        rec.update(overlap_sums(target, draft, x, plain.tokens, grid.sampling_of(cell))[0])
        run.append({"id": ex["id"], **rec})


def summarize(cell: Cell, run: RunDir) -> Dict[str, Any]:
    """The cell's Table 2 row, from its records and timing.json alone."""
    recs = grid.in_cell_order(cell, run.records())
    with open(os.path.join(run.path, "timing.json")) as f:
        costs = json.load(f)
    c, v = costs["c"], costs["v"][str(cell.gamma)]
    sec = {k: sum(r["seconds"][k] for r in recs) for k in ("plain", "plain_t5x", "spec")}
    calls = sum(r["target_calls"] for r in recs)
    tokens = sum(r["spec_length"] for r in recs)
    alpha = alpha_of(recs)
    greedy = cell.temperature == 0.0
    row = dict(cell.labels(), **alpha, c=c, v=v,
               tokens_per_target_call=tokens / max(calls, 1),
               tokens_per_call_predicted=analysis.expected_tokens_per_call(alpha["alpha"], cell.gamma),
               speedup_measured=sec["plain"] / sec["spec"],
               speedup_vs_t5x=sec["plain_t5x"] / sec["spec"],
               speedup_predicted=analysis.walltime_improvement(alpha["alpha"], cell.gamma, c, v),
               speedup_predicted_paper=analysis.walltime_improvement(alpha["alpha"], cell.gamma, c),
               paper_alpha=cell.paper["alpha"], paper_speedup=cell.paper["speedup"],
               identical_fraction=float(np.mean([r["identical"] for r in recs])) if greedy else None,
               tokens_per_s_plain=sum(r["plain_length"] for r in recs) / sec["plain"],
               tokens_per_s_spec=tokens / sec["spec"],
               target_step_ms=costs["step_ms"]["target_1"],  # T, inside a compiled loop
               # the weights a one-token target step reads, per its time: bandwidth achieved
               weights_gb_per_s=costs["target_step_bytes"] / costs["step_ms"]["target_1"] / 1e6,
               compile_seconds=costs["compile_seconds"])
    row.update(grid.metric_columns(cell, recs, {"plain": "plain_output", "spec": "spec_output"}))
    run.write_summary([row])
    hist = np.sum([r["tokens_per_call_hist"] for r in recs], axis=0)
    plots.tokens_per_call(os.path.join(run.path, "tokens_per_call.png"), hist, alpha["alpha"],
                          cell.gamma, f"{cell.name}: tokens per target call (paper Fig. 4)")
    return row


def finish(top: RunDir, rows: List[Dict[str, Any]]) -> None:
    """The table (summary.csv / .md) and its chart, measured beside predicted."""
    top.write_summary(rows)
    labels = [r["cell"] for r in rows]
    series = {"measured (vs ours)": [r["speedup_measured"] for r in rows],
              "measured (vs T5X-style)": [r["speedup_vs_t5x"] for r in rows],
              "eq. (5), measured v": [r["speedup_predicted"] for r in rows],
              "eq. (5), v = 1": [r["speedup_predicted_paper"] for r in rows]}
    if any(r["paper_speedup"] is not None for r in rows):
        series["paper (TPU v4)"] = [r["paper_speedup"] for r in rows]
    plots.grouped_bars(os.path.join(top.path, "walltime.png"), labels, series,
                       "walltime speedup over plain decoding", "Speculative decoding walltime "
                       "(paper Table 2)", baseline=1.0)
