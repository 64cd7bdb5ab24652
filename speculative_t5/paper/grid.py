"""Run a grid of table cells (one gin config each) into one run directory, resumably, and
the measurements every driver shares: step costs c and v, alpha along target text.

Layout of a run directory:
  <output_dir>/<cell>/examples.jsonl   per-example records, appended as they are measured
  <output_dir>/<cell>/config.gin       the cell's full gin config (T5X writes the same file)
  <output_dir>/<cell>/timing.json      c, v, step times and compile seconds of the cell
  <output_dir>/<cell>/summary.{csv,md} the cell's own summary (+ plots for some drivers)
  <output_dir>/summary.{csv,md}        one row per cell: the table
  <output_dir>/config.gin              every cell's config, one after another
  <output_dir>/environment.json, *.png
A run that is stopped and started again with the same command skips the examples already
in each cell's JSONL; a cell whose config changed is refused, not silently mixed.
"""
from __future__ import annotations

import json
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Sequence

import gin
import jax

from speculative_t5.data import bucket
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.ginconfig import parse_gin
from speculative_t5.paper.cells import Cell, build_cell
from speculative_t5.rundir import RunDir
from speculative_t5.timing import decoder_step_bytes, step_times, timed_decodes

RUN_BLOCKS = {"alpha_table": "runs/alpha.gin", "walltime_table": "runs/walltime.gin",
              "gamma_sweep": "runs/gamma_sweep.gin"}


def cell_name(config_file: str) -> str:
    return os.path.splitext(os.path.basename(config_file))[0]


def run_grid(kind: str, cell_files: Sequence[str], output_dir: str,
             run_cell: Callable[[Cell, RunDir], Dict[str, Any]],
             finish: Callable[[RunDir, List[Dict[str, Any]]], None],
             gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
             search_paths: Sequence[str] = ()) -> List[Dict[str, Any]]:
    """For each cell config: parse it (after the driver's run block, before the common
    gin files and bindings), build the Cell, run it into output_dir/<cell>; then write the
    table through `finish(top_rundir, rows)`."""
    if not cell_files:
        raise ValueError("no cells: pass one or more --cell configs/paper/....gin")
    names = [cell_name(f) for f in cell_files]
    if len(set(names)) != len(names):
        raise ValueError(f"two cells share a name: {sorted(n for n in names if names.count(n) > 1)}")
    top = RunDir(output_dir)
    rows, configs = [], []
    for path, name in zip(cell_files, names):
        parse_gin([RUN_BLOCKS[kind], path, *gin_files], bindings, search_paths)
        cell = build_cell(name, path)
        run = RunDir(os.path.join(output_dir, name))
        _check_same_config(run, path)
        configs.append(f"# ---- cell {name} ({path}) ----\n{gin.config_str()}")
        rows.append(run_cell(cell, run))
    gin.clear_config()
    with open(os.path.join(output_dir, "config.gin"), "w") as f:
        f.write("\n".join(configs))
    top.write_environment()
    finish(top, rows)
    return rows


def _check_same_config(run: RunDir, path: str) -> None:
    old = os.path.join(run.path, "config.gin")
    new = gin.config_str()
    if os.path.exists(old) and run.done:
        before = open(old).read()
        if before != new:
            import difflib
            diff = [d for d in difflib.unified_diff(before.splitlines(), new.splitlines(), lineterm="", n=0)
                    if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            raise ValueError(f"{run.path} holds results of a different config than {path} "
                             f"({'; '.join(diff[:4])}); use another --output_dir")
    run.write_config()
    run.write_environment()


def sampling_of(cell: Cell) -> SamplingConfig:
    return SamplingConfig(cell.temperature, cell.top_k, cell.top_p).validate()


def step_costs(run: RunDir, target, draft, gammas: Sequence[int], input_len: int,
               max_len: int, rounds: int) -> Dict[str, Any]:
    """c (draft step / target step, one token) and v(gamma) (target step over gamma+1
    tokens / one token), batch 1, interleaved medians; kept in timing.json so a resumed
    run reports the costs it started with."""
    path = os.path.join(run.path, "timing.json")
    if os.path.exists(path):
        with open(path) as f:
            saved = json.load(f)
        if all(str(g) in saved["v"] for g in gammas):
            return saved
    pos, cache_len = max_len // 2, max_len + max(gammas) + 1
    specs = {"target_1": (target, 1), "draft_1": (draft, 1),
             **{f"target_{g + 1}": (target, g + 1) for g in gammas}}
    steps = step_times(specs, 1, input_len, cache_len, pos, rounds)
    costs = {"c": steps["draft_1"] / steps["target_1"],
             "v": {str(g): steps[f"target_{g + 1}"] / steps["target_1"] for g in gammas},
             "step_ms": {k: 1e3 * t for k, t in steps.items()}, "input_len": input_len,
             "target_step_bytes": decoder_step_bytes(target), "compile_seconds": 0.0}
    save_timing(run, costs)
    return costs


def save_timing(run: RunDir, costs: Dict[str, Any]) -> None:
    with open(os.path.join(run.path, "timing.json"), "w") as f:
        json.dump(costs, f, indent=2)


def metric_columns(cell: Cell, records: Sequence[Dict[str, Any]],
                   outputs: Dict[str, str]) -> Dict[str, float]:
    """The task's metric (BLEU or ROUGE) of each output column {suffix: record key}."""
    if cell.metric is None or any(r.get("reference") is None for r in records):
        return {}
    from speculative_t5.data.tasks import METRICS
    refs = [r["reference"] for r in records]
    out = {}
    for suffix, key in outputs.items():
        for name, value in METRICS[cell.metric](refs, [r[key] for r in records]).items():
            out[f"{name}_{suffix}"] = value
    return out


def in_cell_order(cell: Cell, records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Records of this cell's examples, in example order (a JSONL may hold them in any)."""
    by_id = {r["id"]: r for r in records}
    return [by_id[e["id"]] for e in cell.examples if e["id"] in by_id]


def todo(cell: Cell, run: RunDir) -> List[tuple]:
    """[(index, example)] not yet in the run directory."""
    done = run.done
    return [(i, e) for i, e in enumerate(cell.examples) if e["id"] not in done]


def progress(total: int, desc: str, quiet: bool = False):
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit="ex", disable=quiet or total == 0)


def median_width(cell: Cell) -> int:
    """The median bucketed input width: the encoder length the step timings use."""
    widths = sorted(bucket(e["inputs"]).shape[1] for e in cell.examples)
    return widths[len(widths) // 2]


def timed_examples(cell: Cell, run: RunDir, todo: Sequence[tuple], target, variants: Dict,
                   costs: Dict[str, Any], quiet: bool) -> Iterator[tuple]:
    """For each example to do: (index, example, x [1, W], {variant: (output, seconds)}),
    batch 1, the variants timed back to back with one rng per example. The first example
    of each width compiles its programs untimed; those seconds go to costs['compile_seconds']."""
    sampling, warm = sampling_of(cell), set()
    with progress(len(todo), cell.name, quiet) as bar:
        for i, ex in todo:
            x = bucket(ex["inputs"])                                            # [1, W]
            rng = jax.random.fold_in(jax.random.PRNGKey(cell.seed), i)
            if x.shape[1] not in warm:
                t0 = time.perf_counter()
                timed_decodes(target, variants, x, sampling, cell.max_decode_len, rng)
                costs["compile_seconds"] += time.perf_counter() - t0
                save_timing(run, costs)
                warm.add(x.shape[1])
            yield i, ex, x, timed_decodes(target, variants, x, sampling, cell.max_decode_len, rng)
            bar.update(1)

