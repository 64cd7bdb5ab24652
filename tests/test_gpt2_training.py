"""The GPT-2 code corpus (deterministic, held-out modules never trained on), train_lm
(loss falls, a resumed run equals one that never stopped) and distill_lm (KL falls), on a
slice of the standard library and a tiny GPT-2."""
import json
import os

import gin
import jax
import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5 import commands as cli
from speculative_t5 import training
from speculative_t5.data import code_corpus
from speculative_t5.data.bpe import END_OF_TEXT
from speculative_t5.model.gpt2 import gin_gpt2_config
from speculative_t5.training import lm

TINY = st.GPT2Config(vocab_size=320, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                     eos_id=0, pad_id=0)
KW = dict(batch_size=8, window=16, vocab_size=320, max_files=30, max_windows=64,
          learning_rate=1e-2, warmup_steps=2, checkpoint_every=8, quiet=True)


def test_corpus_is_deterministic_and_heldout_modules_are_never_trained_on(tmp_path):
    files = code_corpus.source_files()
    assert files == code_corpus.source_files() and len(files) > 300
    assert len({s for _, s in files}) == len(files)                      # deduplicated
    skipped = ("test.", "idlelib", "tkinter", "lib2to3", "site-packages")
    assert not [m for m, _ in files if m.startswith(skipped)]
    split = {m: code_corpus.split_of_module(m) for m, _ in files}
    heldout = {m for m, s in split.items() if s == "heldout"}
    assert 10 < len(heldout) < len(files) / 5
    counts = code_corpus.write_code_corpus(str(tmp_path))
    train = code_corpus.read_sources(str(tmp_path), "train")
    held = code_corpus.read_sources(str(tmp_path), "heldout")
    assert (len(train), len(held)) == (counts["train"], counts["heldout"])
    assert held == [s for m, s in files if m in heldout] and not set(held) & set(train)
    prompts = code_corpus.read_prompts(str(tmp_path))
    assert len(prompts) == counts["prompts"] >= 32
    assert code_corpus.heldout_prompts() == prompts                        # the demo's examples
    sources = dict(files)
    for p in prompts:
        assert p["module"] in heldout
        source = sources[p["module"]]
        cut = p["offset"]
        assert source[cut - len(p["prompt"]):cut + len(p["reference"])] == p["prompt"] + p["reference"]
        assert p["prompt"].endswith("\n") and source[cut - len(p["prompt"]) - 1] == "\n"
        assert 400 <= len(p["prompt"]) <= 700 and END_OF_TEXT not in p["prompt"]


def test_completion_prompts_cut_at_function_bodies():
    source = "import os\n" * 70 + 'def f(x):\n    """Doc."""\n    y = x + 1\n    return y\n' + "z = 1\n" * 30
    [p] = code_corpus.completion_prompts(source, "m", context_chars=600, reference_chars=40)
    assert p["prompt"].endswith('"""Doc."""\n') and p["reference"].startswith("    y = x + 1\n")


def test_token_windows():
    w = lm.token_windows(np.arange(10), 3)
    assert w.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]
    with pytest.raises(ValueError, match="shorter than one window"):
        lm.token_windows(np.arange(3), 3)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("code"))
    lm.prepare_code_data(d, vocab_size=320, max_files=30)
    return d


def _leaves(model):
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(model.params)]


@pytest.fixture(scope="module")
def fresh_run(data_dir, tmp_path_factory):
    """A 16-step train_lm run that never stopped: (its directory, the model)."""
    run = str(tmp_path_factory.mktemp("fresh"))
    return run, training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=16, **KW)


@pytest.mark.slow
def test_train_lm_lowers_loss_and_resumes(data_dir, fresh_run, tmp_path):
    run = str(tmp_path / "run")
    training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=16,
                      max_steps_per_run=8, **KW)                          # "killed" at step 8
    assert os.listdir(os.path.join(run, "checkpoints")) == ["8"]
    assert not os.path.exists(os.path.join(run, "hf"))
    with pytest.raises(ValueError, match="stopped at step 8 of 16"):
        lm.load_teacher(run)
    resumed = training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=16, **KW)
    for a, b in zip(_leaves(resumed), _leaves(fresh_run[1])):  # as if it had never stopped
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    logs = [json.loads(line) for line in open(os.path.join(run, "train_log.json"))]
    assert logs[-1]["final_loss"] < logs[0]["final_loss"]
    for a, b in zip(_leaves(lm.load_teacher(run)), _leaves(resumed)):
        np.testing.assert_array_equal(a, b)
    hf = os.path.join(run, "hf")
    assert {"config.json", "model.safetensors", "vocab.json", "merges.txt"} <= set(os.listdir(hf))
    assert st.load_checkpoint(hf).config.replace(param_dtype="float32") == TINY


def test_distill_lm_runs_from_the_target_run(data_dir, fresh_run, tmp_path):
    draft = TINY.replace(n_embd=16, n_head=1)
    kw = dict(KW, learning_rate=3e-2)
    training.distill_lm(model_dir=str(tmp_path / "draft"), teacher=fresh_run[0],
                        data_dir=data_dir, config=draft, steps=8, **kw)
    logs = [json.loads(line) for line in open(os.path.join(tmp_path, "draft", "train_log.json"))]
    assert logs[-1]["desc"] == "distill_lm" and 0 < logs[-1]["final_loss"] < 5
    assert st.load_checkpoint(os.path.join(tmp_path, "draft", "hf")).config.n_embd == 16
    assert os.path.exists(os.path.join(tmp_path, "draft", "hf", "vocab.json"))
    with pytest.raises(ValueError, match="vocab_size"):
        training.distill_lm(model_dir=str(tmp_path / "bad"), teacher=fresh_run[0],
                            data_dir=data_dir, config=draft.replace(vocab_size=400), steps=1, **kw)


def test_recipes_bind_a_matching_pair():
    cli.parse_gin(["models/gpt2/base.gin"], [], [])
    try:
        assert gin_gpt2_config() == st.GPT2Config.preset("gpt2")
    finally:
        gin.clear_config()
    root = os.path.join(os.path.dirname(os.path.dirname(__file__)), "configs")
    configs = []
    for name in ("gpt2_demo_target.gin", "gpt2_demo_draft.gin"):
        cli.parse_gin([os.path.join(root, name)], [], [])
        try:
            configs.append(gin_gpt2_config())
        finally:
            gin.clear_config()
    target, draft = configs
    assert target.vocab_size == draft.vocab_size and target.eos_id == draft.eos_id == 0
    assert target.n_layer * target.n_embd > draft.n_layer * draft.n_embd
    assert "train_lm" in cli.COMMANDS and "distill_lm" in cli.COMMANDS


def test_alpha_along_gpt2_continuations():
    """measure_alpha for GPT-2 (what the demo pair reports) equals the argmax agreement
    computed row by row on each unpadded prompt + continuation, up to and including the
    first end token; a model against itself is 1."""
    from speculative_t5.decoding.sampling import SamplingConfig
    from speculative_t5.measure.alpha import measure_alpha
    from speculative_t5.model import gpt2
    cfg = st.GPT2Config(vocab_size=61, n_positions=64, n_embd=32, n_layer=2, n_head=2,
                        eos_id=60, pad_id=60)
    target = st.init_model(cfg, seed=0)
    draft = st.init_model(cfg.replace(n_layer=1), seed=1)
    rng = np.random.RandomState(0)
    lengths = np.array([5, 2, 7])
    prompts = rng.randint(0, 60, (3, 7)).astype(np.int32)
    out = rng.randint(0, 60, (3, 6)).astype(np.int32)
    out[1, 3:] = cfg.eos_id                                   # row 1 ends at its 4th token
    agree = []
    forward = jax.jit(gpt2.forward, static_argnums=0)
    for b, n in enumerate(lengths):  # each row unpadded (pads only after it: causal)
        seq = np.full((1, 7 + 6 - 1), cfg.pad_id, np.int32)
        seq[0, :n + 5] = np.concatenate([prompts[b, :n], out[b]])[:-1]
        t, d = (np.asarray(forward(m.config, m.params, seq))[0, n - 1:n + 5].argmax(-1)
                for m in (target, draft))
        agree.extend((t == d)[:4 if b == 1 else 6])
    a, _, positions = measure_alpha(target, draft, prompts, out, SamplingConfig(0.0),
                                    prompt_lengths=lengths)
    assert positions == len(agree) == 16 and a == pytest.approx(np.mean(agree))
    assert measure_alpha(target, target, prompts, out, SamplingConfig(1.0),
                         prompt_lengths=lengths)[0] == pytest.approx(1.0, abs=1e-5)
