"""`speculative-t5 decode`: text/TSV in, JSONL out, greedy speculative == plain, resume."""
import json
import os

import pytest

import speculative_t5 as st
from helpers import tiny_config, tiny_decode_pair
from speculative_t5 import commands as cli


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    d = tmp_path_factory.mktemp("decode")
    hf, draft, spm_path = tiny_decode_pair(d)  # an HF target carrying its vocabulary
    inputs = d / "inputs.tsv"
    lines = ["the quick brown fox\tder fox", "seven small birds sing", "a lazy dog",
             "translate english to german: the data", "summarize this text about models"]
    inputs.write_text("\n".join(lines) + "\n")
    return dict(dir=d, spm=spm_path, hf=hf, draft=draft, inputs=str(inputs), n=len(lines))


def _read(path):
    """The records after the header line that names the run."""
    with open(path) as f:
        header, *lines = f.read().splitlines()
    assert json.loads(header)["speculative_t5"]["header"]["target"]["fingerprint"]
    return [json.loads(line) for line in lines]


def test_decode_plain_and_speculative(setup, capsys):
    d = setup["dir"]
    plain, spec = str(d / "plain.jsonl"), str(d / "spec.jsonl")
    assert cli.main(["decode", "--target", setup["hf"], "--input_file", setup["inputs"],
                     "--output", plain, "--max_decode_len", "12", "--batch_size", "2"]) == 0
    assert cli.main(["decode", "--target", setup["hf"], "--draft", setup["draft"],
                     "--input_file", setup["inputs"], "--output", spec, "--batch_size", "4",
                     "--gin.decode.max_decode_len=12", "--gin.decode.gamma=3"]) == 0
    a, b = _read(plain), _read(spec)
    assert [r["index"] for r in a] == list(range(setup["n"]))
    assert [r["index"] for r in b] == list(range(setup["n"]))
    vocab = st.data.Vocabulary(setup["spm"])
    for ra, rb in zip(a, b):
        assert ra["tokens"] == rb["tokens"] and ra["output"] == rb["output"]
        assert ra["output"] == vocab.decode(ra["tokens"]) and 1 <= ra["length"] <= 12
        assert ra["stats"]["target_calls"] == ra["length"]
        assert rb["stats"]["draft_calls"] == 3 * rb["stats"]["target_calls"]
        assert sum((i + 1) * c for i, c in enumerate(rb["stats"]["tokens_per_call_hist"])) == rb["length"]
    assert a[0]["reference"] == "der fox" and "reference" not in a[1]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["examples"] == setup["n"] and summary["exact"]


def test_decode_resumes_without_duplicates(setup):
    out = str(setup["dir"] / "resume.jsonl")
    args = ["decode", "--target", setup["hf"], "--input_file", setup["inputs"], "--output", out,
            "--max_decode_len", "8", "--batch_size", "2", "--temperature", "1.0"]
    assert cli.main(args) == 0
    full = _read(out)
    with open(out) as f:
        lines = f.read().splitlines(keepends=True)
    with open(out, "w") as f:  # as if killed while writing the third record
        f.writelines(lines[:3])
        f.write(lines[3][:15])
    assert cli.main(args) == 0
    again = _read(out)
    assert sorted(r["index"] for r in again) == list(range(setup["n"]))
    # sampling is keyed by example, so the resumed run reproduces the same records
    assert {r["index"]: r["tokens"] for r in again} == {r["index"]: r["tokens"] for r in full}


def test_decode_errors(setup, tmp_path):
    base = ["decode", "--target", setup["hf"], "--input_file", setup["inputs"],
            "--output", str(tmp_path / "o.jsonl")]
    with pytest.raises(SystemExit, match="max_input_len 3"):
        cli.main(base + ["--max_input_len", "3"])
    with pytest.raises(SystemExit, match="vocabulary"):
        cli.main(["decode", "--target", setup["draft"], "--input_file", setup["inputs"],
                  "--output", str(tmp_path / "o.jsonl")])
    bad = tmp_path / "bad.txt"
    bad.write_text("one\n\nthree\n")
    with pytest.raises(SystemExit, match="bad.txt:2: empty line"):
        cli.main(base[:3] + ["--input_file", str(bad), "--output", str(tmp_path / "o2.jsonl")])
    with pytest.raises(SystemExit, match="gamma"):
        cli.main(base + ["--draft", setup["draft"], "--gamma", "0"])
    with pytest.raises(SystemExit, match="needs --target"):
        cli.main(["decode"])


@pytest.mark.slow
def test_decode_zero_cost_and_fallback_drafts(setup, tmp_path):
    """--draft prompt_lookup (no model) and 'prompt_lookup,DIR' (a fallback) with
    --draft_stop: greedy outputs identical to plain; the header names every part; a
    malformed spec or draft_stop without a model is a one-line error before any work."""
    base = ["decode", "--target", setup["hf"], "--input_file", setup["inputs"],
            "--max_decode_len", "12", "--batch_size", "4", "--gamma", "3"]
    plain, lookup, fb = (str(tmp_path / f"{n}.jsonl") for n in ("plain", "lookup", "fb"))
    assert cli.main(base + ["--output", plain]) == 0
    assert cli.main(base + ["--output", lookup, "--draft", "prompt_lookup:2"]) == 0
    assert cli.main(base + ["--output", fb, "--draft", f"prompt_lookup,{setup['draft']}",
                            "--draft_stop", "0.1", "--adaptive_gamma"]) == 0
    want = [r["tokens"] for r in _read(plain)]
    for path in (lookup, fb):
        records = _read(path)
        assert [r["tokens"] for r in records] == want
        for r in records:
            hist = r["stats"]["drafts_per_round_hist"]
            assert sum(hist) == r["stats"]["target_calls"] and len(hist) == 4
            assert r["stats"]["draft_calls"] == sum(i * c for i, c in enumerate(hist))
    with open(fb) as f:
        header = json.loads(f.readline())["speculative_t5"]["header"]
    first, then = header["draft"]
    assert first == {"kind": "prompt_lookup", "max_ngram": 3, "min_ngram": 1}
    assert then["path"] == os.path.abspath(setup["draft"]) and then["fingerprint"]
    assert header["draft_stop"] == 0.1 and header["adaptive_gamma"] is True
    with open(lookup) as f:
        assert json.loads(f.readline())["speculative_t5"]["header"]["draft"]["max_ngram"] == 2
    for spec, match in (("prompt_lookup:x", "MAX_NGRAM"), ("a,b,c", "at most two"),
                        ("prompt_lookup:0", "max_ngram must be an int >= 1")):
        with pytest.raises(SystemExit, match=match):
            cli.main(base + ["--output", str(tmp_path / "bad.jsonl"), "--draft", spec])
    with pytest.raises(SystemExit, match="adaptive_gamma needs --draft"):
        cli.main(base + ["--output", str(tmp_path / "bad.jsonl"), "--adaptive_gamma"])
    with pytest.raises(SystemExit, match="draft_stop needs a draft model"):
        cli.main(base + ["--output", str(tmp_path / "bad.jsonl"), "--draft", "prompt_lookup",
                         "--draft_stop", "0.5"])
    assert not os.path.exists(tmp_path / "bad.jsonl")


@pytest.mark.slow
def test_fit_bigram_then_decode_with_it(setup, tmp_path, capsys):
    """fit_bigram on a .tsv's references writes a table `--draft bigram:PATH` decodes with:
    greedy tokens identical to plain, the header naming the table."""
    table, out = str(tmp_path / "b.npz"), str(tmp_path / "bigram.jsonl")
    refs = tmp_path / "refs.tsv"
    refs.write_text("the quick brown fox\tder fox\na lazy dog\tdie data\nbirds\tder fox sing\n")
    assert cli.main(["fit_bigram", "--input_file", str(refs), "--target", setup["hf"],
                     "--output", table, "--top", "8"]) == 0
    assert "on 3 sequences" in capsys.readouterr().out
    b = st.drafts.Bigram.load(table)
    assert b.vocab_size == tiny_config().vocab_size and b.successors.shape[1] == 8
    base = ["decode", "--target", setup["hf"], "--input_file", setup["inputs"],
            "--max_decode_len", "12", "--batch_size", "4", "--gamma", "3"]
    plain = str(tmp_path / "plain.jsonl")
    assert cli.main(base + ["--output", plain]) == 0
    assert cli.main(base + ["--output", out, "--draft", f"bigram:{table}"]) == 0
    assert [r["tokens"] for r in _read(out)] == [r["tokens"] for r in _read(plain)]
    with open(out) as f:
        draft = json.loads(f.readline())["speculative_t5"]["header"]["draft"]
    assert draft["kind"] == "bigram" and draft["path"] == table and draft["fingerprint"]
    # a .tsv line without a reference cannot be fitted on
    with pytest.raises(SystemExit, match="needs a reference after its tab"):
        cli.main(["fit_bigram", "--input_file", setup["inputs"],
                  "--target", setup["hf"], "--output", str(tmp_path / "c.npz")])


def test_decode_tree(setup, tmp_path):
    """--tree: greedy records equal plain ones, the run names its tree (a resumed run with
    another tree is refused), and what a tree cannot combine with is refused in one line."""
    plain, tree = str(tmp_path / "plain.jsonl"), str(tmp_path / "tree.jsonl")
    base = ["decode", "--target", setup["hf"], "--input_file", setup["inputs"],
            "--max_decode_len", "12", "--batch_size", "4"]
    assert cli.main(base + ["--output", plain]) == 0
    assert cli.main(base + ["--output", tree, "--draft", setup["draft"], "--tree", "2,2,1"]) == 0
    a, b = _read(plain), _read(tree)
    assert [r["tokens"] for r in a] == [r["tokens"] for r in b]
    with open(tree) as f:
        assert json.loads(f.readline())["speculative_t5"]["header"]["tree"] == [2, 2, 1]
    with pytest.raises(SystemExit, match="tree"):
        cli.main(base + ["--output", tree, "--draft", setup["draft"], "--tree", "3,1"])
    for extra, message in ((["--tree", "2,x"], "--tree must be children per depth"),
                           (["--tree", "2,0"], "tree must be"),
                           (["--tree", "2,1", "--tree_children", "best"], "tree_children must be"),
                           (["--tree", "2,1", "--verification", "block"], "chain-only"),
                           (["--tree", "2,1", "--beam_size", "2"], "beam_size"),
                           (["--tree", "2,1", "--draft", "prompt_lookup"], "tree needs a draft model")):
        out = str(tmp_path / "bad.jsonl")
        draft = [] if "--draft" in extra else ["--draft", setup["draft"]]
        with pytest.raises(SystemExit, match=message):
            cli.main(base + ["--output", out, *draft, *extra])
        assert not os.path.exists(out)
