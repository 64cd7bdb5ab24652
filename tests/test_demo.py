"""The shipped pair and `speculative-t5 demo --num_examples 4`, end to end."""
import json
import os

import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5 import commands as cli
from speculative_t5.checkpoints.demo import DEMO_DIR

KEYS = ("alpha", "c", "v", "gamma", "tokens_per_target_call", "speedup_measured",
        "speedup_predicted", "speedup_predicted_paper", "speedup_predicted_full",
        "measured_over_full")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_shipped_pair_loads_and_is_small():
    target, draft, vocab = st.load_demo()
    assert target.config.vocab_size == draft.config.vocab_size
    assert draft.num_params() * 5 < target.num_params()
    for m in (target, draft):  # gated GELU, output layer tied to the embedding (configs/demo_*.gin)
        assert m.config.logits_via_embedding and m.config.is_gated
    def size(*names):
        return sum(os.path.getsize(os.path.join(d, f)) for n in names
                   for d, _, fs in os.walk(os.path.join(DEMO_DIR, n)) for f in fs)
    assert 0 < size("target", "draft") <= 40e6            # the T5 pair's budget (issue #14)
    assert 0 < size("gpt2_target", "gpt2_draft") <= 25e6  # the GPT-2 pair's (issue #13)
    assert set(os.listdir(DEMO_DIR)) == {"target", "draft", "gpt2_target", "gpt2_draft"}
    assert st.data.Vocabulary(vocab).size <= target.config.vocab_size


def test_shipped_target_matches_transformers():
    import torch
    from transformers import T5ForConditionalGeneration
    from helpers import hf_logits
    target, _, _ = st.load_demo()
    ref = T5ForConditionalGeneration.from_pretrained(os.path.join(DEMO_DIR, "target"),
                                                     dtype=torch.float32).eval()
    rng = np.random.RandomState(0)
    x = rng.randint(2, 500, (2, 20)).astype(np.int32)
    y = rng.randint(2, 500, (2, 9)).astype(np.int32)
    y[:, 0] = 0
    np.testing.assert_allclose(np.asarray(st.forward(target, x, y)), hf_logits(ref, x, y),
                               atol=1e-3, rtol=1e-4)


@pytest.mark.slow
def test_demo_command_end_to_end(tmp_path):
    out = str(tmp_path / "demo")
    # two gammas and 2 timing rounds keep it short; the default sweep is the same code
    assert cli.main(["demo", "--num_examples", "4", "--output_dir", out,
                     "--gin.demo.gammas=[2, 4]", "--gin.demo.timing_rounds=2"]) == 0
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    for key in KEYS + ("greedy_identical_fraction",):
        assert key in s, key
    for key in KEYS:
        assert key in s["temperature_1"], key
    assert s["greedy_identical_fraction"] == 1.0
    assert 0.0 <= s["alpha"] <= 1.0 and 0.0 < s["c"] < 1.0 and s["v"] > 0.5
    assert 1.0 <= s["tokens_per_target_call"] <= s["gamma"] + 1
    assert s["num_examples"] == 4 and len(s["gamma_sweep"]) == 2
    assert 1 <= s["sweep_examples"] <= 4 and s["sweep_input_width"] in (32, 64, 128)
    assert s["best_gamma_predicted"] in [r["gamma"] for r in s["gamma_sweep"]]
    report = open(os.path.join(out, "report.md")).read()
    for setting in (s, s["temperature_1"]):  # each decodes with what its own sweep chose
        assert [r["gamma"] for r in setting["gamma_sweep"]] == [2, 4]
        a = setting["adaptive_sweep"]
        assert a["max_gamma"] == 4 and a["speedup_measured"] > 0
        fixed = max(r["speedup_measured"] for r in setting["gamma_sweep"])
        if setting["adaptive_gamma"]:
            assert a["speedup_measured"] >= fixed and setting["gamma"] == 4
            assert setting["speedup_predicted_full"] is None
        else:
            assert setting["gamma"] == setting["best_gamma_predicted_full"]
        assert setting["gamma_choice"] in report
    import matplotlib.image as mpimg
    for name in ("tokens_per_call.png", "speedup_vs_gamma.png"):
        img = mpimg.imread(os.path.join(out, name))
        assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0
    assert "speedup" in report and "tokens_per_call.png" in report and "cost model" in report
    # the measurements are the drivers' run directories
    for run in ("walltime/docstrings_t0", "walltime/docstrings_t1", "gamma_sweep/docstrings_t0",
                "gamma_sweep/docstrings_t1", "beam/docstrings_beam4"):
        assert os.path.exists(os.path.join(out, run, "examples.jsonl")), run
    b = s["beam"]  # T5X's beam search against the speculative one: the same beams
    assert b["examples"] == 4 and b["identical_fraction"] == 1.0 and b["max_score_diff"] < 1e-4
    assert 1.0 <= b["beam_steps_per_target_call"] <= b["gamma"] + 1
    assert b["target_calls_spec"] < b["target_calls_plain"] and "beam search (4 beams" in report
    q = s["quality"]   # the greedy outputs' ROUGE, by the walltime driver's scoring too
    assert q["rouge1"] == pytest.approx(s["rouge1_plain"]) and 0.0 <= q["real_words"] <= 1.0
    assert "ROUGE-1 / 2 / Lsum" in report
    base = s["quality_name_baseline"]  # "Return the <function name>.": no model
    assert set(base) == set(q) and 0 < base["rouge1"] < 100 and "Return the <function name>" in report
    if s["speedup_predicted_full"] is not None:
        assert s["measured_over_full"] == pytest.approx(s["speedup_measured"] / s["speedup_predicted_full"])
    assert s["setup_ms"] and set(s["setup_ms"]) <= {"32", "64", "128"}


def test_demo_cells_are_the_configs_demo_cells():
    """The demo is the paper drivers over configs/demo/*.gin: with its defaults it writes
    exactly those cells; a changed gamma / temperature / pair is a changed cell."""
    from speculative_t5.paper.demo import BEAM_CELL, CELLS, DRAFT_CELLS, cell_text
    for name in {**CELLS, **DRAFT_CELLS, **BEAM_CELL}:
        with open(os.path.join(REPO, "configs", "demo", name + ".gin")) as f:
            assert cell_text(name) == f.read()
    changed = cell_text("docstrings_t1", gamma=3, temperature=0.7, target="/t", draft="/d", vocab="/v")
    assert "GAMMA = 3" in changed and "TEMPERATURE = 0.7" in changed
    assert "TARGET_CHECKPOINT = '/t'" in changed and "VOCABULARY = '/v'" in changed
    # --draft is the fallback's model; the lookup cell has none to replace
    assert cell_text("docstrings_fallback_t0", draft="/my/draft").endswith(
        "fallback_draft.then = '/my/draft'\n")
    assert "/my/draft" not in cell_text("docstrings_lookup_t0", draft="/my/draft")
    beam = cell_text("docstrings_beam4", gamma=5)  # its own gamma, at most 16 inputs
    assert "GAMMA = 2" in beam and "GAMMA = 5" not in beam and "NUM_EXAMPLES = 16" in beam
    assert "NUM_EXAMPLES = 4" in cell_text("docstrings_beam4", num_examples=4)


def test_bucket_widths():
    from speculative_t5.data import bucket
    assert [bucket([5] * n).shape for n in (3, 33, 64, 128)] == [(1, 32), (1, 64), (1, 64), (1, 128)]
    assert bucket([5, 6, 1])[0].tolist() == [5, 6, 1] + [0] * 29
