"""Hugging Face GPT-2 directories through `load_checkpoint` / `export_hf` / the native format
(issue #13 item 3): transformers' own files (safetensors, .bin with the old mask buffers and
a stored lm_head, sharded, without the 'transformer.' prefix) load to logits equal to
transformers' within 1e-4; an exported model opens in transformers with nothing missing;
native save/load and `speculative-t5 convert` round-trip exactly; every broken file is a
CheckpointError naming the tensor or field; a partitioner loads GPT-2 into its shards."""
import json
import os
import shutil

import jax
import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5.checkpoints import CheckpointError
from speculative_t5.checkpoints.common import flat_params
from speculative_t5.commands import main as cli
from speculative_t5.model import gpt2
from helpers import run_on_eight_devices

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.numpy import load_file, save_file  # noqa: E402

FIELDS = dict(vocab_size=83, n_positions=16, n_embd=32, n_layer=2, n_head=4)
CONFIG = gpt2.GPT2Config(**FIELDS, eos_id=82, pad_id=82)
TOKENS = np.random.RandomState(0).randint(0, 83, (2, 9))


def _hf_logits(hf) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.tensor(TOKENS)).logits.numpy()


def _our_logits(model) -> np.ndarray:
    return np.asarray(gpt2.forward(model.config, model.params, TOKENS))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """(transformers model, its logits, {layout: directory})."""
    root = tmp_path_factory.mktemp("gpt2_hf")
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        **FIELDS, eos_token_id=82, bos_token_id=82)).eval()
    with torch.no_grad():  # non-zero biases and norms, so every tensor matters
        for p in hf.parameters():
            p.add_(0.05 * torch.randn_like(p))
    dirs = {"safetensors": str(root / "safetensors"), "sharded": str(root / "sharded")}
    hf.save_pretrained(dirs["safetensors"])
    hf.save_pretrained(dirs["sharded"], max_shard_size="20KB")
    state = {k: v.clone() for k, v in hf.state_dict().items()}
    # transformers 5 writes safetensors only: the .bin as older versions wrote it, with the
    # causal-mask buffers and the tied lm_head stored beside wte
    state["lm_head.weight"] = state["transformer.wte.weight"].clone()
    for i in range(FIELDS["n_layer"]):
        state[f"transformer.h.{i}.attn.bias"] = torch.tril(torch.ones(1, 1, 16, 16))
        state[f"transformer.h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    dirs["bin"] = _copy_config(dirs["safetensors"], str(root / "bin"))
    torch.save(state, os.path.join(dirs["bin"], "pytorch_model.bin"))
    dirs["no prefix"] = _copy_config(dirs["safetensors"], str(root / "no_prefix"))
    save_file({k[len("transformer."):]: v.numpy() for k, v in hf.state_dict().items()
               if k.startswith("transformer.")},
              os.path.join(dirs["no prefix"], "model.safetensors"), metadata={"format": "pt"})
    return hf, _hf_logits(hf), dirs


def _copy_config(src: str, dest: str) -> str:
    os.makedirs(dest)
    shutil.copy(os.path.join(src, "config.json"), dest)
    return dest


@pytest.mark.parametrize("layout", ["safetensors", "sharded", "bin", "no prefix"])
def test_transformers_files_load_to_equal_logits(saved, layout):
    _, theirs, dirs = saved
    if layout == "sharded":
        assert "model.safetensors.index.json" in os.listdir(dirs[layout])
    model = st.load_checkpoint(dirs[layout])
    assert model.decoder_only and model.config == CONFIG
    np.testing.assert_allclose(_our_logits(model), theirs, atol=1e-4, rtol=0)


def test_export_opens_in_transformers(tmp_path):
    model = st.init_model(CONFIG, seed=3)
    rng = np.random.RandomState(1)  # non-zero biases, norms != 1
    model = st.Model(CONFIG, jax.tree_util.tree_map(
        lambda x: x + np.float32(0.05) * rng.standard_normal(x.shape).astype(np.float32), model.params))
    st.export_hf(model, str(tmp_path))
    hf, info = transformers.GPT2LMHeadModel.from_pretrained(str(tmp_path),
                                                            output_loading_info=True)
    assert {k: v for k, v in info.items() if v} == {}, info  # nothing missing or unexpected
    hf.eval()
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()  # tied
    np.testing.assert_allclose(_hf_logits(hf), _our_logits(model), atol=1e-4, rtol=0)
    back = st.load_checkpoint(str(tmp_path))
    _assert_same(back, model)


def _assert_same(a, b):
    assert a.config == b.config
    fa, fb = flat_params(a), flat_params(b)
    assert sorted(fa) == sorted(fb)
    for k in fa:
        np.testing.assert_array_equal(fa[k], fb[k], err_msg=k)


def test_native_round_trip_records_the_family(saved, tmp_path):
    model = st.load_checkpoint(saved[2]["safetensors"])
    st.save_checkpoint(model, str(tmp_path / "n"))
    with open(tmp_path / "n" / "speculative_t5.json") as f:
        meta = json.load(f)
    assert meta["family"] == "gpt2" and meta["config"]["n_layer"] == 2
    _assert_same(st.load_checkpoint(str(tmp_path / "n")), model)
    meta["family"] = "gpt3"
    with open(tmp_path / "n" / "speculative_t5.json", "w") as f:
        json.dump(meta, f)
    with pytest.raises(CheckpointError, match="family 'gpt3'"):
        st.load_checkpoint(str(tmp_path / "n"))


def test_native_without_a_family_is_t5(tmp_path):
    """Files written before GPT-2 existed hold no family: they are T5."""
    cfg = st.T5Config.preset("t5_1_1_tiny").replace(vocab_size=64, emb_dim=16, num_heads=2,
                                                    head_dim=8, mlp_dim=16,
                                                    num_encoder_layers=1, num_decoder_layers=1)
    model = st.init_model(cfg, seed=0)
    st.save_checkpoint(model, str(tmp_path))
    marker = tmp_path / "speculative_t5.json"
    meta = json.loads(marker.read_text())
    assert meta.pop("family") == "t5"
    marker.write_text(json.dumps(meta))
    _assert_same(st.load_checkpoint(str(tmp_path)), model)


def test_convert_hf_native_hf(saved, tmp_path, capsys):
    hf, theirs, dirs = saved
    native, back = str(tmp_path / "native"), str(tmp_path / "hf")
    cli(["convert", "--from", dirs["bin"], "--to", native])
    assert "GPT-2, 2 layers" in capsys.readouterr().out
    cli(["convert", "--from", native, "--to", back, "--format", "hf"])
    assert json.load(open(os.path.join(back, "config.json")))["model_type"] == "gpt2"
    stored = load_file(os.path.join(back, "model.safetensors"))
    for k, v in hf.state_dict().items():
        if k != "lm_head.weight":  # tied, stored once as wte
            np.testing.assert_array_equal(stored[k], v.numpy(), err_msg=k)
    assert "lm_head.weight" not in stored
    np.testing.assert_allclose(_our_logits(st.load_checkpoint(back)), theirs, atol=1e-4)


def _broken(src: str, dest: str, tensors=None, config=None) -> str:
    """A copy of the safetensors directory `src` with its tensors and config.json edited."""
    os.makedirs(dest)
    state = load_file(os.path.join(src, "model.safetensors"))
    if tensors:
        tensors(state)
    save_file(state, os.path.join(dest, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(src, "config.json")) as f:
        cfg = json.load(f)
    cfg.update(config or {})
    with open(os.path.join(dest, "config.json"), "w") as f:
        json.dump(cfg, f)
    return dest


def _set(name, value):
    return lambda state: state.__setitem__(name, value(state))


BROKEN = {
    "missing": (dict(tensors=lambda s: s.pop("transformer.h.1.mlp.c_fc.bias")),
                r"missing tensor\(s\) h\.1\.mlp\.c_fc\.bias"),
    "shape": (dict(tensors=_set("transformer.h.0.attn.c_proj.weight",
                                lambda s: np.zeros((32, 31), np.float32))),
              r"h\.0\.attn\.c_proj\.weight .*has shape \(32, 31\), expected \(32, 32\)"),
    "extra": (dict(tensors=_set("transformer.h.2.ln_1.weight", lambda s: np.ones(32, np.float32))),
              r"unexpected tensor\(s\) h\.2\.ln_1\.weight"),
    "nan": (dict(tensors=_set("transformer.wpe.weight",
                              lambda s: np.full((16, 32), np.nan, np.float32))),
            r"wpe\.weight .*NaN"),
    "untied": (dict(tensors=_set("lm_head.weight", lambda s: s["transformer.wte.weight"] + 1)),
               r"lm_head\.weight differs from wte\.weight"),
    "head shape": (dict(tensors=_set("lm_head.weight", lambda s: np.zeros((83, 16), np.float32))),
                   r"lm_head\.weight has shape \(83, 16\)"),
    "twice": (dict(tensors=_set("ln_f.bias", lambda s: s["transformer.ln_f.bias"])),
              r"ln_f\.bias is stored twice"),
    "integer": (dict(tensors=_set("transformer.ln_f.bias", lambda s: np.zeros(32, np.int32))),
                r"ln_f\.bias .*has dtype int32"),
    "model_type": (dict(config={"model_type": "llama"}), r"model_type 'llama' is not supported"),
    "n_layer": (dict(config={"n_layer": 0}), r"config\.json: GPT2Config\.n_layer must be"),
    "n_layer type": (dict(config={"n_layer": "2"}), r"'n_layer' must be one int"),
    "n_inner": (dict(config={"n_inner": 64}), r"n_inner 64"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_directories_are_named_errors(saved, tmp_path, case):
    edits, message = BROKEN[case]
    path = _broken(saved[2]["safetensors"], str(tmp_path / "d"), **edits)
    with pytest.raises(CheckpointError, match=message):
        st.load_checkpoint(path)


def test_config_given_must_match(saved):
    with pytest.raises(CheckpointError, match="a GPT2Config in file vs a T5Config given"):
        st.load_checkpoint(saved[2]["safetensors"], config=st.T5Config.preset("t5_1_1_tiny"))
    with pytest.raises(CheckpointError, match="n_layer: 2 in file vs 3 given"):
        st.load_checkpoint(saved[2]["safetensors"], config=CONFIG.replace(n_layer=3))
    model = st.load_checkpoint(saved[2]["safetensors"], config=CONFIG, dtype="bfloat16")
    assert model.params["wte"].dtype == jax.numpy.bfloat16


def test_one_device_partitioner(saved):
    p = st.Partitioner(num_partitions=1)
    model = st.load_checkpoint(saved[2]["bin"], partitioner=p)
    p.check(model)
    np.testing.assert_allclose(_our_logits(model), saved[1], atol=1e-4, rtol=0)


SCRIPT = r'''
import json, sys
import jax, numpy as np
import speculative_t5 as st
from speculative_t5.checkpoints.common import flat_params
from speculative_t5.model import gpt2
from safetensors.numpy import load_file, save_file
assert jax.device_count() == 8
root = sys.argv[1]
cfg = gpt2.GPT2Config(vocab_size=88, n_positions=16, n_embd=32, n_layer=2, n_head=4,
                      eos_id=87, pad_id=87)
model = st.init_model(cfg, seed=4)
st.export_hf(model, root + "/hf")
state = load_file(root + "/hf/model.safetensors")
state["lm_head.weight"] = state["transformer.wte.weight"]
save_file(state, root + "/hf/model.safetensors")      # a stored, tied lm_head checked by shard
st.save_checkpoint(model, root + "/native")
ref = flat_params(model)
out = {}
for fmt in ("hf", "native"):
    for parts in (8, 2):
        p = st.Partitioner(num_partitions=parts)
        loaded = st.load_checkpoint(root + "/" + fmt, partitioner=p)
        p.check(loaded)
        wte = loaded.params["wte"]
        out[f"{fmt}/p{parts}"] = {
            "equal": all(np.array_equal(v, ref[k]) for k, v in flat_params(loaded).items()),
            "wte shard": list(wte.addressable_shards[0].data.shape)}
st.export_hf(st.init_model(cfg.replace(vocab_size=83, eos_id=82, pad_id=82)), root + "/odd")
try:
    st.load_checkpoint(root + "/odd", partitioner=st.Partitioner(num_partitions=8))
except Exception as e:
    out["error"] = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps(out))
'''


def test_partitioned_load_on_eight_devices(tmp_path):
    """GPT-2 read straight into the shards of an 8-way and a 4x2 mesh (the tied lm_head
    compared shard by shard), values exactly the unpartitioned ones."""
    out = run_on_eight_devices(SCRIPT, tmp_path)
    for fmt in ("hf", "native"):
        assert out[f"{fmt}/p8"] == {"equal": True, "wte shard": [11, 32]}
        assert out[f"{fmt}/p2"] == {"equal": True, "wte shard": [44, 32]}
    assert out["error"].startswith("ValueError") and "'vocab' dimension (83)" in out["error"]
