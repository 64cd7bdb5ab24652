"""The one measuring core of the walltime drivers (`walltime_table`, `gamma_sweep`, and the
demo, which runs them): a cell's part costs for the cost model, measured once and kept in
the cell's timing.json, and its examples decoded one at a time (batch 1), every variant
back to back per example, compile time kept apart."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterator, List, Sequence

import jax

from speculative_t5.experiments.cells import Cell
from speculative_t5.experiments.rundir import RunDir
from speculative_t5.measure.costs import Costs, measure_costs, timed_parts
from speculative_t5.measure.timing import decoder_step_bytes, timed_decodes


def load_timing(run: RunDir) -> Dict[str, Any]:
    with open(os.path.join(run.path, "timing.json")) as f:
        return json.load(f)


def save_timing(run: RunDir, timing: Dict[str, Any]) -> None:
    with open(os.path.join(run.path, "timing.json"), "w") as f:
        json.dump(timing, f, indent=2)


_MEASURED: Dict[tuple, Costs] = {}  # within one grid run (run_grid clears it)


def forget_costs() -> None:
    """Start a grid run with no shared costs: parts are measured anew for each run."""
    _MEASURED.clear()


def cell_costs(run: RunDir, cell: Cell, target, draft, gammas: Sequence[int],
               examples: Sequence[Dict[str, Any]], rounds: int) -> Dict[str, Any]:
    """The parts of the cost model (`measure.costs`) for this cell's models at its lengths:
    steps at the examples' median input width, set-up at every width they use. Kept in
    timing.json, so a resumed run predicts with the costs it started with."""
    path = os.path.join(run.path, "timing.json")
    if os.path.exists(path):
        saved = load_timing(run)
        if all(str(g) in saved["costs"].get("round_loop", {}) for g in gammas):
            return saved
    widths = sorted(cell.width(e) for e in examples)
    key = (cell.target, cell.draft, cell.dtype, tuple(gammas), tuple(sorted(set(widths))),
           widths[len(widths) // 2], cell.max_decode_len + max(gammas) + 1, rounds,
           cell.sampling._replace(temperature=0.0))  # the loops' cost depends on top-k/p only
    if key not in _MEASURED:  # cells of one grid run with the same models and lengths share them
        _MEASURED[key] = measure_costs(target, draft, *key[3:])
    costs = _MEASURED[key]
    timing = {"costs": costs.to_json(), "c": costs.c, "draft_parts": timed_parts(draft),
              "v": {str(g): costs.v(g) for g in gammas},
              "step_ms": {"target_1": 1e3 * costs.target_step, "draft_1": 1e3 * costs.draft_step},
              "loop_ms": {"plain_step": 1e3 * costs.plain_loop,
                          **{f"round_{g}": 1e3 * costs.round_loop[g] for g in gammas}},
              "target_step_bytes": decoder_step_bytes(target), "compile_seconds": 0.0}
    save_timing(run, timing)
    return timing


def costs_of(timing: Dict[str, Any]) -> Costs:
    return Costs.from_json(timing["costs"])


def predicted_seconds(costs, gamma: int, recs: List[Dict[str, Any]]) -> Dict[str, float]:
    """The cost model's plain and speculative walltime of these records' decodes."""
    return {"plain": sum(costs.plain_seconds(r["width"], r["plain"]["target_calls"]) for r in recs),
            "spec": sum(costs.speculative_seconds(r["width"], gamma, r["spec"]["target_calls"],
                                                  r["spec"]["two_token_draft_calls"],
                                                  r["spec"].get("draft_model_steps")) for r in recs)}


def timed_examples(cell: Cell, run: RunDir, todo: Sequence[tuple], target, variants: Dict,
                   timing: Dict[str, Any], quiet: bool) -> Iterator[tuple]:
    """For each example to do: (index, example, x [1, W], {variant: (output, seconds)}),
    batch 1, the variants timed back to back with one rng per example. The first example
    of each width compiles its programs untimed; those seconds go to timing.json."""
    from tqdm import tqdm
    warm = set()
    with tqdm(total=len(todo), desc=cell.name, unit="ex", disable=quiet or not todo) as bar:
        for i, ex in todo:
            x = cell.padded([ex])                                               # [1, W]
            rng = jax.random.fold_in(jax.random.PRNGKey(cell.seed), i)
            if x.shape[1] not in warm:
                t0 = time.perf_counter()
                timed_decodes(target, variants, x, cell.sampling, cell.max_decode_len, rng)
                timing["compile_seconds"] += time.perf_counter() - t0
                save_timing(run, timing)
                warm.add(x.shape[1])
            yield i, ex, x, timed_decodes(target, variants, x, cell.sampling, cell.max_decode_len, rng)
            bar.update(1)
