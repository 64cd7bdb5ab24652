"""`st.beam_search` against T5X's `beam_search` (t5x/decoding.py) re-derived here in numpy
from its description and driven by Hugging Face's PyTorch models on the same weights
(every beam's prefix teacher-forced from scratch, no cache): T5 1.0 and 1.1 with rows of
different padded lengths, beams 1..4, an EOS the model emits (beams finish; T5 1.1's
searches stop before max_decode_len); a GPT-2 continuing prompts of different lengths.
Same beams, scores to 1e-5, same number of steps. Beam 1 with alpha 0 follows the greedy
path (ending it earlier where an EOS runner-up scores higher); a partitioned search (8 CPU
devices, mesh 4x2, in a subprocess) equals the unpartitioned one; bad arguments are
one-line errors."""
import os

import numpy as np
import pytest

import speculative_t5 as st
from helpers import (gpt2_pair, hf_logits, make_hf_model, random_ids, run_on_eight_devices,
                     save_hf_dir)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_LEN = 8     # one decode length for every case: its programs are shared
NEG = np.float32(-1.0e7)
TESTS = os.path.dirname(os.path.abspath(__file__))


def reference_beam_search(next_logits, batch, beam, eos, alpha, max_len, offset=None):
    """T5X's beam search, row by row in numpy float32. next_logits(tokens [B, W, t]) ->
    [B, W, V]: each beam's logits for its next token after its t tokens. offset [B]: tokens
    before the decode that the brevity penalty counts (T5X's initial_index). Live and
    finished beams are kept ascending (the best last) and candidates ranked by stable sort
    (ties to the lower index), as T5X's flipped `lax.top_k`s. -> (tokens [B, W, max_len] best
    first, scores [B, W], finished flags [B, W] best first, steps)."""
    offset = np.zeros(batch, int) if offset is None else np.asarray(offset)
    n = max_len + 1  # T5X's buffer: a leading start token, then max_len tokens

    def penalty(length):
        return np.float32(((5.0 + length) / 6.0) ** alpha)

    def best(x, k):  # indices of the k largest, ascending, ties to the lower index
        return np.argsort(-x, kind="stable")[:k][::-1]

    live = np.tile(np.array([0.0] + [NEG] * (beam - 1), np.float32), (batch, 1))
    live_seqs = np.zeros((batch, beam, n), np.int64)
    fin, fin_seqs = np.full((batch, beam), NEG), np.zeros((batch, beam, n), np.int64)
    flags = np.zeros((batch, beam), bool)
    bound = penalty(offset.max() + n)
    t = 0
    while t < max_len:
        best_live = live[:, -1:] / bound
        if np.all(np.where(flags, fin.min(1, keepdims=True), NEG) > best_live):
            break  # no live beam can still beat a finished one
        if t > 0 and np.all(best_live < NEG / bound):
            break  # min_log_prob
        logits = next_logits(live_seqs[:, :, 1:t + 1]).astype(np.float64)
        logits -= logits.max(-1, keepdims=True)
        logp = (logits - np.log(np.exp(logits).sum(-1, keepdims=True))).astype(np.float32)
        logp = logp + live[:, :, None]
        V = logp.shape[-1]
        for b in range(batch):
            order = np.argsort(-logp[b].reshape(-1), kind="stable")[:2 * beam]
            cand = logp[b].reshape(-1)[order]
            seqs = live_seqs[b, order // V].copy()
            seqs[:, t + 1] = order % V
            ended = order % V == eos
            alive = cand + np.where(ended, NEG, np.float32(0))
            keep = best(alive, beam)
            live_seqs[b], live[b] = seqs[keep], alive[keep]
            scores = cand / penalty(offset[b] + t + 1) + np.where(ended, np.float32(0), NEG)
            pool = np.concatenate([fin[b], scores])
            top = best(pool, beam)
            fin_seqs[b] = np.concatenate([fin_seqs[b], seqs])[top]
            fin[b] = pool[top]
            flags[b] = np.concatenate([flags[b], ended])[top]
        t += 1
    done = flags.any(1)
    seqs = np.where(done[:, None, None], fin_seqs, live_seqs)[:, ::-1, 1:]
    scores = np.where(done[:, None], fin, live)[:, ::-1]
    return seqs, scores, flags[:, ::-1] | ~done[:, None], t


def assert_same_beams(out, ref, model):
    """Every real beam (finished, or a row's live ones) equal in tokens and scores (1e-5);
    filler slots (a row with fewer finished beams than slots) score about -1e7 in both."""
    tokens, scores, real, steps = ref
    assert out.tokens.dtype == np.int32 and out.scores.dtype == np.float32
    assert out.tokens.shape == tokens.shape and out.scores.shape == scores.shape
    np.testing.assert_array_equal(np.where(real[..., None], out.tokens, -1),
                                  np.where(real[..., None], tokens, -1))
    np.testing.assert_allclose(out.scores[real], scores[real], atol=1e-5, rtol=0)
    assert np.all(out.scores[~real] < -1e6) and np.all(scores[~real] < -1e6)
    eos = out.tokens == model.config.eos_id
    ended = np.where(eos.any(2), eos.argmax(2) + 1, steps)
    np.testing.assert_array_equal(out.lengths[real], ended[real])
    assert out.summary() == {"target_calls": steps * len(tokens), "beam_steps": steps * len(tokens),
                             "beam_steps_per_target_call": 1.0, "beam_size": tokens.shape[1],
                             "alpha": out.stats["alpha"]}


@pytest.fixture(scope="module", params=["t5_1_0", "t5_1_1"])
def t5(request, tmp_path_factory):
    """(our model, the same weights in transformers, inputs [3, 12] padded to lengths 12, 8
    and 3). EOS: the token most often ranked second along the greedy paths, so beams end
    at it while the search goes on (T5 1.0's random models repeat one token greedily)."""
    ref = make_hf_model(request.param, seed=1)
    model = st.load_checkpoint(save_hf_dir(ref, str(tmp_path_factory.mktemp("hf")), "safetensors"))
    x = random_ids(np.random.RandomState(0), 3, 12, model.config.vocab_size, pad_tail=[0, 4, 9])
    free = st.generate(model, x, max_decode_len=MAX_LEN, ignore_eos=True).tokens
    dec = np.concatenate([np.zeros((len(x), 1), np.int32), free[:, :-1]], 1)
    second = np.argsort(-hf_logits(ref, x, dec), axis=-1, kind="stable")[..., 1]
    values, counts = np.unique(second, return_counts=True)
    eos = int(values[np.argmax(counts)])
    return st.Model(model.config.replace(eos_id=eos), model.params), ref, x


def t5_logits(ref, x, beam):
    def next_logits(tokens):  # [B, W, t] -> [B, W, V]
        B, W, t = tokens.shape
        dec = np.concatenate([np.zeros((B * W, 1), np.int64), tokens.reshape(B * W, t)], 1)
        return hf_logits(ref, np.repeat(x, W, 0), dec)[:, -1].reshape(B, W, -1)
    return next_logits


@pytest.mark.parametrize("beam", [1, 2, 3, 4])
def test_t5_equals_t5x_beam_search_on_transformers_logits(t5, beam):
    model, ref, x = t5
    out = st.beam_search(model, x, beam_size=beam, alpha=0.6, max_decode_len=MAX_LEN)
    expected = reference_beam_search(t5_logits(ref, x, beam), len(x), beam,
                                     model.config.eos_id, 0.6, MAX_LEN)
    assert_same_beams(out, expected, model)
    if beam == 4:  # the case is not trivial: beams finish at EOS, before MAX_LEN
        finished = out.tokens == model.config.eos_id
        assert finished.any() and (out.lengths < MAX_LEN).any()


def test_beam_1_is_the_greedy_path_or_an_earlier_end_of_it(t5):
    """Beam 1 keeps the argmax as its live beam and an EOS in its top 2 as its finished one,
    so with alpha 0 (log-probs only fall along a path) it returns the greedy tokens, or a
    prefix of them ended by an EOS that was the runner-up and scored higher: T5X's beam 1
    is not always the greedy decode."""
    model, _, x = t5
    greedy = st.generate(model, x, max_decode_len=MAX_LEN)
    out = st.beam_search(model, x, beam_size=1, alpha=0.0, max_decode_len=MAX_LEN)
    eos, same = model.config.eos_id, 0
    for b in range(len(x)):
        n, tokens = int(out.lengths[b, 0]), out.tokens[b, 0]
        assert n <= greedy.lengths[b]
        np.testing.assert_array_equal(tokens[:n - 1], greedy.tokens[b, :n - 1])
        assert tokens[n - 1] in (eos, greedy.tokens[b, n - 1]) and not tokens[n:].any()
        same += bool((tokens == greedy.tokens[b]).all())
    assert same >= 1


def test_gpt2_equals_t5x_beam_search_on_transformers_logits(tmp_path):
    target, _, prompts, lengths = gpt2_pair()
    st.export_hf(target, str(tmp_path))
    ref = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path)).eval()

    def next_logits(tokens):  # each beam's prompt and tokens, right-padded, no cache
        B, W, t = tokens.shape
        seqs = np.zeros((B, W, prompts.shape[1] + t), np.int64)
        for b in range(B):
            seqs[b, :, :lengths[b]] = prompts[b, :lengths[b]]
            seqs[b, :, lengths[b]:lengths[b] + t] = tokens[b]
        with torch.no_grad():
            logits = ref(torch.tensor(seqs.reshape(B * W, -1))).logits.numpy()
        last = np.repeat(lengths + t - 1, W)
        return logits[np.arange(B * W), last].reshape(B, W, -1)
    out = st.beam_search(target, prompts, beam_size=3, max_decode_len=MAX_LEN,
                         prompt_lengths=lengths)
    expected = reference_beam_search(next_logits, len(prompts), 3, target.config.eos_id, 0.6,
                                     MAX_LEN, offset=lengths)
    assert_same_beams(out, expected, target)
    assert (out.tokens == target.config.eos_id).any()


SCRIPT = r'''
import json, sys
sys.path.insert(0, sys.argv[1])
import jax, numpy as np
import speculative_t5 as st
from helpers import random_ids, tiny_config
assert jax.device_count() == 8, jax.devices()
model = st.init_model(tiny_config(vocab_size=64, num_heads=4), seed=2)
x = random_ids(np.random.RandomState(1), 3, 10, 64, pad_tail=[0, 3, 6])
p = st.Partitioner(num_partitions=2)  # 3 rows padded to 4 over 'data', heads over 'model'
a = st.beam_search(model, x, beam_size=3, max_decode_len=8)
b = st.beam_search(model, x, beam_size=3, max_decode_len=8, partitioner=p)
print("RESULT " + json.dumps({"tokens": bool((a.tokens == b.tokens).all()),
                              "lengths": bool((a.lengths == b.lengths).all()),
                              "scores": float(np.abs(a.scores - b.scores).max()),
                              "calls": [a.stats["target_calls"].tolist(),
                                        b.stats["target_calls"].tolist()]}))
'''


@pytest.mark.slow
def test_partitioned_equals_unpartitioned(tmp_path):
    r = run_on_eight_devices(SCRIPT, TESTS)
    assert r["tokens"] and r["lengths"] and r["scores"] < 1e-5, r
    assert r["calls"][0] == r["calls"][1] and len(r["calls"][0]) == 3


def test_bad_arguments_are_one_line_errors(t5):
    model, _, x = t5
    gpt2, _, prompts, lengths = gpt2_pair()
    cases = [
        (TypeError, "model must be", lambda: st.beam_search("t5", x)),
        (ValueError, "beam_size must be an int >= 1",
         lambda: st.beam_search(model, x, beam_size=0)),
        (ValueError, "beam_size must be an int", lambda: st.beam_search(model, x, beam_size=2.0)),
        (ValueError, "alpha must be a number >= 0", lambda: st.beam_search(model, x, alpha=-1.0)),
        (ValueError, "alpha must be", lambda: st.beam_search(model, x, alpha=float("nan"))),
        (ValueError, "alpha must be", lambda: st.beam_search(model, x, alpha="0.6")),
        (ValueError, "max_decode_len must be", lambda: st.beam_search(model, x, max_decode_len=0)),
        (ValueError, "input_ids must be", lambda: st.beam_search(model, x[0])),
        (ValueError, "outside", lambda: st.beam_search(model, x + 1000)),
        (ValueError, "prompt_lengths is for decoder-only",
         lambda: st.beam_search(model, x, prompt_lengths=[1, 2, 3])),
        (ValueError, "longer than max_input_len",
         lambda: st.beam_search(model, x, max_input_len=5)),
        (TypeError, "partitioner must be", lambda: st.beam_search(model, x, partitioner="4x2")),
        (ValueError, "prompt_lengths must be in", lambda: st.beam_search(
            gpt2, prompts, prompt_lengths=np.zeros_like(lengths))),
        (ValueError, "exceeds the model's 64 positions", lambda: st.beam_search(
            gpt2, prompts, prompt_lengths=lengths, max_decode_len=60)),
    ]
    for kind, text, call in cases:
        with pytest.raises(kind) as e:
            call()
        assert text in str(e.value) and "\n" not in str(e.value), (text, str(e.value))
