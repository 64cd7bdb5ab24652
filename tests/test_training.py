"""Demo corpus, training (loss falls, resume continues) and distillation (alpha rises)."""
import json
import os

import jax.numpy as jnp
import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5 import training
from speculative_t5.measure.alpha import measure_alpha
from speculative_t5.data import demo_corpus
from speculative_t5.decoding.sampling import SamplingConfig


def test_corpus_is_deterministic_and_splits_do_not_overlap():
    a = demo_corpus.build_corpus()
    b = demo_corpus.build_corpus()
    assert a == b and len(a) > 2000
    by_split = {s: [e for e in a if e["split"] == s] for s in demo_corpus.SPLITS}
    assert all(len(v) > 50 for v in by_split.values())
    modules = {s: {e["module"] for e in v} for s, v in by_split.items()}
    assert not modules["train"] & modules["test"] and not modules["train"] & modules["validation"]
    assert not modules["validation"] & modules["test"]
    inputs = {s: {e["input"] for e in v} for s, v in by_split.items()}
    assert not inputs["train"] & inputs["test"]
    assert len({e["input"] for e in a}) == len(a)
    for e in a[:300]:
        assert e["input"].startswith("summarize: ") and "def " in e["input"]
        assert e["target"] not in e["input"]          # the docstring was removed
        assert len(e["target"].split()) >= 3


def test_first_sentence():
    assert demo_corpus.first_sentence("Return the sum of a and b.  More text here.") == \
        "Return the sum of a and b."
    assert demo_corpus.first_sentence("Two words") is None
    assert demo_corpus.first_sentence(">>> example() is shown here") is None


@pytest.mark.slow
def test_summary_line_task_keeps_the_rest_of_the_docstring():
    src = ('def area(w, h):\n    """Return the area of a rectangle.\n\n    Both sides in metres;\n'
           '    negative sides raise ValueError.\n    """\n    return w * h\n\n\n'
           'def double(x):\n    """Return twice the value given."""\n    return 2 * x\n')
    plain = demo_corpus.examples_from_source(src, "geometry")
    line = demo_corpus.examples_from_source(src, "geometry", task="summary_line")
    assert [e["target"] for e in line] == [e["target"] for e in plain] == [
        "Return the area of a rectangle.", "Return twice the value given."]
    assert "metres" not in plain[0]["input"] and "Return the area" not in line[0]["input"]
    assert line[0]["input"] == demo_corpus.PREFIX + (
        "def area(w, h):\n    \"\"\"Both sides in metres;\nnegative sides raise ValueError.\"\"\"\n"
        "    return w * h")
    assert line[1] == plain[1]  # a one-sentence docstring leaves nothing to keep
    assert demo_corpus.after_sentence("Two  words\nhere.  More.", "Two words here.") == "More."
    with pytest.raises(ValueError, match="task must be one of"):
        demo_corpus.build_corpus(task="translate")
    held = [e for e in demo_corpus.build_corpus(task="summary_line") if e["split"] == "test"]
    assert held and all(e["target"] not in e["input"] for e in held)
    assert sum('"""' in e["input"] for e in held) > len(held) // 4


def test_summarize_named_task_spells_the_name_out_first():
    src = ('def getArea_2d(w, h):\n    """Return the area of a rectangle."""\n    return w * h\n\n\n'
           'def _(x):\n    """Return twice the value given."""\n    return 2 * x\n')
    plain = demo_corpus.examples_from_source(src, "geometry")
    named = demo_corpus.examples_from_source(src, "geometry", task="summarize_named")
    assert [e["target"] for e in named] == [e["target"] for e in plain]
    assert named[0]["input"] == demo_corpus.PREFIX + "get area d\n" + plain[0]["input"][
        len(demo_corpus.PREFIX):]
    assert named[1] == plain[1]  # a name without words: the plain input
    assert demo_corpus.name_words("HTTPServer_v2") == ["http", "server", "v"]
    # what the demo shows a reader: the source alone, whichever task built the input
    assert [demo_corpus.source_of(e["input"]) for e in named] == [
        e["input"][len(demo_corpus.PREFIX):] for e in plain]
    assert demo_corpus.source_of(named[0]["input"]).startswith("def getArea_2d(w, h):")


def test_demo_examples_read_inputs_as_the_shipped_pair_was_trained():
    from speculative_t5.checkpoints import demo
    from speculative_t5.paper.cells import demo_examples
    from speculative_t5.paper.ginconfig import parse_gin
    import gin
    rows = [e for e in demo_corpus.build_corpus(task=demo.DEMO_TASK) if e["split"] == "test"]
    got = demo_examples(num_examples=None)
    assert [g["input_text"] for g in got] == [r["input"] for r in rows]
    assert max(len(g["inputs"]) for g in got) == demo.DEMO_INPUT_LENGTH  # cut where training cut
    try:  # the demo's gin task block says the same length (decode.max_input_len reads it)
        parse_gin(["tasks/demo_docstrings.gin"], [], [])
        assert gin.query_parameter("%INPUT_LENGTH") == demo.DEMO_INPUT_LENGTH
    finally:
        gin.clear_config()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("corpus"))
    training.prepare_data(d, vocab_size=128)
    return d


TINY = dict(vocab_size=128, emb_dim=32, num_heads=2, head_dim=16, mlp_dim=64,
            num_encoder_layers=1, num_decoder_layers=1)


def test_training_lowers_loss_and_resumes(corpus_dir, tmp_path):
    cfg = st.T5Config(**TINY, dropout_rate=0.1)  # each step's dropout drawn again on resume
    kw = dict(data_dir=corpus_dir, config=cfg, batch_size=8, input_len=32, target_len=12,
              vocab_size=128, max_examples=64, learning_rate=3e-3, warmup_steps=2,
              checkpoint_every=4, quiet=True)
    model_dir = str(tmp_path / "run")
    training.train(model_dir=model_dir, steps=24, max_steps_per_run=8, **kw)  # "killed" at 8
    ckpts = os.listdir(os.path.join(model_dir, "checkpoints"))
    assert "8" in ckpts and "4" in ckpts and not os.path.exists(os.path.join(model_dir, "hf"))
    resumed = training.train(model_dir=model_dir, steps=24, **kw)    # continues from step 8
    fresh = training.train(model_dir=str(tmp_path / "fresh"), steps=24, **kw)
    # resuming gives exactly the run that never stopped (same data order, same state)
    for a, b in zip(*(jax_leaves(m) for m in (resumed, fresh))):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    logs = [json.loads(l) for l in open(os.path.join(model_dir, "train_log.json"))]
    assert logs[-1]["final_loss"] < logs[0]["final_loss"]
    assert st.detect_format(os.path.join(model_dir, "hf")) == "hf"
    assert os.path.exists(os.path.join(model_dir, "hf", "spiece.model"))
    assert st.load_checkpoint(os.path.join(model_dir, "model")).config == cfg
    # the dropout was on: without it the same run ends elsewhere
    plain = training.train(model_dir=str(tmp_path / "plain"), steps=24,
                           **{**kw, "config": cfg.replace(dropout_rate=0.0)})
    assert any(not np.allclose(a, b) for a, b in zip(jax_leaves(plain), jax_leaves(fresh)))


@pytest.mark.slow
def test_warm_start_begins_from_another_runs_weights(corpus_dir, tmp_path):
    cfg = st.T5Config(**TINY)
    kw = dict(data_dir=corpus_dir, config=cfg, batch_size=8, input_len=32, target_len=12,
              vocab_size=128, max_examples=64, learning_rate=3e-3, warmup_steps=2,
              checkpoint_every=4, quiet=True)
    first = training.train(model_dir=str(tmp_path / "first"), steps=8, **kw)
    # a run of 0 steps on the warm start writes out exactly the weights it began from
    warm = training.train(model_dir=str(tmp_path / "warm"), steps=4, max_steps_per_run=0,
                          init_from=str(tmp_path / "first"), **kw)
    for a, b in zip(jax_leaves(warm), jax_leaves(first)):
        np.testing.assert_array_equal(a, b)
    cold = training.train(model_dir=str(tmp_path / "cold"), steps=4, max_steps_per_run=0, **kw)
    assert any(not np.array_equal(a, b) for a, b in zip(jax_leaves(cold), jax_leaves(first)))
    # or from a released checkpoint directory: the native float32 copy exactly, the Hugging
    # Face export as its bfloat16 weights held in float32
    for sub, dtype in (("model", np.float32), ("hf", jnp.bfloat16)):
        warm = training.train(model_dir=str(tmp_path / f"warm_{sub}"), steps=4,
                              max_steps_per_run=0, init_from=str(tmp_path / "first" / sub), **kw)
        for a, b in zip(jax_leaves(warm), jax_leaves(first)):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, np.asarray(b).astype(dtype).astype(np.float32))
    with pytest.raises(ValueError, match="neither a training run's model_dir"):
        training.train(model_dir=str(tmp_path / "x"), steps=4, init_from=str(tmp_path / "none"), **kw)
    os.makedirs(tmp_path / "empty" / "checkpoints")
    with pytest.raises(ValueError, match="no training checkpoint"):
        training.train(model_dir=str(tmp_path / "x"), steps=4,
                       init_from=str(tmp_path / "empty"), **kw)
    with pytest.raises(ValueError, match="do not fit this run's model config"):
        training.train(model_dir=str(tmp_path / "y"), steps=4, init_from=str(tmp_path / "first"),
                       **{**kw, "config": st.T5Config(**{**TINY, "mlp_dim": 48})})
    with pytest.raises(ValueError, match="another vocabulary"):
        training.prepare_data(corpus_dir, vocab_size=128, vocab_file=__file__)


def jax_leaves(model):
    import jax
    return [np.asarray(x) for x in jax.tree_util.tree_leaves(model.params)]


@pytest.mark.slow
def test_distillation_raises_alpha(corpus_dir, tmp_path):
    cfg = st.T5Config(**TINY)
    teacher = training.train(model_dir=str(tmp_path / "teacher"), data_dir=corpus_dir, config=cfg,
                             steps=30, batch_size=8, input_len=32, target_len=10, vocab_size=128,
                             max_examples=48, learning_rate=5e-3, warmup_steps=2,
                             checkpoint_every=100, quiet=True)
    draft_cfg = cfg.replace(emb_dim=16, mlp_dim=32, num_heads=1)
    kw = dict(teacher=str(tmp_path / "teacher" / "model"), data_dir=corpus_dir, config=draft_cfg,
              batch_size=8, input_len=32, target_len=10, vocab_size=128, max_examples=48,
              learning_rate=1e-2, warmup_steps=2, checkpoint_every=100, quiet=True)
    before = training.distill(model_dir=str(tmp_path / "d0"), steps=1, **kw)
    # on the data, the teacher's greedy outputs and one sample of it per input
    after = training.distill(model_dir=str(tmp_path / "d1"), steps=60, sampled_outputs=1, **kw)
    assert np.load(str(tmp_path / "d1" / "teacher_samples" / "0.npz"))["outputs"].shape == (48, 10)
    with pytest.raises(ValueError, match="sampled_outputs=1, now 0"):  # another run's directory
        training.distill(model_dir=str(tmp_path / "d1"), steps=60, **kw)
    with pytest.raises(ValueError, match="sampled_outputs must be an int >= 0"):
        training.distill(model_dir=str(tmp_path / "d3"), steps=60, sampled_outputs=-1, **kw)
    vocab = st.data.Vocabulary(os.path.join(corpus_dir, "spiece.model"))
    rows = training.read_split(corpus_dir, "train")[:48]
    x = st.data.tokenize([r["input"] for r in rows], vocab, 32)
    y = st.generate(teacher, x, max_decode_len=10).tokens
    s = SamplingConfig(1.0)
    a0 = measure_alpha(teacher, before, x, y, s)[0]
    a1 = measure_alpha(teacher, after, x, y, s)[0]
    assert a1 > a0 + 0.1, (a0, a1)
    # a distillation warm-started from a draft begins exactly at its weights
    warm = training.distill(model_dir=str(tmp_path / "d2"), steps=4, max_steps_per_run=0,
                            init_from=str(tmp_path / "d1" / "model"), **kw)
    for a, b in zip(jax_leaves(warm), jax_leaves(after)):
        np.testing.assert_array_equal(a, b)


def test_teacher_outputs_resume_after_a_kill_and_refuse_another_teacher(tmp_path, monkeypatch):
    from speculative_t5 import engine
    teacher = st.init_model(st.T5Config(**TINY), seed=0)
    x = np.random.RandomState(0).randint(2, 100, (11, 8)).astype(np.int32)
    whole = training.teacher_outputs(teacher, x, 6, batch_size=2)
    assert whole.shape == (11, 6)
    cache = str(tmp_path / "outputs.npz")
    real, calls = engine.generate, []

    def dies_on_the_fourth_batch(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(engine, "generate", dies_on_the_fourth_batch)
    with pytest.raises(KeyboardInterrupt):
        training.teacher_outputs(teacher, x, 6, batch_size=2, cache=cache, save_every=2)
    monkeypatch.setattr(engine, "generate", real)
    assert np.load(cache)["outputs"].shape == (4, 6)   # two batches saved before the kill
    np.testing.assert_array_equal(
        training.teacher_outputs(teacher, x, 6, batch_size=2, cache=cache, save_every=2), whole)
    np.testing.assert_array_equal(np.load(cache)["outputs"], whole)
    other = st.init_model(st.T5Config(**TINY), seed=1)
    for args, kw in (((other, x), {}), ((teacher, x[::-1].copy()), {}),
                     ((teacher, x), {"temperature": 1.0})):
        with pytest.raises(ValueError, match="another teacher, other inputs or other sampling"):
            training.teacher_outputs(*args, 6, batch_size=2, cache=cache, **kw)
    # samples at T = 1 (the prefixes a sampled decode drafts from): each batch its own key
    # from the seed, so a killed run resumes with the samples it would have drawn
    sampled = training.teacher_outputs(teacher, x, 6, batch_size=2, temperature=1.0, seed=3)
    assert not np.array_equal(sampled, whole)
    assert not np.array_equal(sampled, training.teacher_outputs(teacher, x, 6, batch_size=2,
                                                                temperature=1.0, seed=4))
    calls.clear()
    monkeypatch.setattr(engine, "generate", dies_on_the_fourth_batch)
    samples = str(tmp_path / "samples.npz")
    with pytest.raises(KeyboardInterrupt):
        training.teacher_outputs(teacher, x, 6, batch_size=2, cache=samples, save_every=2,
                                 temperature=1.0, seed=3)
    monkeypatch.setattr(engine, "generate", real)
    np.testing.assert_array_equal(training.teacher_outputs(
        teacher, x, 6, batch_size=2, cache=samples, save_every=2, temperature=1.0, seed=3), sampled)


def _write_package(root, name, source):
    os.makedirs(os.path.join(root, name), exist_ok=True)
    with open(os.path.join(root, name, "__init__.py"), "w") as f:
        f.write(source)


def test_package_examples_join_train_and_never_copy_a_stdlib_function(tmp_path):
    stdlib = [e for e in demo_corpus.build_corpus() if e["split"] == "test"]
    held = stdlib[0]    # a held-out function, vendored verbatim into a package below
    src = held["input"][len(demo_corpus.PREFIX):]
    body = src.split("\n", 1)   # its source with the docstring put back after the def line
    vendored = body[0] + f"\n    {held['target']!r}\n" + (body[1] if len(body) > 1 else "    pass") + "\n"
    renamed = ("def scale_vector(v, k):\n    'Multiply every entry of the vector by k.'\n"
               f"    return [x * k for x in v]\n\n\ndef {held['name']}(q):\n"
               f"    {held['target']!r}\n    return q + 1\n")
    root = str(tmp_path / "site")
    _write_package(root, "pkga", vendored + "\n" + renamed)
    _write_package(root, "pkgb", renamed)          # the same functions again: counted once
    _write_package(os.path.join(root, "pkga"), "tests", renamed.replace("scale", "tscale"))
    found = demo_corpus.package_examples(demo_corpus.build_corpus(), roots=[root], processes=1)
    assert [(e["module"], e["name"], e["split"]) for e in found] == [
        ("pkg:pkga", "scale_vector", "train")]      # same input or same (name, sentence): out
    assert found[0]["target"] == "Multiply every entry of the vector by k."
    assert found[0]["input"].startswith(demo_corpus.PREFIX + "def scale_vector(v, k):")


_POOL_UNDER_A_COMMAND = """
import multiprocessing, os, signal, sys, time
from speculative_t5.commands.interrupt import interruptible
from speculative_t5.data import demo_corpus
with interruptible():
    with multiprocessing.get_context("fork").Pool(1, initializer=demo_corpus._quiet_worker) as pool:
        worker = pool.apply(os.getpid)
        os.kill(worker, signal.SIGINT)       # Ctrl-C reaches the whole process group
        time.sleep(0.5)
        print(pool.apply(os.getpid) == worker, flush=True)
"""


def test_corpus_pool_workers_leave_ctrl_c_to_the_command():
    """Forked under a command's handlers, a worker that took Ctrl-C would unwind the
    parent's stack copy (a second "interrupted", a pool that never finishes)."""
    import subprocess
    import sys
    run = subprocess.run([sys.executable, "-c", _POOL_UNDER_A_COMMAND], capture_output=True,
                         text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True" and "interrupted" not in run.stderr


def test_prepare_data_refuses_a_corpus_built_otherwise(corpus_dir):
    with pytest.raises(ValueError, match=r"built with \{'packages': False.*packages': True"):
        training.prepare_data(corpus_dir, vocab_size=128, packages=True)
    with pytest.raises(ValueError, match="target_weight"):
        training.prepare_data(corpus_dir, vocab_size=128, target_weight=4)
    manifest = json.load(open(os.path.join(corpus_dir, "manifest.json")))
    assert manifest["packages"] is False and manifest["counts"]["train"] > 2000


def test_dropout_is_training_only_and_drops_whole_features():
    import flax.linen as nn
    import jax
    from speculative_t5.model.t5 import T5, _dropout
    cfg = st.T5Config(**TINY, dropout_rate=0.5)
    params = {"params": st.init_model(cfg, seed=0).params}
    rng = np.random.RandomState(0)
    x = rng.randint(2, 128, (2, 7)).astype(np.int32)
    y = rng.randint(2, 128, (2, 5)).astype(np.int32)
    y[:, 0] = 0
    det = np.asarray(T5(cfg).apply(params, x, y))
    # the rate never touches inference
    np.testing.assert_array_equal(det, T5(cfg.replace(dropout_rate=0.0)).apply(params, x, y))

    def dropped(seed):
        return np.asarray(T5(cfg).apply(params, x, y, enable_dropout=True,
                                        rngs={"dropout": jax.random.PRNGKey(seed)}))
    np.testing.assert_array_equal(dropped(1), dropped(1))
    assert not np.allclose(dropped(1), dropped(2)) and not np.allclose(dropped(1), det)

    class Drop(nn.Module):
        @nn.compact
        def __call__(self, h):
            return _dropout(cfg)(h, deterministic=False)
    out = np.asarray(Drop().apply({}, np.ones((4, 5, 2000), np.float32),
                                  rngs={"dropout": jax.random.PRNGKey(3)}))    # [B, T, E]
    # T5X's: a feature kept is scaled by 1 / (1 - rate), and one mask serves every position
    assert set(np.unique(out).tolist()) <= {0.0, 2.0}
    assert (out == out[:, :1]).all()
    assert abs((out == 0).mean() - 0.5) < 0.02
