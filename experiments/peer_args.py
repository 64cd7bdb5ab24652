"""The options every benchmark against Hugging Face takes (`bench_hf.py`, `bench_gpt2.py`):
gamma, new tokens, repeats and torch's threads, set here so both read them alike."""
import argparse
import os


def peer_parser(doc: str, max_new_tokens: int = 32, repeats: int = 3) -> argparse.ArgumentParser:
    """An ArgumentParser with --gamma, --max_new_tokens, --repeats and --threads (torch's
    intra-op threads; default: the cores this process may use)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max_new_tokens", type=int, default=max_new_tokens)
    p.add_argument("--repeats", type=int, default=repeats, help="timed repetitions (medians)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    return p
