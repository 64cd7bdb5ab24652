"""Summary quality of a demo target on the held-out docstring task: greedy outputs' ROUGE
and real-word fraction (`measure.quality`) beside a no-model baseline ("Return the <function
name>.", `name_baseline`), the held-out teacher-forced loss beside the same with the inputs
shuffled between rows (what the input is worth to the target), and a few outputs to read.

  python experiments/demo_quality.py                          # the shipped pair
  python experiments/demo_quality.py --target runs/demo/target/hf --vocab runs/demo/corpus/spiece.model
  python experiments/demo_quality.py --train_dir runs/demo/target --gin_file runs/demo/target.gin
      (the latest orbax checkpoint of a training run still going; its config from the gin file)

`--split test --num_examples 32` is the demo's walltime cell (its first 32 inputs).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import speculative_t5 as st  # noqa: E402
from speculative_t5.checkpoints.demo import DEMO_INPUT_LENGTH, DEMO_TASK  # noqa: E402
from speculative_t5.data.demo_corpus import TASKS, build_corpus  # noqa: E402
from speculative_t5.data.inputs import pad_rows, tokenize  # noqa: E402
from speculative_t5.data.vocabulary import Vocabulary  # noqa: E402
from speculative_t5.measure.quality import name_baseline, summary_quality  # noqa: E402
from speculative_t5.model.t5 import T5  # noqa: E402
from speculative_t5.training.trainer import target_loss  # noqa: E402


def from_training(train_dir: str, gin_file: str):
    """(Model, step) from a training run's latest orbax checkpoint."""
    import gin
    import orbax.checkpoint as ocp
    import speculative_t5.training  # noqa: F401 (the gin file binds train / distill)
    from speculative_t5.paper.ginconfig import parse_gin
    from speculative_t5.model.config import gin_t5_config
    parse_gin([gin_file], [], [])
    config = gin_t5_config()  # T5Config as the gin file binds it
    manager = ocp.CheckpointManager(os.path.abspath(os.path.join(train_dir, "checkpoints")))
    step = manager.latest_step()
    if step is None:
        raise SystemExit(f"no checkpoint under {train_dir}/checkpoints")
    state = manager.restore(step)
    gin.clear_config()
    return st.Model(config, state["params"]), int(step)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target")
    ap.add_argument("--vocab")
    ap.add_argument("--train_dir")
    ap.add_argument("--gin_file")
    ap.add_argument("--split", default="test", choices=("validation", "test"))
    ap.add_argument("--task", default=DEMO_TASK, choices=TASKS,
                    help="the corpus task the target was trained on (`demo_corpus.TASKS`)")
    ap.add_argument("--input_len", type=int, default=DEMO_INPUT_LENGTH,
                    help="input pieces kept (the length the target was trained on)")
    ap.add_argument("--num_examples", type=int, default=None)
    ap.add_argument("--batch_size", type=int, default=32)
    ap.add_argument("--show", type=int, default=8)
    args = ap.parse_args()
    if args.train_dir:
        model, step = from_training(args.train_dir, args.gin_file)
        vocab = Vocabulary(args.vocab or os.path.join(os.path.dirname(args.train_dir), "corpus",
                                                      "spiece.model"))
        name = f"{args.train_dir} step {step}"
    elif args.target:
        model, vocab, name = st.load_checkpoint(args.target), Vocabulary(args.vocab), args.target
    else:
        model, _, vocab_path = st.load_demo()
        vocab, name = Vocabulary(vocab_path), "the shipped demo target"
    rows = [e for e in build_corpus(task=args.task) if e["split"] == args.split]
    rows = rows[:args.num_examples]
    ids = tokenize([r["input"] for r in rows], vocab, args.input_len)
    t0, outs = time.perf_counter(), []
    for i in range(0, len(ids), args.batch_size):
        chunk = ids[i:i + args.batch_size]
        tokens = st.generate(model, pad_rows(chunk, args.batch_size), max_decode_len=32).tokens
        outs += [vocab.decode(list(t)) for t in np.asarray(tokens)[:len(chunk)]]
    references = [r["target"] for r in rows]
    q = summary_quality(references, outs)
    targets = tokenize(references, vocab, 32)
    module = T5(model.config)
    loss, ntok = target_loss(module, model.params, ids, targets)
    # the same targets given other rows' inputs: how much the target reads its input at all
    shuffled, _ = target_loss(module, model.params,
                              ids[np.random.RandomState(0).permutation(len(ids))], targets)
    print(f"{name}: {len(rows)} {args.split} inputs, greedy, {time.perf_counter() - t0:.0f} s")
    print(f"ROUGE-1 {q['rouge1']:.1f}  ROUGE-2 {q['rouge2']:.1f}  ROUGE-Lsum {q['rougeLsum']:.1f}"
          f"  real words {q['real_words']:.3f}  loss {float(loss):.3f} ({int(ntok)} target tokens; "
          f"{float(shuffled):.3f} given other rows' inputs)")
    b = summary_quality(references, [name_baseline(r["input"]) for r in rows])
    print(f"no model, 'Return the <function name>.': ROUGE-1 {b['rouge1']:.1f}  ROUGE-2 "
          f"{b['rouge2']:.1f}  ROUGE-Lsum {b['rougeLsum']:.1f}  real words {b['real_words']:.3f}")
    for r, o in list(zip(rows, outs))[:args.show]:
        print(f"- {r['name']}: {o!r}  (reference: {r['target']!r})")


if __name__ == "__main__":
    main()
