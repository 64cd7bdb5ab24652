"""The paper's experiments (Leviathan et al. 2023, Tables 2 and 3, Figure 5) as drivers
over a grid of gin-configured cells (`configs/paper/*.gin`), each writing one resumable
run directory: `run("walltime_table", cells, output_dir)`, or the command-line entry points
`alpha_table`, `walltime_table`, `gamma_sweep` below."""
from typing import Any, Dict, List, Optional, Sequence

from speculative_t5.paper import alpha_table as _alpha, gamma_sweep as _sweep, walltime as _walltime
from speculative_t5.paper.grid import run_grid

DRIVERS = {"alpha_table": (_alpha.alpha_cell, _alpha.finish),
           "walltime_table": (_walltime.walltime_cell, _walltime.finish),
           "gamma_sweep": (_sweep.gamma_sweep_cell, _sweep.finish)}


def run(kind: str, cells: Sequence[str], output_dir: str, gin_files: Sequence[str] = (),
        bindings: Sequence[str] = (), search_paths: Sequence[str] = (),
        quiet: bool = False) -> List[Dict[str, Any]]:
    """Run every cell config with the `kind` driver into output_dir; returns the table rows.
    gin_files / bindings apply to every cell, after the cell's own config."""
    if kind not in DRIVERS:
        raise ValueError(f"unknown driver {kind!r}; known: {', '.join(DRIVERS)}")
    cell_fn, finish = DRIVERS[kind]
    import jax
    quiet = quiet or jax.process_index() > 0  # several processes: the coordinator reports
    return run_grid(kind, cells, output_dir, lambda cell, rd: cell_fn(cell, rd, quiet=quiet),
                    finish, gin_files, bindings, search_paths)


def _command(kind: str):
    def command(cell: Sequence[str], output_dir: str, tfds_data_dir: Optional[str] = None,
                quiet: bool = False, gin_files: Sequence[str] = (), bindings: Sequence[str] = (),
                search_paths: Sequence[str] = ()) -> List[Dict[str, Any]]:
        bindings = list(bindings)
        if tfds_data_dir:
            bindings.append(f"TFDS_DATA_DIR = {tfds_data_dir!r}")
        return run(kind, cell, output_dir, gin_files, bindings, search_paths, quiet)
    command.__name__ = kind
    command.__doc__ = f"`speculative-t5 {kind}`: the {kind} driver over --cell configs."
    return command


alpha_table, walltime_table, gamma_sweep = (_command(k) for k in DRIVERS)
