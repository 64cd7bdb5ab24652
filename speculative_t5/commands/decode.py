"""`speculative-t5 decode`: decode a text/TSV file with a target (and optionally a draft)
model into JSONL, in fixed-shape batches, resuming where an earlier run of the same
settings stopped.

The output's first line is a header naming the run (model and vocabulary fingerprints,
input file fingerprint, every option that changes an output); a rerun resumes only that run,
and a file that is not this tool's output is never touched. Sampling is keyed by example
index, so an output does not depend on the batch size or on where a run was interrupted.
One process writes an output at a time: OUTPUT.lock beside it names the writer
(`locks.hold`), and a second is refused. With beam_size, each input is decoded by T5X's beam
search (`st.beam_search`; with a draft model the exact speculative beam search): a record's
output is its best beam, and "beams" its beam_outputs best."""
from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Any, Dict, Iterator, Optional, Set, Tuple

import gin
import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from speculative_t5.beam_engine import PATHS_PER_BEAM, beam_search, check_alpha
from speculative_t5.checkpoints import (BigramFile, draft_parts, load_checkpoint, load_draft,
                                      names_a_model)
from speculative_t5.commands import interrupt
from speculative_t5.data import BPEVocabulary, find_vocabulary, pad_rows, pad_to, read_inputs
from speculative_t5.decoding.output import combine
from speculative_t5.decoding.sampling import check_verification
from speculative_t5.locks import hold
from speculative_t5.paper.rundir import JsonlLog, fingerprint
from speculative_t5.engine import (check_draft, check_draft_stop, check_int, check_lenience,
                                     check_tree, generate, sampling_config)
from speculative_t5.partitioning import Partitioner

LENGTH_BUCKET = 16  # inputs are padded to a multiple of this, so few shapes are compiled
DTYPES = (None, "float32", "bfloat16", "float16")


def _identity(path: Optional[str]) -> Optional[Dict[str, Any]]:
    return None if path is None else {"path": os.path.abspath(path) if "://" not in path else path,
                                      "fingerprint": fingerprint(path)}


def _draft_identity(spec: Optional[str]):
    """A draft spec's identity: each checkpoint's path and fingerprint, each zero-cost
    draft's settings (one entry, or a [first, then] list for a fallback)."""
    if spec is None:
        return None
    parts = [_identity(p) if isinstance(p, str) else
             {"kind": "bigram", **_identity(p.path)} if isinstance(p, BigramFile) else
             {"kind": "prompt_lookup", "max_ngram": p.max_ngram, "min_ngram": p.min_ngram}
             for p in draft_parts(spec)]
    return parts[0] if len(parts) == 1 else parts


def _draft_dirs(spec: Optional[str]) -> list:
    return [p for p in draft_parts(spec) if isinstance(p, str)] if spec else []


@contextlib.contextmanager
def _open_log(output: Optional[str], run: Dict[str, Any],
              n: int) -> Iterator[Tuple[Optional[JsonlLog], Set[int]]]:
    """(the output log, the example indices already in it), the output held for this writer
    while the block runs (None, nothing done: no output). With several processes (one
    program in lock-step, outputs gathered to all) only the coordinator, process 0, holds,
    reads and writes the file; it tells the others what is done, or that it refused it."""
    if output is None:
        yield None, set()
        return
    opened = []
    with hold(output, directory=False, what="--output",
              prepare=lambda: opened.append(JsonlLog(output, key="index", header=run))):
        log = opened[0] if opened else None  # resumes this run only
        if jax.process_count() == 1:
            yield log, set(log.done)
            return
        from jax.experimental import multihost_utils
        mask = np.zeros(n, np.int32)
        if log is not None:
            mask[sorted(log.done)] = 1
        mask = np.asarray(multihost_utils.broadcast_one_to_all(mask))
        yield log, set(np.flatnonzero(mask).tolist())


def check_vocabulary(vocabulary, model) -> None:
    """A GPT-2 reads GPT-2's BPE files, a T5 a SentencePiece model; every id must have a row."""
    if isinstance(vocabulary, BPEVocabulary) != model.decoder_only:
        raise ValueError(f"vocabulary {vocabulary.path} is "
                         f"{'GPT-2 BPE' if isinstance(vocabulary, BPEVocabulary) else 'SentencePiece'}"
                         f" but the target is a {'GPT-2' if model.decoder_only else 'T5'}")
    vocabulary.check_fits(model.config.vocab_size)


def _report_prompt(res, vocabulary, target, ids, sampling, max_decode_len, partitioner,
                   lengths, speculative: bool, quiet: bool) -> None:
    """Print a --prompt decode's continuation and its target passes; a greedy speculative
    decode is checked against plain greedy of the same prompt (decoded here to say so)."""
    if quiet:
        return
    n, calls = int(res.lengths[0]), res.row(0)["target_calls"]
    line = f"{n} tokens in {calls} target passes"
    if speculative and sampling.greedy:
        plain = generate(target, ids, max_decode_len=max_decode_len, sampling=sampling,
                         partitioner=partitioner, prompt_lengths=lengths)
        same = np.array_equal(plain.tokens[0], res.tokens[0])
        line += f" (plain: {plain.row(0)['target_calls']}), identical to plain greedy: " \
                f"{'yes' if same else 'no'}"
    print(vocabulary.decode(res.tokens[0, :n].tolist()))
    print(line)


def check_beam(beam_size, alpha, beam_outputs, beam_paths, draft: Optional[str], sampling,
               lenience: float, verification: str, draft_stop,
               adaptive_gamma) -> Tuple[Optional[int], Optional[float], int, Optional[int]]:
    """The beam options validated, and the options beam search has no use for refused (one
    line each) -> (beam_size, alpha, beam_outputs, beam_paths); without beam_size,
    (None, None, 1, None) (alpha, beam_outputs and beam_paths given alone are refused)."""
    if beam_size is None:
        for name, value, default in (("alpha", alpha, 0.6), ("beam_outputs", beam_outputs, 1),
                                     ("beam_paths", beam_paths, None)):
            if value != default:
                raise ValueError(f"{name} is a beam search option: give --beam_size too")
        return None, None, 1, None
    beam_size = check_int("beam_size", beam_size, 1)
    alpha = check_alpha(alpha)
    if isinstance(beam_outputs, bool) or not isinstance(beam_outputs, int) \
            or not 1 <= beam_outputs <= beam_size:
        raise ValueError(f"beam_outputs must be an int in 1..beam_size ({beam_size}), got "
                         f"{beam_outputs!r}")
    refused = [(sampling.temperature != 0, f"temperature {sampling.temperature}"),
               (sampling.top_k != 0, f"top_k {sampling.top_k}"),
               (sampling.top_p != 1, f"top_p {sampling.top_p}"),
               (lenience != 1, f"lenience {lenience}"),
               (verification != "token", f"verification {verification!r}"),
               (draft_stop is not None, f"draft_stop {draft_stop}"),
               (adaptive_gamma is not False, "adaptive_gamma")]
    for given, what in refused:
        if given:
            raise ValueError(f"{what} does not apply to beam search (--beam_size): it is "
                             "deterministic and exact; leave it out")
    parts = draft_parts(draft) if draft else []
    if len(parts) > 1 or (parts and not isinstance(parts[0], str)):
        raise ValueError(f"beam search's draft must be a model checkpoint (its own beam search "
                         f"drafts the beams), not {draft!r}: the zero-cost drafts propose one path")
    if beam_paths is not None:
        if not parts:
            raise ValueError("beam_paths is for a speculative beam search: give --draft "
                             "(a model checkpoint) too")
        beam_paths = check_int("beam_paths", beam_paths, beam_size)
    elif parts:
        beam_paths = PATHS_PER_BEAM * beam_size  # st.beam_search's default, named in the run
    return beam_size, alpha, beam_outputs, beam_paths


def check_cli_tree(tree, tree_children: str, draft: Optional[str], beam_size, verification: str,
                   lenience: float, draft_stop, adaptive_gamma):
    """--tree ("3,2,1", or children per depth from gin) checked with what it composes with
    (`engine.check_tree`; the draft must be a model checkpoint) -> a TreeShape or None."""
    if isinstance(tree, str):
        try:
            tree = tuple(int(k) for k in tree.split(","))
        except ValueError:
            raise ValueError(f"--tree must be children per depth like 3,2,1, got {tree!r}") from None
    if tree is None:
        return check_tree(None, tree_children, None, verification, lenience, draft_stop,
                          adaptive_gamma)
    if beam_size:
        raise ValueError("--tree does not combine with --beam_size (beam search drafts its "
                         "own beams)")
    return check_tree(tree, tree_children, draft, verification, lenience, draft_stop,
                      adaptive_gamma, bool(draft) and names_a_model(draft))


def beam_record(res, row: int, vocabulary, beam_outputs: int) -> Dict[str, Any]:
    """Row `row` of a `BeamSearchOutput` as a record's fields: the best beam's output,
    tokens, length and score, the beam_outputs best beams (output, tokens, score), and the
    row's statistics (target_calls, beam_steps; with a draft draft_calls, rounds and
    steps_per_call_hist)."""
    beams = []
    for k in range(beam_outputs):
        tokens = res.tokens[row, k, :int(res.lengths[row, k])].tolist()
        beams.append({"output": vocabulary.decode(tokens), "tokens": tokens,
                      "score": float(res.scores[row, k])})
    s = res.stats
    stats = {k: int(s[k][row]) for k in ("target_calls", "beam_steps", "draft_calls", "rounds")
             if k in s}
    if "steps_per_call_hist" in s:
        stats["steps_per_call_hist"] = np.asarray(s["steps_per_call_hist"][row]).tolist()
    best = beams[0]
    return {"output": best["output"], "tokens": best["tokens"], "length": len(best["tokens"]),
            "score": best["score"], "beams": beams, "stats": stats}


def beam_summary(rows, beam_size: int, alpha: float) -> Dict[str, Any]:
    """Totals over beam records' stats (each with its best beam's length)."""
    calls, steps = (sum(r[k] for r in rows) for k in ("target_calls", "beam_steps"))
    return {"tokens": sum(r["length"] for r in rows), "target_calls": calls,
            "draft_calls": sum(r.get("draft_calls", 0) for r in rows), "beam_steps": steps,
            "beam_steps_per_target_call": steps / calls if calls else 0.0,
            "beam_size": beam_size, "alpha": alpha}


@gin.configurable(denylist=["quiet"])
def decode(target: str = gin.REQUIRED, input_file: Optional[str] = None,
           output: Optional[str] = None, draft: Optional[str] = None, vocab: Optional[str] = None,
           gamma: int = 4, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           lenience: float = 1.0, max_decode_len: Optional[int] = None, max_input_len: int = 512,
           batch_size: int = 8, seed: int = 0, prefix: str = "", dtype: Optional[str] = None,
           activation_dtype: Optional[str] = None, partitioner: Optional[Partitioner] = None,
           verification: str = "token", draft_stop: Optional[float] = None,
           adaptive_gamma: bool = False, prompt: Optional[str] = None,
           max_new_tokens: Optional[int] = None, beam_size: Optional[int] = None,
           alpha: float = 0.6, beam_outputs: int = 1, beam_paths: Optional[int] = None,
           tree: Any = None, tree_children: str = "drawn", quiet: bool = False) -> dict:
    """Decode every line of `input_file`; one JSONL record per example in `output`.

    prompt: one text instead of an input file (output optional): its continuation is
    printed with "N tokens in M target passes", and for a greedy speculative decode whether
    it is identical to plain greedy (plain is decoded too, to say so). A GPT-2 target
    (decoder-only) continues each line or prompt, tokenized with the directory's vocab.json
    + merges.txt; max_new_tokens is max_decode_len by its decoder-only name (give one or
    both equal; default 64).

    partitioner: the mesh to run on; default `Partitioner()`, configured by gin the T5X way
    (`--gin.Partitioner.num_partitions=4`): the models load straight into their shards and
    each batch's rows spread over 'data'. Several processes (`--multiprocess` or
    `--coordinator_address ...`) run every batch together; process 0 writes the output.
    draft: a draft model checkpoint, 'prompt_lookup[:MAX[:MIN]]' or 'bigram:TABLE.npz' (no
    model), or 'FIRST,THEN' (a fallback: 'prompt_lookup,PATH'); see `checkpoints.load_draft`.
    verification: "token" (default) or "block"; draft_stop: a probability, as in
    `st.generate`; both part of the run. adaptive_gamma: gamma becomes each round's
    maximum, c and v measured at the first batch (see `st.generate`). tree: children per
    depth ("3,2,1" or a tuple): a token tree a round (`st.generate`'s tree; a draft model
    checkpoint; tree_children "drawn" or "top_k"), part of the run.

    beam_size: T5X's beam search with this many beams (`st.beam_search`, length penalty
    ((5 + length) / 6) ** alpha); with a draft checkpoint the exact speculative beam search
    (gamma tokens a round on beam_paths path rows per input, default 4 * beam_size: the same
    beams). A record's output, tokens and length are its best beam's; "beams" holds the
    beam_outputs best (output, tokens, score). Sampling, lenience, block verification,
    draft_stop, adaptive_gamma and zero-cost drafts do not apply and are refused."""
    # every option is checked before anything is read, written or loaded
    sampling = sampling_config(None, temperature, top_k, top_p)
    if max_new_tokens is not None and max_decode_len is not None \
            and max_new_tokens != max_decode_len:
        raise ValueError(f"give max_new_tokens or max_decode_len, not both (got "
                         f"{max_new_tokens} and {max_decode_len})")
    gamma = check_int("gamma", gamma, 1)
    max_decode_len = (check_int("max_new_tokens", max_new_tokens, 1) if max_new_tokens is not None
                      else check_int("max_decode_len", 64 if max_decode_len is None
                                     else max_decode_len, 1))
    max_input_len, batch_size = (check_int("max_input_len", max_input_len, 1),
                                 check_int("batch_size", batch_size, 1))
    seed, lenience = check_int("seed", seed, 0), check_lenience(lenience)
    verification = check_verification(verification, lenience)
    for name, value in (("dtype", dtype), ("activation_dtype", activation_dtype)):
        if value not in DTYPES:
            raise ValueError(f"{name} must be one of {DTYPES[1:]}, got {value!r}")
    if (prompt is None) == (input_file is None):
        raise ValueError("decode needs --input_file (with --output) or --prompt, not both"
                         if prompt is not None else "decode needs --input_file and --output, or --prompt")
    if prompt is not None and (not isinstance(prompt, str) or not prompt.strip()):
        raise ValueError(f"--prompt must be a non-empty text, got {prompt!r}")
    if output is None and prompt is None:
        raise ValueError("decode needs --output (the JSONL to write) with --input_file")
    if output is not None and os.path.isdir(output):
        raise ValueError(f"--output {output} is a directory; give a file path")
    if output is not None and input_file is not None and \
            os.path.abspath(output) == os.path.abspath(input_file):
        raise ValueError(f"--output {output} is the input file")
    beam_size, alpha, beam_outputs, beam_paths = check_beam(
        beam_size, alpha, beam_outputs, beam_paths, draft, sampling, lenience, verification,
        draft_stop, adaptive_gamma)
    draft_stop = check_draft_stop(draft_stop, draft, bool(_draft_dirs(draft)))
    tree = check_cli_tree(tree, tree_children, draft, beam_size, verification, lenience,
                          draft_stop, adaptive_gamma)
    if not isinstance(adaptive_gamma, bool):
        raise ValueError(f"adaptive_gamma must be true or false, got {adaptive_gamma!r}")
    if adaptive_gamma and not draft:
        raise ValueError("adaptive_gamma needs --draft")
    draft_identity = _draft_identity(draft)
    vocabulary = find_vocabulary(vocab, target, *_draft_dirs(draft))
    examples = read_inputs(input_file, prefix) if prompt is None else [(prefix + prompt, None)]
    if prompt is not None:
        batch_size = 1  # one text: no padded rows to decode beside it
    encoded = [vocabulary.encode(text) for text, _ in examples]
    for i, ids in enumerate(encoded):
        if len(ids) > max_input_len:
            raise ValueError(f"{input_file}:{i + 1}: input has {len(ids)} tokens, longer than "
                             f"max_input_len {max_input_len}")
    run = {"target": _identity(target), "draft": draft_identity,
           "vocabulary": _identity(vocabulary.path), "input_file": _identity(input_file),
           **({"prompt": prompt} if prompt is not None else {}),
           "prefix": prefix, "gamma": gamma if draft else None, **sampling._asdict(),
           "lenience": lenience, "max_decode_len": max_decode_len, "seed": seed,
           "dtype": dtype, "activation_dtype": activation_dtype,
           "verification": verification if draft and not beam_size else None,
           "draft_stop": draft_stop, "adaptive_gamma": adaptive_gamma or None,  # None: as before
           "beam_size": beam_size, "alpha": alpha, "beam_outputs": beam_outputs if beam_size
           else None, "beam_paths": beam_paths,
           **({"tree": list(tree.branching), "tree_children": tree_children} if tree else {})}
    with _open_log(output, run, len(examples)) as (log, done):
        todo = [i for i in range(len(examples)) if i not in done]
        if log is not None:
            interrupt.progress(lambda: f"{len(log.done)} of {len(examples)} records saved "
                               f"in {output}")
        quiet = quiet or jax.process_index() > 0
        partitioner = partitioner or Partitioner()
        if partitioner.mesh.size == 1:
            partitioner = None  # one device: the models load and run whole
        rows, seconds_total = [], 0.0
        if todo:
            target_model = load_checkpoint(target, dtype=dtype, activation_dtype=activation_dtype,
                                           partitioner=partitioner)
            draft_model = load_draft(draft, target_model.config.vocab_size, dtype=dtype,
                                     activation_dtype=activation_dtype,
                                     partitioner=partitioner) if draft else None
            check_vocabulary(vocabulary, target_model)
            if draft_model is not None:
                draft_model = check_draft(target_model, draft_model)
        base = jax.random.PRNGKey(seed)
        bar = tqdm(total=len(todo), desc="decode", unit="ex",
                   disable=quiet or not todo or prompt is not None)
        for start in range(0, len(todo), batch_size):
            idx = todo[start:start + batch_size]
            width = -(-max(len(encoded[i]) for i in idx) // LENGTH_BUCKET) * LENGTH_BUCKET
            # a fixed batch: one compiled program; one key per example index
            ids = pad_rows(pad_to([encoded[i] for i in idx], width), batch_size)
            lengths = None  # a GPT-2's prompts are right-padded; their lengths say where they end
            if target_model.decoder_only:
                lengths = [len(encoded[i]) for i in idx]
                lengths = np.asarray(lengths + lengths[:1] * (batch_size - len(idx)))
            keys = jax.vmap(lambda i: jax.random.fold_in(base, i))(
                jnp.asarray(idx + idx[:1] * (batch_size - len(idx)), jnp.uint32))
            t0 = time.perf_counter()
            if beam_size:
                res = beam_search(target_model, ids, beam_size=beam_size, alpha=alpha,
                                  max_decode_len=max_decode_len, prompt_lengths=lengths,
                                  partitioner=partitioner, draft=draft_model, gamma=gamma,
                                  paths=beam_paths)
            else:
                res = generate(target_model, ids, draft=draft_model, gamma=gamma,
                               max_decode_len=max_decode_len, sampling=sampling,
                               lenience=lenience, verification=verification,
                               draft_stop=draft_stop, rng=keys, adaptive_gamma=adaptive_gamma,
                               partitioner=partitioner, prompt_lengths=lengths,
                               **({"tree": tree.branching, "tree_children": tree_children}
                                  if tree else {}))
            seconds = time.perf_counter() - t0
            if prompt is not None and beam_size and not quiet:
                print(vocabulary.decode(res.tokens[0, 0, :int(res.lengths[0, 0])].tolist()))
                print(f"{int(res.stats['beam_steps'][0])} beam steps in "
                      f"{int(res.stats['target_calls'][0])} target passes")
            elif prompt is not None:
                _report_prompt(res, vocabulary, target_model, ids, sampling, max_decode_len,
                               partitioner, lengths, draft_model is not None, quiet)
            for row, i in enumerate(idx):
                if beam_size:
                    record = beam_record(res, row, vocabulary, beam_outputs)
                    stats, n = record["stats"], record["length"]
                    record = {"index": i, "input": examples[i][0], **record,
                              "batch_seconds": round(seconds, 4), "exact": True}
                else:
                    stats = res.row(row)
                    n = stats.pop("length")
                    tokens = res.tokens[row, :n].tolist()
                    record = {"index": i, "input": examples[i][0],
                              "output": vocabulary.decode(tokens), "tokens": tokens, "length": n,
                              "stats": stats, "batch_seconds": round(seconds, 4),
                              "exact": bool(res.stats["exact"])}
                if examples[i][1] is not None:
                    record["reference"] = examples[i][1]
                if log is not None:
                    log.append(record)
                rows.append(dict(stats, length=n))
            seconds_total += seconds
            bar.update(len(idx))
            bar.set_postfix(
                tok_s=f"{sum(r['length'] for r in rows) / max(seconds_total, 1e-9):.1f}")
        bar.close()
    if beam_size:
        totals = beam_summary(rows, beam_size, alpha)
    else:
        totals = combine(rows)
        totals.pop("tokens_per_call_histogram")
    summary = dict(totals, seconds=seconds_total, examples=len(todo), skipped=len(done),
                   tokens_per_second=totals["tokens"] / max(seconds_total, 1e-9),
                   exact=lenience == 1.0)
    if not draft and not beam_size:
        summary["acceptance_rate"] = None
    if not quiet and prompt is None:
        print(json.dumps(summary))
    return summary
