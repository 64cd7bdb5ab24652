"""Checkpoint formats load to the same model; bad checkpoints fail loudly, naming the file
and the tensor, and never return a partial model."""
import json
import os

import jax
import numpy as np
import pytest

import speculative_t5 as st
from helpers import decoder_inputs, make_hf_model, random_ids, save_hf_dir, tiny_config
from speculative_t5.checkpoints.common import expected_shapes, flat_params
from t5x_format import write_t5x_legacy, write_t5x_orbax


@pytest.fixture(scope="module", params=["t5_1_0", "t5_1_1"])
def model(request):
    return st.init_model(tiny_config(request.param), seed=11)


def _same_model(a, b):
    assert a.config.replace(param_dtype="float32") == b.config.replace(param_dtype="float32")
    fa, fb = flat_params(a), flat_params(b)
    assert fa.keys() == fb.keys()
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)
    rng = np.random.RandomState(0)
    x = random_ids(rng, 2, 6, a.config.vocab_size, pad_tail=[0, 2])
    y = decoder_inputs(rng, 2, 5, a.config.vocab_size)
    np.testing.assert_array_equal(np.asarray(st.forward(a, x, y)), np.asarray(st.forward(b, x, y)))


@pytest.mark.parametrize("zarr_min_size", [None, 64])
def test_t5x_legacy_inline_and_tensorstore(model, zarr_min_size, tmp_path):
    ckpt = write_t5x_legacy(model, str(tmp_path / "checkpoint_100"), zarr_min_size)
    if zarr_min_size:
        assert any(d.startswith("target.encoder.layers_0") for d in os.listdir(ckpt))
    assert st.detect_format(ckpt) == "t5x"
    loaded = st.load_checkpoint(ckpt)          # config inferred from the shapes
    assert loaded.config == model.config
    _same_model(model, loaded)
    # a T5X model dir: the latest checkpoint_<step> is used
    write_t5x_legacy(st.init_model(model.config, seed=99), str(tmp_path / "checkpoint_5"))
    _same_model(model, st.load_checkpoint(str(tmp_path)))


def test_t5x_legacy_bfloat16_version2_uint16(tmp_path):
    model = st.cast_params(st.init_model(tiny_config(), seed=2), "bfloat16")
    # version 2 stored bfloat16 as uint16 in tensorstore
    as_uint16 = st.Model(model.config, jax.tree_util.tree_map(
        lambda x: np.asarray(x).view(np.uint16), model.params))
    ckpt = write_t5x_legacy(as_uint16, str(tmp_path / "c"), zarr_min_size=1, version=2)
    loaded = st.load_checkpoint(ckpt, dtype="bfloat16")
    _same_model(model, loaded)


@pytest.mark.parametrize("item_dir", [True, False])
def test_t5x_orbax(model, item_dir, tmp_path):
    ckpt = write_t5x_orbax(model, str(tmp_path / "checkpoint_100"), item_dir)
    assert st.detect_format(ckpt) == "t5x_orbax"
    _same_model(model, st.load_checkpoint(ckpt))


def test_exported_files_follow_the_umask(model, tmp_path):
    """safetensors alone writes 0600: an export others on the machine could not read."""
    old = os.umask(0o022)
    try:
        st.export_hf(model, str(tmp_path / "hf"))
    finally:
        os.umask(old)
    for name in ("model.safetensors", "config.json"):
        assert os.stat(tmp_path / "hf" / name).st_mode & 0o777 == 0o644, name


def test_native_round_trip_and_dtype(model, tmp_path):
    st.save_checkpoint(model, str(tmp_path / "m"))
    assert st.detect_format(str(tmp_path / "m")) == "native"
    _same_model(model, st.load_checkpoint(str(tmp_path / "m")))
    with pytest.raises(FileExistsError):
        st.save_checkpoint(model, str(tmp_path / "m"))
    half = st.load_checkpoint(str(tmp_path / "m"), dtype="bfloat16")
    assert half.config.param_dtype == "bfloat16"
    assert half.params["token_embedder"]["embedding"].dtype.name == "bfloat16"
    # bfloat16 compute (T5X's ACTIVATION_DTYPE) over float32 weights: logits stay float32,
    # near the float32 model's but rounded differently
    bf = st.load_checkpoint(str(tmp_path / "m"), activation_dtype="bfloat16")
    assert (bf.config.dtype, bf.config.param_dtype) == ("bfloat16", "float32")
    rng = np.random.RandomState(0)
    x = random_ids(rng, 2, 6, model.config.vocab_size, pad_tail=[0, 2])
    y = decoder_inputs(rng, 2, 5, model.config.vocab_size)
    ref, low = np.asarray(st.forward(model, x, y)), np.asarray(st.forward(bf, x, y))
    assert low.dtype == np.float32 and not np.array_equal(ref, low)
    np.testing.assert_allclose(low, ref, atol=0.1 * np.abs(ref).max())
    with pytest.raises(ValueError, match="dtype must be float32, bfloat16 or float16"):
        st.load_checkpoint(str(tmp_path / "m"), activation_dtype="int8")


def test_config_inference_matches_presets():
    from speculative_t5.checkpoints.t5x import infer_config
    for name in ("t5_1_1_xxl", "t5_11b", "t5_small"):
        cfg = st.T5Config.preset(name)
        # zero-stride views: the shapes of an 11B model without its memory
        flat = {k: np.lib.stride_tricks.as_strided(np.zeros(1, np.float32), s, [0] * len(s))
                for k, s in expected_shapes(cfg).items()}
        assert infer_config(flat, name) == cfg


# ----------------------------------------------------------------------------- bad input
@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    return save_hf_dir(make_hf_model("t5_1_1", seed=0),
                       str(tmp_path_factory.mktemp("hf") / "m"), "safetensors")


def _copy(src, dst):
    import shutil
    shutil.copytree(src, dst)
    return dst


def _rewrite_safetensors(path, fn):
    from safetensors.numpy import load_file, save_file
    file = os.path.join(path, "model.safetensors")
    tensors = load_file(file)
    fn(tensors)
    save_file(tensors, file)
    return file


def test_missing_tensor_names_tensor_and_file(hf_dir, tmp_path):
    path = _copy(hf_dir, str(tmp_path / "m"))
    name = "decoder.block.1.layer.2.DenseReluDense.wo.weight"
    _rewrite_safetensors(path, lambda t: t.pop(name))
    with pytest.raises(st.CheckpointError, match="missing") as e:
        st.load_checkpoint(path)
    assert name in str(e.value) and path in str(e.value), str(e.value)


def test_wrong_shape_names_tensor(hf_dir, tmp_path):
    path = _copy(hf_dir, str(tmp_path / "m"))
    name = "encoder.block.0.layer.0.SelfAttention.q.weight"
    file = _rewrite_safetensors(path, lambda t: t.__setitem__(name, np.zeros((5, 40), np.float32)))
    with pytest.raises(st.CheckpointError, match="shape") as e:
        st.load_checkpoint(path)
    assert name in str(e.value) and file in str(e.value)


def test_unexpected_tensor_and_nan_are_errors(hf_dir, tmp_path):
    path = _copy(hf_dir, str(tmp_path / "a"))
    _rewrite_safetensors(path, lambda t: t.__setitem__("encoder.block.9.layer.0.layer_norm.weight",
                                                       np.ones(40, np.float32)))
    with pytest.raises(st.CheckpointError, match="unexpected tensor.*encoder.block.9"):
        st.load_checkpoint(path)
    path = _copy(hf_dir, str(tmp_path / "b"))
    name = "decoder.final_layer_norm.weight"
    _rewrite_safetensors(path, lambda t: t[name].__setitem__(3, np.nan))
    with pytest.raises(st.CheckpointError, match="NaN") as e:
        st.load_checkpoint(path)
    assert name in str(e.value)


@pytest.mark.parametrize("kind", ["safetensors", "bin", "t5x"])
def test_truncated_files_name_the_file(hf_dir, model, kind, tmp_path):
    if kind == "safetensors":
        path = _copy(hf_dir, str(tmp_path / "st"))
        file = os.path.join(path, "model.safetensors")
    elif kind == "bin":
        path = save_hf_dir(make_hf_model("t5_1_0", seed=0), str(tmp_path / "bin"), "bin")
        file = os.path.join(path, "pytorch_model.bin")
    else:
        path = write_t5x_legacy(model, str(tmp_path / "t5x"))
        file = os.path.join(path, "checkpoint")
    data = open(file, "rb").read()
    open(file, "wb").write(data[: len(data) // 2])
    with pytest.raises(st.CheckpointError) as e:
        st.load_checkpoint(path)
    assert file in str(e.value)


def test_missing_zarr_chunk_is_an_error_not_zeros(model, tmp_path):
    ckpt = write_t5x_legacy(model, str(tmp_path / "c"), zarr_min_size=64)
    name = "target.encoder.layers_0.attention.query.kernel"
    chunks = [f for f in os.listdir(os.path.join(ckpt, name)) if not f.startswith(".")]
    os.remove(os.path.join(ckpt, name, chunks[0]))
    with pytest.raises(st.CheckpointError, match="encoder/layers_0/attention/query/kernel"):
        st.load_checkpoint(ckpt)
    import shutil
    shutil.rmtree(os.path.join(ckpt, name))
    with pytest.raises(st.CheckpointError, match=name):
        st.load_checkpoint(ckpt)


def test_corrupt_native_checkpoint(model, tmp_path):
    path = str(tmp_path / "n")
    st.save_checkpoint(model, path)
    with open(os.path.join(path, "speculative_t5.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(st.CheckpointError, match="speculative_t5.json"):
        st.load_checkpoint(path)
    path = str(tmp_path / "n2")
    st.save_checkpoint(model, path)
    import shutil
    for d in os.listdir(os.path.join(path, "params")):
        if d.startswith("ocdbt") or d == "d":
            shutil.rmtree(os.path.join(path, "params", d))
    with pytest.raises(st.CheckpointError, match="params"):
        st.load_checkpoint(path)


def test_unknown_format_and_missing_path(tmp_path):
    with pytest.raises(st.CheckpointError, match="does not exist"):
        st.load_checkpoint(str(tmp_path / "nope"))
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "weights.npz").write_bytes(b"123")
    with pytest.raises(st.CheckpointError, match="unknown checkpoint format"):
        st.load_checkpoint(str(tmp_path / "x"))
    with pytest.raises(st.CheckpointError, match="unknown checkpoint format"):
        st.load_checkpoint(str(tmp_path / "x"), format="onnx")


def test_config_mismatch_is_an_error(hf_dir, model, tmp_path):
    with pytest.raises(st.CheckpointError, match="num_heads"):
        st.load_checkpoint(hf_dir, config=st.T5Config.from_hf_config(
            json.load(open(os.path.join(hf_dir, "config.json")))).replace(num_heads=5, head_dim=8))
    ckpt = write_t5x_legacy(model, str(tmp_path / "t"))
    with pytest.raises(st.CheckpointError, match="emb_dim"):
        st.load_checkpoint(ckpt, config=model.config.replace(emb_dim=64))
    bad = _copy(hf_dir, str(tmp_path / "cfg"))
    cfg = json.load(open(os.path.join(bad, "config.json")))
    cfg["feed_forward_proj"] = "gated-swishy"
    json.dump(cfg, open(os.path.join(bad, "config.json"), "w"))
    with pytest.raises(st.CheckpointError, match="feed_forward_proj"):
        st.load_checkpoint(bad)
