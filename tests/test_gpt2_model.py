"""The Flax GPT-2 (`model/gpt2.py`) against Hugging Face's PyTorch GPT2LMHeadModel with
random weights: teacher-forced logits within 1e-4 for two configs (one with a vocabulary
that is not a multiple of 8 and few positions), and the cached step protocol -- a prompt
prefilled in one call, then one or several tokens at a time at per-row positions -- equal
to the teacher-forced logits."""
import jax.numpy as jnp
import numpy as np
import pytest

from speculative_t5.model import gpt2

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

CONFIGS = {"small vocab, 16 positions": dict(vocab_size=83, n_positions=16, n_embd=32,
                                             n_layer=2, n_head=4),
           "wider": dict(vocab_size=256, n_positions=64, n_embd=48, n_layer=3, n_head=3)}


def _hf_pair(fields, seed=0):
    torch.manual_seed(seed)
    hf_cfg = transformers.GPT2Config(**fields, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    hf = transformers.GPT2LMHeadModel(hf_cfg).eval()
    with torch.no_grad():  # non-zero biases and norms, so every term is checked
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    config = gpt2.GPT2Config.from_hf_config(hf_cfg.to_dict())
    params = gpt2.params_from_hf({k: v.numpy() for k, v in hf.state_dict().items()}, config)
    return hf, config, params


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_logits_equal_transformers(name):
    hf, config, params = _hf_pair(CONFIGS[name])
    tokens = np.random.RandomState(0).randint(0, config.vocab_size, (3, 11))
    ours = np.asarray(gpt2.forward(config, params, tokens))
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("beside", [False, True])  # attention beside the cache: as on a TPU
def test_cached_steps_equal_teacher_forcing(beside):
    hf, config, params = _hf_pair(CONFIGS["small vocab, 16 positions"], seed=1)
    rng = np.random.RandomState(1)
    tokens = rng.randint(0, config.vocab_size, (3, 12))
    full = np.asarray(gpt2.forward(config, params, tokens))                    # [3, 12, V]
    lengths = np.array([2, 5, 4])                                              # prompts
    prompt = np.where(np.arange(5)[None, :] < lengths[:, None], tokens[:, :5], config.pad_id)
    cache = gpt2.init_cache(config, 3, 16)
    logits, cache = gpt2.decode(config, params, cache, jnp.asarray(prompt), jnp.zeros(3, jnp.int32),
                                beside_cache=beside)
    for b in range(3):  # each row's prompt positions; the pads after it do not matter
        np.testing.assert_allclose(np.asarray(logits)[b, :lengths[b]], full[b, :lengths[b]], atol=1e-4)
    pos = lengths.copy()
    for width in (1, 3, 1, 2):  # each row continues at its own position, K tokens at a time
        step = np.stack([tokens[b, pos[b]:pos[b] + width] for b in range(3)])
        logits, cache = gpt2.decode(config, params, cache, jnp.asarray(step), jnp.asarray(pos),
                                    beside_cache=beside)
        for b in range(3):
            np.testing.assert_allclose(np.asarray(logits)[b], full[b, pos[b]:pos[b] + width],
                                       atol=1e-4)
        pos = pos + width


def test_config_checks():
    assert gpt2.GPT2Config.preset("distilgpt2").n_layer == 6
    assert gpt2.GPT2Config.preset("gpt2-xl").n_embd == 1600
    with pytest.raises(ValueError, match="unknown GPT-2 preset"):
        gpt2.GPT2Config.preset("gpt3")
    with pytest.raises(ValueError, match="n_embd 30 is not a multiple of n_head 4"):
        gpt2.GPT2Config(n_embd=30, n_head=4)
    with pytest.raises(ValueError, match="model_type"):
        gpt2.GPT2Config.from_hf_config({"model_type": "t5"})
    with pytest.raises(ValueError, match="'n_layer' must be one int"):
        gpt2.GPT2Config.from_hf_config({"vocab_size": 10, "n_positions": 8, "n_embd": 8,
                                        "n_head": 2, "n_layer": "2"})
    config = gpt2.GPT2Config(vocab_size=10, n_positions=8, n_embd=8, n_layer=1, n_head=2,
                             eos_id=9, pad_id=9)
    tensors = {"wte.weight": np.zeros((10, 8))}
    with pytest.raises(ValueError, match="missing 'wpe.weight'"):
        gpt2.params_from_hf(tensors, config)
    with pytest.raises(ValueError, match=r"wte.weight: shape \(10, 7\)"):
        gpt2.params_from_hf({"wte.weight": np.zeros((10, 7))}, config)
