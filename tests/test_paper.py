"""The paper drivers: every config parses and builds its cell, each driver runs end to end
on tiny models over tfds mock data and writes all its files, a killed run resumes without
losing or repeating an example, gin flags override files and bad bindings are named."""
import csv
import glob
import json
import os

import gin
import matplotlib.image as mpimg
import numpy as np
import pytest

import speculative_t5 as st
from helpers import run_processes, tiny_config, train_sentencepiece
from speculative_t5 import commands as cli, training  # noqa: F401 (training: gin configurables)
from speculative_t5.paper import drivers as paper
from speculative_t5.data import tasks
from speculative_t5.paper.cells import build_cell
from speculative_t5.paper.rundir import RunDir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CHECKPOINT_MACROS = [f"{t}_T5_1_1_{d} = '/ckpt/{t}_{d}'" for t in ("ENDE", "CNNDM")
                     for d in ("XXL", "SMALL", "BASE", "LARGE")]


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    return train_sentencepiece(str(tmp_path_factory.mktemp("spm")), vocab_size=48)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """A tiny random target, a smaller random draft, and a 'near' draft (the target's
    weights perturbed: agrees often, not always), saved as native checkpoints."""
    import jax
    root = tmp_path_factory.mktemp("pair")
    target = st.init_model(tiny_config(), seed=0)
    noise = st.init_model(tiny_config(), seed=1)
    near = st.Model(target.config, jax.tree_util.tree_map(lambda a, b: a + 0.3 * b,
                                                           target.params, noise.params))
    models = {"target": target, "near": near,
              "draft": st.init_model(tiny_config(num_decoder_layers=1, emb_dim=16, num_heads=2), seed=2)}
    paths = {name: str(root / name) for name in models}
    for name, model in models.items():
        st.save_checkpoint(model, paths[name])
    return paths


def _configs():
    return sorted(os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "configs", "**", "*.gin"),
                                                             recursive=True))


@pytest.mark.parametrize("rel", _configs())
def test_every_config_parses_and_builds(rel, spm):
    text = open(os.path.join(REPO, rel)).read()
    bindings = CHECKPOINT_MACROS + ["MOCK_DATA = 3", "NUM_EXAMPLES = 2"]
    if "demo_docstrings" not in text:  # the demo cells use the shipped pair's vocabulary
        bindings.append(f"VOCABULARY = '{spm}'")
    cli.parse_gin([os.path.join(REPO, rel)], bindings, [])
    try:
        if "include 'runs/paper.gin'" not in text:
            return  # a training config or the checkpoints template: parsing is the check
        cell = build_cell(os.path.basename(rel)[:-4], rel)
        assert len(cell.examples) == 2 and cell.gamma >= 1
        assert cell.temperature == (1.0 if "_t1" in rel else 0.0)
        assert cell.verification == ("block" if "block_verification" in text else "token")
        assert cell.draft.startswith("prompt_lookup") == ("prompt_lookup" in text)
        assert cell.beam_size == (4 if "beam_search" in text else 0)
        if "fallback" in rel:  # Fallback(prompt lookup, a draft model's path)
            assert cell.draft.split(",")[1].startswith(("gs://", "/"))
        if cell.task in tasks.TASKS:
            assert gin.query_parameter("%PREFIX") == tasks.TASKS[cell.task]["prefix"]
            assert all(e["input_text"].startswith(tasks.TASKS[cell.task]["prefix"])
                       for e in cell.examples)
            assert cell.metric == tasks.TASKS[cell.task]["metric"]
        if rel.startswith("configs/paper/") and "11b" not in rel:  # the paper's XXL pairs
            assert cell.target.endswith("_XXL")
            # the paper's own figures beside ours (it reports no beam search, no trees)
            assert bool(cell.paper["alpha"] and cell.paper["speedup"]) == (
                not cell.beam_size and not cell.tree)
        if "TREE" in text:  # a token-tree row: its depth is its gamma
            assert cell.tree == (2, 2, 1, 1) and cell.gamma == 4 and cell.labels()["tree_nodes"] == 14
    finally:
        gin.clear_config()


def test_unset_checkpoint_macro_is_named(spm):
    cli.parse_gin([os.path.join(REPO, "configs/paper/ende_t5_small_t0.gin")],
                  ["MOCK_DATA = 3", f"VOCABULARY = '{spm}'"], [])
    try:
        with pytest.raises(ValueError, match="gin macro ENDE_T5_1_1_(XXL|SMALL) is not set"):
            build_cell("ende_t5_small_t0", "configs/paper/ende_t5_small_t0.gin")
    finally:
        gin.clear_config()


def _cell_file(tmp_path, pair, spm, name="ende_t0", decoding="speculative_greedy", extra="",
               draft="draft"):
    """draft: a key of `pair`, or a draft spec ('prompt_lookup', 'prompt_lookup,draft':
    the pair's names stand for their paths)."""
    spec = ",".join(pair.get(part, part) for part in draft.split(","))
    path = tmp_path / f"{name}.gin"
    path.write_text(f"""include 'runs/paper.gin'
include 'tasks/wmt_ende.gin'
include 'decoding/{decoding}.gin'
TARGET_CHECKPOINT = '{pair["target"]}'
DRAFT_CHECKPOINT = '{spec}'
VOCABULARY = '{spm}'
MOCK_DATA = 6
NUM_EXAMPLES = 3
DTYPE = 'float32'
INPUT_LENGTH = 24
TARGET_LENGTH = 8
GAMMA = 2
{extra}""")
    return str(path)


def _png_ok(path):
    img = mpimg.imread(path)
    assert img.shape[0] > 100 and img.shape[1] > 100 and img.std() > 0


def _records(path):
    """A JSONL file's records (after the header line a `decode` output starts with)."""
    with open(path) as f:
        records = [json.loads(line) for line in f]
    return [r for r in records if "speculative_t5" not in r]


def test_walltime_table_end_to_end_and_flags(tmp_path, pair, spm):
    """A greedy cell and a beam cell (decoding/beam_search.gin: T5X's beam search timed
    against the speculative one) in one table."""
    cell = _cell_file(tmp_path, pair, spm)
    beam = _cell_file(tmp_path, pair, spm, name="ende_beam4", decoding="beam_search",
                      draft="near", extra="TARGET_LENGTH = 10\n")
    out = str(tmp_path / "run")
    args = ["walltime_table", "--cell", cell, "--cell", beam, "--output_dir", out, "--quiet",
            "--tfds_data_dir", str(tmp_path / "tfds"), "--gin.walltime_cell.timing_rounds=2",
            "--gin.NUM_EXAMPLES=2"]
    assert cli.main(args) == 0
    for f in ("summary.csv", "summary.md", "config.gin", "environment.json", "walltime.png",
              "ende_t0/examples.jsonl", "ende_t0/config.gin", "ende_t0/timing.json",
              "ende_t0/summary.csv", "ende_t0/tokens_per_call.png"):
        assert os.path.exists(os.path.join(out, f)), f
    _png_ok(os.path.join(out, "walltime.png"))
    recs = _records(os.path.join(out, "ende_t0", "examples.jsonl"))
    assert [r["id"] for r in recs] == ["validation-0", "validation-1"]  # --gin.NUM_EXAMPLES won
    assert all(r["identical"] and r["t5x_identical"] for r in recs)     # greedy: exact
    assert all(set(r["seconds"]) == {"plain", "plain_t5x", "spec"} for r in recs)
    with open(os.path.join(out, "summary.csv")) as f:
        rows = {r["cell"]: r for r in csv.DictReader(f)}
    row = rows["ende_t0"]
    assert row["beam_size"] == "" and float(row["identical_fraction"]) == 1.0
    # float32: plain greedy in a batch of 4 gives the batch-1 tokens (the noise floor is 1)
    assert float(row["plain_batch_identical_fraction"]) == 1.0
    noise = json.load(open(os.path.join(out, "ende_t0", "noise_floor.json")))
    assert noise["batch"] == 4 and set(noise["identical"]) == {"validation-0", "validation-1"}
    assert 0 <= float(row["alpha"]) <= 1 and float(row["c"]) > 0 and float(row["v"]) > 0
    assert float(row["weights_gb_per_s"]) > 0 and float(row["tokens_per_s_spec"]) > 0
    assert float(row["bleu_plain"]) == float(row["bleu_spec"])
    tpc = float(row["tokens_per_target_call"])
    assert 1 <= tpc <= 3
    # the cost model: the parts timed beside each decode (its record's "parts"), combined
    # by the formula written out here, give the row's full prediction; measured /
    # predicted is their ratio
    plain = spec = 0.0
    for r in recs:
        p, w = r["parts"], r["width"]
        # plain_1: a plain step over the plain decode's own, shorter cache (max_decode_len
        # positions; the speculative caches are rounded up to a multiple of 16)
        assert set(p) >= {"target_1", "target_3", "draft_1", "draft_2", "loop_0", "loop_2",
                          "round_2", "call", f"setup_target_{w}", f"setup_draft_{w}",
                          "plain_1"} and min(p.values()) >= 0
        assert p["target_1"] > 0 and p["target_3"] > 0 and p["round_2"] > 0 and p["plain_1"] > 0
        plain += p["call"] + p[f"setup_target_{w}"] + r["plain"]["target_calls"] * (p["plain_1"] + p["loop_0"])
        # a round's model steps as timed in turn (round_2), not target_3 + 2 draft_1
        spec += (p["call"] + p[f"setup_target_{w}"] + p[f"setup_draft_{w}"]
                 + r["spec"]["target_calls"] * (p["round_2"] + p["loop_2"])
                 + r["spec"]["two_token_draft_calls"] * (p["draft_2"] - p["draft_1"]))
    assert float(row["speedup_predicted_full"]) == pytest.approx(plain / spec, rel=1e-3)
    # c and v: the medians of the parts timed beside the decodes
    assert float(row["c"]) == pytest.approx(np.median([r["parts"]["draft_1"] for r in recs])
                                            / np.median([r["parts"]["target_1"] for r in recs]))
    assert float(row["measured_over_full"]) == pytest.approx(
        float(row["speedup_measured"]) / float(row["speedup_predicted_full"]), rel=1e-3)
    assert all(r["plain"]["target_calls"] == r["plain"]["length"] for r in recs)
    # the beam row: the same beams as T5X's beam search, fewer target calls, equal BLEU
    b = rows["ende_beam4"]
    assert b["beam_size"] == "4" and b["speedup_predicted_full"] == ""
    assert float(b["identical_fraction"]) == 1.0 and float(b["max_score_diff"]) < 1e-4
    assert 1.0 < float(b["beam_steps_per_target_call"]) <= 3.0
    assert int(b["target_calls_spec"]) < int(b["target_calls_plain"])
    assert b["bleu_plain"] == b["bleu_spec"] and float(b["speedup_measured"]) > 0
    beams = _records(os.path.join(out, "ende_beam4", "examples.jsonl"))
    assert len(beams) == 2 and all(r["plain_output"] == r["spec_output"] for r in beams)
    summary = open(os.path.join(out, "summary.csv")).read()  # a rerun resumes: same rows
    assert cli.main(args) == 0 and open(os.path.join(out, "summary.csv")).read() == summary
    # a TPU prediction added to the finished run (nothing re-measured): the cell's alpha with
    # the c and v of a `compile --json` report's parts
    report = {"topology": "v4-8", "batch": 1, "gamma": 2, "max_decode_len": 8, "c": 0, "v": 0,
              "parts": {"setup": {"roofline_ms": 2.0}, "target_step": {"roofline_ms": 4.0},
                        "verify": {"roofline_ms": 4.4}, "draft_step": {"roofline_ms": 0.2}}}
    path = tmp_path / "compile.json"
    path.write_text(json.dumps(report))
    assert cli.main(args + [f"--gin.walltime_cell.tpu_report='{path}'"]) == 0
    with open(os.path.join(out, "summary.csv")) as f:
        tpu = next(r for r in csv.DictReader(f) if r["cell"] == "ende_t0")
    a, c, v = float(row["alpha"]), 0.2 / 4.0, 4.4 / 4.0
    assert tpu["tpu_topology"] == "v4-8" and float(tpu["c_tpu"]) == pytest.approx(c)
    assert float(tpu["speedup_predicted_tpu"]) == pytest.approx(
        (1 - a ** 3) / ((1 - a) * (2 * c + v)), rel=1e-5)          # eq. (5)
    assert _records(os.path.join(out, "ende_t0", "examples.jsonl")) == recs
    path.write_text(json.dumps({**report, "gamma": 7}))
    with pytest.raises(SystemExit, match="compiled for gamma 7 \\(the cell: 2\\)"):
        cli.main(args + [f"--gin.walltime_cell.tpu_report='{path}'"])
    config = open(os.path.join(out, "ende_t0", "config.gin")).read()
    assert "walltime_cell.timing_rounds = 2" in config and "tfds" in config.split("TFDS_DATA_DIR")[1]
    # the same directory with another config is refused, not mixed
    with pytest.raises(SystemExit, match="different config.*NUM_EXAMPLES"):
        cli.main(["walltime_table", "--cell", cell, "--output_dir", out, "--quiet",
                  "--tfds_data_dir", str(tmp_path / "tfds"),
                  "--gin.walltime_cell.timing_rounds=2", "--gin.NUM_EXAMPLES=3"])
    with pytest.raises(SystemExit, match="bad gin configuration.*no_such_knob"):
        cli.main(["walltime_table", "--cell", cell, "--output_dir", out,
                  "--gin.walltime_cell.no_such_knob=1"])
    with pytest.raises(SystemExit, match="no cells"):
        cli.main(["alpha_table", "--output_dir", out])


class Killed(Exception):
    pass


def test_killed_run_resumes_without_gaps_or_repeats(tmp_path, pair, spm, monkeypatch):
    cells = [_cell_file(tmp_path, pair, spm, "a_t0"),
             _cell_file(tmp_path, pair, spm, "b_t1", "speculative_sampling")]
    out = str(tmp_path / "run")
    args = dict(gin_files=[], bindings=["walltime_cell.timing_rounds = 2"], quiet=True)
    appended, real_append = [], RunDir.append

    def dying_append(self, record):
        if len(appended) == 4:  # killed while writing the 5th record (2nd of cell b)
            with open(self.jsonl, "a") as f:
                f.write(json.dumps(record)[:20])
            raise Killed()
        appended.append(record["id"])
        real_append(self, record)
    monkeypatch.setattr(RunDir, "append", dying_append)
    with pytest.raises(Killed):
        paper.run("walltime_table", cells, out, **args)
    monkeypatch.setattr(RunDir, "append", real_append)
    with open(os.path.join(out, "b_t1", "examples.jsonl")) as f:
        assert f.read().endswith('{"id": "validation-1')  # the torn line the kill left
    first = {c: RunDir(os.path.join(out, c)).records() for c in ("a_t0", "b_t1")}
    assert [len(r) for r in first.values()] == [3, 1]
    costs = {c: json.load(open(os.path.join(out, c, "timing.json")))["costs"] for c in first}
    rows = paper.run("walltime_table", cells, out, **args)
    for c in first:  # a resumed cell keeps the costs it started with
        assert json.load(open(os.path.join(out, c, "timing.json")))["costs"] == costs[c]
    for c in ("a_t0", "b_t1"):
        recs = _records(os.path.join(out, c, "examples.jsonl"))
        assert sorted(r["id"] for r in recs) == ["validation-0", "validation-1", "validation-2"]
        assert recs[:len(first[c])] == first[c]  # what was done is kept, not redone
    assert [r["examples"] for r in rows] == [3, 3]
    assert rows[0]["identical_fraction"] == 1.0 and rows[1]["identical_fraction"] is None


def test_beam_cells_are_checked(tmp_path, pair, spm):
    """Beam settings that cannot apply are refused in one line, before anything runs."""
    for extra, message in (("TEMPERATURE = 1.0", "decodes argmax with token verification"),
                           ("BEAM_ALPHA = -1", "beam_alpha must be a number >= 0"),
                           ("BEAM_PATHS = 2", "beam_paths must be None or an int >= beam_size")):
        bad = _cell_file(tmp_path, pair, spm, name="bad", decoding="beam_search", extra=extra)
        with pytest.raises(ValueError, match=message):
            paper.run("walltime_table", [bad], str(tmp_path / "bad"))
    bad = _cell_file(tmp_path, pair, spm, name="bad", decoding="beam_search",
                     draft="prompt_lookup")
    with pytest.raises(ValueError, match="a beam cell's draft must be a draft model checkpoint"):
        paper.run("walltime_table", [bad], str(tmp_path / "bad"))
    beam = _cell_file(tmp_path, pair, spm, name="beam", decoding="beam_search")
    with pytest.raises(ValueError, match="gamma_sweep sweeps speculative decoding"):
        paper.run("gamma_sweep", [beam], str(tmp_path / "sweep"),
                  bindings=[f"TFDS_DATA_DIR = '{tmp_path / 'tfds'}'"])


@pytest.mark.slow
def test_two_processes_run_a_driver_like_one_and_resume(tmp_path, spm):
    """A driver as two processes on localhost (2 CPU devices each, the target partitioned
    2 ways: mesh 2 x 2 over both): every decode is one program over both processes'
    devices, process 0 alone writes the run directory, and its records equal a one-process
    run's (alpha_table, sampled, batches of 4 rows spread over 'data'); killed mid-cell,
    the two resume from process 0's files (the other process is sent them) with nothing
    lost or repeated. Every driver runs its cells through the same `run_grid`."""
    cfg = tiny_config(vocab_size=64, num_heads=2, mlp_dim=40)  # divisible by 'model'
    pair = {"target": str(tmp_path / "target"), "draft": str(tmp_path / "draft")}
    st.save_checkpoint(st.init_model(cfg, 0), pair["target"])
    st.save_checkpoint(st.init_model(cfg.replace(num_decoder_layers=1), 5), pair["draft"])
    cell = _cell_file(tmp_path, pair, spm, "b_t1", "speculative_sampling")
    one, two = str(tmp_path / "one"), str(tmp_path / "two")
    paper.run("alpha_table", [cell], one, bindings=["alpha_cell.batch_size = 4"], quiet=True)
    args = ["alpha_table", "--cell", cell, "--output_dir", two,
            "--gin.Partitioner.num_partitions=2", "--gin.alpha_cell.batch_size=4"]
    outs = run_processes(args, devices=2)
    assert "b_t1" in outs[0][1] and "b_t1" not in outs[1][1]  # only the coordinator reports
    path = os.path.join(two, "b_t1", "examples.jsonl")
    whole = open(path).read()
    a, b = _records(os.path.join(one, "b_t1", "examples.jsonl")), _records(path)
    assert [(r["id"], r["output"], r["positions"]) for r in a] == \
        [(r["id"], r["output"], r["positions"]) for r in b]
    assert [r["overlap_sum"] for r in a] == pytest.approx([r["overlap_sum"] for r in b], 1e-5)
    assert len(b) == 3 and len({r["output"] for r in b}) > 1  # sampled: rows differ
    assert "num_partitions = 2" in open(os.path.join(two, "b_t1", "config.gin")).read()
    # killed while writing the 2nd record: the two resume from process 0's files
    lines = whole.splitlines(keepends=True)
    open(path, "w").write(lines[0] + lines[1][:25])
    os.remove(os.path.join(two, "summary.csv"))
    run_processes(args, devices=2)
    assert open(path).read() == whole
    assert open(os.path.join(two, "summary.csv")).read().count("b_t1") == 1


def test_alpha_table_two_cells(tmp_path, pair, spm):
    cells = [_cell_file(tmp_path, pair, spm, "ende_t0", draft="near"),
             _cell_file(tmp_path, pair, spm, "ende_t1", "speculative_sampling", draft="near")]
    out = str(tmp_path / "run")
    rows = paper.run("alpha_table", cells, out, bindings=["alpha_cell.batch_size = 2"], quiet=True)
    assert [r["cell"] for r in rows] == ["ende_t0", "ende_t1"]
    for r in rows:
        assert 0 < r["alpha"] < 1 and r["alpha_ci95"] >= 0 and r["positions"] > 0
    _png_ok(os.path.join(out, "alpha.png"))
    assert open(os.path.join(out, "summary.md")).read().count("| ende_t") == 2
    # greedy alpha = the argmax agreement rate along the target's own greedy output
    target, draft = st.load_checkpoint(pair["target"]), st.load_checkpoint(pair["near"])
    recs = _records(os.path.join(out, "ende_t0", "examples.jsonl"))
    cli.parse_gin([cells[0]], [], [])
    try:
        cell = build_cell("ende_t0", cells[0])
    finally:
        gin.clear_config()
    agree = total = 0
    for ex in cell.examples:
        x = np.array([ex["inputs"]], np.int32)
        out_t = st.generate(target, x, max_decode_len=8)
        n = int(out_t.lengths[0])
        dec = np.pad(out_t.tokens[:, :n - 1], ((0, 0), (1, 0)))
        pt = np.argmax(np.asarray(st.forward(target, x, dec)), -1)
        pd = np.argmax(np.asarray(st.forward(draft, x, dec)), -1)
        agree += int((pt == pd).sum())
        total += n
    assert sum(r["positions"] for r in recs) == total
    assert rows[0]["alpha"] == pytest.approx(agree / total)


@pytest.mark.slow
def test_gamma_sweep(tmp_path, pair, spm):
    """The sweep times fixed gammas and (adaptive = True) adaptive gamma beside them; an
    adaptive cell decodes in walltime_table (greedy: plain's tokens) with no fixed-gamma
    prediction, and is refused by the sweep."""
    cell = _cell_file(tmp_path, pair, spm, "ende_t0")
    out = str(tmp_path / "run")
    rows = paper.run("gamma_sweep", [cell], out, bindings=[
        "gamma_sweep_cell.gammas = [1, 3]", "gamma_sweep_cell.timing_rounds = 2",
        "gamma_sweep_cell.adaptive = True"], quiet=True)
    row = rows[0]
    assert row["best_gamma_measured"] in (1, 3) and row["best_gamma_predicted"] in (1, 3)
    assert 0 < row["c_hat"] < 1
    a = row["adaptive"]
    assert a["max_gamma"] == 3 and a["speedup_measured"] > 0 and 1 <= a["tokens_per_target_call"] <= 4
    recs = _records(os.path.join(out, "ende_t0", "examples.jsonl"))
    assert all(set(r["seconds"]) == {"plain", "1", "3", "adaptive"} for r in recs)
    # adaptive rounds draft 0..3, so a row's target calls are those of some mix of widths
    assert all(r["spec"]["adaptive"]["length"] == r["plain"]["length"] for r in recs)
    adaptive = _cell_file(tmp_path, pair, spm, "ende_adaptive", extra="ADAPTIVE_GAMMA = True\nGAMMA = 3\n")
    tree = _cell_file(tmp_path, pair, spm, "ende_tree", extra="TREE = (2, 1)\n")
    table, trees = paper.run("walltime_table", [adaptive, tree], str(tmp_path / "table"), quiet=True,
                             bindings=["walltime_cell.timing_rounds = 2", "NUM_EXAMPLES = 2",
                                       "walltime_cell.t5x_baseline = False"])
    for row in (table, trees):  # greedy: plain's tokens; no chain's prediction applies
        assert row["identical_fraction"] == 1.0 and row["speedup_measured"] > 0
        assert row["speedup_predicted_full"] is None and row["measured_over_full"] is None
        assert row["tokens_per_call_predicted"] is None
    assert table["adaptive_gamma"] is True and table["gamma"] == 3
    assert trees["tree"] == "2,1" and trees["gamma"] == 2 and trees["v"] is None
    assert 1 <= trees["tokens_per_target_call"] <= 3
    assert trees["tree_nodes"] == 4  # 2 + 2 nodes a round, checked in one target call
    for cell in (adaptive, tree):  # a compile report prices a fixed gamma's chain
        with pytest.raises(ValueError, match="compile report prices rounds of a fixed gamma"):
            paper.run("walltime_table", [cell], str(tmp_path / "tpu"), quiet=True,
                      bindings=[f"walltime_cell.tpu_report = '{tmp_path / 'none.json'}'"])
    with pytest.raises(ValueError, match="decodes with adaptive gamma: gamma_sweep times fixed"):
        paper.run("gamma_sweep", [adaptive], str(tmp_path / "adaptive_sweep"), quiet=True)
    with pytest.raises(ValueError, match=r"decodes a token tree \(2, 1\): gamma_sweep times"):
        paper.run("gamma_sweep", [tree], str(tmp_path / "tree_sweep"), quiet=True)
    for name, extra, decoding, message in (
            ("beam_adaptive", "ADAPTIVE_GAMMA = True", "beam_search", "adaptive_gamma is for speculative"),
            ("beam_tree", "TREE = (2, 1)", "beam_search", "tree does not combine with beam search"),
            ("tree_block", "TREE = (2, 1)\nVERIFICATION = 'block'", "speculative_greedy",
             "tree does not combine with verification='block'"),
            ("tree_bad", "TREE = (2, 0)", "speculative_greedy", "each an int >= 1"),
            ("tree_adaptive", "TREE = (2, 1)\nADAPTIVE_GAMMA = True", "speculative_greedy",
             "tree does not combine with adaptive_gamma")):
        bad = _cell_file(tmp_path, pair, spm, name, decoding=decoding, extra=extra + "\n")
        with pytest.raises(ValueError, match=message):
            paper.run("walltime_table", [bad], str(tmp_path / name), quiet=True)
    lookup = _cell_file(tmp_path, pair, spm, "tree_lookup", draft="prompt_lookup", extra="TREE = (2, 1)\n")
    with pytest.raises(ValueError, match="tree needs a draft model"):
        paper.run("walltime_table", [lookup], str(tmp_path / "tree_lookup"), quiet=True)
    lines = open(os.path.join(out, "ende_t0", "summary.csv")).read().splitlines()
    assert [line.split(",")[0] for line in lines[1:]] == ["1", "3"]
    for f in ("speedup_vs_gamma.png", "ende_t0/speedup_vs_gamma.png", "ende_t0/operations_vs_gamma.png"):
        _png_ok(os.path.join(out, f))
    with pytest.raises(ValueError, match="distinct ints"):
        paper.run("gamma_sweep", [cell], str(tmp_path / "bad"),
                  bindings=["gamma_sweep_cell.gammas = [0]"], quiet=True)


def test_choose_gamma():
    """Adaptive where it measured at least as fast as the fastest fixed gamma; else the
    cost model's fastest fixed gamma, not the measured one."""
    from speculative_t5.paper.gamma_sweep import choose_gamma
    swept = {"best_speedup_measured": 1.5, "best_gamma_measured": 3, "best_gamma_predicted_full": 2,
             "rows": [{"gamma": g} for g in (1, 2, 3)],
             "adaptive": {"max_gamma": 3, "speedup_measured": 1.4, "tokens_per_target_call": 2.0}}
    fixed = choose_gamma(swept)
    assert fixed["adaptive"] is False and fixed["gamma"] == 2
    assert "cost model" in fixed["why"] and "adaptive measured 1.40x" in fixed["why"]
    swept["adaptive"]["speedup_measured"] = 1.5
    chosen = choose_gamma(swept)
    assert chosen["adaptive"] is True and chosen["gamma"] == 3 and "adaptive gamma" in chosen["why"]
    assert choose_gamma(dict(swept, adaptive=None))["gamma"] == 2


@pytest.mark.slow
def test_gamma_sweep_lookup_cell(tmp_path, pair, spm):
    """A prompt-lookup cell sweeps like any other: no model, so c and c_hat are 0."""
    cell = _cell_file(tmp_path, pair, spm, "lookup_t0", draft="prompt_lookup")
    row, = paper.run("gamma_sweep", [cell], str(tmp_path / "run"), quiet=True, bindings=[
        "gamma_sweep_cell.gammas = [1, 3]", "gamma_sweep_cell.timing_rounds = 2",
        "NUM_EXAMPLES = 2"])
    assert row["c"] == 0 and row["c_hat"] == 0 and 0 <= row["coverage"] <= 1
    assert [r["gamma"] for r in row["rows"]] == [1, 3]
    assert all(r["speedup_measured"] > 0 and r["speedup_predicted_full"] > 0 for r in row["rows"])


@pytest.mark.slow
def test_text_file_cell_and_decode_run_block(tmp_path, pair, spm):
    """tasks/text_file.gin feeds a TSV to a driver (with BLEU against its references), and
    runs/decode.gin turns any cell into `speculative-t5 decode` (decoding/plain.gin: no draft)."""
    tsv = tmp_path / "in.tsv"
    tsv.write_text("the quick fox\tder schnelle fuchs\nseven small birds\tsieben kleine voegel\n")
    cell = tmp_path / "file_t0.gin"
    cell.write_text(f"""include 'runs/paper.gin'
include 'tasks/text_file.gin'
include 'decoding/speculative_greedy.gin'
TARGET_CHECKPOINT = '{pair["target"]}'
DRAFT_CHECKPOINT = '{pair["draft"]}'
VOCABULARY = '{spm}'
INPUT_FILE = '{tsv}'
PREFIX = 'translate English to German: '
METRIC = 'bleu'
DTYPE = 'float32'
TARGET_LENGTH = 6
""")
    out = str(tmp_path / "run")
    rows = paper.run("walltime_table", [str(cell)], out, quiet=True, bindings=[
        "walltime_cell.timing_rounds = 2", "walltime_cell.t5x_baseline = False",
        "walltime_cell.noise_floor_batch = 0"])
    assert rows[0]["examples"] == 2 and rows[0]["identical_fraction"] == 1.0
    assert "bleu_plain" in rows[0] and rows[0]["bleu_plain"] == rows[0]["bleu_spec"]
    recs = _records(os.path.join(out, "file_t0", "examples.jsonl"))
    assert [r["id"] for r in recs] == ["line-1", "line-2"]
    assert recs[1]["reference"] == "sieben kleine voegel"
    txt = tmp_path / "in.txt"
    txt.write_text("the quick fox\n")
    for decoding, has_draft in (("speculative_greedy", True), ("plain", False)):
        jsonl = str(tmp_path / f"{decoding}.jsonl")
        assert cli.main(["decode", f"--gin_file={cell}", "--gin_file=runs/decode.gin",
                         f"--gin_file=decoding/{decoding}.gin", "--input_file", str(txt),
                         "--output", jsonl]) == 0
        rec = _records(jsonl)[0]
        assert rec["input"] == "translate English to German: the quick fox"
        assert (rec["stats"]["draft_calls"] > 0) == has_draft and rec["length"] <= 6



def _lookup_first(history, j, max_n=3, min_n=1):
    """What PromptLookup proposes first with j tokens emitted (history: the input's tokens,
    then those j): what followed the most recent earlier occurrence of the longest last
    n-gram (n <= j), or None."""
    L = len(history)
    for n in range(min(max_n, j), min_n - 1, -1):
        for i in range(L - n - 1, -1, -1):
            if history[i:i + n] == history[L - n:]:
                return history[i + n]
    return None


@pytest.mark.slow
def test_walltime_table_zero_cost_and_fallback_cells(tmp_path, pair, spm):
    """A prompt-lookup cell and a Fallback(lookup, model) cell through walltime_table: every
    file written, greedy identical to plain, the lookup's c 0 and its proposing timed in the
    loop, the fallback's model charged only for the rounds it drafted."""
    cells = [_cell_file(tmp_path, pair, spm, "lookup_t0", draft="prompt_lookup"),
             _cell_file(tmp_path, pair, spm, "fallback_t0", draft="prompt_lookup:2,draft")]
    out = str(tmp_path / "run")
    rows = paper.run("walltime_table", cells, out, quiet=True, bindings=[
        "walltime_cell.timing_rounds = 2", "walltime_cell.t5x_baseline = False",
        "NUM_EXAMPLES = 2"])
    for f in ("summary.csv", "summary.md", "walltime.png", "lookup_t0/timing.json",
              "fallback_t0/tokens_per_call.png", "fallback_t0/noise_floor.json"):
        assert os.path.exists(os.path.join(out, f)), f
    lookup, fallback = rows
    for row in rows:
        assert row["identical_fraction"] == 1.0 and 1 <= row["tokens_per_target_call"] <= 3
        assert 0 <= row["coverage"] <= 1 and 0 <= row["alpha"] <= 1
        assert row["speedup_predicted_full"] > 0 and row["speedup_measured"] > 0
    assert lookup["alpha"] <= lookup["coverage"] + 1e-9  # no proposal: overlap 0
    assert lookup["draft"] == "prompt_lookup" and lookup["c"] == 0.0 and fallback["c"] > 0
    header = open(os.path.join(out, "summary.csv")).readline()
    assert "coverage" in header and "alpha_covered" in header
    timing = {c: json.load(open(os.path.join(out, c, "timing.json"))) for c in ("lookup_t0", "fallback_t0")}
    assert not timing["lookup_t0"]["draft_parts"]["draft_model_steps_timed"]
    assert timing["lookup_t0"]["draft_parts"]["zero_cost_draft_in_loop"]
    assert timing["fallback_t0"]["draft_parts"]["draft_model_steps_timed"]
    assert timing["lookup_t0"]["costs"]["setup"][str(_records(os.path.join(
        out, "lookup_t0", "examples.jsonl"))[0]["width"])]["draft"] == 0.0
    for cell, recs in ((c, _records(os.path.join(out, c, "examples.jsonl"))) for c in timing):
        spec = plain = 0.0
        for r in recs:
            s, p, w = r["spec"], r["parts"], r["width"]
            if cell == "lookup_t0":  # no draft model: no draft steps or set-up timed
                assert s["draft_model_steps"] == 0 and s["two_token_draft_calls"] == 0
                assert not {"draft_1", "draft_2", f"setup_draft_{w}"} & set(p)
                p = dict(p, draft_1=0.0, draft_2=0.0, **{f"setup_draft_{w}": 0.0})
            assert s["draft_model_steps"] <= 2 * s["target_calls"]
            spec += (p["call"] + p[f"setup_target_{w}"] + p[f"setup_draft_{w}"]
                     + s["target_calls"] * (p["target_3"] + p["loop_2"])
                     + s["draft_model_steps"] * p["draft_1"]
                     + s["two_token_draft_calls"] * (p["draft_2"] - p["draft_1"]))
            plain += p["call"] + p[f"setup_target_{w}"] + r["plain"]["target_calls"] * (p["plain_1"] + p["loop_0"])
        row = rows[0] if cell == "lookup_t0" else rows[1]
        assert row["speedup_predicted_full"] == pytest.approx(plain / spec, rel=1e-3)


def test_alpha_table_lookup_is_teacher_forced(tmp_path, pair, spm):
    """alpha of a prompt-lookup cell: along the target's greedy text, where the lookup run on
    the input and the text so far proposes, the overlap is p(its token) -- greedy: whether it
    is the target's next token; elsewhere 0, the positions counted apart as coverage. Equal
    to a direct count with the lookup written out in Python."""
    cell_file = _cell_file(tmp_path, pair, spm, "lookup_t0", draft="prompt_lookup")
    out = str(tmp_path / "run")
    row, = paper.run("alpha_table", [cell_file], out, bindings=["alpha_cell.batch_size = 2"],
                     quiet=True)
    target = st.load_checkpoint(pair["target"])
    cli.parse_gin([cell_file], [], [])
    try:
        cell = build_cell("lookup_t0", cell_file)
    finally:
        gin.clear_config()
    agree = found = total = 0
    for ex in cell.examples:
        x = np.array([ex["inputs"]], np.int32)
        y = st.generate(target, x, max_decode_len=8)
        y = y.tokens[0, :int(y.lengths[0])].tolist()
        for j in range(len(y)):
            x_1 = _lookup_first([t for t in ex["inputs"] if t != 0] + y[:j], j)
            found += x_1 is not None
            agree += x_1 == y[j]
        total += len(y)
    assert 0 < found < total  # the example has positions with and without a match
    assert row["positions"] == total
    assert row["alpha"] == pytest.approx(agree / total)
    assert row["coverage"] == pytest.approx(found / total)
    assert row["alpha_covered"] == pytest.approx(agree / found)
