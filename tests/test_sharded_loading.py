"""`load_checkpoint(path, partitioner=p)` reads every format straight into the partitioner's
shards (issue #11): each parameter placed as `p.param_shardings` says, each device holding
only its slice, values identical to the unpartitioned load, every check as strict as ever.

The pytest process has one CPU device, so the 8-device checks run in one subprocess (one JAX
start) that loops over formats and meshes and prints its findings as JSON: the slow tier
(about 50 s on 2 cores); the default tier keeps the one-device partitioner's load."""
import os

import pytest

import speculative_t5 as st
from helpers import run_on_eight_devices, tiny_config

TESTS = os.path.dirname(os.path.abspath(__file__))

SCRIPT = r'''
import json, os, sys, traceback
sys.path.insert(0, sys.argv[1])
import jax, numpy as np
import speculative_t5 as st
from safetensors.numpy import load_file, save_file
from speculative_t5.checkpoints import hf, t5x
from speculative_t5.checkpoints.common import flat_params
from t5x_format import write_t5x_legacy, write_t5x_orbax

root = sys.argv[2]
assert jax.device_count() == 8, jax.devices()
cfg = st.T5Config.preset("t5_1_1_tiny").replace(vocab_size=512, num_heads=8, head_dim=16)
model = st.init_model(cfg, seed=5)


def sharded_hf(src, dest, parts=3):
    """`src` re-saved as model-0000i-of-0000n.safetensors + model.safetensors.index.json."""
    os.makedirs(dest)
    os.link(os.path.join(src, "config.json"), os.path.join(dest, "config.json"))
    tensors, weight_map = load_file(os.path.join(src, "model.safetensors")), {}
    for i in range(parts):
        name = f"model-{i + 1:05d}-of-{parts:05d}.safetensors"
        part = {k: v for j, (k, v) in enumerate(sorted(tensors.items())) if j % parts == i}
        save_file(part, os.path.join(dest, name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return dest


def torch_bin(src, dest):
    import torch
    os.makedirs(dest)
    os.link(os.path.join(src, "config.json"), os.path.join(dest, "config.json"))
    tensors = load_file(os.path.join(src, "model.safetensors"))
    state = {k: torch.from_numpy(v) for k, v in tensors.items()}
    torch.save(state, os.path.join(dest, "pytorch_model.bin"))
    return dest


paths = {"native": os.path.join(root, "native"), "hf": os.path.join(root, "hf")}
st.save_checkpoint(model, paths["native"])
st.export_hf(model, paths["hf"])
paths["hf_sharded"] = sharded_hf(paths["hf"], os.path.join(root, "hf_sharded"))
paths["hf_bin"] = torch_bin(paths["hf"], os.path.join(root, "hf_bin"))
paths["t5x"] = write_t5x_legacy(model, os.path.join(root, "t5x"), zarr_min_size=2048)
paths["t5x_orbax"] = write_t5x_orbax(model, os.path.join(root, "t5x_orbax"))

SETUPS = {"p8": (dict(num_partitions=8), "target"), "p2": (dict(num_partitions=2), "target"),
          "draft_replicated": (dict(num_partitions=8), "draft"),
          "draft_partitioned": (dict(num_partitions=2, draft="partitioned"), "draft")}


def compare(loaded, p, role, reference):
    """Failures: sharding, shard sizes, values (gathered) against `reference`."""
    bad = []
    want = jax.tree_util.tree_leaves(p.param_shardings(loaded.config, role))
    leaves = jax.tree_util.tree_leaves_with_path(loaded.params)
    assert len(want) == len(leaves)
    for (path, x), s in zip(leaves, want):
        key = jax.tree_util.keystr(path)
        if not x.sharding.is_equivalent_to(s, x.ndim):
            bad.append(f"{key}: sharding {x.sharding.spec} != {s.spec}")
        split = int(np.prod([p.mesh.shape[a] for a in s.spec if a is not None]))
        want_shape = tuple(s.shard_shape(x.shape))
        if split > 1 and int(np.prod(want_shape)) * split != x.size:
            bad.append(f"{key}: expected shard {want_shape} is not 1/{split} of {x.shape}")
        for sh in x.addressable_shards:
            if sh.data.shape != want_shape:
                bad.append(f"{key}: shard on {sh.device} is {sh.data.shape}, want {want_shape}")
    got = flat_params(loaded)
    for k, v in reference.items():
        if got[k].dtype != v.dtype or not np.array_equal(got[k], v):
            bad.append(f"{k}: values differ from the unpartitioned load")
    return bad


out = {"cases": {}, "errors": {}, "reads": {}}
# every format's unpartitioned load equals the model (tests/test_checkpoints.py)
reference = {dt: flat_params(st.load_checkpoint(paths["native"], dtype=dt))
             for dt in ("float32", "bfloat16")}
for fmt, path in paths.items():
    for name, (kwargs, role) in SETUPS.items():
        p = st.Partitioner(**kwargs)
        try:
            out["cases"][f"{fmt}/{name}"] = compare(
                st.load_checkpoint(path, partitioner=p, role=role), p, role, reference["float32"])
        except Exception:
            out["cases"][f"{fmt}/{name}"] = [traceback.format_exc()]
    p = st.Partitioner(num_partitions=8)
    try:
        out["cases"][f"{fmt}/p8_bfloat16"] = compare(
            st.load_checkpoint(path, partitioner=p, dtype="bfloat16"), p, "target",
            reference["bfloat16"])
    except Exception:
        out["cases"][f"{fmt}/p8_bfloat16"] = [traceback.format_exc()]

# reads are slices: the most elements any one read returned, per tensor, vs its size
for fmt, cls in (("hf", hf._Lazy), ("t5x", t5x._Stored)):
    read, largest = cls.read, {}

    def counting(self, index=None, read=read):
        arr = read(self, index)
        largest[self.name] = max(largest.get(self.name, 0), int(arr.size))
        return arr
    cls.read = counting
    try:
        st.load_checkpoint(paths[fmt], partitioner=st.Partitioner(num_partitions=8))
    finally:
        cls.read = read
    out["reads"][fmt] = largest


def error_of(fn):
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


p8 = st.Partitioner(num_partitions=8)
bad = st.Model(cfg, jax.tree_util.tree_map(np.array, model.params))
bad.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"] = np.zeros((128, 7), np.float32)
for fmt, write in (("t5x", lambda m, d: write_t5x_legacy(m, d, zarr_min_size=2048)),
                   ("t5x_orbax", write_t5x_orbax)):
    d = write(bad, os.path.join(root, "bad_" + fmt))
    out["errors"]["shape_" + fmt] = error_of(lambda: st.load_checkpoint(d, partitioner=p8))
tensors = load_file(os.path.join(paths["hf"], "model.safetensors"))
tensors["decoder.block.1.layer.2.DenseReluDense.wo.weight"][5, 77] = np.inf
nan_dir = os.path.join(root, "hf_inf")
os.makedirs(nan_dir)
os.link(os.path.join(paths["hf"], "config.json"), os.path.join(nan_dir, "config.json"))
save_file(tensors, os.path.join(nan_dir, "model.safetensors"))
out["errors"]["inf_hf"] = error_of(lambda: st.load_checkpoint(nan_dir, partitioner=p8))
inf_model = st.Model(cfg, jax.tree_util.tree_map(np.array, model.params))
inf_model.params["encoder"]["layers_1"]["mlp"]["wo"]["kernel"][200, 3] = np.nan
st.save_checkpoint(inf_model, os.path.join(root, "native_nan"))
out["errors"]["nan_native"] = error_of(
    lambda: st.load_checkpoint(os.path.join(root, "native_nan"), partitioner=p8))
six = st.init_model(cfg.replace(num_heads=6), seed=1)
st.export_hf(six, os.path.join(root, "six_heads"))
out["errors"]["heads"] = error_of(
    lambda: st.load_checkpoint(os.path.join(root, "six_heads"), partitioner=p8))
print("RESULT " + json.dumps(out))
'''

FORMATS = ("native", "hf", "hf_sharded", "hf_bin", "t5x", "t5x_orbax")


@pytest.fixture(scope="module")
def eight_devices(tmp_path_factory):
    """The subprocess's findings: {'cases': {'fmt/setup': [failures]}, 'errors', 'reads'}."""
    root = tmp_path_factory.mktemp("sharded")
    return run_on_eight_devices(SCRIPT, TESTS, root / "ckpts", timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_format_loads_straight_into_the_partitioners_shards(eight_devices, fmt):
    """Target over 8 and over 4x2 devices, a replicated and a partitioned draft, and a
    bfloat16 cast per shard: right shardings, 1/n shards, the unpartitioned values exactly."""
    cases = {k: v for k, v in eight_devices["cases"].items() if k.startswith(fmt + "/")}
    assert set(cases) == {f"{fmt}/{s}" for s in ("p8", "p2", "draft_replicated",
                                                  "draft_partitioned", "p8_bfloat16")}
    assert {k: v for k, v in cases.items() if v} == {}


@pytest.mark.slow
def test_lazy_readers_read_slices_not_whole_tensors(eight_devices):
    """Over 8 partitions a partitioned tensor is read in eighths (replicated ones whole)."""
    size = 512 * 128  # the embedding [vocab, embed], partitioned over 'vocab'
    assert eight_devices["reads"]["hf"]["shared.weight"] == size // 8
    assert eight_devices["reads"]["hf"]["lm_head.weight"] == size // 8
    assert eight_devices["reads"]["hf"]["encoder.final_layer_norm.weight"] == 128  # [embed]
    stored = eight_devices["reads"]["t5x"]
    assert stored["token_embedder/embedding"] == size // 8
    assert stored["encoder/layers_0/mlp/wi_0/kernel"] == 128 * 256 // 8


@pytest.mark.slow
def test_errors_stay_as_strict_with_a_partitioner(eight_devices):
    errors = eight_devices["errors"]
    for fmt in ("t5x", "t5x_orbax"):
        message = errors["shape_" + fmt]
        assert message.startswith("CheckpointError") and \
            "decoder/layers_0/mlp/wi_0/kernel has shape (128, 7), expected" in message
    assert errors["inf_hf"].startswith("CheckpointError") and \
        "decoder.block.1.layer.2.DenseReluDense.wo.weight" in errors["inf_hf"] and \
        "NaN or Inf" in errors["inf_hf"]
    assert errors["nan_native"].startswith("CheckpointError") and \
        "encoder/layers_1/mlp/wo/kernel has NaN or Inf" in errors["nan_native"]
    assert errors["heads"].startswith("ValueError") and "(6)" in errors["heads"] \
        and "(8 devices)" in errors["heads"]


def test_one_device_partitioner_and_role_checked(tmp_path):
    model = st.init_model(tiny_config(), seed=2)
    st.save_checkpoint(model, str(tmp_path / "n"))
    p = st.Partitioner(num_partitions=1)
    loaded = st.load_checkpoint(str(tmp_path / "n"), partitioner=p)
    p.check(loaded)
    with pytest.raises(ValueError, match="role must be 'target' or 'draft'"):
        st.load_checkpoint(str(tmp_path / "n"), partitioner=p, role="verifier")
