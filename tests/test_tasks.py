"""seqio tasks under tfds.testing.mock_data, with a SentencePiece model trained in the test."""
import numpy as np
import pytest

from helpers import train_sentencepiece

import tensorflow_datasets as tfds

from speculative_t5.data import tasks


@pytest.fixture(scope="module")
def spm(tmp_path_factory):
    return train_sentencepiece(str(tmp_path_factory.mktemp("spm")), vocab_size=48)


@pytest.mark.parametrize("name,prefix", [("wmt_ende", "translate English to German: "),
                                         ("cnn_dailymail", "summarize: ")])
def test_task_yields_prefixed_tokenized_examples(spm, name, prefix):
    import seqio
    with tfds.testing.mock_data(num_examples=6):
        exs = tasks.examples(name, split="validation", num=4, input_len=24, target_len=16,
                             vocab_path=spm)
    assert len(exs) == 4
    vocab = seqio.SentencePieceVocabulary(spm)
    for ex in exs:
        assert ex["inputs_pretokenized"].startswith(prefix)
        assert len(ex["inputs"]) <= 24 and len(ex["targets"]) <= 16
        assert ex["inputs"][-1] == 1 and ex["targets"][-1] == 1      # EOS, also after trimming
        assert (ex["inputs"][:-1] != 1).all() and (ex["inputs"] > 0).all()
        np.testing.assert_array_equal(
            ex["inputs"][:-1], vocab.encode(ex["inputs_pretokenized"])[:len(ex["inputs"]) - 1])
    assert len({ex["inputs_pretokenized"] for ex in exs}) == 4


def test_unknown_task_is_named(spm):
    with pytest.raises(ValueError, match="unknown task 'xsum'"):
        tasks.get_task("xsum", vocab_path=spm)


def test_metrics():
    assert tasks.bleu(["the cat sat on the mat"], ["the cat sat on the mat"])["bleu"] == pytest.approx(100)
    assert tasks.bleu(["the cat sat on the mat"], ["a dog ran"])["bleu"] < 10
    r = tasks.rouge(["the cat sat on the mat"], ["the cat sat on a mat"])
    assert set(r) == {"rouge1", "rouge2", "rougeLsum"}
    assert 70 < r["rouge1"] < 100 and r["rouge2"] < r["rouge1"]
    assert tasks.rouge(["a b c"], ["a b c"])["rougeLsum"] == pytest.approx(100)


def test_rouge_is_the_plain_mean_and_deterministic():
    refs = ["the cat sat on the mat", "a dog ran far away", "birds sing at dawn"]
    preds = ["the cat sat", "a dog ran home", "fish swim at night"]
    each = [tasks.rouge([r], [p]) for r, p in zip(refs, preds)]
    together = tasks.rouge(refs, preds)
    for k in ("rouge1", "rouge2", "rougeLsum"):
        assert together[k] == pytest.approx(np.mean([e[k] for e in each]))
    assert tasks.rouge(refs, preds) == together  # no resampling: identical outputs, identical scores
