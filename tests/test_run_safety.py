"""A run directory is one run's and one writer's (issue #39): a resumed trainer with other
settings (learning rate, batch size, model shape) is refused in one line naming them and
`--restart` starts over; a second writer on a driver's output_dir, a decode --output or a
model_dir is refused in one line, a dead writer's lock is taken over; a finished run rerun
says so and writes no NaN. Tiny models, a few steps."""
import gc
import json
import os
import shutil
import socket
import subprocess
import sys
import time

import gin
import pytest

import speculative_t5 as st
from helpers import tiny_config, train_sentencepiece
from speculative_t5 import commands as cli, training
from speculative_t5.locks import DIR_LOCK, Lock
from speculative_t5.paper import drivers
from speculative_t5.training import lm

TINY = st.GPT2Config(vocab_size=320, n_positions=32, n_embd=32, n_layer=1, n_head=2,
                     eos_id=0, pad_id=0)
KW = dict(batch_size=8, window=16, vocab_size=320, max_files=30, max_windows=64,
          learning_rate=1e-2, warmup_steps=2, checkpoint_every=8, quiet=True)


@pytest.fixture(autouse=True)
def _no_gin_left():
    """`cli.main` leaves its gin bindings in force: later direct calls must not see them."""
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("code"))
    lm.prepare_code_data(d, vocab_size=320, max_files=30)
    return d


@pytest.fixture(scope="module")
def killed_run(data_dir, tmp_path_factory):
    """A 4-step train_lm run "killed" after step 2 (its checkpoint kept)."""
    run = str(tmp_path_factory.mktemp("killed") / "run")
    training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=4,
                      max_steps_per_run=2, **KW)
    return run


def _copy(run, tmp_path, name="run"):
    return shutil.copytree(run, str(tmp_path / name))


def _one_line(message):
    message = str(message).split("\n  In call to configurable")[0]  # gin's addition
    assert "\n" not in message, message
    return message


def _holder(lock_path):
    """Another process holding the lock at lock_path (as a running writer would)."""
    code = ("import fcntl, json, os, socket, sys, time\n"
            "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
            "fcntl.flock(fd, fcntl.LOCK_EX)\n"
            "os.write(fd, json.dumps({'pid': os.getpid(), 'host': socket.gethostname(), "
            "'since': time.time()}).encode())\n"
            "print('held', flush=True)\ntime.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", code, lock_path], stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def _stale_lock(lock_path):
    """A lock file left by a writer that died (its pid no longer runs on this host)."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with open(lock_path, "w") as f:
        json.dump({"pid": dead.pid, "host": socket.gethostname(), "since": time.time()}, f)


def test_resumed_train_lm_with_another_learning_rate_is_refused_and_restart_starts_over(
        killed_run, data_dir, tmp_path, capsys):
    run = _copy(killed_run, tmp_path)
    with pytest.raises(ValueError) as e:
        training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=4,
                          **dict(KW, learning_rate=1e-3))
    assert _one_line(e.value) == (f"{run} was started with learning_rate=0.01, now 0.001; pass "
                                  "--restart to start over or use a new directory")
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["2"]  # nothing touched
    for change, name in ((dict(batch_size=4), "batch_size=8, now 4"),
                         (dict(steps=6), "steps=4, now 6")):
        with pytest.raises(ValueError, match=name):
            training.train_lm(model_dir=run, data_dir=data_dir, config=TINY,
                              **{**KW, "steps": 4, **change})
    # the command line: one line, and --restart moves the old run aside and starts over
    gin_file = tmp_path / "lm.gin"
    gin_file.write_text("include 'models/gpt2/base.gin'\n" + "".join(
        f"GPT2Config.{k} = {v!r}\n" for k, v in TINY.to_dict().items()) + "".join(
        f"train_lm.{k} = {v!r}\n" for k, v in dict(
            KW, data_dir=data_dir, learning_rate=1e-3, max_steps_per_run=0).items()
        if k != "quiet") + "train_lm.config = %MODEL_CONFIG\n")
    args = ["train_lm", f"--gin_file={gin_file}", "--model_dir", run, "--steps", "4"]
    with pytest.raises(SystemExit) as e:
        cli.main(args)
    assert _one_line(e.value).startswith(f"error: {run} was started with learning_rate=0.01")
    capsys.readouterr()
    assert cli.main(args + ["--restart"]) == 0
    assert "restart: the earlier run's files are in" in capsys.readouterr().out
    [aside] = [n for n in os.listdir(run) if n.startswith("before_restart_")]
    assert sorted(os.listdir(os.path.join(run, aside, "checkpoints"))) == ["2"]
    assert not os.path.exists(os.path.join(run, "train_log.json"))  # no step ran yet
    assert json.load(open(os.path.join(run, "run_config.json")))["settings"]["learning_rate"] \
        == 1e-3
    assert not os.listdir(os.path.join(run, "checkpoints"))
    assert not os.path.exists(os.path.join(run, DIR_LOCK))          # released


# orbax leaves a coroutine of the refused restore unawaited; the refusal is what is tested
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_resumed_train_lm_with_another_model_shape_is_one_line(killed_run, data_dir, tmp_path):
    run = _copy(killed_run, tmp_path)
    wider = TINY.replace(n_embd=64)
    with pytest.raises(ValueError) as e:
        training.train_lm(model_dir=run, data_dir=data_dir, config=wider, steps=4, **KW)
    assert "was started with config.n_embd=32, now 64; pass --restart" in _one_line(e.value)
    # a model_dir from before run_config.json: orbax's tree diff becomes one line too
    os.remove(os.path.join(run, "run_config.json"))
    with pytest.raises(ValueError) as e:
        training.train_lm(model_dir=run, data_dir=data_dir, config=wider, steps=4, **KW)
    assert "holds a step-2 checkpoint of another model" in _one_line(e.value)
    del e
    gc.collect()  # orbax's unawaited coroutine is reported here, not in the next test


def test_finished_run_rerun_says_done_and_writes_no_nan(killed_run, data_dir, tmp_path, capsys):
    run = _copy(killed_run, tmp_path)
    training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=4, **KW)  # finishes
    log = os.path.join(run, "train_log.json")
    before = open(log).read()
    _stale_lock(os.path.join(run, DIR_LOCK))  # a writer killed -9 left its lock: taken over
    capsys.readouterr()
    training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=4,
                      **dict(KW, quiet=False))
    assert f"all 4 steps were already done in {run}" in capsys.readouterr().out
    assert open(log).read() == before  # no record of a session that ran no step

    def no_constants(name):
        raise AssertionError(f"{name} in train_log.json")
    records = [json.loads(line, parse_constant=no_constants) for line in open(log)]
    assert [(r["start_step"], r["end_step"]) for r in records] == [(0, 2), (2, 4)]
    assert all(r["run"]["learning_rate"] == 1e-2 and r["run"]["batch_size"] == 8
               and r["run"]["config"]["n_embd"] == 32 for r in records)
    assert not os.path.exists(os.path.join(run, DIR_LOCK))
    assert st.load_checkpoint(os.path.join(run, "hf")).config.n_embd == 32


def test_second_writer_on_a_model_dir_is_refused(killed_run, data_dir, tmp_path):
    run = _copy(killed_run, tmp_path)
    holder = _holder(os.path.join(run, DIR_LOCK))
    try:
        with pytest.raises(ValueError) as e:
            training.train_lm(model_dir=run, data_dir=data_dir, config=TINY, steps=4, **KW)
    finally:
        holder.kill()
        holder.wait()
    assert _one_line(e.value).startswith(
        f"{run} is being written by pid {holder.pid} on host {socket.gethostname()} since ")
    assert _one_line(e.value).endswith("; wait for it or use another directory")
    assert sorted(os.listdir(os.path.join(run, "checkpoints"))) == ["2"]


def test_second_writer_on_a_decode_output_is_refused(killed_run, data_dir, tmp_path):
    prompts = tmp_path / "in.txt"
    prompts.write_text("def f(x):\n")
    out = str(tmp_path / "out.jsonl")
    lock = Lock(out + ".lock", out, "--output").acquire()  # this process writes it
    try:
        with pytest.raises(SystemExit) as e:
            cli.main(["decode", "--target", killed_run, "--vocab", os.path.join(data_dir, "bpe"),
                      "--input_file", str(prompts), "--output", out])
    finally:
        lock.release()
    assert _one_line(e.value).startswith(f"error: {out} is being written by pid {os.getpid()} "
                                         f"on host {socket.gethostname()} since ")
    assert str(e.value).endswith("; wait for it or use another --output")
    assert not os.path.exists(out) and not os.path.exists(out + ".lock")


def test_two_driver_runs_on_one_output_dir(tmp_path):
    """The second of two alpha_table runs started on one --output_dir is refused at once;
    a changed cell config on a resumed directory is refused (it was before this issue too),
    and --restart moves the old results aside; a dead run's lock is taken over."""
    spm = train_sentencepiece(str(tmp_path))
    target = str(tmp_path / "target")  # its own draft: alpha is still measured
    st.save_checkpoint(st.init_model(tiny_config(num_encoder_layers=1, num_decoder_layers=1)),
                       target)
    tsv = tmp_path / "in.tsv"
    tsv.write_text("the quick fox\tder schnelle fuchs\nseven small birds\tsieben voegel\n")
    cell = tmp_path / "file_t0.gin"
    cell.write_text(f"""include 'runs/paper.gin'
include 'tasks/text_file.gin'
include 'decoding/speculative_greedy.gin'
TARGET_CHECKPOINT = '{target}'
DRAFT_CHECKPOINT = '{target}'
VOCABULARY = '{spm}'
INPUT_FILE = '{tsv}'
DTYPE = 'float32'
TARGET_LENGTH = 4
""")
    out = str(tmp_path / "runs")
    args = ["alpha_table", "--cell", str(cell), "--output_dir", out, "--quiet",
            "--gin.alpha_cell.batch_size=2"]
    os.makedirs(out)
    holder = _holder(os.path.join(out, DIR_LOCK))
    try:
        with pytest.raises(SystemExit) as e:
            cli.main(args)
    finally:
        holder.kill()
        holder.wait()
    assert _one_line(e.value).startswith(f"error: {out} is being written by pid {holder.pid}")
    assert os.listdir(out) == [DIR_LOCK]  # nothing written: the dead holder's file is left
    assert cli.main(args) == 0            # ... and taken over
    jsonl = os.path.join(out, "file_t0", "examples.jsonl")
    records = open(jsonl).read()
    assert records.count('"id"') == 2 and not os.path.exists(os.path.join(out, DIR_LOCK))
    with pytest.raises(SystemExit) as e:
        cli.main(args + ["--gin.SEED=1"])
    assert "different config" in _one_line(e.value) and "seed = 1" in str(e.value).lower()
    assert open(jsonl).read() == records
    assert cli.main(args + ["--gin.SEED=1", "--restart"]) == 0
    [aside] = [n for n in os.listdir(out) if n.startswith("before_restart_")]
    assert open(os.path.join(out, aside, "file_t0", "examples.jsonl")).read() == records
    assert {"summary.csv", "config.gin"} <= set(os.listdir(os.path.join(out, aside)))
    assert "seed = 1" in open(os.path.join(out, "file_t0", "config.gin")).read().lower()
    assert open(jsonl).read().count('"id"') == 2
    with pytest.raises(ValueError, match=r"is being written by pid \d+ on host"):
        with Lock(os.path.join(out, DIR_LOCK), out).acquire():
            drivers.run("alpha_table", [str(cell)], out, quiet=True)
