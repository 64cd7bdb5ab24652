"""The GPT-2 path of the command line: `decode --prompt` and `--input_file` on Hugging Face
GPT-2 directories with their own tokenizer files, checked against transformers'
GPT2LMHeadModel.generate (the independent reference) on the same directories; the GPT-2
demo end to end on a tiny pair; and the errors a user meets first."""
import json
import os
import re
import shutil

import numpy as np
import pytest

import speculative_t5 as st
from speculative_t5 import commands as cli
from speculative_t5.data.bpe import BPEVocabulary, train_bpe
from helpers import tiny_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["def add(a, b):\n    ", "import os\n\n\ndef read(path):\n    with open(path) as f:\n",
           "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, x):\n"]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """A tiny random GPT-2 target and its 1-layer draft (the target's first block), saved as
    Hugging Face directories, each with a BPE vocabulary trained here on stdlib source."""
    root = tmp_path_factory.mktemp("gpt2_cli")
    import json as json_module
    texts = [open(json_module.__file__).read(), open(os.__file__).read()]
    vocab = train_bpe(texts, str(root / "vocab"), 400)
    config = st.GPT2Config(vocab_size=vocab.size, n_positions=128, n_embd=32, n_layer=3,
                           n_head=4, eos_id=vocab.eos_id, pad_id=vocab.eos_id)
    target = st.init_model(config, seed=1)
    draft = st.Model(config.replace(n_layer=1),
                     {k: v for k, v in target.params.items() if k not in ("h_1", "h_2")})
    out = {}
    for name, model in (("target", target), ("draft", draft)):
        st.export_hf(model, str(root / name))
        for f in vocab.files:
            shutil.copy(f, root / name)
        out[name] = str(root / name)
    out["root"] = root
    return out


def _reference(path: str, prompt: str, n: int):
    """transformers' greedy continuation of `prompt` (token ids) from the directory."""
    vocab = BPEVocabulary(path)
    ids = vocab.encode(prompt)
    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=n,
                          eos_token_id=vocab.eos_id, pad_token_id=vocab.eos_id)
    return out[0, len(ids):].tolist()


def test_prompt_prints_continuation_and_passes(dirs, capsys):
    assert cli.main(["decode", "--target", dirs["target"], "--draft", dirs["draft"],
                     "--prompt", PROMPTS[0], "--gamma", "4", "--max_new_tokens", "20"]) == 0
    text, line = capsys.readouterr().out.rstrip("\n").rsplit("\n", 1)
    m = re.fullmatch(r"(\d+) tokens in (\d+) target passes \(plain: (\d+)\), "
                     r"identical to plain greedy: yes", line)
    assert m, line
    ref = _reference(dirs["target"], PROMPTS[0], 20)
    vocab = BPEVocabulary(dirs["target"])
    assert int(m.group(1)) == len(ref) and text == vocab.decode(ref)
    assert int(m.group(2)) < int(m.group(3)) == len(ref)  # fewer target passes than tokens


@pytest.mark.slow  # ~16 s; greedy against transformers stays in test_gpt2_generate
def test_input_file_matches_transformers(dirs, tmp_path):
    """Prompts of different lengths, two to a batch (so rows are padded differently): each
    record's tokens are transformers' greedy continuation; T = 1 with block verification
    runs through the same path and records the prompt text."""
    inputs = tmp_path / "prompts.txt"
    lines = [p.replace("\n", "\\n") for p in PROMPTS]  # one a line: newlines spelled out
    inputs.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    assert cli.main(["decode", "--target", dirs["target"], "--draft", dirs["draft"],
                     "--input_file", str(inputs), "--output", str(out), "--gamma", "3",
                     "--batch_size", "2", "--max_new_tokens", "16"]) == 0
    with open(out) as f:
        records = [json.loads(line) for line in f][1:]
    assert len(records) == 3
    for rec, text in zip(records, lines):
        assert rec["input"] == text
        assert rec["tokens"] == _reference(dirs["target"], text, 16)
    sampled = tmp_path / "t1.jsonl"
    assert cli.main(["decode", "--target", dirs["target"], "--draft", dirs["draft"],
                     "--input_file", str(inputs), "--output", str(sampled), "--temperature", "1",
                     "--verification", "block", "--max_new_tokens", "16"]) == 0
    with open(sampled) as f:
        header, *records = [json.loads(line) for line in f]
    assert header["speculative_t5"]["header"]["verification"] == "block"
    assert all(0 < r["length"] <= 16 for r in records)


def test_errors(dirs, tmp_path):
    bare = tmp_path / "bare"
    shutil.copytree(dirs["target"], bare)
    os.remove(bare / "merges.txt")
    with pytest.raises(SystemExit, match="no vocabulary.*vocab.json"):
        cli.main(["decode", "--target", str(bare), "--prompt", "x = 1"])
    with pytest.raises(SystemExit, match=r"exceeds the model's 128 positions"):
        cli.main(["decode", "--target", dirs["target"], "--prompt", "x = 1\n" * 60,
                  "--max_new_tokens", "40"])
    t5 = tmp_path / "t5"
    st.export_hf(st.init_model(tiny_config()), str(t5))
    with pytest.raises(SystemExit, match="one family"):
        cli.main(["decode", "--target", dirs["target"], "--draft", str(t5), "--prompt", "x = 1"])
    with pytest.raises(SystemExit, match="--input_file.*or --prompt, not both"):
        cli.main(["decode", "--target", dirs["target"], "--prompt", "x", "--input_file",
                  str(tmp_path / "in.txt")])
    with pytest.raises(SystemExit, match="needs --input_file and --output, or --prompt"):
        cli.main(["decode", "--target", dirs["target"]])
    # two lengths that disagree, even when one of them is the default's value
    for other in ("64", "8"):
        with pytest.raises(SystemExit, match=f"max_new_tokens or max_decode_len, not both "
                                             f"\\(got 16 and {other}\\)"):
            cli.main(["decode", "--target", dirs["target"], "--prompt", "x = 1",
                      "--max_new_tokens", "16", "--max_decode_len", other])


@pytest.mark.slow
def test_demo_gpt2_runs_on_a_pair(dirs, tmp_path):
    """`demo --family gpt2` with --target/--draft: every file written, the summary's numbers
    consistent with its own records (greedy identical to plain, tokens per call in range)."""
    out = tmp_path / "demo"
    cli.main(["demo", "--family", "gpt2", "--target", dirs["target"], "--draft", dirs["draft"],
              "--output_dir", str(out), "--num_examples", "3", "--gamma", "3",
              "--gin.demo.timing_rounds=2"])
    with open(out / "summary.json") as f:
        s = json.load(f)
    for name in ("report.md", "tokens_per_call.png"):
        assert (out / name).exists()
    assert s["family"] == "gpt2" and s["num_examples"] == 3
    g = s["greedy"]
    assert g["identical_fraction"] == 1.0
    assert 1.0 <= g["tokens_per_target_call"] <= 4.0 and 0.0 <= g["alpha"] <= 1.0
    assert sum(g["tokens_per_call_histogram"]) > 0
    assert s["sampled"]["speedup_measured"] > 0 and np.isfinite(g["speedup_predicted_full"])
