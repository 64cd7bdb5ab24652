"""`plan`: bytes per device from eval_shape and logical axes, mesh checks, the CLI."""
import json
import math

import jax
import jax.numpy as jnp
import pytest

import speculative_t5 as st
from helpers import tiny_config
from t5x_format import write_t5x_legacy, write_t5x_orbax
from speculative_t5 import commands as cli
from speculative_t5.measure import plan as pl
from speculative_t5.model import api

XXL = st.T5Config.preset("t5_1_1_xxl", param_dtype="bfloat16", dtype="bfloat16")
SPLIT = {"vocab", "mlp", "heads", "joined_kv"}  # the logical axes T5X splits over 'model'


def _leaves(tree):
    return jax.tree_util.tree_leaves(tree)


def _zeros_model(config):
    """A real model with zero weights (the cache's sizes do not depend on the values)."""
    return api.Model(config, jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype),
                                                    api.param_shapes(config)))


def test_xxl_params_whole_on_one_device_match_eval_shape():
    expected = sum(x.size * x.dtype.itemsize for x in _leaves(api.param_shapes(XXL)))
    result = pl.plan(XXL, num_partitions=1)
    assert result["bytes_per_device"]["target_params"] == expected
    # T5.1.1-XXL as this preset builds it (vocab 32128, untied output layer): 11.14B
    # parameters, 22.27 GB in bfloat16 (the paper's "11B"; often quoted as 11.3B)
    assert result["target"]["num_params"] == 11_135_332_352
    assert expected == 2 * 11_135_332_352
    assert 22.2e9 < expected < 22.7e9


def test_xxl_params_split_four_ways_leaf_by_leaf():
    shapes, axes = api.param_shapes(XXL), api.param_axes(XXL)
    expected = 0
    for shape, spec in zip(_leaves(shapes), jax.tree_util.tree_leaves(
            axes, is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))):
        split = [n // 4 if name in SPLIT else n for n, name in zip(shape.shape, spec)]
        assert all(n % 4 == 0 for n, name in zip(shape.shape, spec) if name in SPLIT)
        expected += math.prod(split) * shape.dtype.itemsize
    result = pl.plan(XXL, st.T5Config.preset("t5_1_1_small", param_dtype="bfloat16"),
                     num_partitions=4, batch=8)
    assert result["bytes_per_device"]["target_params"] == expected
    whole = pl.plan(XXL, num_partitions=1)["bytes_per_device"]["target_params"]
    assert whole / 4 < expected < whole / 4 * 1.001      # only layer norms stay whole
    # the small draft (6 heads) is replicated by default: every device holds all of it
    small = st.T5Config.preset("t5_1_1_small", param_dtype="bfloat16")
    assert result["bytes_per_device"]["draft_params"] == 2 * sum(
        x.size for x in _leaves(api.param_shapes(small)))
    # 4 partitions x 2 data: batch rows halve, the parameters do not change
    wider = pl.plan(XXL, small, num_partitions=4, num_devices=8, batch=8)
    assert wider["mesh"] == {"num_devices": 8, "data": 2, "model": 4}
    assert wider["bytes_per_device"]["target_params"] == expected
    assert wider["target"]["cache_bytes"]["total"] * 2 == result["target"]["cache_bytes"]["total"]


def test_cache_bytes_equal_a_real_cache():
    config = tiny_config(vocab_size=54, num_heads=4, head_dim=8)
    draft_config = tiny_config(vocab_size=54, num_heads=3, num_decoder_layers=1)
    model = _zeros_model(config)
    B, S, max_decode_len, gamma = 2, 7, 5, 3
    ids = jnp.ones((B, S), jnp.int32)
    length = 16  # max_decode_len = 5 positions, rounded up as generate allocates
    real = api.init_cache(model, ids, length)
    real_bytes = sum(x.nbytes for x in _leaves(real))
    result = pl.plan(config, draft_config, batch=B, input_length=S,
                     max_decode_len=max_decode_len, gamma=gamma)
    assert result["cache_length"] == length
    assert result["bytes_per_device"]["target_cache"] == real_bytes
    assert result["target"]["cache_bytes"]["self"] == sum(x.nbytes for x in _leaves(real["self"]))
    assert result["target"]["cache_bytes"]["cross"] == sum(x.nbytes for x in _leaves(real["cross"]))
    draft_real = api.init_cache(_zeros_model(draft_config), ids, length)
    assert result["bytes_per_device"]["draft_cache"] == sum(x.nbytes for x in _leaves(draft_real))
    # two partitions: heads halve in the self and cross caches, batch and encoded stay
    two = pl.plan(config, draft_config, num_partitions=2, batch=B, input_length=S,
                  max_decode_len=max_decode_len, gamma=gamma)["target"]["cache_bytes"]
    one = result["target"]["cache_bytes"]
    assert (two["self"], two["cross"], two["encoded"]) == (one["self"] // 2, one["cross"] // 2,
                                                           one["encoded"])
    # a replicated draft's cache is split over 'data' only (here 1): whole on each device
    assert pl.plan(config, draft_config, num_partitions=2, batch=B, input_length=S,
                   max_decode_len=max_decode_len, gamma=gamma)["bytes_per_device"][
        "draft_cache"] == result["bytes_per_device"]["draft_cache"]
    # without a draft the cache holds max_decode_len positions
    plain = pl.plan(config, batch=B, input_length=S, max_decode_len=max_decode_len)
    assert plain["cache_length"] == max_decode_len and plain["speedup_bound"] is None


def test_roofline_and_speedup_bound():
    from speculative_t5.measure.analysis import walltime_improvement
    small = st.T5Config.preset("t5_1_1_small", param_dtype="bfloat16", dtype="bfloat16")
    r = pl.plan(XXL, small, num_partitions=4, batch=8, gamma=4, alpha=0.7)
    v4 = r["chips"]["v4"]
    step = r["target"]["step_bytes"]
    assert v4["target_step_ms"] == pytest.approx(1e3 * step / 1.2e12)
    assert v4["round_ms"] == pytest.approx(4 * v4["draft_step_ms"] + v4["target_step_ms"])
    c = r["draft"]["step_bytes"] / step
    assert r["speedup_bound"]["speedup"] == pytest.approx(walltime_improvement(0.7, 4, c, 1.0))
    assert 0 < c < 0.1 and r["chips"]["v5e"]["fits"] and v4["fits"]
    # the encoder's weights are not read by a decoder step
    assert r["target"]["step_weight_bytes"] < 0.6 * r["target"]["param_bytes"]
    # XXL float32 on one device does not fit a v4 (44.5 GB) but does an H100
    whole = pl.plan(XXL.replace(param_dtype="float32"))["chips"]
    assert not whole["v4"]["fits"] and whole["h100"]["fits"]


def test_a_batch_data_does_not_divide_is_padded_as_generate_pads_it():
    three = pl.plan(XXL, num_partitions=4, num_devices=8, batch=3)
    four = pl.plan(XXL, num_partitions=4, num_devices=8, batch=4)
    assert three["batch"] == 4 and three["bytes_per_device"] == four["bytes_per_device"]


def test_bad_mesh_names_both_numbers():
    with pytest.raises(ValueError, match="num_partitions 4 does not divide num_devices 6"):
        pl.plan(XXL, num_partitions=4, num_devices=6)
    with pytest.raises(ValueError, match="num_heads 6 is not divisible by num_partitions 4"):
        pl.plan(st.T5Config.preset("t5_1_1_small"), num_partitions=4)
    with pytest.raises(ValueError, match="mlp_dim 10238 is not divisible by num_partitions 4"):
        pl.plan(XXL.replace(mlp_dim=10238), num_partitions=4)
    with pytest.raises(ValueError, match="draft num_heads 6 is not divisible by num_partitions 4"):
        pl.plan(XXL, st.T5Config.preset("t5_1_1_small"), num_partitions=4,
                draft_partitioning="partitioned")


def test_configs_read_from_directories_without_weights(tmp_path):
    config = tiny_config()
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(config.to_hf_config()))
    native = tmp_path / "native"
    native.mkdir()
    (native / "speculative_t5.json").write_text(json.dumps({"config": config.to_dict()}))
    assert pl.read_config(str(hf)) == config
    assert pl.read_config(str(native)) == config
    assert pl.read_config("t5_1_1_xxl") == st.T5Config.preset("t5_1_1_xxl")
    with pytest.raises(ValueError, match="neither a preset"):
        pl.read_config(str(tmp_path / "missing"))
    # T5X stores no config: inferred from the shapes the checkpoint declares (a model dir
    # with checkpoint_<step>/ reads its latest step)
    model = _zeros_model(config)
    write_t5x_legacy(model, str(tmp_path / "t5x" / "checkpoint_100"), zarr_min_size=64)
    write_t5x_orbax(model, str(tmp_path / "orbax"))
    assert pl.read_config(str(tmp_path / "t5x")) == config
    assert pl.read_config(str(tmp_path / "orbax")) == config


def test_cli_table_and_json(capsys):
    argv = ["plan", "--target", "t5_1_1_xxl", "--draft", "t5_1_1_small", "--num_partitions", "4",
            "--batch", "8", "--input_length", "512", "--max_decode_len", "128",
            "--dtype", "bfloat16", "--chip", "v4"]
    assert cli.main(argv) == 0
    table = capsys.readouterr().out
    assert "target parameters" in table and "* TPU v4" in table and "speedup bound" in table
    assert cli.main(argv + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["chip"] == "v4" and out["mesh"]["model"] == 4
    assert set(out["chips"]) == {"v4", "v5e", "v5p", "h100", "h200"}
    assert out["bytes_per_device"]["total"] == sum(
        v for k, v in out["bytes_per_device"].items() if k != "total")
    with pytest.raises(SystemExit, match="num_heads 6 is not divisible by num_partitions 4"):
        cli.main(["plan", "--target", "t5_1_1_small", "--num_partitions", "4"])
    with pytest.raises(SystemExit, match="needs --target"):
        cli.main(["plan"])


# -- GPT-2 -------------------------------------------------------------------------------------
def _tiny_gpt2(**overrides):
    return st.GPT2Config(**{**dict(vocab_size=64, n_positions=32, n_embd=32, n_layer=2,
                                   n_head=4, eos_id=63, pad_id=63), **overrides})


def test_gpt2_presets_have_hugging_faces_parameter_counts():
    # transformers' GPT2LMHeadModel(num_parameters) for gpt2 and gpt2-xl (lm_head tied)
    r = pl.plan(st.GPT2Config.preset("gpt2-xl"), st.GPT2Config.preset("gpt2"), batch=8,
                input_length=256, max_decode_len=128)
    assert r["target"]["num_params"] == 1_557_611_200 and r["draft"]["num_params"] == 124_439_808
    assert r["bytes_per_device"]["target_params"] == 4 * 1_557_611_200
    # a step reads every weight but the position table (1024 x 1600 floats)
    assert r["target"]["step_weight_bytes"] == 4 * (1_557_611_200 - 1024 * 1600)
    # prompt + max_decode_len = 384 positions, a multiple of 16 (no room for gamma's
    # overhang: its writes are dropped)
    assert r["cache_length"] == 384 and "target prefill" in r["activation_phases"]


def test_gpt2_cache_bytes_equal_a_real_prefilled_cache():
    config, draft_config = _tiny_gpt2(), _tiny_gpt2(n_layer=1, n_head=2)
    B, S, max_decode_len, gamma = 2, 6, 5, 3
    # S + max_decode_len = 11 positions, rounded up to 16 as generate allocates
    real = api.prefill_cache(_zeros_model(config), jnp.ones((B, S), jnp.int32),
                             jnp.full((B,), S, jnp.int32), 16 - S)
    r = pl.plan(config, draft_config, batch=B, input_length=S, max_decode_len=max_decode_len,
                gamma=gamma)
    assert r["bytes_per_device"]["target_cache"] == sum(x.nbytes for x in _leaves(real))
    assert r["target"]["cache_bytes"]["self"] == sum(x.nbytes for x in _leaves(real["layers"]))
    assert r["target"]["step_bytes"] == r["target"]["step_weight_bytes"] + \
        r["target"]["cache_bytes"]["self"]
    # the model's own byte count of its keys/values agrees
    from speculative_t5.model import gpt2
    assert r["target"]["cache_bytes"]["self"] == gpt2.cache_bytes(config, B, r["cache_length"])
    # two partitions: the split weights and the heads of the cache halve
    two = pl.plan(config, draft_config, num_partitions=2, batch=B, input_length=S,
                  max_decode_len=max_decode_len, gamma=gamma)
    shapes, axes = api.param_shapes(config), api.param_axes(config)
    expected = sum(math.prod(n // 2 if name in SPLIT else n for n, name in zip(x.shape, spec))
                   * x.dtype.itemsize for x, spec in zip(_leaves(shapes), jax.tree_util.tree_leaves(
                       axes, is_leaf=lambda a: isinstance(a, jax.sharding.PartitionSpec))))
    assert two["bytes_per_device"]["target_params"] == expected
    assert two["target"]["cache_bytes"]["self"] == r["target"]["cache_bytes"]["self"] // 2


def test_gpt2_plan_errors_name_the_numbers(tmp_path, capsys):
    with pytest.raises(ValueError, match="vocab_size 50257 is not divisible by num_partitions 2"):
        pl.plan(st.GPT2Config.preset("gpt2").replace(n_head=8), num_partitions=2)
    with pytest.raises(ValueError, match="n_head 25 is not divisible by num_partitions 2"):
        pl.plan(st.GPT2Config.preset("gpt2-xl").replace(vocab_size=50304), num_partitions=2)
    with pytest.raises(ValueError, match="input_length 1000 tokens \\+ max_decode_len 128 exceeds "
                                         "the GPT-2's 1024 positions"):
        pl.plan(st.GPT2Config.preset("gpt2"), input_length=1000)
    with pytest.raises(ValueError, match="the draft is a t5 and the target a gpt2"):
        pl.plan(st.GPT2Config.preset("gpt2"), st.T5Config.preset("t5_1_1_small"))
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(_tiny_gpt2().to_hf_config()))
    assert pl.read_config(str(hf)) == _tiny_gpt2()
    assert cli.main(["plan", "--target", str(hf), "--input_length", "8",
                     "--max_decode_len", "8"]) == 0
    assert "target cache (self" in capsys.readouterr().out
