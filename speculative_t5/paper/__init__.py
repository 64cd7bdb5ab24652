"""What writes run directories: the paper's drivers over gin-configured cells
(`alpha_table`, `walltime_table`, `gamma_sweep`), the demo (the same drivers over the demo
cells plus a console report), plots, and the resumable run directory itself."""
