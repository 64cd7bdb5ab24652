"""Partitioned decoding (`st.Partitioner`, T5X's mesh and rules) and multi-process runs.

The mesh checks run in a subprocess with 8 host CPU devices (tests/mesh_checks.py): greedy
and sampled tokens on mesh 4x2 (1x8, 2x4 and 8x1 in the slow tier, with block verification
and a partitioned draft on 2x4) equal the unpartitioned decode's, the teacher-forced logits agree to 1e-5, every device holds its slice of each
parameter and cache, and the exactness chi-square passes through a partitioned mesh; a
GPT-2 target's decodes (every draft kind) equal its unpartitioned ones on meshes 1x8 and
4x2 (slow). The multi-process tests (slow tier) run `decode` as two processes on
localhost (JAX's distributed runtime, 4 CPU devices each), compare the output with a
one-process run and resume a torn output."""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import traverse_util

import speculative_t5 as st
from helpers import run_processes, tiny_config, train_sentencepiece

HERE = os.path.dirname(os.path.abspath(__file__))


def _mesh_checks(*parts):
    env = dict(os.environ)  # with the run's compile cache (conftest)
    proc = subprocess.run([sys.executable, os.path.join(HERE, "mesh_checks.py"), *parts],
                          capture_output=True, text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULTS ")][-1]
    return json.loads(line[len("RESULTS "):])


@pytest.fixture(scope="module")
def mesh_4x2():
    """One subprocess for the default tier's mesh checks: decodes on the 4x2 mesh, the
    errors and the exactness chi-square (the slow tier's meshes add block verification and
    a partitioned draft, on 2x4)."""
    return _mesh_checks("decodes:4x2", "errors", "exactness")


def _check_decodes(r, meshes):
    """Every decode on `meshes` equals the unpartitioned one; logits, parameter and cache
    shards as the mesh splits them."""
    assert r["devices"] == 8
    decodes = {k: v for k, v in r.items()
               if k.split()[0] in meshes and k.endswith(("greedy", "T=1", "top-p"))}
    # 4 runs a mesh; 2x4 adds block-verified top-k/top-p, a token tree at T = 1, and the
    # partitioned draft's greedy and T = 1
    assert len(decodes) == 4 * len(meshes) + 4 * ("2x4" in meshes), sorted(decodes)
    assert all(decodes.values()), [k for k, v in decodes.items() if not v]
    for mesh in meshes:
        parts = {"1x8": 8, "2x4": 4, "8x1": 1, "4x2": 2}[mesh]
        data = 8 // parts
        assert r[f"{mesh} logits max diff"] < 1e-5
        # decoder mlp wi_0 [emb 128, mlp 256] split over 'model'; a layer norm scale whole
        assert r[f"{mesh} shard shapes"] == [[128, 256 // parts], [128]]
        # self cache [B 8, L 16, H 8, D 16] and cross keys [B, H, D, S 12]
        assert r[f"{mesh} cache shards"] == [[8 // data, 16, 8 // parts, 16],
                                             [8 // data, 8 // parts, 16, 12]]


def test_partitioned_decodes_equal_unpartitioned_on_a_mesh(mesh_4x2):
    _check_decodes(mesh_4x2, ["4x2"])
    r = mesh_4x2
    assert "does not divide the 8 devices" in r["error not dividing devices"]
    assert "'heads' dimension (4)" in r["error heads"] and "(8 devices)" in r["error heads"]
    assert "disagree" in r["error submesh disagrees"] and r["submesh"] == 4


@pytest.mark.slow
def test_partitioned_decodes_equal_unpartitioned_on_every_other_mesh():
    _check_decodes(_mesh_checks("decodes:1x8,2x4,8x1"), ["1x8", "2x4", "8x1"])


@pytest.mark.slow
def test_partitioned_gpt2_decodes_equal_unpartitioned():
    """A GPT-2 target with prompts of lengths 1..9 (6 rows: padded to 8 on 4x2) through a
    model draft, prompt lookup and a block-verified fallback: tokens and stats identical to
    the unpartitioned decode, greedy and T = 1 with the same row keys."""
    r = _mesh_checks("gpt2")
    decodes = {k: v for k, v in r.items() if k.endswith(("greedy", "T=1"))}
    assert len(decodes) == 1 + 3 and all(decodes.values()), decodes
    assert r["gpt2 stops"] >= 1 and r["gpt2 T=1 sampled other tokens"]
    # layers' keys [B 8, L 9 + 4, H 8, D 4] and the offsets [B]
    assert r["gpt2 4x2 cache shards"] == [[2, 13, 4, 4], [2]]


def test_partitioned_sampling_is_exact(mesh_4x2):
    """Exact enumeration against 24,000 partitioned speculative samples at T = 1 with top-k 3
    (mesh 4x2; the top-k threshold over a vocabulary split by the mesh)."""
    r = mesh_4x2
    for name in ("top-k 3",):
        pvalue, cells = r[f"chi-square {name}"]
        assert cells >= 20 and pvalue > 1e-3, (name, pvalue)


def test_partitioner_options_are_checked():
    with pytest.raises(ValueError, match="num_partitions 2 does not divide the 1 devices"):
        st.Partitioner(num_partitions=2)
    with pytest.raises(ValueError, match="num_partitions must be an int >= 1"):
        st.Partitioner(num_partitions=0)
    with pytest.raises(ValueError, match="draft must be one of"):
        st.Partitioner(draft="sharded")
    with pytest.raises(ValueError, match="the mesh axes are 'data' and 'model'"):
        st.Partitioner(logical_axis_rules=[("batch", "replica")])
    with pytest.raises(ValueError, match="parameter_layouts must be one of"):
        st.Partitioner(parameter_layouts="auto")
    with pytest.raises(ValueError, match="layout_batch must be an int >= 1"):
        st.Partitioner(layout_batch=0)
    with pytest.raises(TypeError, match="partitioner must be a speculative_t5.Partitioner"):
        st.generate(st.init_model(tiny_config(), 0), [[3, 4]], partitioner=2)
    p = st.Partitioner()
    assert p == st.Partitioner() and hash(p) == hash(st.Partitioner())
    assert tuple(p.spec(("batch", "length", "heads", "kv"))) == ("data", None, "model", None)


def test_parameters_are_placed_in_the_layouts_the_compiler_asks_for(monkeypatch, tmp_path):
    """parameter_layouts='compiler' (the default): loading (orbax and safetensors) and
    `generate` place each parameter in the layout `layouts.compiler_layouts` returns -- on a
    TPU the compiler's answer; a CPU keeps row-major, so a stand-in asks for every 2-D
    kernel column-major here -- and the decode reads them so: the same tokens, sampled at
    T = 1 over padded rows, as row-major parameters; 'default' keeps row-major."""
    from jax.experimental.layout import Layout
    from speculative_t5 import layouts

    def column_major(config, partitioner, role):
        return jax.tree_util.tree_map(
            lambda s: Layout(major_to_minor=(1, 0)) if len(s.shape) == 2 else None,
            st.param_shapes(config))
    monkeypatch.setattr(layouts, "compiler_layouts", column_major)
    target = st.init_model(tiny_config(), seed=0)
    draft = st.init_model(tiny_config(num_decoder_layers=1), seed=1)
    st.save_checkpoint(target, str(tmp_path / "native"))
    st.export_hf(draft, str(tmp_path / "hf"))
    p = st.Partitioner()
    query = ("decoder", "layers_0", "self_attention", "query", "kernel")

    def layout(model):
        x = model.params
        for k in query:
            x = x[k]
        return tuple(x.format.layout.major_to_minor)
    loaded = st.load_checkpoint(str(tmp_path / "native"), partitioner=p)
    loaded_draft = st.load_checkpoint(str(tmp_path / "hf"), partitioner=p, role="draft")
    assert layout(loaded) == layout(loaded_draft) == (1, 0)
    assert layout(p.shard(target)) == (1, 0) and layout(target) == (0, 1)
    assert layouts.relaid(p.param_formats(target.config)) == [
        "/".join(k) for k, _ in sorted(traverse_util.flatten_dict(
            st.param_shapes(target.config)).items()) if len(_.shape) == 2]
    ids = np.array([[5, 6, 7, 8, 1], [9, 10, 1, 0, 0]], np.int32)
    kw = dict(gamma=3, max_decode_len=12, temperature=1.0, rng=jax.random.PRNGKey(3))
    want = st.generate(target, ids, draft=draft, **kw).tokens
    np.testing.assert_array_equal(st.generate(loaded, ids, draft=loaded_draft, partitioner=p,
                                              **kw).tokens, want)
    np.testing.assert_array_equal(st.generate(target, ids, draft=draft, partitioner=p,
                                              **kw).tokens, want)
    row_major = st.Partitioner(parameter_layouts="default")
    assert layout(row_major.shard(target)) == (0, 1) and row_major != p


# multi-process -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("multihost")
    spm = train_sentencepiece(str(d))
    cfg = tiny_config(vocab_size=64, num_heads=2, mlp_dim=40)
    target, draft = str(d / "target"), str(d / "draft")
    st.save_checkpoint(st.init_model(cfg, 0), target)
    st.save_checkpoint(st.init_model(cfg.replace(num_decoder_layers=1), 5), draft)
    words = "the a quick brown fox lazy dog sings over seven small birds data text".split()
    lines = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(2 + i % 9))
             for i in range(16)]
    inputs = d / "inputs.txt"
    inputs.write_text("\n".join(lines) + "\n")
    return dict(dir=d, spm=spm, target=target, draft=draft, inputs=str(inputs))


def _decode_args(pair, output):
    return ["decode", "--target", pair["target"], "--draft", pair["draft"], "--vocab",
            pair["spm"], "--input_file", pair["inputs"], "--output", str(output),
            "--batch_size", "8", "--gamma", "3", "--max_decode_len", "12",
            "--temperature", "1.0", "--gin.Partitioner.num_partitions=2"]


def _two_processes(pair, output):
    return run_processes(_decode_args(pair, output))


def _summary(stdout):
    """decode's JSON summary line (the collectives library logs to stdout too)."""
    lines = [x for x in stdout.splitlines() if x.startswith("{")]
    return json.loads(lines[-1]) if lines else None


def _records(path):
    with open(path) as f:
        header, *lines = f.read().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        r.pop("batch_seconds")
    return json.loads(header), records


@pytest.fixture(scope="module")
def one_process(pair):
    """The reference: the same decode unpartitioned, in this process (one device)."""
    from speculative_t5 import commands as cli
    one = pair["dir"] / "one.jsonl"
    assert cli.main(_decode_args(pair, one)[:-1]) == 0
    return _records(one)


@pytest.mark.slow
def test_two_processes_decode_like_one(pair, one_process):
    two = pair["dir"] / "two.jsonl"
    outs = _two_processes(pair, two)  # mesh 4 x 2 over 2 processes' 8 devices
    assert _summary(outs[0][0])["examples"] == 16
    assert _summary(outs[1][0]) is None  # only the coordinator reports
    header_one, records_one = one_process
    header_two, records_two = _records(two)
    assert header_one == header_two and records_one == records_two
    assert [r["index"] for r in records_two] == list(range(16))
    assert len({tuple(r["tokens"]) for r in records_one}) > 8  # sampled, rows differ


@pytest.mark.slow
def test_two_processes_resume_a_torn_output(pair, one_process):
    """Killed mid-write: a header, 10 records and a torn 11th; both processes resume it."""
    two = pair["dir"] / "resumed.jsonl"
    header, records = one_process
    lines = [json.dumps(header)] + [json.dumps({**r, "batch_seconds": 0.0}) for r in records]
    two.write_text("\n".join(lines[:11]) + "\n" + lines[11][:30])
    outs = _two_processes(pair, two)
    assert _summary(outs[0][0])["skipped"] == 10
    assert _records(two) == one_process
