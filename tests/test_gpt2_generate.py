"""GPT-2 through the same loops: prompts of different lengths in one batch, each row
continuing at its own position.

Greedy continuations equal transformers' GPT2LMHeadModel.generate (the independent
reference) row by row; speculative decoding with a smaller GPT-2 draft, prompt lookup, a
fallback, block verification and adaptive gamma gives the plain greedy tokens; T = 1 is
exact by enumeration; mixing families and bad prompt lengths are clear errors."""
import itertools

import jax
import numpy as np
import pytest

import speculative_t5 as st
import test_exactness as tx
import test_generate as tg
from speculative_t5.checkpoints.common import flat_params
from speculative_t5.decoding.sampling import adjust
from speculative_t5.model import gpt2
from helpers import gpt2_pair, tiny_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

MAX_LEN = 20


@pytest.fixture(scope="module")
def pair():
    return gpt2_pair(MAX_LEN)


def test_greedy_equals_transformers(pair):
    target, _, prompts, lengths = pair
    out = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=MAX_LEN)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**{
        **target.config.to_hf_config(), "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0})).eval()
    missing, unexpected = hf.load_state_dict(_torch_state(target), strict=False)
    assert not unexpected and all(".attn.bias" in k or "masked_bias" in k for k in missing)
    stopped = 0
    for b in range(len(lengths)):
        with torch.no_grad():
            ref = hf.generate(torch.tensor(prompts[b:b + 1, :lengths[b]]), do_sample=False,
                              max_new_tokens=MAX_LEN, eos_token_id=target.config.eos_id,
                              pad_token_id=target.config.eos_id)[0, lengths[b]:].tolist()
        n = int(out.lengths[b])
        assert out.tokens[b, :n].tolist() == ref[:n], b
        stopped += n < MAX_LEN
        assert n == len(ref) or ref[n - 1] == target.config.eos_id
    assert 1 <= stopped < len(lengths)  # rows that stop at EOS and rows that run to MAX_LEN


def _torch_state(model):
    """Our GPT-2 parameters as transformers' state dict (`gpt2.hf_name`, the loader's map)."""
    state = {f"transformer.{gpt2.hf_name(k)}": v for k, v in flat_params(model).items()}
    state["lm_head.weight"] = state["transformer.wte.weight"]
    return {k: torch.tensor(v) for k, v in state.items()}


@pytest.mark.parametrize("gamma", [pytest.param(1, marks=pytest.mark.slow), 3,
                                   pytest.param(7, marks=pytest.mark.slow)])
def test_speculative_greedy_equals_plain(pair, gamma):
    target, draft, prompts, lengths = pair
    plain = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=MAX_LEN)
    noise = jax.tree_util.tree_map(  # a perturbed copy: agrees often, not always
        lambda x: x + 0.02 * jax.random.normal(jax.random.PRNGKey(3), x.shape), target.params)
    runs = {"model": dict(draft=draft), "draft == target": dict(draft=target),
            "random draft": dict(draft=st.init_model(target.config, seed=7)),
            "perturbed copy": dict(draft=st.Model(target.config, noise))}
    if gamma == 3:  # every other draft kind and option at one gamma, combined (each run
        runs.update({  # compiles its own program); apart at gamma 7, in the slow tier
            "lookup": dict(draft=st.drafts.PromptLookup()),
            "fallback, adaptive, draft_stop, block": dict(
                draft=st.drafts.Fallback(st.drafts.PromptLookup(2, 2), draft),
                adaptive_gamma=(0.2, 1.4), draft_stop=0.05, verification="block")})
    if gamma == 7:
        runs.update({
            "block": dict(draft=draft, verification="block"),
            "fallback, adaptive": dict(draft=st.drafts.Fallback(st.drafts.PromptLookup(2, 2), draft),
                                       adaptive_gamma=(0.2, 1.4)),
            "draft_stop": dict(draft=draft, draft_stop=0.05)})
    for name, kw in runs.items():
        out = st.generate(target, prompts, prompt_lengths=lengths, gamma=gamma,
                          max_decode_len=MAX_LEN, **kw)
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=name)
        np.testing.assert_array_equal(out.lengths, plain.lengths, err_msg=name)
        tg._check_stats(out, gamma, fixed_model_draft=name in ("model", "block"))
        assert (out.lengths > gamma + 1).sum() >= 3
        if name == "model":
            assert out.summary()["acceptance_rate"] > 0.2
        if name == "draft == target":
            assert out.summary()["acceptance_rate"] == 1.0


V, STEPS, N = tx.V, tx.STEPS, 60_000  # as test_drafts' and block verification's
SMALL = st.GPT2Config(vocab_size=V, n_positions=16, n_embd=16, n_layer=2, n_head=2, eos_id=1,
                      pad_id=0)
PROMPT = np.array([[3, 5, 2, 7]], np.int32)


def _exact(model, sampling):
    """P(first STEPS continuation tokens) by enumeration of the target's own distributions."""
    prefixes = list(itertools.product(range(V), repeat=STEPS - 1))
    seqs = np.array([[*PROMPT[0], *p] for p in prefixes], np.int32)
    logits = gpt2.forward(model.config, model.params, seqs)[:, PROMPT.shape[1] - 1:]
    probs = np.asarray(adjust(logits, sampling), np.float64)                   # [V^2, 3, V]
    return tx.enumerate_distribution(probs, model.config.eos_id)


@pytest.mark.parametrize("kind", ["model", "fallback",
                                  pytest.param("model, top-k 3", marks=pytest.mark.slow),
                                  "block, prompt + max_decode_len = n_positions",
                                  pytest.param("tree, prompt + max_decode_len = n_positions",
                                               marks=pytest.mark.slow)])
def test_speculative_sampling_is_exact(kind):
    """T = 1 against enumeration. The last kinds end at the model's position limit, so the
    rounds near the end feed tokens at positions past it (their outputs unused); a token
    tree's deeper nodes sit past it too."""
    config = SMALL.replace(n_positions=PROMPT.shape[1] + STEPS) if "n_positions" in kind else SMALL
    target, draft = st.init_model(config, seed=0), st.init_model(config, seed=1)
    d = st.drafts.Fallback(st.drafts.PromptLookup(1, 1), draft) if kind == "fallback" else draft
    sampling = st.SamplingConfig(1.0, top_k=3 if "top-k" in kind else 0)
    out = st.generate(target, np.repeat(PROMPT, N, 0), draft=d, gamma=2, max_decode_len=STEPS,
                      sampling=sampling, rng=jax.random.PRNGKey(0),
                      verification="block" if "block" in kind else "token",
                      tree=(2, 2) if "tree" in kind else None)
    # both branches exercised (a tree's two children are accepted more often than a chain's one)
    assert 0.1 < out.summary()["acceptance_rate"] < (0.99 if "tree" in kind else 0.95)
    pvalue, cells = tx.chi_square_pvalue(out.tokens, _exact(target, sampling))
    assert cells >= 20 and pvalue > 1e-3, (kind, pvalue, cells)


def test_errors(pair):
    target, draft, prompts, lengths = pair
    t5 = st.init_model(tiny_config(vocab_size=61), seed=0)
    with pytest.raises(ValueError, match="one family"):
        st.generate(target, prompts, prompt_lengths=lengths, draft=st.Model(
            t5.config.replace(eos_id=target.config.eos_id, pad_id=target.config.pad_id), t5.params))
    other = st.init_model(target.config.replace(vocab_size=62, n_layer=1), seed=0)
    with pytest.raises(ValueError, match="share one vocabulary"):
        st.generate(target, prompts, prompt_lengths=lengths, draft=other)
    with pytest.raises(ValueError, match=r"prompt_lengths must be in \[1, 9\]"):
        st.generate(target, prompts, prompt_lengths=[0, 1, 2, 3, 4, 5])
    with pytest.raises(ValueError, match="prompt_lengths must be 6 ints"):
        st.generate(target, prompts, prompt_lengths=[3, 4])
    with pytest.raises(ValueError, match="exceeds the model's 64 positions"):
        st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=60)
    with pytest.raises(ValueError, match="recompute_cross_attention is for T5"):
        st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=MAX_LEN,
                    recompute_cross_attention=True)
    with pytest.raises(ValueError, match="prompt_lengths is for decoder-only"):
        st.generate(t5, prompts, prompt_lengths=lengths)


def test_speculative_greedy_up_to_the_position_limit(pair):
    """prompt width + max_decode_len = n_positions (29, the cache rounded up to 32): rounds
    near the end feed tokens at positions past the model's last one (the model clamps them
    for its position table) -- greedy equals plain for the model draft, token-wise and
    block-verified, at gamma 7."""
    target, draft, prompts, lengths = pair
    n = prompts.shape[1] + MAX_LEN

    def limited(m):
        return st.Model(m.config.replace(n_positions=n), {**m.params, "wpe": m.params["wpe"][:n]})
    target, draft = limited(target), limited(draft)
    plain = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=MAX_LEN)
    assert (plain.lengths == MAX_LEN).sum() >= 2           # rows that run to the end
    for verification in ("token", "block"):
        out = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=MAX_LEN,
                          draft=draft, gamma=7, verification=verification)
        np.testing.assert_array_equal(out.tokens, plain.tokens, err_msg=verification)
