"""`walltime_table`'s beam-search rows: a cell with `beam_size` (gin
`decoding/beam_search.gin`) times T5X's beam search (`st.beam_search`) against the exact
speculative beam search (the same call with the cell's draft model) on each example, batch 1,
back to back, and reports beam steps per target call, the walltime ratio, how many examples
got the same beams, and the task metric of each's best beam (equal when the beams are)."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List

import numpy as np

from speculative_t5.beam_engine import beam_search
from speculative_t5.paper.cells import Cell
from speculative_t5.paper.rundir import RunDir


def _decodes(cell: Cell, target, draft, x) -> Dict[str, tuple]:
    """{'plain' | 'spec': (BeamSearchOutput, seconds)} for one input x [1, W]."""
    out = {}
    for name, kwargs in (("plain", {}),
                         ("spec", {"draft": draft, "gamma": cell.gamma, "paths": cell.beam_paths})):
        t0 = time.perf_counter()
        res = beam_search(target, x, beam_size=cell.beam_size, alpha=cell.beam_alpha,
                          max_decode_len=cell.max_decode_len, **kwargs)
        out[name] = (res, time.perf_counter() - t0)
    return out


def measure(cell: Cell, run: RunDir, todo: List, models, quiet: bool) -> None:
    """Decode the examples to do; the first of each input width compiles untimed (its
    seconds go to timing.json's compile_seconds, as the other rows')."""
    from tqdm import tqdm
    from speculative_t5.paper import timed
    target, draft, vocab = models
    path = os.path.join(run.path, "timing.json")
    timing = timed.load_timing(run) if os.path.exists(path) else {"compile_seconds": 0.0}
    warm = set()
    for i, ex in tqdm(todo, desc=cell.name, unit="ex", disable=quiet or not todo):
        x = cell.padded([ex])                                                   # [1, W]
        if x.shape[1] not in warm:
            t0 = time.perf_counter()
            _decodes(cell, target, draft, x)
            timing["compile_seconds"] += time.perf_counter() - t0
            timed.save_timing(run, timing)
            warm.add(x.shape[1])
        runs = _decodes(cell, target, draft, x)
        (plain, _), (spec, _) = runs["plain"], runs["spec"]
        best = [vocab.decode(o.tokens[0, 0]) for o in (plain, spec)]
        same = bool(np.array_equal(plain.tokens, spec.tokens)
                    and np.array_equal(plain.lengths, spec.lengths))
        run.append({"id": ex["id"], "index": i, "width": int(x.shape[1]),
                    "seconds": {k: round(t, 6) for k, (_, t) in runs.items()},
                    "plain": plain.summary(), "spec": spec.summary(), "identical": same,
                    "max_score_diff": float(np.max(np.abs(plain.scores - spec.scores))),
                    "plain_tokens": plain.tokens[0, 0, :plain.lengths[0, 0]].tolist(),
                    "plain_output": best[0], "spec_output": best[1],
                    "input": ex["input_text"], "reference": ex["reference"]})


def summarize(cell: Cell, run: RunDir) -> Dict[str, Any]:
    """The cell's row, from its records alone."""
    from speculative_t5.paper import timed
    recs = cell.in_order(run.records())
    sec = {k: sum(r["seconds"][k] for r in recs) for k in ("plain", "spec")}
    steps = sum(r["spec"]["beam_steps"] for r in recs)
    calls = sum(r["spec"]["target_calls"] for r in recs)
    row = dict(cell.labels(), beam_size=cell.beam_size, beam_alpha=cell.beam_alpha,
               beam_paths=recs[0]["spec"]["paths"], beam_steps_per_target_call=steps / calls,
               target_calls_plain=sum(r["plain"]["target_calls"] for r in recs),
               target_calls_spec=calls, speedup_measured=sec["plain"] / sec["spec"],
               identical_fraction=float(np.mean([r["identical"] for r in recs])),
               max_score_diff=max(r["max_score_diff"] for r in recs),
               ms_per_example_plain=1e3 * sec["plain"] / len(recs),
               ms_per_example_spec=1e3 * sec["spec"] / len(recs),
               paper_alpha=cell.paper["alpha"], paper_speedup=cell.paper["speedup"],
               compile_seconds=timed.load_timing(run)["compile_seconds"])
    row.update(cell.metric_columns(recs, {"plain": "plain_output", "spec": "spec_output"}))
    run.write_summary([row])
    return row
