"""`walltime_table` (paper Table 2): per example, batch 1, the warm walltime of plain
decoding (ours, cross-attention K/V cached; and T5X-style, recomputed every step) and of
speculative decoding, interleaved; per cell alpha, c, v, tokens per target call, measured
speedup beside three predictions: eq. (5) as the paper writes it (v = 1), eq. (5) with the
measured v, and the full cost model (`measure.costs`: per-input set-up, measured rounds,
two-token draft calls), with the measured / predicted ratio of each decode."""
from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import gin
import numpy as np

from speculative_t5.data import pad_rows
from speculative_t5.engine import generate
from speculative_t5.decoding.output import combine
from speculative_t5.paper import beam_walltime, plots, timed
from speculative_t5.paper.cells import Cell
from speculative_t5.paper.rundir import RunDir
from speculative_t5.measure import analysis
from speculative_t5.measure.alpha import alpha_of, overlap_sums


@gin.configurable(denylist=["cell", "run"])
def walltime_cell(cell: Cell, run: RunDir, timing_rounds: int = 20, t5x_baseline: bool = True,
                  noise_floor_batch: int = 4, tpu_report: Optional[str] = None,
                  quiet: bool = False) -> Dict:
    """Measure the examples not yet in `run`, then summarize all of them (one table row).
    t5x_baseline: also time plain decoding with cross-attention K/V recomputed every step.
    noise_floor_batch: greedy cells also decode every example plainly in batches of this
    many rows (0: not), the noise floor "identical to plain" is read against.
    tpu_report: a `speculative-t5 compile --json` output for this cell's models at batch 1
    and its gamma: the row adds the TPU prediction, the cell's measured alpha with the
    compiler's c and v (`tpu_prediction`).
    A beam cell (`cell.beam_size`) times beam search instead (`beam_walltime`; no cost
    model, so no TPU prediction)."""
    report = None if tpu_report is None or cell.beam_size else read_tpu_report(tpu_report, cell)
    todo = cell.todo(run.done)
    if cell.beam_size:  # T5X's beam search against the speculative one (`beam_walltime`)
        if todo:
            beam_walltime.measure(cell, run, todo, cell.load_models(), quiet)
        return beam_walltime.summarize(cell, run)
    noise = cell.temperature == 0.0 and noise_floor_batch and not os.path.exists(_noise_path(run))
    if todo or noise:
        models = cell.load_models()
        if todo:
            _measure(cell, run, todo, models, timing_rounds, t5x_baseline, quiet)
        if noise:
            _noise_floor(cell, run, models[0], noise_floor_batch)
    row = summarize(cell, run)
    if report is not None:
        row.update(tpu_prediction(report, row["alpha"], cell))
        run.write_summary([row])
    return row


def read_tpu_report(path: str, cell: Cell) -> Dict[str, Any]:
    """A `compile --json` report, checked to describe this cell's decode (batch 1, its gamma
    and max_decode_len): anything else is refused in one line."""
    if cell.adaptive_gamma or cell.tree:
        raise ValueError(f"walltime_cell.tpu_report: cell {cell.name} decodes with "
                         f"{'adaptive gamma' if cell.adaptive_gamma else 'a token tree'}, and a "
                         f"compile report prices rounds of a fixed gamma's chain")
    try:
        with open(path) as f:
            report = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"walltime_cell.tpu_report: cannot read {path}: {e}") from None
    need = ("topology", "batch", "gamma", "max_decode_len", "parts", "c", "v")
    if not isinstance(report, dict) or any(k not in report for k in need):
        raise ValueError(f"walltime_cell.tpu_report: {path} is not a `speculative-t5 compile "
                         f"--json` report (it needs {', '.join(need)})")
    want = {"batch": 1, "gamma": cell.gamma, "max_decode_len": cell.max_decode_len}
    wrong = [f"{k} {report[k]} (the cell: {v})" for k, v in want.items() if report[k] != v]
    if wrong:
        raise ValueError(f"walltime_cell.tpu_report: {path} was compiled for "
                         f"{', '.join(wrong)}; compile with --batch 1 --gamma {cell.gamma} "
                         f"--max_decode_len {cell.max_decode_len}")
    return report


def tpu_prediction(report: Dict[str, Any], alpha: float, cell: Cell) -> Dict[str, Any]:
    """The cell's speedup on the compiled TPU topology: its measured alpha with the
    compiler's c and v (eq. (5)), and the cost model over the compiled parts' roofline
    times. The compiler's figures, not walltime."""
    from speculative_t5.measure.tpu_compile import predicted_speedup
    pred = predicted_speedup(report["parts"], alpha, cell.gamma, cell.max_decode_len)
    return {"tpu_topology": report["topology"], "c_tpu": pred["c"], "v_tpu": pred["v"],
            "speedup_predicted_tpu": pred["speedup_predicted"],
            "speedup_predicted_tpu_cost_model": pred["speedup_predicted_cost_model"]}


def _noise_path(run: RunDir) -> str:
    return os.path.join(run.path, "noise_floor.json")


def _noise_floor(cell: Cell, run: RunDir, target, batch: int) -> None:
    """Plain greedy decodes of every example in fixed batches of `batch` rows (example
    order, all at the cell's widest input width: one program), compared token for token
    with its batch-1 plain decode. In float32 they agree; in bfloat16 (as on TPU) the
    rounding of batched matmuls can flip a near-tie argmax, and the fraction that still
    agrees is the floor below which "speculative identical to plain" says nothing."""
    recs = {r["id"]: r for r in run.records()}
    width = max(cell.width(e) for e in cell.examples)
    same = {}
    for start in range(0, len(cell.examples), batch):
        exs = cell.examples[start:start + batch]
        x = pad_rows(cell.padded(exs, width), batch)                              # [B, W]
        out = generate(target, x, max_decode_len=cell.max_decode_len, sampling=cell.sampling)
        for row, e in enumerate(exs):
            tokens = out.tokens[row, :out.lengths[row]].tolist()
            same[e["id"]] = tokens == recs[e["id"]]["plain_tokens"]
    with open(_noise_path(run), "w") as f:
        json.dump({"batch": batch, "width": width, "identical": same}, f, indent=2)


def _measure(cell: Cell, run: RunDir, todo: List, models, timing_rounds: int,
             t5x_baseline: bool, quiet: bool) -> None:
    target, draft, vocab = models
    timing, timers = timed.cell_costs(run, cell, target, draft, [cell.gamma], cell.examples,
                                      timing_rounds)
    variants = {"plain": {}, "spec": {"draft": draft, "gamma": cell.gamma,
                                      "verification": cell.verification,
                                      "adaptive_gamma": cell.adaptive_gamma,
                                      "tree": cell.tree, "tree_children": cell.tree_children}}
    if t5x_baseline:
        variants["plain_t5x"] = {"recompute_cross_attention": True}
    for i, ex, x, runs, parts in timed.timed_examples(cell, run, todo, target, variants, timing,
                                                      timers, quiet):
        (plain, _), (spec, _) = runs["plain"], runs["spec"]
        rec = {"index": i, "width": int(x.shape[1]),
               "seconds": {k: round(t, 6) for k, (_, t) in runs.items()}, "parts": parts,
               "plain": plain.row(0), "spec": spec.row(0),
               "plain_tokens": plain.tokens[0, :plain.lengths[0]].tolist(),
               "identical": bool(np.array_equal(plain.tokens, spec.tokens)),
               "plain_output": vocab.decode(plain.tokens[0]),
               "spec_output": vocab.decode(spec.tokens[0]), "input": ex["input_text"],
               "reference": ex["reference"]}
        if t5x_baseline:
            rec["t5x_identical"] = bool(np.array_equal(plain.tokens, runs["plain_t5x"][0].tokens))
        rec.update(overlap_sums(target, draft, x, plain.tokens, cell.sampling)[0])
        run.append({"id": ex["id"], **rec})


def _noise_fraction(run: RunDir, recs: List[Dict[str, Any]]):
    if not os.path.exists(_noise_path(run)):
        return None
    with open(_noise_path(run)) as f:
        same = json.load(f)["identical"]
    return float(np.mean([same[r["id"]] for r in recs]))


def summarize(cell: Cell, run: RunDir) -> Dict[str, Any]:
    """The cell's Table 2 row, from its records and timing.json alone."""
    recs = cell.in_order(run.records())
    timing = timed.load_timing(run)
    costs = timed.costs_of(timing, recs)
    g = cell.gamma
    c, v = costs.c, costs.v(g)
    sec = {k: sum(r["seconds"][k] for r in recs) for k in recs[0]["seconds"]}
    pred = timed.predicted_seconds(costs, g, recs)
    spec = combine([r["spec"] for r in recs])
    alpha = alpha_of(recs)
    a = alpha["alpha"]
    greedy = cell.temperature == 0.0
    # the predictions price chains of `gamma` drafts: an adaptive decode's rounds draft
    # 0..gamma, a tree's are checked in one call over its nodes (v would be the chain's)
    fixed = not cell.adaptive_gamma and cell.tree is None
    row = dict(cell.labels(), **alpha, c=c, v=v if cell.tree is None else None,
               tokens_per_target_call=spec["tokens_per_target_call"],
               tokens_per_call_predicted=analysis.expected_tokens_per_call(a, g) if fixed else None,
               speedup_measured=sec["plain"] / sec["spec"],
               speedup_vs_t5x=sec["plain_t5x"] / sec["spec"] if "plain_t5x" in sec else None,
               speedup_predicted_full=pred["plain"] / pred["spec"] if fixed else None,
               speedup_predicted=analysis.walltime_improvement(a, g, c, v) if fixed else None,
               speedup_predicted_paper=analysis.walltime_improvement(a, g, c) if fixed else None,
               measured_over_full=((sec["plain"] / sec["spec"]) / (pred["plain"] / pred["spec"])
                                   if fixed else None),
               plain_measured_over_predicted=sec["plain"] / pred["plain"],
               spec_measured_over_predicted=sec["spec"] / pred["spec"] if fixed else None,
               paper_alpha=cell.paper["alpha"], paper_speedup=cell.paper["speedup"],
               identical_fraction=float(np.mean([r["identical"] for r in recs])) if greedy else None,
               plain_batch_identical_fraction=_noise_fraction(run, recs),
               tokens_per_s_plain=sum(r["plain"]["length"] for r in recs) / sec["plain"],
               tokens_per_s_spec=spec["tokens"] / sec["spec"],
               target_step_ms=1e3 * costs.target_step,  # T, inside a compiled loop
               # a round's model steps in turn beyond their parts timed alone (R - vT - g cT)
               interleave_ms=1e3 * costs.interleave(g),
               # the weights a one-token target step reads, per its time: bandwidth achieved
               weights_gb_per_s=timing["target_step_bytes"] / costs.target_step / 1e9,
               compile_seconds=timing["compile_seconds"])
    row.update(cell.metric_columns(recs, {"plain": "plain_output", "spec": "spec_output"}))
    run.write_summary([row])
    plots.tokens_per_call(os.path.join(run.path, "tokens_per_call.png"),
                          spec["tokens_per_call_histogram"], a, g,
                          f"{cell.name}: tokens per target call (paper Fig. 4)")
    return row


def finish(top: RunDir, rows: List[Dict[str, Any]]) -> None:
    """The table (summary.csv / .md) and its chart, measured beside predicted."""
    top.write_summary(rows)
    labels = [r["cell"] for r in rows]
    series = {"measured (vs ours)": [r["speedup_measured"] for r in rows]}
    if all(r.get("speedup_vs_t5x") is not None for r in rows):
        series["measured (vs T5X-style)"] = [r["speedup_vs_t5x"] for r in rows]
    # a beam row has no cost-model prediction: its bars are left out
    series.update({"cost model": [r.get("speedup_predicted_full") for r in rows],
                   "eq. (5), measured v": [r.get("speedup_predicted") for r in rows],
                   "eq. (5), v = 1": [r.get("speedup_predicted_paper") for r in rows]})
    if any(r["paper_speedup"] is not None for r in rows):
        series["paper (TPU v4)"] = [r["paper_speedup"] for r in rows]
    plots.grouped_bars(os.path.join(top.path, "walltime.png"), labels, series,
                       "walltime speedup over plain decoding", "Speculative decoding walltime "
                       "(paper Table 2)", baseline=1.0)
