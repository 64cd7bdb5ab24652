"""Presets, config validation, gin model blocks and the `speculative-t5 convert` CLI."""
import glob
import os
import subprocess
import sys

import gin
import numpy as np
import pytest

import speculative_t5 as st
from helpers import HF_CONFIGS, decoder_inputs, make_hf_model, random_ids, save_hf_dir
from speculative_t5 import commands as cli
from speculative_t5.model.config import gin_t5_config

# (emb, heads, head_dim, enc layers, dec layers, mlp) from T5X's published gin files
PUBLISHED = {
    "t5_1_1_small": (512, 6, 64, 8, 8, 1024), "t5_1_1_base": (768, 12, 64, 12, 12, 2048),
    "t5_1_1_large": (1024, 16, 64, 24, 24, 2816), "t5_1_1_xl": (2048, 32, 64, 24, 24, 5120),
    "t5_1_1_xxl": (4096, 64, 64, 24, 24, 10240), "t5_small": (512, 8, 64, 6, 6, 2048),
    "t5_base": (768, 12, 64, 12, 12, 3072), "t5_large": (1024, 16, 64, 24, 24, 4096),
    "t5_3b": (1024, 32, 128, 24, 24, 16384), "t5_11b": (1024, 128, 128, 24, 24, 65536),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_presets(name):
    c = st.T5Config.preset(name)
    assert (c.emb_dim, c.num_heads, c.head_dim, c.num_encoder_layers, c.num_decoder_layers,
            c.mlp_dim) == PUBLISHED[name]
    assert c.vocab_size == 32128
    assert c.is_gated == name.startswith("t5_1_1") and c.logits_via_embedding != c.is_gated


def test_bad_config_values_are_named():
    with pytest.raises(ValueError, match="unknown T5 preset 't5_huge'"):
        st.T5Config.preset("t5_huge")
    with pytest.raises(ValueError, match="num_heads"):
        st.T5Config(num_heads=0)
    with pytest.raises(ValueError, match="mlp_activations"):
        st.T5Config(mlp_activations=("swish",))
    with pytest.raises(ValueError, match="dtype"):
        st.T5Config(dtype="float8")
    with pytest.raises(ValueError, match="dropout_rate"):
        st.T5Config(dropout_rate=1.0)
    with pytest.raises(ValueError, match="config.json: T5Config.dropout_rate"):
        st.T5Config.from_hf_config({**HF_CONFIGS["t5_1_1"], "dropout_rate": "0.1"})
    with pytest.raises(ValueError, match="model_type"):
        st.T5Config.from_hf_config({"model_type": "bart"})
    with pytest.raises(ValueError, match="d_model"):
        st.T5Config.from_hf_config({"vocab_size": 10, "num_heads": 2})


@pytest.mark.parametrize("variant", sorted(HF_CONFIGS))
def test_hf_config_round_trip(variant):
    cfg = st.T5Config.from_hf_config(HF_CONFIGS[variant])
    assert st.T5Config.from_hf_config(cfg.to_hf_config()) == cfg
    assert st.T5Config.from_dict(cfg.to_dict()) == cfg
    trained = cfg.replace(dropout_rate=0.1)  # a training setting, carried both ways
    assert st.T5Config.from_hf_config(trained.to_hf_config()) == trained


def _gin_files():
    root = cli.gin_root()
    return sorted(os.path.relpath(p, root) for p in glob.glob(os.path.join(root, "models", "t5_*", "*.gin")))


@pytest.mark.parametrize("rel", _gin_files())
def test_gin_model_blocks_give_the_presets(rel):
    family, size = rel.split(os.sep)[1], os.path.splitext(os.path.basename(rel))[0]
    name = f"t5_1_1_{size}" if family == "t5_1_1" else f"t5_{size}"
    cli.parse_gin([rel], [], [])
    try:
        assert gin_t5_config() == st.T5Config.preset(name)
    finally:
        gin.clear_config()


def test_gin_binding_overrides_file_and_bad_binding_is_named():
    cli.parse_gin(["models/t5_1_1/small.gin"], ["T5Config.num_decoder_layers = 2"], [])
    try:
        assert gin_t5_config() == st.T5Config.preset("t5_1_1_small", num_decoder_layers=2)
    finally:
        gin.clear_config()
    with pytest.raises(SystemExit, match="bad gin configuration.*NoSuchThing"):
        cli.parse_gin([], ["NoSuchThing.x = 1"], [])
    with pytest.raises(SystemExit, match="bad gin configuration"):
        cli.parse_gin(["models/t5_1_1/nope.gin"], [], [])
    gin.clear_config()


def test_cli_convert_hf_to_native_and_back(tmp_path):
    ref = make_hf_model("t5_1_0", seed=4)
    src = save_hf_dir(ref, str(tmp_path / "hf"), "bin")
    native, hf2 = str(tmp_path / "native"), str(tmp_path / "hf2")
    assert cli.main(["convert", "--from", src, "--to", native]) == 0
    assert st.detect_format(native) == "native"
    # gin flags, T5X style, set what the flags did not
    assert cli.main(["convert", "--from", native, "--gin.convert.destination='%s'" % hf2,
                     "--gin.convert.format='hf'"]) == 0
    assert st.detect_format(hf2) == "hf"
    a, b = st.load_checkpoint(src), st.load_checkpoint(hf2)
    rng = np.random.RandomState(0)
    x, y = random_ids(rng, 1, 5, 101), decoder_inputs(rng, 1, 4, 101)
    np.testing.assert_array_equal(np.asarray(st.forward(a, x, y)), np.asarray(st.forward(b, x, y)))
    with pytest.raises(SystemExit, match="not empty"):
        cli.main(["convert", "--from", src, "--to", hf2, "--format", "hf"])
    with pytest.raises(SystemExit, match="unknown checkpoint format|does not exist"):
        cli.main(["convert", "--from", str(tmp_path / "missing"), "--to", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--from and --to"):
        cli.main(["convert"])
    with pytest.raises(SystemExit, match="--gin.NAME=VALUE"):
        cli.main(["convert", "--gin.convert.source"])


def test_console_script_is_installed():
    out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "speculative-t5"),
                          "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "convert" in out.stdout
