"""Resumable run directories: a killed run restarted with the same command loses no
example and counts none twice."""
import json

import gin
import pytest

from speculative_t5.paper.rundir import RunDir


class Killed(Exception):
    pass


def test_kill_and_resume_no_duplicates_no_gaps(tmp_path):
    calls, kill_at = [], {"n": 5}

    def work(x):
        calls.append(x)
        if len(calls) == kill_at["n"]:
            raise Killed()
        return {"square": x * x}

    items = [(f"ex{i}", i) for i in range(12)]
    with pytest.raises(Killed):
        RunDir(str(tmp_path)).run(items, work)
    kill_at["n"] = None
    # a kill in the middle of a write leaves a torn last line
    with open(tmp_path / "examples.jsonl", "a") as f:
        f.write('{"id": "ex4", "squ')
    records = RunDir(str(tmp_path)).run(items, work)
    ids = [r["id"] for r in records]
    assert sorted(ids) == sorted(i for i, _ in items) and len(set(ids)) == len(ids)
    assert all(r["square"] == int(r["id"][2:]) ** 2 for r in records)
    assert calls == [0, 1, 2, 3, 4] + list(range(4, 12))  # only the interrupted one redone


def test_duplicate_and_corrupt_records_are_errors(tmp_path):
    rd = RunDir(str(tmp_path))
    rd.append({"id": 1, "v": 2})
    with pytest.raises(ValueError, match="already"):
        rd.append({"id": 1, "v": 3})
    with pytest.raises(ValueError, match="needs an 'id'"):
        rd.append({"v": 3})
    with open(tmp_path / "examples.jsonl", "a") as f:
        f.write("garbage\n" + json.dumps({"id": 2}) + "\n")
    with pytest.raises(ValueError, match="corrupt record 2"):
        RunDir(str(tmp_path))


def test_summary_config_environment(tmp_path):
    rd = RunDir(str(tmp_path))
    rd.write_summary([{"task": "wmt", "alpha": 0.7512, "gamma": 7}, {"task": "cnn", "alpha": 0.65}])
    assert open(tmp_path / "summary.csv").read().splitlines()[0] == "task,alpha,gamma"
    md = open(tmp_path / "summary.md").read()
    assert "| wmt | 0.751 | 7 |" in md and "| cnn | 0.650 |  |" in md
    gin.clear_config()
    gin.parse_config("T5Config.emb_dim = 64")
    try:
        assert "emb_dim = 64" in open(rd.write_config()).read()
    finally:
        gin.clear_config()
    env = rd.write_environment()
    assert env["jax"] and env["processor"]
    with pytest.raises(ValueError, match="no summary rows"):
        rd.write_summary([])
