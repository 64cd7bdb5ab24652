"""Nothing mixed, nothing destroyed, nothing hangs: each defect found by trying the CLI and
the checkpoint readers as a hostile or careless user would, as a regression test."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import speculative_t5 as st
from helpers import tiny_config, train_sentencepiece
from speculative_t5 import commands as cli
from speculative_t5.checkpoints.common import flat_params
from t5x_format import write_t5x_legacy


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("hardening")
    spm = train_sentencepiece(str(d))
    models = {}
    for name, seed, layers in (("a", 0, 2), ("b", 1, 2), ("draft", 4, 1)):
        path = str(d / name)
        st.export_hf(st.init_model(tiny_config(num_decoder_layers=layers), seed=seed), path)
        shutil.copy(spm, os.path.join(path, "spiece.model"))
        models[name] = path
    lines = ["the quick brown fox", "seven small birds sing", "a lazy dog jumps over",
             "translate english to german: the data", "summarize this text about models"]
    inputs, other = d / "in.txt", d / "other.txt"
    inputs.write_text("\n".join(lines) + "\n")
    other.write_text("\n".join(reversed(lines)) + "\n")
    return dict(dir=d, spm=spm, inputs=str(inputs), other=str(other), n=len(lines), **models)


def _records(path):
    with open(path) as f:
        lines = f.read().splitlines()
    assert "header" in json.loads(lines[0])["speculative_t5"]
    return [json.loads(line) for line in lines[1:]]


def _decode(setup, out, *extra, target="a"):
    return cli.main(["decode", "--target", setup[target], "--input_file", setup["inputs"],
                     "--output", str(out), "--max_decode_len", "6", "--batch_size", "2", *extra])


# 1. decode resume mixes runs -----------------------------------------------------------
@pytest.mark.parametrize("change, field", [
    (["--input_file_other"], "input_file"),
    (["--target_b"], "target"),
    (["--temperature", "1.0"], "temperature"),
    (["--draft", "DRAFT", "--gamma", "2"], "draft"),
    (["--prefix", "summarize: "], "prefix"),
])
def test_decode_resumes_only_the_same_run(setup, tmp_path, change, field):
    out = tmp_path / "o.jsonl"
    assert _decode(setup, out) == 0
    before = out.read_bytes()
    args = ["decode", "--target", setup["b" if "--target_b" in change else "a"],
            "--input_file", setup["other" if "--input_file_other" in change else "inputs"],
            "--output", str(out), "--max_decode_len", "6", "--batch_size", "2",
            *[setup["draft"] if a == "DRAFT" else a for a in change
              if a not in ("--target_b", "--input_file_other")]]
    with pytest.raises(SystemExit, match=rf"holds another run.*{field}"):
        cli.main(args)
    assert out.read_bytes() == before  # touched nothing
    # the same run resumes (nothing to do) and a changed batch size is the same run
    assert _decode(setup, out, "--batch_size", "3") == 0
    assert out.read_bytes() == before


def test_decode_fingerprints_the_model_not_just_its_path(setup, tmp_path):
    model = tmp_path / "m"
    shutil.copytree(setup["a"], model)
    out = tmp_path / "o.jsonl"
    assert cli.main(["decode", "--target", str(model), "--input_file", setup["inputs"],
                     "--output", str(out), "--max_decode_len", "4"]) == 0
    shutil.rmtree(model)
    shutil.copytree(setup["b"], model)  # another model at the same path
    with pytest.raises(SystemExit, match="holds another run.*target.fingerprint"):
        cli.main(["decode", "--target", str(model), "--input_file", setup["inputs"],
                  "--output", str(out), "--max_decode_len", "4"])


# 2. decode --output onto a file that is not ours -----------------------------------------
def test_decode_never_modifies_a_file_that_is_not_its_output(setup, tmp_path):
    plain = tmp_path / "f.txt"
    plain.write_text("only line\n")
    with pytest.raises(SystemExit, match="is the input file"):
        cli.main(["decode", "--target", setup["a"], "--input_file", str(plain),
                  "--output", str(plain)])
    assert plain.read_text() == "only line\n"
    for content in ["only line\n", "only line", '{"index": 0}\n', '{"a": 1}\n{"b": 2}\n']:
        notes = tmp_path / "notes.jsonl"
        notes.write_text(content)
        with pytest.raises(SystemExit, match="not a speculative-t5 output.*left untouched"):
            _decode(setup, notes)
        assert notes.read_text() == content
    with pytest.raises(SystemExit, match="is a directory"):
        _decode(setup, tmp_path)


def test_decode_errors_are_one_line_before_loading(setup, tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"fine line\ncaf\xe9 au lait\n")
    with pytest.raises(SystemExit, match=r"latin1.txt:2: not UTF-8"):
        cli.main(["decode", "--target", setup["a"], "--input_file", str(bad),
                  "--output", str(tmp_path / "o.jsonl")])
    for flag, value, name in (("--batch_size", "0", "batch_size"), ("--top_p", "0", "top_p"),
                              ("--lenience", "2", "lenience"), ("--seed", "-1", "seed")):
        with pytest.raises(SystemExit, match=name):
            _decode(setup, tmp_path / "o.jsonl", flag, value)
    assert not (tmp_path / "o.jsonl").exists()  # validated before anything was written
    with pytest.raises(SystemExit, match="error: .*missing.jsonl|No such file"):
        cli.main(["decode", "--target", setup["a"], "--input_file", str(tmp_path / "missing.jsonl"),
                  "--output", str(tmp_path / "o.jsonl")])


# 3. convert --overwrite onto a sharded Hugging Face directory ------------------------------
def test_convert_overwrite_replaces_a_sharded_directory_whole(setup, tmp_path):
    transformers = pytest.importorskip("transformers")
    old = transformers.T5ForConditionalGeneration.from_pretrained(setup["b"])
    dest = tmp_path / "dest"
    old.save_pretrained(str(dest), max_shard_size="20KB")
    assert any("index" in f for f in os.listdir(dest))
    assert cli.main(["convert", "--from", setup["a"], "--to", str(dest), "--format", "hf",
                     "--overwrite"]) == 0
    assert not any("index" in f or "-of-" in f for f in os.listdir(dest))
    new, ref = st.load_checkpoint(str(dest)), st.load_checkpoint(setup["a"])
    for k, v in flat_params(ref).items():
        np.testing.assert_array_equal(flat_params(new)[k], v, err_msg=k)
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []  # no temp dir left


def test_convert_failing_midway_leaves_the_destination_as_it_was(setup, tmp_path, monkeypatch):
    dest = tmp_path / "dest"
    assert cli.main(["convert", "--from", setup["b"], "--to", str(dest), "--format", "hf"]) == 0
    before = {f: (dest / f).read_bytes() for f in os.listdir(dest)}
    import speculative_t5.checkpoints as ckpt

    def broken(model, path):
        os.makedirs(path)
        (open(os.path.join(path, "config.json"), "w")).write("{half")
        raise OSError("disk full")
    monkeypatch.setattr(ckpt, "export_hf", broken)
    with pytest.raises(SystemExit, match="disk full"):
        cli.main(["convert", "--from", setup["a"], "--to", str(dest), "--format", "hf",
                  "--overwrite"])
    assert {f: (dest / f).read_bytes() for f in os.listdir(dest)} == before
    assert [f for f in os.listdir(tmp_path) if f.startswith(".")] == []


def test_convert_refuses_files_and_overlaps(setup, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(SystemExit, match="is a file"):
        cli.main(["convert", "--from", setup["a"], "--to", str(f), "--overwrite"])
    for dest in (setup["a"], os.path.join(setup["a"], "inner")):
        with pytest.raises(SystemExit, match="overlap"):
            cli.main(["convert", "--from", setup["a"], "--to", dest, "--format", "hf",
                      "--overwrite"])
    assert st.load_checkpoint(setup["a"]) is not None


# 4. Ctrl-C / SIGTERM stop a compiled decode; absurd lengths are refused up front ----------
@pytest.fixture(scope="module")
def endless(setup):
    """A model that never emits EOS at T = 0 (its output layer's EOS column a copy of the pad
    token's: they tie, and argmax takes the lower id), so a decode runs max_decode_len steps."""
    model = st.init_model(tiny_config(num_encoder_layers=1, num_decoder_layers=1), seed=2)
    params = jax.tree_util.tree_map(np.array, model.params)
    kernel = params["decoder"]["logits_dense"]["kernel"]
    kernel[:, model.config.eos_id] = kernel[:, model.config.pad_id]
    path = str(setup["dir"] / "endless")
    st.export_hf(st.Model(model.config, params), path)
    shutil.copy(setup["spm"], os.path.join(path, "spiece.model"))
    return path


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
def test_a_signal_stops_a_long_compiled_decode_within_seconds(setup, endless, tmp_path, sig):
    out = tmp_path / "o.jsonl"
    env = dict(os.environ)  # with the run's compile cache (conftest)
    proc = subprocess.Popen(
        [sys.executable, "-m", "speculative_t5.commands", "decode", "--target", endless,
         "--input_file", setup["inputs"], "--output", str(out), "--batch_size", "1",
         "--max_decode_len", "3000000"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(6)  # load, compile, and well into the first (minutes-long) decode
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(sig)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=60)
        assert time.monotonic() - t0 < 15
    finally:  # never leave a decode running if the test fails
        proc.kill()
    assert proc.returncode == 130, err
    assert re.search(r"interrupted: 0 of 5 records saved in .*o.jsonl; run the same command "
                     "to resume", err), err
    assert "Traceback" not in err
    assert _records(out) == []  # the header survives; a rerun resumes it


def test_absurd_lengths_are_refused_before_allocating(setup, tmp_path):
    with pytest.raises(SystemExit, match=r"needs about [\d,]+ bytes") as e:
        _decode(setup, tmp_path / "o.jsonl", "--max_decode_len", str(10 ** 11))
    assert "\n" not in str(e.value)  # one line (gin's "In call to configurable" dropped)
    model = st.load_checkpoint(setup["a"])
    with pytest.raises(ValueError, match=r"needs about [\d,]+ bytes.*input length 1000000"):
        st.generate(model, np.ones((64, 10 ** 6), np.int32), max_decode_len=4)


# 5. hostile checkpoint metadata -> CheckpointError, in seconds ------------------------------
@pytest.mark.parametrize("field, value, match", [
    ("num_layers", 3000, "num_encoder_layers is 3000, more than the sane limit"),
    ("num_layers", 100000, "more than the sane limit"),
    ("vocab_size", 10 ** 12, "vocab_size is 1000000000000"),
    ("eos_token_id", [1, 2], "eos_token_id' must be one int"),
    ("eos_token_id", 10 ** 6, "eos_id must be an int in"),
    ("feed_forward_proj", None, "feed_forward_proj None is not supported"),
    ("d_model", "512", "d_model' must be one int"),
    ("num_heads", True, "num_heads' must be one int"),
    ("layer_norm_epsilon", "tiny", "layer_norm_epsilon"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings"),
])
def test_hostile_config_json(setup, tmp_path, field, value, match):
    path = tmp_path / "m"
    shutil.copytree(setup["a"], path)
    cfg = json.loads((path / "config.json").read_text())
    if field == "tie_word_embeddings":
        cfg.pop("scale_decoder_outputs", None)
    cfg[field] = value
    (path / "config.json").write_text(json.dumps(cfg))
    t0 = time.monotonic()
    with pytest.raises(st.CheckpointError, match=match) as e:
        st.load_checkpoint(str(path))
    assert "config.json" in str(e.value) and time.monotonic() - t0 < 10


def _declare_shape(ckpt, tensor, shape):
    """Make a legacy T5X checkpoint declare `shape` for a zarr tensor, in its .zarray and in
    the msgpack spec alike (as a hostile writer would), without writing any data."""
    from flax import serialization
    name = "target." + tensor.replace("/", ".")
    zarray = os.path.join(ckpt, name, ".zarray")
    meta = json.load(open(zarray))
    meta["shape"] = list(shape)
    json.dump(meta, open(zarray, "w"))
    path = os.path.join(ckpt, "checkpoint")
    contents = serialization.msgpack_restore(open(path, "rb").read())
    node = contents["optimizer"]["target"]
    for part in tensor.split("/"):
        node = node[part]
    node["metadata"]["shape"] = list(shape)
    open(path, "wb").write(serialization.msgpack_serialize(contents))


def test_hostile_zarr_shape_and_index_paths(setup, tmp_path):
    model = st.init_model(tiny_config(), seed=3)
    big = (10 ** 6, 10 ** 6)  # 4 TB of float32 if anything tried to allocate it
    ckpt = write_t5x_legacy(model, str(tmp_path / "checkpoint_1"), zarr_min_size=64)
    _declare_shape(ckpt, "decoder/layers_0/encoder_decoder_attention/query/kernel", big)
    t0 = time.monotonic()
    with pytest.raises(st.CheckpointError, match=r"has shape \(1000000, 1000000\), expected"):
        st.load_checkpoint(ckpt)
    assert time.monotonic() - t0 < 10
    # the embedding declaring an impossible architecture
    ckpt2 = write_t5x_legacy(model, str(tmp_path / "checkpoint_2"), zarr_min_size=64)
    _declare_shape(ckpt2, "token_embedder/embedding", big)
    with pytest.raises(st.CheckpointError, match="impossible T5.*emb_dim is 1000000"):
        st.load_checkpoint(ckpt2)
    # a .zarray that disagrees with its spec
    ckpt3 = write_t5x_legacy(model, str(tmp_path / "checkpoint_3"), zarr_min_size=64)
    zarray = os.path.join(ckpt3, "target.token_embedder.embedding", ".zarray")
    meta = json.load(open(zarray))
    meta["shape"] = list(big)
    json.dump(meta, open(zarray, "w"))
    with pytest.raises(st.CheckpointError, match="cannot read tensor token_embedder/embedding"):
        st.load_checkpoint(ckpt3)
    # a Hugging Face index naming a file outside the checkpoint
    hf = tmp_path / "hf"
    shutil.copytree(setup["a"], hf)
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"shared.weight": "../../etc/passwd"}}))
    with pytest.raises(st.CheckpointError, match="outside the checkpoint directory"):
        st.load_checkpoint(str(hf))


# 6. reproducible sampling: a kill mid-batch at T > 0 --------------------------------------
def test_kill_mid_batch_at_t1_resumes_to_the_uninterrupted_output(setup, tmp_path):
    """Sampling is keyed by example index: killed after the first record of a batch of 2 and
    resumed (so the rest is batched [1, 2], [3, 4] instead of [0, 1], [2, 3], [4]), the
    run writes exactly the uninterrupted run's samples. (Speculative decoding keys rows the
    same way: tests/test_generate.py.)"""
    whole = tmp_path / "whole.jsonl"
    assert _decode(setup, whole, "--temperature", "1.0") == 0
    full = _records(whole)
    cut = tmp_path / "cut.jsonl"
    with open(whole) as f:
        lines = f.read().splitlines(keepends=True)
    cut.write_text("".join(lines[:2]) + lines[2][:20])  # header, record 0, a torn record 1
    assert _decode(setup, cut, "--temperature", "1.0") == 0
    again = _records(cut)
    assert [r["index"] for r in again] == list(range(setup["n"]))
    assert {r["index"]: r["tokens"] for r in again} == {r["index"]: r["tokens"] for r in full}
    assert len({tuple(r["tokens"]) for r in full}) > 1


def test_orbax_checkpoints_are_checked_from_metadata_before_restoring(tmp_path, monkeypatch):
    """Native and T5X orbax checkpoints: declared shapes are compared with the config before
    orbax restores (allocates) anything."""
    import orbax.checkpoint as ocp
    from t5x_format import write_t5x_orbax
    model = st.init_model(tiny_config(), seed=3)
    native = str(tmp_path / "native")
    st.save_checkpoint(model, native)
    meta = json.load(open(os.path.join(native, "speculative_t5.json")))
    meta["config"]["mlp_dim"] = 10 ** 5  # the config now disagrees with the stored tensors
    json.dump(meta, open(os.path.join(native, "speculative_t5.json"), "w"))
    bad = st.Model(model.config, jax.tree_util.tree_map(np.array, model.params))
    bad.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"] = np.zeros((32, 7), np.float32)
    t5x = write_t5x_orbax(bad, str(tmp_path / "t5x"))

    def no_restore(*args, **kwargs):
        raise AssertionError("restore was called before the shapes were checked")
    monkeypatch.setattr(ocp.PyTreeCheckpointer, "restore", no_restore)
    monkeypatch.setattr(ocp.StandardCheckpointer, "restore", no_restore)
    with pytest.raises(st.CheckpointError, match=r"mlp/wi_0/kernel has shape \(32, 40\), expected \(32, 100000\)"):
        st.load_checkpoint(native)
    with pytest.raises(st.CheckpointError, match=r"decoder/layers_0/mlp/wi_0/kernel has shape \(32, 7\), expected"):
        st.load_checkpoint(t5x)
