"""Drafts' acceptance rate alpha against the shipped demo target, on held-out inputs.

    python experiments/draft_alpha.py [DRAFT_DIR ...] [--split validation] [--num_examples 128]

alpha = E[sum_x min(p, q)] along the target's own outputs (`measure.alpha`), greedy and at
T = 1 (the outputs sampled with one key for every draft), for the shipped draft and each
DRAFT_DIR (a checkpoint directory `load_checkpoint` reads, e.g. a `distill` run's hf/).
The validation split by default: the demo decodes the test split, so a draft chosen here
is not chosen on the demo's own inputs. Counts only: no timing.
"""
import argparse

import jax

import speculative_t5 as st
from speculative_t5.data import pad_to
from speculative_t5.decoding import SamplingConfig
from speculative_t5.measure.alpha import measure_alpha
from speculative_t5.paper.cells import demo_examples


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("drafts", nargs="*", help="checkpoint directories of other drafts")
    p.add_argument("--split", default="validation", choices=["validation", "test"])
    p.add_argument("--num_examples", type=int, default=128)
    p.add_argument("--max_decode_len", type=int, default=64)
    args = p.parse_args()
    target, draft, vocab = st.load_demo()
    drafts = {"shipped draft": draft, **{d: st.load_checkpoint(d, dtype="float32") for d in args.drafts}}
    examples = demo_examples(split=args.split, num_examples=args.num_examples, vocabulary=vocab)
    x = pad_to([e["inputs"] for e in examples], 64)                              # [N, 64]
    print(f"{len(examples)} {args.split} inputs of the demo task, the shipped target")
    print("| T | draft | alpha | 95% CI | positions |\n|---|---|---|---|---|")
    for temperature in (0.0, 1.0):
        sampling = SamplingConfig(temperature)
        y = st.generate(target, x, max_decode_len=args.max_decode_len, sampling=sampling,
                        rng=jax.random.PRNGKey(7)).tokens                        # [N, L]
        for name, d in drafts.items():
            a, ci, n = measure_alpha(target, d, x, y, sampling)
            print(f"| {temperature:g} | {name} | {a:.3f} | +-{ci:.3f} | {n} |")


if __name__ == "__main__":
    main()
