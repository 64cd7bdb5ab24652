"""The multi-token decoder step against the teacher-forced forward pass."""
import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
from helpers import decoder_inputs, random_ids, tiny_config


@pytest.fixture(scope="module", params=["t5_1_0", "t5_1_1"])
def model(request):
    return st.init_model(tiny_config(request.param), seed=7)


@pytest.mark.parametrize("beside", [False, True])
def test_chunked_decode_at_per_row_positions_equals_forward(model, beside):
    """Rows advance by different amounts in every call (chunks of 1, 3, 2, 5 tokens), so rows
    sit at different positions; each call also writes junk past each row's accepted tokens,
    which the next call must overwrite (the rollback property). beside: attention over the
    cache as it was and the new keys beside it (as on a TPU), the same logits."""
    rng = np.random.RandomState(0)
    B, T, V = 4, 14, model.config.vocab_size
    x = random_ids(rng, B, 9, V, pad_tail=[0, 3, 5, 1])
    y = decoder_inputs(rng, B, T, V)
    full = np.asarray(st.forward(model, x, y))                                 # [B, T, V]
    cache = st.init_cache(model, jnp.asarray(x), max_len=T + 5)
    pos = np.zeros(B, np.int32)
    seen = np.zeros((B, T), bool)
    spread = 0
    for step, K in enumerate([1, 3, 2, 5, 3, 2, 5, 5, 5]):
        tokens = rng.randint(2, V, size=(B, K)).astype(np.int32)               # junk by default
        for b in range(B):
            n = min(K, T - pos[b])
            tokens[b, :n] = y[b, pos[b]:pos[b] + n]
        logits, cache = st.decode(model, cache, jnp.asarray(tokens), jnp.asarray(pos),
                                  beside_cache=beside)
        logits = np.asarray(logits)
        assert logits.shape == (B, K, V) and logits.dtype == np.float32
        # row b accepts a different number of this call's tokens (>= 1 so everyone progresses)
        accept = [(step + b) % K + 1 for b in range(B)]
        for b in range(B):
            n = min(accept[b], T - pos[b])
            np.testing.assert_allclose(logits[b, :n], full[b, pos[b]:pos[b] + n], atol=2e-5,
                                       err_msg=f"row {b} positions {pos[b]}..{pos[b] + n - 1}")
            seen[b, pos[b]:pos[b] + n] = True
            pos[b] += n
        spread = max(spread, int(pos.max() - pos.min()))
    assert seen.all()
    assert spread >= 3  # rows really were at different positions


def test_rollback_then_new_continuation_equals_fresh_forward(model):
    """Decode sequence A, roll a row back to position r and feed a different continuation B:
    the logits equal a fresh forward of B (stale keys past r are never seen)."""
    rng = np.random.RandomState(1)
    B, T, V, r = 2, 10, model.config.vocab_size, 4
    x = random_ids(rng, B, 6, V)
    a = decoder_inputs(rng, B, T, V)
    b_seq = a.copy()
    b_seq[:, r:] = rng.randint(2, V, size=(B, T - r))
    cache = st.init_cache(model, jnp.asarray(x), max_len=T)
    _, cache = st.decode(model, cache, jnp.asarray(a), jnp.zeros(B, jnp.int32))
    logits, _ = st.decode(model, cache, jnp.asarray(b_seq[:, r:]), jnp.full(B, r, jnp.int32))
    fresh = np.asarray(st.forward(model, x, b_seq))
    np.testing.assert_allclose(np.asarray(logits), fresh[:, r:], atol=2e-5)
    # and the stale continuation would have given different logits (the test can fail)
    assert np.abs(np.asarray(st.forward(model, x, a))[:, r + 1:] - fresh[:, r + 1:]).max() > 1e-3


@pytest.mark.parametrize("beside", [False, True])
def test_writes_past_cache_end_are_dropped(model, beside):
    """A step that runs past max_len still gives the right logits for in-range positions."""
    rng = np.random.RandomState(2)
    V, L = model.config.vocab_size, 6
    x = random_ids(rng, 1, 5, V)
    y = decoder_inputs(rng, 1, L, V)
    full = np.asarray(st.forward(model, x, y))
    cache = st.init_cache(model, jnp.asarray(x), max_len=L)
    _, cache = st.decode(model, cache, jnp.asarray(y[:, :L - 1]), jnp.zeros(1, jnp.int32))
    tokens = np.concatenate([y[:, L - 1:], rng.randint(2, V, size=(1, 3))], 1).astype(np.int32)
    logits, cache = st.decode(model, cache, jnp.asarray(tokens), jnp.full(1, L - 1, jnp.int32),
                              beside_cache=beside)
    np.testing.assert_allclose(np.asarray(logits)[:, 0], full[:, L - 1], atol=2e-5)
    assert cache["self"][0]["k"].shape[1] == L


def test_recomputed_cross_attention_equals_cached(model):
    """The T5X-faithful mode (cross K/V recomputed every step) gives the same logits."""
    rng = np.random.RandomState(3)
    V = model.config.vocab_size
    x = jnp.asarray(random_ids(rng, 2, 7, V, pad_tail=[0, 2]))
    y = jnp.asarray(decoder_inputs(rng, 2, 5, V))
    a, _ = st.decode(model, st.init_cache(model, x, 8), y, jnp.zeros(2, jnp.int32))
    b, _ = st.decode(model, st.init_cache(model, x, 8, recompute_cross_attention=True), y,
                     jnp.zeros(2, jnp.int32))
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6)


def test_forward_rejects_bad_ids(model):
    with pytest.raises(ValueError, match="outside"):
        st.forward(model, np.array([[1, model.config.vocab_size]]), np.array([[0]]))
    with pytest.raises(ValueError, match="rank 2"):
        st.forward(model, np.array([1, 2]), np.array([[0]]))
    with pytest.raises(ValueError, match="batch sizes differ"):
        st.forward(model, np.array([[1, 2]]), np.array([[0], [0]]))
    with pytest.raises(ValueError, match="integer"):
        st.forward(model, np.array([[1.0, 2.0]]), np.array([[0]]))


def test_param_tree_has_t5x_names_and_logical_axes():
    cfg = tiny_config("t5_1_1")
    axes = st.param_axes(cfg)
    assert tuple(axes["encoder"]["layers_0"]["attention"]["query"]["kernel"]) == ("embed", "joined_kv")
    assert tuple(axes["decoder"]["layers_1"]["mlp"]["wo"]["kernel"]) == ("mlp", "embed")
    assert tuple(axes["decoder"]["logits_dense"]["kernel"]) == ("embed", "vocab")
    assert tuple(axes["token_embedder"]["embedding"]) == ("vocab", "embed")
    assert tuple(axes["decoder"]["relpos_bias"]["rel_embedding"]) == ("heads", "relpos_buckets")
    shapes = st.param_shapes(cfg)
    assert shapes["encoder"]["layers_0"]["attention"]["query"]["kernel"].shape == (32, 24)
    assert set(shapes["decoder"]["layers_0"]) == {
        "pre_self_attention_layer_norm", "self_attention", "pre_cross_attention_layer_norm",
        "encoder_decoder_attention", "pre_mlp_layer_norm", "mlp"}
    assert set(shapes["decoder"]["layers_0"]["mlp"]) == {"wi_0", "wi_1", "wo"}
    v10 = st.param_shapes(tiny_config("t5_1_0"))
    assert set(v10["decoder"]["layers_0"]["mlp"]) == {"wi", "wo"}
    assert "logits_dense" not in v10["decoder"]


@pytest.mark.slow
def test_bfloat16_params_and_activations_run():
    cfg = tiny_config("t5_1_1", dtype="bfloat16", param_dtype="bfloat16")
    model = st.init_model(cfg, seed=0)
    assert model.params["encoder"]["layers_0"]["attention"]["query"]["kernel"].dtype == jnp.bfloat16
    rng = np.random.RandomState(0)
    logits = st.forward(model, random_ids(rng, 1, 4, 53), decoder_inputs(rng, 1, 3, 53))
    assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
    # bf16 logits track the float32 model's closely (same weights, upcast)
    f32 = st.cast_params(model, "float32")
    f32 = st.Model(f32.config.replace(dtype="float32"), f32.params)
    rng = np.random.RandomState(0)
    ref = st.forward(f32, random_ids(rng, 1, 4, 53), decoder_inputs(rng, 1, 3, 53))
    assert np.abs(np.asarray(logits) - np.asarray(ref)).max() < 0.1 * np.abs(np.asarray(ref)).max()
