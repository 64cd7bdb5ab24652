"""The one measuring core of the walltime drivers (`walltime_table`, `gamma_sweep`, and the
demo, which runs them): a cell's part costs for the cost model, measured before its decodes
and kept in the cell's timing.json, and its examples decoded one at a time (batch 1), every
variant back to back per example and each part timed once more right after them (kept in
the example's record: the prediction pairs each decode with parts timed beside it, so a
machine that slows down or speeds up during a cell moves both alike), compile time kept
apart."""
from __future__ import annotations

import json
import os
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import jax

from speculative_t5.paper.cells import Cell
from speculative_t5.paper.rundir import RunDir
from speculative_t5.engine import cache_positions
from speculative_t5.measure.costs import Costs, PartTimers, timed_parts
from speculative_t5.measure.timing import decoder_step_bytes, timed_decodes


def load_timing(run: RunDir) -> Dict[str, Any]:
    with open(os.path.join(run.path, "timing.json")) as f:
        return json.load(f)


def save_timing(run: RunDir, timing: Dict[str, Any]) -> None:
    with open(os.path.join(run.path, "timing.json"), "w") as f:
        json.dump(timing, f, indent=2)


# within one grid run (run_grid clears it); costs None: timers only warmed (resumed cells)
_MEASURED: Dict[tuple, Tuple[PartTimers, Optional[Costs]]] = {}


def forget_costs() -> None:
    """Start a grid run with no shared costs: parts are measured anew for each run."""
    _MEASURED.clear()


def cell_costs(run: RunDir, cell: Cell, target, draft, gammas: Sequence[int],
               examples: Sequence[Dict[str, Any]], rounds: int) -> Tuple[Dict[str, Any], PartTimers]:
    """The parts of the cost model (`measure.costs`) for this cell's models at its lengths:
    steps at the examples' median input width, set-up at every width they use; and their
    timers (`timed_examples` times every part again beside each example). Kept in
    timing.json, so a resumed run keeps the costs it started with."""
    widths = sorted(cell.width(e) for e in examples)
    # the speculative decodes' cache length, as `generate` allocates it (`cache_positions`:
    # max_decode_len rounded up to a multiple of 16); cells with nearby lengths share it,
    # and so the timers' compiled programs
    cache_len = cache_positions(cell.max_decode_len)
    key = (cell.target, cell.draft, cell.dtype, tuple(gammas), tuple(sorted(set(widths))),
           widths[len(widths) // 2], cache_len,
           cell.sampling,  # the loop's own work: sampling costs more than argmax
           cell.max_decode_len)  # the plain decode's cache length
    path = os.path.join(run.path, "timing.json")
    saved = load_timing(run) if os.path.exists(path) else None
    if saved is not None and not all(str(g) in saved["costs"].get("round_loop", {}) for g in gammas):
        saved = None                                    # from an older version: measure anew
    if key not in _MEASURED:  # cells of one grid run with the same models and lengths share them
        timers = PartTimers(target, draft, *key[3:])
        # a resumed cell keeps the costs it started with: its timers need only compiling
        _MEASURED[key] = timers, (timers.measure(rounds) if saved is None else timers.warm())
    timers, costs = _MEASURED[key]
    if saved is not None:
        return saved, timers
    if costs is None:     # measured for nothing so far (shared by resumed cells only)
        costs = timers.measure(rounds)
        _MEASURED[key] = timers, costs
    timing = {"costs": costs.to_json(), "c": costs.c, "draft_parts": timed_parts(draft),
              "v": {str(g): costs.v(g) for g in gammas},
              "step_ms": {"target_1": 1e3 * costs.target_step, "draft_1": 1e3 * costs.draft_step,
                          "plain_1": None if costs.plain_step is None else 1e3 * costs.plain_step},
              "loop_ms": {"plain_step": 1e3 * costs.plain_loop,
                          **{f"round_{g}": 1e3 * costs.round_loop[g] for g in gammas}},
              # a round's model steps in turn (R_gamma) beyond the steps timed alone
              "interleave_ms": {str(g): 1e3 * costs.interleave(g) for g in gammas},
              "target_step_bytes": decoder_step_bytes(target), "compile_seconds": 0.0}
    save_timing(run, timing)
    return timing, timers


def costs_of(timing: Dict[str, Any], recs: Sequence[Dict[str, Any]] = ()) -> Costs:
    """The cell's costs: each part's median over the records' own timings of it (`parts`,
    taken beside their decodes) where they have them, else the cell's up-front measurement."""
    return Costs.from_json(timing["costs"]).median_with([r["parts"] for r in recs if "parts" in r])


def predicted_seconds(costs: Costs, gamma: int, recs: List[Dict[str, Any]]) -> Dict[str, float]:
    """The cost model's plain and speculative walltime of these records' decodes, each from
    the parts timed beside it (`parts` in its record) where it has them, else `costs`."""
    out = {"plain": 0.0, "spec": 0.0}
    for r in recs:
        c = Costs.from_parts({**costs.parts(), **r["parts"]}, costs.step_width, costs.cache_len) \
            if "parts" in r else costs
        out["plain"] += c.plain_seconds(r["width"], r["plain"]["target_calls"])
        out["spec"] += c.speculative_seconds(r["width"], gamma, r["spec"]["target_calls"],
                                             r["spec"]["two_token_draft_calls"],
                                             r["spec"].get("draft_model_steps"))
    return out


def timed_examples(cell: Cell, run: RunDir, todo: Sequence[tuple], target, variants: Dict,
                   timing: Dict[str, Any], timers: PartTimers, quiet: bool) -> Iterator[tuple]:
    """For each example to do: (index, example, x [1, W], {variant: (output, seconds)},
    {part: seconds} timed right after), batch 1, the variants timed back to back with one
    rng per example. The first example of each width compiles its programs untimed; those
    seconds go to timing.json."""
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
            runs = timed_decodes(target, variants, x, cell.sampling, cell.max_decode_len, rng)
            yield i, ex, x, runs, timers.once(x.shape[1])
            bar.update(1)
