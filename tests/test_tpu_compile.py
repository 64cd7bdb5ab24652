"""`speculative-t5 compile`: tiny T5 and GPT-2 speculative decodes compiled for a 4-chip TPU
v4 with no TPU attached (libtpu's compiler, deviceless), the compiler's memory against
`plan`, the HBM bytes read off the HLO against the weights and caches a step must read,
and the command's one-line errors. Skipped, with the reason, only where libtpu cannot load.
The whole decodes compile in the slow tier (~30 s each on 2 cores)."""
import sys

import jax
import pytest

from helpers import tiny_config

import speculative_t5 as st
from speculative_t5 import commands as cli
from speculative_t5.measure import tpu_compile
from speculative_t5.measure.analysis import walltime_improvement


@pytest.fixture(scope="module")
def v4_8():
    try:
        return tpu_compile.tpu_devices("v4-8")
    except Exception as e:  # libtpu missing or unable to load here: say why
        pytest.skip(f"libtpu cannot load: {type(e).__name__}: {e}")


def _pair(family):
    if family == "t5":
        target = tiny_config(num_heads=4, vocab_size=64, mlp_dim=48)
        return target, target.replace(num_encoder_layers=1, num_decoder_layers=1)
    target = st.GPT2Config(vocab_size=64, n_positions=64, n_embd=32, n_layer=2, n_head=4,
                            eos_id=63, pad_id=63)
    return target, target.replace(n_layer=1)


def _report(family, whole, tree=None):
    target, draft = _pair(family)
    return tpu_compile.compile_report(target, draft, "v4-8", num_partitions=2, batch=2,
                                      input_length=8, max_decode_len=12, gamma=3, alpha=0.8,
                                      whole=whole, tree=tree)


def _check_parts(r):
    assert r["num_devices"] == 4 and r["mesh"] == {"data": 2, "model": 2}
    parts, ideal = r["parts"], r["ideal_step_bytes"]
    assert set(parts) >= {"setup", "target_step", "verify", "draft_step"}
    for name in ("target_step", "verify"):  # a step reads at least its weights and caches
        assert parts[name]["hbm_bytes"] >= ideal["target_step"]
    assert parts["draft_step"]["hbm_bytes"] >= ideal["draft_step"]
    for part in parts.values():  # XLA counts every memory space, the HLO count HBM only
        assert part["bytes_accessed"] >= part["hbm_bytes"] > 0
    assert all(part["flops"] > 0 for part in parts.values())
    assert r["c"] > 0 and r["v"] > 0.9  # tiny: c near 1 (a replicated draft), v near 1
    assert r["speedup_predicted"] == pytest.approx(
        walltime_improvement(0.8, 3, r["c"], r["v"]))


def test_tiny_t5_parts_compile_for_v4_8(v4_8):
    """The set-up, the target step, the verify pass, the draft step and a pass over a token
    tree's nodes, compiled alone."""
    r = _report("t5", whole=False, tree=(3, 2, 1))
    _check_parts(r)
    assert r["programs"] == {} and r["memory_per_device_bytes"] is None
    tree = r["parts"]["tree_verify"]
    assert r["tree"] == [3, 2, 1] and r["tree_nodes"] == 15
    # 16 positions in one pass: more flops than the 4-position verify, at least its weights
    assert tree["flops"] > r["parts"]["verify"]["flops"]
    assert tree["hbm_bytes"] >= r["ideal_step_bytes"]["target_step"]
    assert r["tree_verify_over_step"] == pytest.approx(
        tree["roofline_ms"] / r["parts"]["target_step"]["roofline_ms"])
    assert "a token tree (3, 2, 1) (15 nodes)" in tpu_compile.format_report(r)
    # parameters in the layouts the compiler asks for in a verify-sized step (as a decode on
    # the TPU places them): the decoder's projections; the encoder's stay row-major
    relaid = r["relaid_parameters"]
    assert r["parameter_layouts"] == "compiler"
    assert "decoder/layers_0/self_attention/query/kernel" in relaid["target"]
    assert all(path.startswith("decoder/") for paths in relaid.values() for path in paths)
    assert r["layout_batch"] == 1  # batch 2 over 'data' 2: one row per model copy
    assert (f"parameter layouts: the compiler's for batch 1 per model copy (target {len(relaid['target'])} relaid"
            in tpu_compile.format_report(r))


def test_a_decode_for_a_tpu_feeds_its_draft_two_tokens_a_round(v4_8):
    """No branch on the width of a model draft's first call there (XLA would copy the
    draft's cache into the branch every round): `ModelDraft.feed_two`."""
    from speculative_t5.engine import on_accelerator
    assert on_accelerator(st.Partitioner(num_partitions=2, devices=v4_8))


@pytest.mark.slow
@pytest.mark.parametrize("family", ["t5", "gpt2"])
def test_tiny_speculative_decode_compiles_for_v4_8(v4_8, family):
    """The whole plain and speculative decodes and their parts compile for v4-8 (4 chips)
    with num_partitions 2; the compiler's arguments are the parameters plan counts."""
    r = _report(family, whole=True)
    _check_parts(r)
    assert set(r["programs"]) == {"plain_decode", "speculative_decode"}
    m, planned = r["memory_per_device_bytes"], r["plan"]
    assert m == r["programs"]["speculative_decode"]["memory_per_device_bytes"]
    params = planned["target_params"] + planned["draft_params"]
    # tiny arrays are padded to the TPU's (8, 128) tiles: never fewer bytes than plan's
    assert params <= m["arguments"] < 8 * params
    assert m["total"] >= planned["total"]
    # a tiny model's weights stay in on-chip memory across the loop's iterations, so its
    # steps there read next to nothing from HBM: only that the loops were found is checked
    loop = r["in_loop"]
    assert loop["target_step_hbm_bytes"] > 0 and loop["round_hbm_bytes"] > 0
    # a round's iteration holds the draft's first (two-token) call: v leaves it to c
    assert loop["v"] == pytest.approx((loop["round_hbm_bytes"] - loop["draft_step_hbm_bytes"])
                                      / loop["target_step_hbm_bytes"])


# A loop body as the TPU compiler writes it (cut down): a cache [32, 128, 4, 64] bf16 (2 MiB)
# read by an attention fusion, then its new keys [32, 4, 64] scattered in; `in_hbm` leaves
# the scatter's output in HBM (in place: the loop carry's own buffer), otherwise the scatter
# runs in on-chip memory S(3) and a copy-start writes the whole cache back.
_BODY = """\
%scatter_computation (param_0: bf16[32,128,4,64], param_1: s32[32], param_2: bf16[32,4,64]) -> bf16[32,128,4,64] {
  %param_0 = bf16[32,128,4,64]{3,2,1,0} parameter(0)
  %param_1 = s32[32]{0} parameter(1)
  %param_2 = bf16[32,4,64]{2,1,0} parameter(2)
  %reshape.1 = bf16[32,1,4,64]{3,2,1,0} reshape(%param_2)
  ROOT %scatter.1 = bf16[32,128,4,64]{3,2,1,0} scatter(%param_0, %param_1, %reshape.1), to_apply=%region
}

%attention_computation (param_0: bf16[32,128,4,64], param_1: bf16[32,4,64]) -> f32[32,4,128] {
  %param_0 = bf16[32,128,4,64]{3,2,1,0} parameter(0)
  %param_1 = bf16[32,4,64]{2,1,0} parameter(1)
  ROOT %dot.1 = f32[32,4,128]{2,1,0} dot(%param_1, %param_0)
}

%body (p: (bf16[32,128,4,64], s32[32], bf16[32,4,64])) -> (bf16[32,128,4,64], s32[32], bf16[32,4,64]) {
  %p = (bf16[32,128,4,64]{3,2,1,0}, s32[32]{0}, bf16[32,4,64]{2,1,0}) parameter(0)
  %cache = bf16[32,128,4,64]{3,2,1,0} get-tuple-element(%p), index=0
  %pos = s32[32]{0} get-tuple-element(%p), index=1
  %new = bf16[32,4,64]{2,1,0} get-tuple-element(%p), index=2
  %scores = f32[32,4,128]{2,1,0} fusion(%cache, %new), kind=kOutput, calls=%attention_computation
  SCATTER
  ROOT %tuple = (bf16[32,128,4,64]{3,2,1,0}, s32[32]{0}, bf16[32,4,64]{2,1,0}) tuple(%written, %pos, %new)
}

ENTRY %main (a: (bf16[32,128,4,64], s32[32], bf16[32,4,64])) -> (bf16[32,128,4,64], s32[32], bf16[32,4,64]) {
  %a = (bf16[32,128,4,64]{3,2,1,0}, s32[32]{0}, bf16[32,4,64]{2,1,0}) parameter(0)
  ROOT %while = (bf16[32,128,4,64]{3,2,1,0}, s32[32]{0}, bf16[32,4,64]{2,1,0}) while(%a), condition=%cond, body=%body
}
"""
_IN_HBM = ("%written = bf16[32,128,4,64]{3,2,1,0} fusion(%cache, %pos, %new), kind=kCustom, "
           "calls=%scatter_computation")
_ON_CHIP = ("%staged = bf16[32,128,4,64]{3,2,1,0:S(3)} fusion(%cache, %pos, %new), kind=kCustom, "
            "calls=%scatter_computation\n  %copy-start.1 = (bf16[32,128,4,64]{3,2,1,0}, "
            "bf16[32,128,4,64]{3,2,1,0:S(3)}, u32[]{:S(2)}) copy-start(%staged)\n  %written = "
            "bf16[32,128,4,64]{3,2,1,0} copy-done(%copy-start.1)")


def test_hbm_bytes_count_a_scatter_into_a_cache_in_hbm_as_its_update():
    """Read off the HLO text (no compiler needed): the attention reads the cache once (2 MiB)
    and the new keys; a scatter in place in HBM writes the update (16 KiB) and reads the new
    keys and slots; staged in on-chip memory it reads the whole cache and a copy writes it
    all back, which `copies_per_iteration` shows."""
    from speculative_t5.measure import hlo
    cache, new, pos, scores = 32 * 128 * 4 * 64 * 2, 32 * 4 * 64 * 2, 32 * 4, 32 * 4 * 128 * 4
    attention = cache + new + scores
    in_place = hlo.loop_bytes(_BODY.replace("SCATTER", _IN_HBM))
    assert in_place["per_iteration"] == attention + (pos + new + new)
    assert in_place["copies_per_iteration"] == 0
    staged = hlo.loop_bytes(_BODY.replace("SCATTER", _ON_CHIP))
    assert staged["per_iteration"] == attention + (cache + pos + new) + cache
    assert staged["copies_per_iteration"] == cache


def test_cli_topologies_are_the_modules():
    """`--topology`'s choices are the slices tpu_compile knows (the parser does not import it)."""
    action = next(a for a in cli._parser()._subparsers._group_actions[0].choices["compile"]._actions
                  if a.dest == "topology")
    assert set(action.choices) == set(tpu_compile.TOPOLOGIES)


def test_cli_errors_are_one_line(v4_8):
    with pytest.raises(SystemExit, match="num_partitions 3 does not divide"):
        cli.main(["compile", "--target", "t5_1_1_small", "--topology", "v4-8",
                  "--num_partitions", "3"])
    with pytest.raises(SystemExit, match="--tree needs --draft"):
        cli.main(["compile", "--target", "t5_1_1_small", "--tree", "2,1"])
    with pytest.raises(SystemExit, match="--tree must be children per depth"):
        cli.main(["compile", "--target", "t5_1_1_small", "--draft", "t5_1_1_small",
                  "--tree", "2,a"])
    with pytest.raises(SystemExit, match=r"does not fit a TPU v4 .*target parameters"):
        cli.main(["compile", "--target", "t5_1_1_xxl", "--topology", "v4-2",
                  "--dtype", "float32"])


def test_without_libtpu_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "libtpu", None)  # import libtpu -> ImportError
    with pytest.raises(SystemExit) as e:
        cli.main(["compile", "--target", "t5_1_1_small"])
    assert str(e.value) == ("error: compiling for a TPU needs libtpu, the TPU compiler: "
                            f'pip install "jax[tpu]=={jax.__version__}" (or speculative_t5[tpu])')
