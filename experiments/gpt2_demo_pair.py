"""The GPT-2 demo pair on held-out standard-library code: next-token loss of both models,
alpha, and speculative greedy against plain greedy.

    python experiments/gpt2_demo_pair.py --target DIR --draft DIR --data_dir DIR [--num_prompts 32]

Also the held-out loss of a bigram table fitted to the train split (the baseline).
DIR: a Hugging Face GPT-2 directory (…/hf, the shipped demo_models/gpt2_*) or a train_lm /
distill_lm run directory (its final float32 checkpoint). --data_dir: the corpus the pair
was trained on (`prepare_code_data`'s; its held-out split and prompts are read).
Held-out loss: mean next-token cross-entropy (nats) over the held-out split's 256-token
windows (the recipes' window). Prompts: `num_prompts` of heldout.jsonl spread evenly, each
cut to its last `max_prompt` tokens. alpha is measured along the target's greedy
continuation (32 tokens): at T = 0 the fraction of positions where the argmaxes agree, at
T = 1 the mean of sum_x min(p(x), q(x)). Counts only, no timings: one JSON object on stdout.
"""
import argparse
import json

import numpy as np

import speculative_t5 as st
from speculative_t5.data.bpe import BPEVocabulary
from speculative_t5.data.code_corpus import read_prompts
from speculative_t5.decoding.sampling import SamplingConfig
from speculative_t5.measure.alpha import measure_alpha
from speculative_t5.training import lm


def encode_prompts(vocab, prompts, max_prompt, pad_id):
    rows = [vocab.encode(p["prompt"])[-max_prompt:] for p in prompts]
    lengths = np.array([len(r) for r in rows])
    ids = np.full((len(rows), lengths.max()), pad_id, np.int32)
    for b, r in enumerate(rows):
        ids[b, :len(r)] = r
    return ids, lengths


def bigram_loss(train: np.ndarray, windows: np.ndarray, vocab_size: int) -> float:
    """The baseline a model must beat: next-token cross-entropy (nats) over the same windows
    of the paper's bigram draft (`st.drafts.Bigram`) fitted to the train split."""
    bigram = st.drafts.Bigram.fit([train], vocab_size, top=256)
    succ, probs, rest = (np.asarray(x) for x in (bigram.successors, bigram.probs, bigram.rest))
    a, b = windows[:, :-1].ravel(), windows[:, 1:].ravel()                    # [N * W]
    hit = succ[a] == b[:, None]                                                 # [N * W, top]
    p = np.where(hit.any(1), (probs[a] * hit).sum(1), rest[a])
    return float(-np.mean(np.log(p)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--data_dir", required=True)
    ap.add_argument("--num_prompts", type=int, default=32)
    ap.add_argument("--max_prompt", type=int, default=192)
    ap.add_argument("--max_decode_len", type=int, default=32)
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--window", type=int, default=256)
    args = ap.parse_args()
    target, draft = lm.load_teacher(args.target), lm.load_teacher(args.draft)
    vocab = BPEVocabulary(f"{args.data_dir}/bpe")
    report = {"target_params": target.num_params(), "draft_params": draft.num_params()}
    windows = lm.token_windows(lm.token_stream(args.data_dir, "heldout", vocab), args.window)
    report["heldout_windows"] = len(windows)
    for name, model in (("target", target), ("draft", draft)):
        report[f"heldout_loss_{name}"] = lm.heldout_loss(model, windows)
    report["heldout_loss_bigram"] = bigram_loss(
        lm.token_stream(args.data_dir, "train", vocab), windows, target.config.vocab_size)

    prompts = read_prompts(args.data_dir)
    prompts = [prompts[i * len(prompts) // args.num_prompts] for i in range(args.num_prompts)]
    ids, lengths = encode_prompts(vocab, prompts, args.max_prompt, target.config.pad_id)
    report["prompt_tokens"] = [int(lengths.min()), float(lengths.mean()), int(lengths.max())]
    plain = st.generate(target, ids, prompt_lengths=lengths, max_decode_len=args.max_decode_len)
    spec = st.generate(target, ids, prompt_lengths=lengths, draft=draft, gamma=args.gamma,
                       max_decode_len=args.max_decode_len)
    report["speculative_equals_plain"] = bool(
        np.array_equal(plain.tokens, spec.tokens) and np.array_equal(plain.lengths, spec.lengths))
    report["speculative_summary"] = spec.summary()
    report["plain_target_calls"] = int(np.asarray(plain.stats["target_calls"]).sum())
    for t in (0.0, 1.0):
        a, ci, n = measure_alpha(target, draft, ids, plain.tokens, SamplingConfig(t),
                                 prompt_lengths=lengths)
        report[f"alpha_T{t:g}"] = {"alpha": a, "ci95": ci, "positions": n}
    report["example"] = {"prompt_tail": prompts[0]["prompt"][-200:],
                         "reference": prompts[0]["reference"][:120],
                         "target_greedy": vocab.decode(plain.tokens[0][:plain.lengths[0]])}
    print(json.dumps(report, indent=1, default=str))


if __name__ == "__main__":
    main()
