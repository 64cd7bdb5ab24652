"""How far `st.gamma_costs` moves with the one input (batch 1) it calibrates on.

    python experiments/gamma_costs_spread.py [--temperature 1] [--inputs 0 5 20 40 63 0]

The shipped demo pair, held-out inputs sorted by length (as `bench_adaptive.py` sorts them),
gamma 8, max_decode_len 64: for each listed input (one may repeat, to see the same input
measured twice) the costs measured afresh, as `generate(adaptive_gamma=True)` measures
them for a batch of that shape. A decode at batch 1 chooses every round from these, so
their spread is how far its choices can stray by measurement alone.
"""
import argparse
import importlib

import speculative_t5 as st
from speculative_t5.experiments.cells import demo_examples

generate_module = importlib.import_module("speculative_t5.generate")  # st.generate is the function


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--inputs", type=int, nargs="+", default=[0, 5, 20, 40, 63, 0])
    args = parser.parse_args()
    target, draft, vocab = st.load_demo()
    examples = sorted(demo_examples(num_examples=64, vocabulary=vocab),
                      key=lambda e: len(e["inputs"]))
    print(f"demo pair, T={args.temperature:g}, gamma 8, batch 1", flush=True)
    print("| input | width | c | v | v1 | w |", flush=True)
    for i in args.inputs:
        ids = examples[i]["inputs"]
        x = st.data.pad_to([ids], -(-len(ids) // 32) * 32)                     # [1, W]
        generate_module._MEASURED.clear()  # measure afresh, not the process's first figures
        c = st.gamma_costs(target, draft, x, 8, 64, st.SamplingConfig(args.temperature))
        print(f"| {i} | {x.shape[1]} | {c.c:.3f} | {c.v:.3f} | {c.v1:.3f} | {c.w:.3f} |",
              flush=True)


if __name__ == "__main__":
    main()
