"""The Flax T5 is numerically Hugging Face's PyTorch T5 (the independent reference)."""
import numpy as np
import pytest

import speculative_t5 as st
from helpers import HF_CONFIGS, decoder_inputs, hf_logits, make_hf_model, random_ids, save_hf_dir

pytest.importorskip("torch")


@pytest.fixture(scope="module", params=["t5_1_0", "t5_1_1"])
def hf_model(request):
    return request.param, make_hf_model(request.param, seed=1)


def _inputs(vocab):
    rng = np.random.RandomState(0)
    # long enough for the logarithmic relative-position buckets and the max-distance clamp
    x = random_ids(rng, 3, 40, vocab, pad_tail=[0, 7, 25])
    y = decoder_inputs(rng, 3, 30, vocab)
    return x, y


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_hf_checkpoint_logits_match_transformers(hf_model, fmt, tmp_path):
    variant, ref = hf_model
    path = save_hf_dir(ref, str(tmp_path / variant), fmt)
    assert st.detect_format(path) == "hf"
    model = st.load_checkpoint(path)
    assert model.config.logits_via_embedding == (variant == "t5_1_0")
    assert model.config.is_gated == (variant == "t5_1_1")
    x, y = _inputs(model.config.vocab_size)
    ours = np.asarray(st.forward(model, x, y))
    theirs = hf_logits(ref, x, y)
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (3, 30, 101)
    assert np.abs(theirs).max() > 1.0  # the comparison is not between near-zero numbers
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=0)


@pytest.mark.parametrize("variant", ["t5_1_0", "t5_1_1"])
def test_export_hf_opens_in_transformers_with_equal_logits(variant, tmp_path):
    from transformers import T5ForConditionalGeneration
    cfg = st.T5Config.from_hf_config(dict(HF_CONFIGS[variant]))
    model = st.init_model(cfg, seed=3)
    st.export_hf(model, str(tmp_path))
    ref, info = T5ForConditionalGeneration.from_pretrained(str(tmp_path), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    x, y = _inputs(cfg.vocab_size)
    np.testing.assert_allclose(np.asarray(st.forward(model, x, y)), hf_logits(ref.eval(), x, y),
                               atol=1e-4, rtol=0)
    # and back: our loader reads what we exported
    again = st.load_checkpoint(str(tmp_path))
    assert again.config == cfg
    np.testing.assert_array_equal(np.asarray(st.forward(again, x, y)),
                                  np.asarray(st.forward(model, x, y)))
