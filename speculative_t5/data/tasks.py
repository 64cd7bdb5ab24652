"""seqio Tasks for the paper's two T5 settings, over tfds, with their metrics.

  wmt_ende        wmt_t2t_translate/de-en, inputs "translate English to German: " + en,
                  targets de, BLEU (sacrebleu)
  cnn_dailymail   cnn_dailymail, inputs "summarize: " + article, targets highlights,
                  ROUGE-1/2/Lsum (rouge-score)

The vocabulary is a path (T5's public SentencePiece model by default; any T5-style model
with pad 0 / eos 1 works), the tfds data dir a flag, so the same code reads real data on a
TPU VM and `tfds.testing.mock_data` here. Needs the `data` extra (seqio, tfds, sacrebleu,
rouge-score).
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

import gin

DEFAULT_VOCAB = "gs://t5-data/vocabs/cc_all.32000.100extra/sentencepiece.model"
TASKS = {
    "wmt_ende": dict(tfds="wmt_t2t_translate/de-en:1.0.0", prefix="translate English to German: ",
                     source="en", target="de", metric="bleu"),
    "cnn_dailymail": dict(tfds="cnn_dailymail:3.4.0", prefix="summarize: ", source="article",
                          target="highlights", metric="rouge"),
}


def bleu(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
    """Corpus BLEU (sacrebleu, 13a tokenizer, exp smoothing), as T5's metric reports it."""
    import sacrebleu
    return {"bleu": sacrebleu.corpus_bleu(list(predictions), [list(targets)],
                                          smooth_method="exp", tokenize="13a").score}


def rouge(targets: Sequence[str], predictions: Sequence[str]) -> Dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-Lsum F-measure x 100 (rouge-score, stemmed). The plain
    mean, not T5's bootstrap midpoint: resampling would give identical outputs different
    scores from run to run."""
    from rouge_score import rouge_scorer
    keys = ("rouge1", "rouge2", "rougeLsum")
    scorer = rouge_scorer.RougeScorer(keys, use_stemmer=True)
    totals = dict.fromkeys(keys, 0.0)
    for t, p in zip(targets, predictions):
        # rougeLsum splits summaries into sentences on newlines
        scores = scorer.score(t.replace(" . ", " .\n"), p.replace(" . ", " .\n"))
        for k in keys:
            totals[k] += scores[k].fmeasure
    return {k: 100 * v / max(len(targets), 1) for k, v in totals.items()}


METRICS = {"bleu": bleu, "rouge": rouge}


def _prefixed(prefix: str, source: str, target: str):
    import tensorflow as tf

    def fn(ds):
        return ds.map(lambda ex: {"inputs": tf.strings.join([prefix, ex[source]]),
                                  "targets": ex[target]},
                      num_parallel_calls=tf.data.AUTOTUNE)
    return fn


@gin.configurable
def get_task(name: str, vocab_path: str = DEFAULT_VOCAB, tfds_data_dir: Optional[str] = None):
    """The seqio.Task for `name` ('wmt_ende' or 'cnn_dailymail'), registered (replacing any
    earlier registration) as 'speculative_t5_<name>'."""
    import seqio
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known: {', '.join(TASKS)}")
    spec = TASKS[name]
    vocab = seqio.SentencePieceVocabulary(vocab_path)
    features = {k: seqio.Feature(vocabulary=vocab, add_eos=True) for k in ("inputs", "targets")}
    registered = f"speculative_t5_{name}"
    if registered in seqio.TaskRegistry.names():
        seqio.TaskRegistry.remove(registered)
    return seqio.TaskRegistry.add(
        registered,
        source=seqio.TfdsDataSource(tfds_name=spec["tfds"], tfds_data_dir=tfds_data_dir,
                                    splits=("train", "validation", "test")),
        preprocessors=[_prefixed(spec["prefix"], spec["source"], spec["target"]),
                       seqio.preprocessors.tokenize, seqio.preprocessors.append_eos_after_trim],
        output_features=features,
        metric_fns=[METRICS[spec["metric"]]])


def examples(name: str, split: str = "validation", num: Optional[int] = None,
             input_len: int = 512, target_len: int = 128, vocab_path: str = DEFAULT_VOCAB,
             tfds_data_dir: Optional[str] = None):
    """[{'inputs': int32 ids (EOS-terminated, truncated), 'targets': ids,
    'inputs_pretokenized': str, 'targets_pretokenized': str}] in file order."""
    task = get_task(name, vocab_path, tfds_data_dir)
    ds = task.get_dataset({"inputs": input_len, "targets": target_len}, split=split,
                          shuffle=False, try_in_mem_cache=False)
    if num is not None:
        ds = ds.take(num)
    out = []
    for ex in ds.as_numpy_iterator():
        out.append({"inputs": ex["inputs"], "targets": ex["targets"],
                    "inputs_pretokenized": ex["inputs_pretokenized"].decode("utf-8"),
                    "targets_pretokenized": ex["targets_pretokenized"].decode("utf-8")})
    return out
