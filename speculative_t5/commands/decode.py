"""`speculative-t5 decode`: decode a text/TSV file with a target (and optionally a draft)
model into JSONL, in fixed-shape batches, resuming where an earlier run stopped."""
from __future__ import annotations

import json
import os
import time
from typing import Optional

import gin
import jax
from tqdm import tqdm

from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.data import find_vocabulary, pad_rows, pad_to, read_inputs
from speculative_t5.decoding.output import combine
from speculative_t5.generate import generate
from speculative_t5.experiments.rundir import JsonlLog

LENGTH_BUCKET = 16  # inputs are padded to a multiple of this, so few shapes are compiled


@gin.configurable(denylist=["quiet"])
def decode(target: str = gin.REQUIRED, input_file: str = gin.REQUIRED,
           output: str = gin.REQUIRED, draft: Optional[str] = None, vocab: Optional[str] = None,
           gamma: int = 4, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           lenience: float = 1.0, max_decode_len: int = 64, max_input_len: int = 512,
           batch_size: int = 8, seed: int = 0, prefix: str = "", dtype: Optional[str] = None,
           quiet: bool = False) -> dict:
    """Decode every line of `input_file`; one JSONL record per example in `output`."""
    vocabulary = find_vocabulary(vocab, target, draft)
    target_model = load_checkpoint(target, dtype=dtype)
    draft_model = load_checkpoint(draft, dtype=dtype) if draft else None
    vocabulary.check_fits(target_model.config.vocab_size)
    examples = read_inputs(input_file, prefix)
    encoded = [vocabulary.encode(text) for text, _ in examples]
    for i, ids in enumerate(encoded):
        if len(ids) > max_input_len:
            raise ValueError(f"{input_file}:{i + 1}: input has {len(ids)} tokens, longer than "
                             f"max_input_len {max_input_len}")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    log = JsonlLog(output, key="index")  # resumable: indices already there are skipped
    done = log.done
    todo = [i for i in range(len(examples)) if i not in done]
    rng = jax.random.PRNGKey(seed)
    rows, seconds_total = [], 0.0
    bar = tqdm(total=len(todo), desc="decode", unit="ex", disable=quiet)
    for start in range(0, len(todo), batch_size):
        idx = todo[start:start + batch_size]
        width = -(-max(len(encoded[i]) for i in idx) // LENGTH_BUCKET) * LENGTH_BUCKET
        # a fixed batch: one compiled program
        ids = pad_rows(pad_to([encoded[i] for i in idx], width), batch_size)
        t0 = time.perf_counter()
        res = generate(target_model, ids, draft=draft_model, gamma=gamma,
                       max_decode_len=max_decode_len, temperature=temperature, top_k=top_k,
                       top_p=top_p, lenience=lenience,
                       rng=jax.random.fold_in(rng, idx[0]))
        seconds = time.perf_counter() - t0
        for row, i in enumerate(idx):
            stats = res.row(row)
            n = stats.pop("length")
            tokens = res.tokens[row, :n].tolist()
            record = {"index": i, "input": examples[i][0], "output": vocabulary.decode(tokens),
                      "tokens": tokens, "length": n, "stats": stats,
                      "batch_seconds": round(seconds, 4), "exact": bool(res.stats["exact"])}
            if examples[i][1] is not None:
                record["reference"] = examples[i][1]
            log.append(record)
            rows.append(dict(stats, length=n))
        seconds_total += seconds
        bar.update(len(idx))
        bar.set_postfix(tok_s=f"{sum(r['length'] for r in rows) / max(seconds_total, 1e-9):.1f}")
    bar.close()
    totals = combine(rows)
    totals.pop("tokens_per_call_histogram")
    summary = dict(totals, seconds=seconds_total, examples=len(todo), skipped=len(done),
                   tokens_per_second=totals["tokens"] / max(seconds_total, 1e-9),
                   exact=lenience == 1.0)
    if not draft:
        summary["acceptance_rate"] = None
    if not quiet:
        print(json.dumps(summary))
    return summary
