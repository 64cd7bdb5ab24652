"""The paper's experiments (Leviathan et al. 2023, Tables 2 and 3, Figure 5) as drivers
over a grid of gin-configured cells (`configs/paper/*.gin`), each writing one resumable
run directory: `run("walltime_table", cells, output_dir)`."""
from typing import Any, Dict, List, Sequence

from speculative_t5.paper import alpha_table, gamma_sweep, walltime
from speculative_t5.paper.grid import run_grid

DRIVERS = {"alpha_table": (alpha_table.alpha_cell, alpha_table.finish),
           "walltime_table": (walltime.walltime_cell, walltime.finish),
           "gamma_sweep": (gamma_sweep.gamma_sweep_cell, gamma_sweep.finish)}


def run(kind: str, cells: Sequence[str], output_dir: str, gin_files: Sequence[str] = (),
        bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
        quiet: bool = False) -> List[Dict[str, Any]]:
    """Run every cell config with the `kind` driver into output_dir; returns the table rows.
    gin_files / bindings apply to every cell, after the cell's own config."""
    if kind not in DRIVERS:
        raise ValueError(f"unknown driver {kind!r}; known: {', '.join(DRIVERS)}")
    cell_fn, finish = DRIVERS[kind]
    return run_grid(kind, cells, output_dir, lambda cell, rd: cell_fn(cell, rd, quiet=quiet),
                    finish, gin_files, bindings, search_paths)
