"""The paper's experiments (Leviathan et al. 2023, Tables 2 and 3, Figure 5) as drivers
over a grid of gin-configured cells (`configs/paper/*.gin`), each writing one resumable
run directory: `run("walltime_table", cells, output_dir)`, or the command-line entry points
`alpha_table`, `walltime_table`, `gamma_sweep` below.

An output_dir is one run's, written by one process at a time (`locks.hold`); a cell whose
config changed since its records were written is refused (`grid`), and `restart` moves the
directory's earlier results aside (`locks.move_aside`) to start over."""
import os
from typing import Any, Dict, List, Optional, Sequence

from speculative_t5.locks import hold, move_aside
from speculative_t5.paper import alpha_table as _alpha, gamma_sweep as _sweep, walltime as _walltime
from speculative_t5.paper.grid import run_grid

DRIVERS = {"alpha_table": (_alpha.alpha_cell, _alpha.finish),
           "walltime_table": (_walltime.walltime_cell, _walltime.finish),
           "gamma_sweep": (_sweep.gamma_sweep_cell, _sweep.finish)}


# what the drivers write at the top of an output_dir; each cell is a subdirectory holding
# examples.jsonl
TOP_FILES = ("summary.csv", "summary.md", "config.gin", "environment.json", "alpha.png",
             "walltime.png", "speedup_vs_gamma.png")


def _results(output_dir: str) -> List[str]:
    """What the drivers wrote in output_dir: the top-level files and every cell."""
    if not os.path.isdir(output_dir):
        return []
    return [n for n in sorted(os.listdir(output_dir))
            if n in TOP_FILES or os.path.isfile(os.path.join(output_dir, n, "examples.jsonl"))]


def run(kind: str, cells: Sequence[str], output_dir: str, gin_files: Sequence[str] = (),
        bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
        quiet: bool = False, restart: bool = False) -> List[Dict[str, Any]]:
    """Run every cell config with the `kind` driver into output_dir; returns the table rows.
    gin_files / bindings apply to every cell, after the cell's own config. restart: move
    the directory's earlier results aside first (else a changed cell config is refused)."""
    if kind not in DRIVERS:
        raise ValueError(f"unknown driver {kind!r}; known: {', '.join(DRIVERS)}")
    cell_fn, finish = DRIVERS[kind]
    import jax
    quiet = quiet or jax.process_index() > 0  # several processes: the coordinator reports
    prepare = (lambda: move_aside(output_dir, _results(output_dir), quiet)) if restart else None
    with hold(output_dir, prepare=prepare):
        return run_grid(kind, cells, output_dir,
                        lambda cell, rd: cell_fn(cell, rd, quiet=quiet),
                        finish, gin_files, bindings, search_paths)


def _command(kind: str):
    def command(cell: Sequence[str], output_dir: str, tfds_data_dir: Optional[str] = None,
                quiet: bool = False, gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
                search_paths: Sequence[str] = (), restart: bool = False) -> List[Dict[str, Any]]:
        bindings = list(bindings)
        if tfds_data_dir:
            bindings.append(f"TFDS_DATA_DIR = {tfds_data_dir!r}")
        return run(kind, cell, output_dir, gin_files, bindings, search_paths, quiet, restart)
    command.__name__ = kind
    command.__doc__ = f"`speculative-t5 {kind}`: the {kind} driver over --cell configs."
    return command


alpha_table, walltime_table, gamma_sweep = (_command(k) for k in DRIVERS)
