"""`alpha_table` (paper Table 3): alpha = E[sum_x min(p(x), q(x))] over the positions of
target-generated text (greedy at temperature 0, sampled at temperature 1), per pair x task
x temperature, with a 95% confidence interval. No speculative decoding runs: alpha is a
property of the two models and the task."""
from __future__ import annotations

import os
from typing import Any, Dict, List

import gin
import jax
import numpy as np
from tqdm import tqdm

from speculative_t5.paper import plots
from speculative_t5.measure.alpha import alpha_of, overlap_sums
from speculative_t5.data import pad_rows
from speculative_t5.engine import generate
from speculative_t5.paper.cells import Cell
from speculative_t5.paper.rundir import RunDir


@gin.configurable(denylist=["cell", "run"])
def alpha_cell(cell: Cell, run: RunDir, batch_size: int = 8, quiet: bool = False) -> Dict:
    """Measure the examples not yet in `run` in fixed batches (the same batches, and so the
    same samples, whether or not the run was interrupted), then summarize the cell."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"alpha_cell.batch_size must be an int >= 1, got {batch_size!r}")
    todo = cell.todo(run.done)
    if todo:
        target, draft, vocab = cell.load_models()
        sampling = cell.sampling
        missing = {i for i, _ in todo}
        with tqdm(total=len(todo), desc=cell.name, unit="ex", disable=quiet) as bar:
            for start in range(0, len(cell.examples), batch_size):
                idx = list(range(start, min(start + batch_size, len(cell.examples))))
                if not missing.intersection(idx):
                    continue
                exs = [cell.examples[i] for i in idx]
                x = pad_rows(cell.padded(exs), batch_size)                         # [B, W]
                rng = jax.random.fold_in(jax.random.PRNGKey(cell.seed), start)
                out = generate(target, x, max_decode_len=cell.max_decode_len,
                               sampling=sampling, rng=rng)
                sums = overlap_sums(target, draft, x, out.tokens, sampling)
                for row, (i, e) in enumerate(zip(idx, exs)):
                    if i not in missing:
                        continue
                    rec = dict(sums[row], index=i, output=vocab.decode(out.tokens[row]),
                               length=int(out.lengths[row]))
                    run.append({"id": e["id"], **rec})
                    bar.update(1)
    return summarize(cell, run)


def summarize(cell: Cell, run: RunDir) -> Dict[str, Any]:
    recs = cell.in_order(run.records())
    labels = cell.labels()
    labels.pop("gamma")
    row = dict(labels, **alpha_of(recs), paper_alpha=cell.paper["alpha"],
               mean_output_length=float(np.mean([r["length"] for r in recs])))
    run.write_summary([row])
    return row


def finish(top: RunDir, rows: List[Dict[str, Any]]) -> None:
    top.write_summary(rows)
    series = {"measured": [r["alpha"] for r in rows]}
    errors = {"measured": [r["alpha_ci95"] for r in rows]}
    if any(r["paper_alpha"] is not None for r in rows):
        series["paper"] = [r["paper_alpha"] for r in rows]
    plots.grouped_bars(os.path.join(top.path, "alpha.png"), [r["cell"] for r in rows], series,
                       "alpha = E[sum min(p, q)]", "Acceptance rate alpha (paper Table 3)",
                       errors=errors)
