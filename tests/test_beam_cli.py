"""`speculative-t5 decode --beam_size`: records hold st.beam_search's best beam and its
--beam_outputs best beams; with --draft (a checkpoint) the speculative beam search writes the
same beams (scores to float rounding); a resume with other beam settings and every option beam search has no use for
are refused in one line, before anything is loaded. One compiled shape throughout (batch 2,
inputs padded to 16, max_decode_len 8, 2 beams)."""
import json

import numpy as np
import pytest

import speculative_t5 as st
from helpers import tiny_decode_pair
from speculative_t5 import commands as cli
from speculative_t5.data import pad_rows, pad_to

LINES = ["the quick brown fox", "seven small birds sing", "a lazy dog"]  # 3: a padded row


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("beam_cli")
    hf, draft, spm_path = tiny_decode_pair(d)  # an HF target carrying its vocabulary
    inputs = d / "inputs.txt"
    inputs.write_text("\n".join(LINES) + "\n")
    (d / "table.npz").write_bytes(b"")            # a bigram spec's file (refused unread)
    base = ["decode", "--target", hf, "--input_file", str(inputs), "--batch_size", "2",
            "--max_decode_len", "8"]
    return dict(dir=d, spm=spm_path, hf=hf, draft=draft, base=base)


def _read(path):
    with open(path) as f:
        header, *lines = f.read().splitlines()
    return json.loads(header)["speculative_t5"]["header"], [json.loads(x) for x in lines]


@pytest.fixture(scope="module")
def decoded(setup):
    """(plain header, plain records, speculative header, speculative records, summaries)."""
    d, base = setup["dir"], setup["base"]
    plain, spec = str(d / "plain.jsonl"), str(d / "spec.jsonl")
    summaries = [cli.main(base + ["--output", plain, "--beam_size", "2", "--beam_outputs", "2"]),
                 cli.main(base + ["--output", spec, "--draft", setup["draft"], "--gamma", "3",
                                  "--gin.decode.beam_size=2", "--gin.decode.beam_outputs=2",
                                  "--beam_paths", "3"])]
    assert summaries == [0, 0]
    return (*_read(plain), *_read(spec))


def test_beam_records_are_st_beam_search(setup, decoded):
    """The best beam and both beams (tokens, scores) are st.beam_search's on the same
    encoded, padded inputs; beams best first; output the decoded best beam."""
    header, records = decoded[0], decoded[1]
    assert (header["beam_size"], header["alpha"], header["beam_outputs"]) == (2, 0.6, 2)
    assert header["beam_paths"] is None and header["verification"] is None
    vocab = st.data.Vocabulary(setup["spm"])
    encoded = [vocab.encode(line) for line in LINES]
    target = st.load_checkpoint(setup["hf"])
    want = []
    for i in range(0, len(LINES), 2):
        chunk = encoded[i:i + 2]
        out = st.beam_search(target, pad_rows(pad_to(chunk, 16), 2), beam_size=2, alpha=0.6,
                             max_decode_len=8)
        for row in range(len(chunk)):
            want.append([(out.tokens[row, k, :out.lengths[row, k]].tolist(),
                          float(out.scores[row, k])) for k in range(2)])
    assert [r["index"] for r in records] == [0, 1, 2]
    for r, beams in zip(records, want):
        assert [(b["tokens"], b["score"]) for b in r["beams"]] == beams
        assert r["tokens"] == beams[0][0] and r["score"] == beams[0][1]
        assert r["length"] == len(r["tokens"]) and r["output"] == vocab.decode(r["tokens"])
        assert [b["output"] for b in r["beams"]] == [vocab.decode(t) for t, _ in beams]
        assert r["beams"][0]["score"] >= r["beams"][1]["score"]
        assert r["stats"]["target_calls"] == r["stats"]["beam_steps"] >= 1 and r["exact"]


def test_speculative_beam_records_equal_plain(setup, decoded, capsys):
    """--draft CHECKPOINT: the same beams and scores, fewer or as many target calls as beam
    steps, the draft's settings in the header; a rerun resumes with nothing to do, and one
    with another --beam_size is refused in one line, the file untouched."""
    _, plain, header, spec = decoded
    assert (header["beam_size"], header["beam_paths"], header["gamma"]) == (2, 3, 3)
    key = lambda r: (r["output"], r["tokens"], r["length"],  # noqa: E731
                     [(b["output"], b["tokens"]) for b in r["beams"]])
    assert [key(r) for r in spec] == [key(r) for r in plain]
    # scores to float rounding: the target scores gamma + 1 tokens a call, not one
    np.testing.assert_allclose([[b["score"] for b in r["beams"]] for r in spec],
                               [[b["score"] for b in r["beams"]] for r in plain], atol=1e-5, rtol=0)
    for r in spec:
        s = r["stats"]
        assert 1 <= s["target_calls"] <= s["beam_steps"] and r["score"] == r["beams"][0]["score"]
        assert s["draft_calls"] == 3 * s["target_calls"] and len(s["steps_per_call_hist"]) == 5
        assert sum(s["steps_per_call_hist"]) == s["target_calls"]
    out = str(setup["dir"] / "spec.jsonl")
    args = setup["base"] + ["--output", out, "--draft", setup["draft"], "--gamma", "3",
                            "--beam_outputs", "2", "--beam_paths", "3"]
    capsys.readouterr()
    assert cli.main(args + ["--beam_size", "2"]) == 0  # resumed: every record done
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["skipped"] == 3 and summary["examples"] == 0
    assert "beam_steps_per_target_call" in summary
    before = open(out).read()
    with pytest.raises(SystemExit, match=r"holds another run.*beam_size: 2 -> 3") as e:
        cli.main(args + ["--beam_size", "3"])
    assert "\n" not in str(e.value) and open(out).read() == before


def test_beam_summary_and_prompt(setup, decoded, capsys, tmp_path):
    """The summary line's beam totals; --prompt prints the best beam and its passes."""
    capsys.readouterr()
    out = str(tmp_path / "one.jsonl")
    assert cli.main(setup["base"] + ["--output", out, "--beam_size", "2"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    records = _read(out)[1]
    assert [r["beams"] for r in records] == [r["beams"][:1] for r in decoded[1]]
    assert summary["beam_steps_per_target_call"] == 1.0 and summary["examples"] == 3
    assert summary["target_calls"] == sum(r["stats"]["target_calls"] for r in records)
    assert summary["tokens"] == sum(r["length"] for r in records)
    assert cli.main(["decode", "--target", setup["hf"], "--prompt", LINES[0], "--beam_size",
                     "2", "--max_decode_len", "8"]) == 0
    text, line = capsys.readouterr().out.strip().splitlines()[-2:]
    vocab = st.data.Vocabulary(setup["spm"])
    one = st.beam_search(st.load_checkpoint(setup["hf"]), pad_to([vocab.encode(LINES[0])], 16),
                         beam_size=2, max_decode_len=8)  # batch 1: its own termination test
    assert text == vocab.decode(one.tokens[0, 0, :one.lengths[0, 0]].tolist())
    steps = int(one.stats["beam_steps"][0])
    assert line == f"{steps} beam steps in {steps} target passes"


BEAM = ["--beam_size", "2"]
REFUSED = [
    (BEAM + ["--temperature", "0.5"], "temperature 0.5 does not apply to beam search"),
    (BEAM + ["--top_k", "5"], "top_k 5 does not apply"),
    (BEAM + ["--top_p", "0.9"], "top_p 0.9 does not apply"),
    (BEAM + ["--lenience", "0.5"], "lenience 0.5 does not apply"),
    (BEAM + ["--verification", "block"], "verification 'block' does not apply"),
    (BEAM + ["--draft", "DRAFT", "--draft_stop", "0.5"], "draft_stop 0.5 does not apply"),
    (BEAM + ["--draft", "DRAFT", "--adaptive_gamma"], "adaptive_gamma does not apply"),
    (BEAM + ["--draft", "prompt_lookup"], "draft must be a model checkpoint"),
    (BEAM + ["--draft", "bigram:TABLE"], "draft must be a model checkpoint"),
    (BEAM + ["--draft", "prompt_lookup,DRAFT"], "draft must be a model checkpoint"),
    (["--beam_size", "0"], "beam_size must be an int >= 1"),
    (BEAM + ["--alpha", "-1"], "alpha must be a number >= 0"),
    (BEAM + ["--beam_outputs", "3"], r"beam_outputs must be an int in 1..beam_size \(2\)"),
    (BEAM + ["--beam_outputs", "0"], "beam_outputs must be an int in 1"),
    (BEAM + ["--beam_paths", "4"], "beam_paths is for a speculative beam search"),
    (BEAM + ["--draft", "DRAFT", "--beam_paths", "1"], "beam_paths must be an int >= 2"),
    (["--beam_outputs", "2"], "beam_outputs is a beam search option: give --beam_size"),
    (["--alpha", "1.0"], "alpha is a beam search option"),
    (["--beam_paths", "4", "--draft", "DRAFT"], "beam_paths is a beam search option"),
]


@pytest.mark.parametrize("args,match", REFUSED, ids=[" ".join(a) for a, _ in REFUSED])
def test_refused_in_one_line_before_loading(setup, tmp_path, args, match):
    paths = {"DRAFT": setup["draft"], "bigram:TABLE": f"bigram:{setup['dir'] / 'table.npz'}",
             "prompt_lookup,DRAFT": f"prompt_lookup,{setup['draft']}"}
    out = tmp_path / "o.jsonl"
    with pytest.raises(SystemExit, match=match) as e:
        cli.main(setup["base"] + ["--output", str(out)] + [paths.get(a, a) for a in args])
    assert "\n" not in str(e.value) and not out.exists()
