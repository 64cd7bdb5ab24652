"""What the benchmarks share: the demo inputs batched alike (`batches_of`) and the options
every benchmark against Hugging Face takes (`peer_parser`: `bench_hf.py`, `bench_gpt2.py`).
Imported by the scripts beside it (run as `python experiments/NAME.py`)."""
import argparse
import os
import statistics
import time

import speculative_t5 as st



def peer_parser(doc: str, max_new_tokens: int = 32, repeats: int = 3) -> argparse.ArgumentParser:
    """An ArgumentParser with --gamma, --max_new_tokens, --repeats and --threads (torch's
    intra-op threads; default: the cores this process may use)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=max_new_tokens)
    p.add_argument("--repeats", type=int, default=repeats, help="timed repetitions (medians)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    return p


def batches_of(examples, batch):
    """The inputs in batches of `batch` rows, each padded to a multiple of 32 positions."""
    out = []
    for i in range(0, len(examples), batch):
        chunk = examples[i:i + batch]
        width = -(-max(len(e["inputs"]) for e in chunk) // 32) * 32
        out.append(st.data.pad_to([e["inputs"] for e in chunk], width))        # [B, W]
    return out


def timed_runs(runs, repeats):
    """Each of `runs` (name -> function) called once (compiles, first calls), then `repeats`
    times in turn, so the machine's drift touches all alike -> (first results by name,
    median seconds by name)."""
    results = {k: fn() for k, fn in runs.items()}
    times = {k: [] for k in runs}
    for _ in range(repeats):
        for k, fn in runs.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return results, {k: statistics.median(v) for k, v in times.items()}
