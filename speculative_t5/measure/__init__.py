"""Measurement: alpha along target text, the paper's analysis (eq. 1, eq. 5, Theorem 3.11),
timing inside compiled loops, and the cost model that predicts a decode's walltime from
separately measured parts. Used by the experiment drivers, the demo and the benchmarks."""
