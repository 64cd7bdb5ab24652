"""`gamma_sweep` (paper Figure 5, Theorem 3.11): for each gamma, per example at batch 1,
the walltime of speculative decoding against plain decoding (interleaved), and the
arithmetic-operations factor; measured beside eq. (5) (measured v and v = 1) and
Theorem 3.11 and the full cost model (`measure.costs`), and the best gamma each way."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence

import gin

from speculative_t5.decoding.output import combine, ratio
from speculative_t5.paper import plots, timed
from speculative_t5.paper.cells import Cell
from speculative_t5.paper.rundir import RunDir
from speculative_t5.measure import analysis
from speculative_t5.measure.alpha import alpha_of, overlap_sums
from speculative_t5.measure.costs import draft_model


def _check_gammas(gammas) -> List[int]:
    gammas = list(gammas)
    if not gammas or any(not isinstance(g, int) or g < 1 for g in gammas) \
            or len(set(gammas)) != len(gammas):
        raise ValueError(f"gamma_sweep_cell.gammas must be distinct ints >= 1, got {gammas!r}")
    return sorted(gammas)


@gin.configurable(denylist=["cell", "run"])
def gamma_sweep_cell(cell: Cell, run: RunDir, gammas: Sequence[int] = (1, 2, 3, 4, 5, 6, 7, 8),
                     timing_rounds: int = 20, one_width: bool = False,
                     max_examples: Optional[int] = None, adaptive: bool = False,
                     quiet: bool = False) -> Dict:
    """Measure the examples not yet in `run` at every gamma, then summarize the cell.
    one_width: sweep only the examples of the cell's most common input width (one compiled
    program per gamma instead of one per gamma and width); max_examples: at most this many.
    adaptive: also time `adaptive_gamma` drafting up to the largest gamma (its costs measured
    by `st.gamma_costs` while its program compiles), beside the fixed gammas: the summary's
    `adaptive` entry, and `choose_gamma` picks between them."""
    gammas = _check_gammas(gammas)
    if cell.beam_size:
        raise ValueError(f"cell {cell.name} is a beam-search cell (beam_size {cell.beam_size}): "
                         f"gamma_sweep sweeps speculative decoding; walltime_table times beam "
                         f"search")
    if cell.adaptive_gamma:
        raise ValueError(f"cell {cell.name} decodes with adaptive gamma: gamma_sweep times fixed "
                         f"gammas (gamma_sweep_cell.adaptive = True times adaptive beside them)")
    if cell.tree:
        raise ValueError(f"cell {cell.name} decodes a token tree {cell.tree}: gamma_sweep times "
                         f"chains of each gamma")
    examples = _swept(cell, one_width)[:max_examples]
    ids = {e["id"] for e in examples}
    todo = [(i, e) for i, e in cell.todo(run.done) if e["id"] in ids]
    if todo:
        _measure(cell, run, todo, gammas, examples, timing_rounds, adaptive, quiet)
    return summarize(cell, run, gammas, adaptive)


def _swept(cell: Cell, one_width: bool) -> List[Dict[str, Any]]:
    if not one_width:
        return list(cell.examples)
    widths = [cell.width(e) for e in cell.examples]
    common = max(sorted(set(widths)), key=widths.count)
    return [e for e, w in zip(cell.examples, widths) if w == common]


def _measure(cell: Cell, run: RunDir, todo: List, gammas: List[int], examples: List,
             timing_rounds: int, adaptive: bool, quiet: bool) -> None:
    target, draft, _ = cell.load_models()
    timing, timers = timed.cell_costs(run, cell, target, draft, gammas, examples, timing_rounds)
    model = draft_model(draft)  # a zero-cost draft does no arithmetic worth counting
    timing["c_hat"] = 0.0 if model is None else (analysis.decode_macs_per_token(model.config)
                                                 / analysis.decode_macs_per_token(target.config))
    timed.save_timing(run, timing)
    variants = {"plain": {}, **{str(g): {"draft": draft, "gamma": g,
                                         "verification": cell.verification} for g in gammas}}
    if adaptive:
        variants["adaptive"] = {"draft": draft, "gamma": max(gammas), "adaptive_gamma": True,
                                "verification": cell.verification}
    for i, ex, x, runs, parts in timed.timed_examples(cell, run, todo, target, variants, timing,
                                                      timers, quiet):
        seconds = {k: round(t, 6) for k, (_, t) in runs.items()}
        plain, _ = runs.pop("plain")
        rec = {"index": i, "width": int(x.shape[1]), "seconds": seconds, "parts": parts,
               "plain": plain.row(0),
               "spec": {g: r.row(0) for g, (r, _) in runs.items()}}
        rec.update(overlap_sums(target, draft, x, plain.tokens, cell.sampling)[0])
        run.append({"id": ex["id"], **rec})


def summarize(cell: Cell, run: RunDir, gammas: List[int], adaptive: bool = False) -> Dict[str, Any]:
    """Per-gamma rows (the cell's summary and plots); returns the cell's best-gamma row."""
    recs = cell.in_order(run.records())
    timing = timed.load_timing(run)
    costs = timed.costs_of(timing, recs)
    missing = [g for g in gammas + (["adaptive"] if adaptive else [])
               if str(g) not in recs[0]["seconds"]]
    if missing:
        raise ValueError(f"{run.path} was measured for other gammas (no {missing}); use "
                         "another --output_dir")
    c_hat = timing["c_hat"]
    alpha = alpha_of(recs)
    a, c = alpha["alpha"], costs.c
    t_plain = sum(r["seconds"]["plain"] for r in recs)
    rows = []
    for g in gammas:
        k = str(g)
        spec = combine([r["spec"][k] for r in recs])
        pred = timed.predicted_seconds(costs, g, [dict(r, spec=r["spec"][k]) for r in recs])
        rows.append({"gamma": g, "v": costs.v(g), "tokens_per_target_call": spec["tokens_per_target_call"],
                     "tokens_per_call_predicted": analysis.expected_tokens_per_call(a, g),
                     "speedup_measured": t_plain / sum(r["seconds"][k] for r in recs),
                     "speedup_predicted_full": pred["plain"] / pred["spec"],
                     "speedup_predicted": analysis.walltime_improvement(a, g, c, costs.v(g)),
                     "speedup_predicted_paper": analysis.walltime_improvement(a, g, c),
                     "operations_measured": ratio(spec["target_calls"] * (g + 1)
                                                  + c_hat * spec["draft_calls"], spec["tokens"]),
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
    adaptive_row = None
    if adaptive:
        spec = combine([r["spec"]["adaptive"] for r in recs])
        adaptive_row = {"max_gamma": max(gammas),
                        "tokens_per_target_call": spec["tokens_per_target_call"],
                        "speedup_measured": t_plain / sum(r["seconds"]["adaptive"] for r in recs)}
    return dict(labels, **alpha, c=c, c_hat=c_hat, adaptive=adaptive_row,
                best_gamma_measured=best("speedup_measured")["gamma"],
                best_speedup_measured=best("speedup_measured")["speedup_measured"],
                best_gamma_predicted_full=best("speedup_predicted_full")["gamma"],
                best_gamma_predicted=best("speedup_predicted")["gamma"],
                best_gamma_predicted_paper=best("speedup_predicted_paper")["gamma"],
                cell_gamma=cell.gamma, compile_seconds=timing["compile_seconds"],
                examples_swept=len(recs), width_swept=max(r["width"] for r in recs),
                curve=([r["gamma"] for r in rows], [r["speedup_measured"] for r in rows]),
                rows=rows)


def choose_gamma(swept: Dict[str, Any]) -> Dict[str, Any]:
    """What a cell's decode should run, from its sweep (`gamma_sweep_cell`'s summary):
    adaptive gamma where it measured at least as fast as the fastest fixed gamma, else the
    fixed gamma the cost model predicts fastest (steadier than the measured best of a few
    noisy timings). {"adaptive": bool, "gamma": the gamma to decode with (adaptive's
    largest), "why": one line saying so}."""
    best, fixed = swept["best_speedup_measured"], swept["best_gamma_predicted_full"]
    a = swept.get("adaptive")
    if a is not None and a["speedup_measured"] >= best:
        return {"adaptive": True, "gamma": a["max_gamma"],
                "why": f"adaptive gamma (at most {a['max_gamma']}): measured "
                       f"{a['speedup_measured']:.2f}x, the fastest fixed gamma "
                       f"({swept['best_gamma_measured']}) {best:.2f}x"}
    why = f"gamma {fixed}, the cost model's fastest over gammas {[r['gamma'] for r in swept['rows']]}"
    if a is not None:
        why += (f" (adaptive measured {a['speedup_measured']:.2f}x, under the fastest fixed "
                f"gamma's {best:.2f}x)")
    return {"adaptive": False, "gamma": fixed, "why": why}


def finish(top: RunDir, rows: List[Dict[str, Any]]) -> None:
    """One best-gamma row per cell, and every cell's measured curve on one chart."""
    curves = {r["cell"]: r["curve"] for r in rows}
    top.write_summary([{k: v for k, v in r.items() if k not in ("curve", "rows", "adaptive")}
                       for r in rows])
    plots.lines(os.path.join(top.path, "speedup_vs_gamma.png"), curves, "gamma",
                "measured walltime speedup", "Speedup vs gamma, every cell (paper Fig. 5)",
                baseline=1.0)
