"""Run a grid of table cells (one gin config each) into one run directory, resumably.

Layout of a run directory:
  <output_dir>/<cell>/examples.jsonl   per-example records, appended as they are measured
  <output_dir>/<cell>/config.gin       the cell's full gin config (T5X writes the same file)
  <output_dir>/<cell>/timing.json      c, v, step times and compile seconds of the cell
  <output_dir>/<cell>/summary.{csv,md} the cell's own summary (+ plots for some drivers)
  <output_dir>/summary.{csv,md}        one row per cell: the table
  <output_dir>/config.gin              every cell's config, one after another
  <output_dir>/environment.json, *.png
A run that is stopped and started again with the same command skips the examples already
in each cell's JSONL; a cell whose config changed is refused, not silently mixed. Several
processes (`--multiprocess`, `--coordinator_address ...`) run every cell together, each
decode one program over all their devices; process 0 writes the run directory.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Sequence

import gin

from speculative_t5.paper import timed
from speculative_t5.paper.cells import Cell, build_cell
from speculative_t5.paper.ginconfig import parse_gin
from speculative_t5.paper.rundir import RunDir, coordinated_dir

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
    output_dir = coordinated_dir(output_dir)  # several processes: process 0 writes
    top = RunDir(output_dir)
    timed.forget_costs()
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


# bindings that change a cell's summary, not its measurements: a finished run takes them
SUMMARY_ONLY = ("walltime_cell.tpu_report",)


def _measured(config: str) -> List[str]:
    """The config's lines less the SUMMARY_ONLY bindings (and their continuation lines)."""
    out, skip = [], False
    for line in config.splitlines():
        skip = line.startswith(SUMMARY_ONLY) or (skip and line[:1] in (" ", "\t"))
        if not skip:
            out.append(line)
    return out


def _check_same_config(run: RunDir, path: str) -> None:
    old = os.path.join(run.path, "config.gin")
    new = gin.config_str()
    if os.path.exists(old) and run.done:
        before = open(old).read()
        if _measured(before) != _measured(new):
            import difflib
            diff = [d for d in difflib.unified_diff(before.splitlines(), new.splitlines(), lineterm="", n=0)
                    if d[:1] in "+-" and d[:3] not in ("+++", "---")]
            raise ValueError(f"{run.path} holds results of a different config than {path} "
                             f"({'; '.join(diff[:4])}); use another --output_dir, or --restart to "
                             "start over (the earlier results are moved aside)")
    run.write_config()
    run.write_environment()
