"""A table cell of the paper's experiments: one target/draft pair on one task at one
sampling setting, read from a gin config (`configs/paper/*.gin`), with its examples.

A cell config includes `runs/paper.gin` (binds `paper_cell` to macros), a task block
(`tasks/wmt_ende.gin`, ...) and a decoding block (`decoding/speculative_greedy.gin`, ...),
and sets TARGET_CHECKPOINT, DRAFT_CHECKPOINT and GAMMA. Examples come from a seqio task
(`task_examples`), a text/TSV file (`file_examples`) or the demo corpus (`demo_examples`).
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple

import gin

import numpy as np

from speculative_t5.data import Vocabulary, bucket, pad_to, read_inputs, truncate
from speculative_t5.decoding import SamplingConfig
from speculative_t5.decoding.sampling import check_verification
from speculative_t5.decoding.trees import TreeShape
from speculative_t5.partitioning import Partitioner

Example = Dict[str, Any]  # {id, inputs: [int] (EOS-terminated), input_text, reference}


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    task: str
    target: str                   # checkpoint path (HF, T5X or native; gs:// works)
    draft: str                    # a draft spec (`checkpoints.load_draft`): a checkpoint
                                  # path, 'prompt_lookup[:MAX[:MIN]]' or 'prompt_lookup,PATH'
    draft_name: str               # the label in tables ('T5-small')
    vocabulary: str
    examples: Tuple[Example, ...]
    temperature: float
    top_k: int
    top_p: float
    gamma: int
    max_decode_len: int
    dtype: Optional[str]
    metric: Optional[str]         # 'bleu', 'rouge' or None (no references)
    seed: int
    paper: Dict[str, Optional[float]]  # the paper's own alpha / speedup for this cell
    input_width: Optional[int] = None  # pad every input to this; None: length buckets
    activation_dtype: Optional[str] = None  # None: the checkpoint's (float32)
    partitioner: Optional[Partitioner] = None  # gin: Partitioner.num_partitions = N
    verification: str = "token"   # or "block" (gin/decoding/block_verification.gin)
    beam_size: int = 0            # > 0: a beam-search cell (gin/decoding/beam_search.gin):
                                  # T5X's beam search vs the speculative one (`beam_walltime`)
    beam_alpha: float = 0.6       # beam search's length penalty exponent
    beam_paths: Optional[int] = None  # draft path rows per input (None: 4 * beam_size)
    adaptive_gamma: bool = False  # each round drafts 0..gamma (`st.generate(adaptive_gamma=)`)
    tree: Optional[Tuple[int, ...]] = None  # children per depth: a token tree a round
    tree_children: str = "drawn"  # or "top_k" (`st.generate(tree=, tree_children=)`)

    def width(self, example: Example) -> int:
        """The encoder width an example is decoded at: its length bucket (the next power of
        two >= 32, so batch 1 pays for the text, not padding), or the cell's fixed width
        (one compiled program per decoder, for runs where compiling costs more)."""
        return self.input_width or bucket(example["inputs"]).shape[1]

    def padded(self, examples: Sequence[Example], width: Optional[int] = None) -> np.ndarray:
        """int32 [len(examples), W]: the inputs 0-padded to `width` (default: the widest
        of their widths)."""
        width = width or max(self.width(e) for e in examples)
        return pad_to([e["inputs"] for e in examples], width)

    def load_models(self):
        """(target, draft, vocabulary), checked to fit together. The draft is what the
        cell's spec names (`checkpoints.load_draft`): a draft Model, a PromptLookup, or a
        Fallback of the two. On several devices the models load into the cell's
        partitioner's shards (a draft model replicated unless it says otherwise), and every
        decode of the cell runs model-parallel over them."""
        from speculative_t5.checkpoints import load_checkpoint, load_draft
        from speculative_t5.engine import check_draft
        part = self.partitioner if self.partitioner and self.partitioner.mesh.size > 1 else None
        target = load_checkpoint(self.target, dtype=self.dtype, partitioner=part,
                                 activation_dtype=self.activation_dtype)
        draft = load_draft(self.draft, target.config.vocab_size, dtype=self.dtype,
                           partitioner=part, activation_dtype=self.activation_dtype)
        vocab = Vocabulary(self.vocabulary)
        try:  # before any timing, not at the first decode
            draft = check_draft(target, draft)
            vocab.check_fits(target.config.vocab_size)
        except ValueError as e:
            raise ValueError(f"cell {self.name}: {e}") from None
        return target, draft, vocab

    @property
    def sampling(self) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_k, self.top_p).validate()

    def todo(self, done: Set[str]) -> List[Tuple[int, Example]]:
        """[(index, example)] whose id is not in `done` (a run directory's finished ids)."""
        return [(i, e) for i, e in enumerate(self.examples) if e["id"] not in done]

    def in_order(self, records: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
        """Records of this cell's examples, in example order (a JSONL may hold them in any)."""
        by_id = {r["id"]: r for r in records}
        return [by_id[e["id"]] for e in self.examples if e["id"] in by_id]

    def metric_columns(self, records: Sequence[Dict[str, Any]],
                       outputs: Dict[str, str]) -> Dict[str, float]:
        """The task's metric (BLEU or ROUGE) of each output column {suffix: record key}."""
        if self.metric is None or any(r.get("reference") is None for r in records):
            return {}
        from speculative_t5.data.tasks import METRICS
        refs = [r["reference"] for r in records]
        out = {}
        for suffix, key in outputs.items():
            for name, value in METRICS[self.metric](refs, [r[key] for r in records]).items():
                out[f"{name}_{suffix}"] = value
        return out

    def labels(self) -> Dict[str, Any]:
        """The columns that say which cell a summary row is."""
        return {"cell": self.name, "task": self.task, "draft": self.draft_name,
                "temperature": self.temperature, "gamma": self.gamma,
                "verification": self.verification, "examples": len(self.examples),
                **({"beam_size": self.beam_size} if self.beam_size else {}),
                **({"adaptive_gamma": True} if self.adaptive_gamma else {}),
                **({"tree": ",".join(map(str, self.tree)), "tree_children": self.tree_children,
                    "tree_nodes": TreeShape(self.tree).num_nodes - 1}  # checked a target call
                   if self.tree else {})}


@gin.configurable(denylist=["name"])
def paper_cell(name: str, target: str = gin.REQUIRED, draft: str = gin.REQUIRED,
               examples: Sequence[Example] = gin.REQUIRED, task: str = "", draft_name: str = "",
               vocabulary: str = gin.REQUIRED, temperature: float = 0.0, top_k: int = 0,
               top_p: float = 1.0, gamma: int = 4, max_decode_len: int = 128,
               dtype: Optional[str] = None, metric: Optional[str] = None, seed: int = 0,
               paper_alpha: Optional[float] = None,
               paper_speedup: Optional[float] = None, input_width: Optional[int] = None,
               activation_dtype: Optional[str] = None, verification: str = "token",
               beam_size: int = 0, beam_alpha: float = 0.6,
               beam_paths: Optional[int] = None, adaptive_gamma: bool = False,
               tree: Optional[Sequence[int]] = None, tree_children: str = "drawn") -> Cell:
    """Build and check a Cell from the gin bindings in force. draft: a draft spec as
    `decode --draft` takes it (`checkpoints.load_draft`): a checkpoint path,
    'prompt_lookup[:MAX[:MIN]]', or 'prompt_lookup,PATH' (Fallback: the lookup where it
    matches, the model elsewhere); checked here, loaded by `Cell.load_models`.
    beam_size > 0: a beam-search cell (argmax, token verification, a draft model).
    adaptive_gamma: each round drafts 0..gamma, chosen from the running acceptance rate and
    the costs `st.gamma_costs` measures on the cell's inputs. tree: children per depth (a
    draft model expands a token tree a round, the target checks it in one call; its depth
    is the cell's gamma), tree_children 'drawn' or 'top_k'."""
    from speculative_t5.checkpoints import draft_parts
    from speculative_t5.data.tasks import METRICS
    for field, value in (("target", target), ("draft", draft), ("vocabulary", vocabulary)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"cell {name}: {field} must be a path, got {value!r}")
    try:
        draft_parts(draft)
    except ValueError as e:
        raise ValueError(f"cell {name}: {e}") from None
    if not isinstance(gamma, int) or gamma < 1:
        raise ValueError(f"cell {name}: gamma must be an int >= 1, got {gamma!r}")
    if not isinstance(max_decode_len, int) or max_decode_len < 1:
        raise ValueError(f"cell {name}: max_decode_len must be an int >= 1, got {max_decode_len!r}")
    if input_width is not None and (not isinstance(input_width, int) or input_width < 1):
        raise ValueError(f"cell {name}: input_width must be None or an int >= 1, got {input_width!r}")
    for field, value in (("dtype", dtype), ("activation_dtype", activation_dtype)):
        if value is not None and value not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"cell {name}: {field} must be None, 'float32', 'bfloat16' or "
                             f"'float16', got {value!r}")
    if metric is not None and metric not in METRICS:
        raise ValueError(f"cell {name}: unknown metric {metric!r}; known: {', '.join(METRICS)}")
    try:
        check_verification(verification)
    except ValueError as e:
        raise ValueError(f"cell {name}: {e}") from None
    _check_beam(name, beam_size, beam_alpha, beam_paths, draft, temperature, top_k, top_p,
                verification)
    if not isinstance(adaptive_gamma, bool):
        raise ValueError(f"cell {name}: adaptive_gamma must be True or False, got {adaptive_gamma!r}")
    if adaptive_gamma and beam_size:
        raise ValueError(f"cell {name}: adaptive_gamma is for speculative sampling, not beam "
                         f"search (beam_size {beam_size})")
    if tree is not None:
        tree, gamma = _check_tree(name, tree, tree_children, draft, verification,
                                  adaptive_gamma, beam_size)
    examples = tuple(examples)
    if not examples:
        raise ValueError(f"cell {name}: no examples")
    ids = [e["id"] for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError(f"cell {name}: duplicate example ids")
    return Cell(name=name, task=task, target=target, draft=draft, draft_name=draft_name or draft,
                vocabulary=vocabulary, examples=examples, temperature=float(temperature),
                top_k=top_k, top_p=float(top_p), gamma=gamma, max_decode_len=max_decode_len,
                dtype=dtype, metric=metric, seed=seed,
                paper={"alpha": paper_alpha, "speedup": paper_speedup}, input_width=input_width,
                activation_dtype=activation_dtype, partitioner=Partitioner(),
                verification=verification, beam_size=beam_size, beam_alpha=float(beam_alpha),
                beam_paths=beam_paths, adaptive_gamma=adaptive_gamma, tree=tree,
                tree_children=tree_children)


def _check_tree(name, tree, tree_children, draft, verification, adaptive_gamma, beam_size):
    """A tree cell's shape checked with what it composes with (`engine.check_tree`: a draft
    model, token-wise verification, no adaptive gamma; no beam search) -> (the shape as a
    tuple, its depth: the cell's gamma)."""
    from speculative_t5.checkpoints import names_a_model
    from speculative_t5.engine import check_tree
    if beam_size:
        raise ValueError(f"cell {name}: tree does not combine with beam search (beam_size "
                         f"{beam_size}: it drafts its own beams)")
    try:
        shape = check_tree(tree, tree_children, draft, verification, 1.0, None, adaptive_gamma,
                           names_a_model(draft))
    except (TypeError, ValueError) as e:
        raise ValueError(f"cell {name}: {e}") from None
    return tuple(shape.branching), shape.depth


def _check_beam(name, beam_size, beam_alpha, beam_paths, draft, temperature, top_k, top_p,
                verification) -> None:
    """A beam cell's settings: beam search is argmax over beams, verified token-wise, and
    drafted by a model's own beam search (the zero-cost drafts propose one path)."""
    from speculative_t5.beam_engine import check_alpha
    from speculative_t5.checkpoints import draft_parts
    if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 0:
        raise ValueError(f"cell {name}: beam_size must be an int >= 0 (0: no beam search), "
                         f"got {beam_size!r}")
    if not beam_size:
        return
    try:
        check_alpha(beam_alpha)
    except ValueError as e:
        raise ValueError(f"cell {name}: beam_{e}") from None
    if beam_paths is not None and (isinstance(beam_paths, bool) or not isinstance(beam_paths, int)
                                   or beam_paths < beam_size):
        raise ValueError(f"cell {name}: beam_paths must be None or an int >= beam_size "
                         f"({beam_size}), got {beam_paths!r}")
    if (temperature, top_k, top_p) != (0.0, 0, 1.0) or verification != "token":
        raise ValueError(f"cell {name}: a beam cell (beam_size {beam_size}) decodes argmax "
                         f"with token verification: temperature 0, top_k 0, top_p 1 "
                         f"(gin/decoding/beam_search.gin)")
    parts = draft_parts(draft)
    if len(parts) != 1 or not isinstance(parts[0], str):
        raise ValueError(f"cell {name}: a beam cell's draft must be a draft model checkpoint "
                         f"(its beam search drafts beams; the zero-cost drafts propose one "
                         f"path), got {draft!r}")


@gin.configurable
def fallback_draft(first: str = "prompt_lookup", then: str = gin.REQUIRED) -> str:
    """The draft spec 'FIRST,THEN' (`Fallback(first, then)`) from its two parts, so a gin
    config can name a part by reference: `fallback_draft.then = @draft/demo_model_dir()`."""
    for field, value in (("first", first), ("then", then)):
        if not isinstance(value, str) or not value or "," in value:
            raise ValueError(f"fallback_draft.{field} must be one draft spec (a path or "
                             f"'prompt_lookup[:MAX[:MIN]]'), got {value!r}")
    return f"{first},{then}"


@gin.configurable
def demo_bigram(vocabulary: str = gin.REQUIRED, target: str = gin.REQUIRED,
                top: int = 256) -> str:
    """The draft spec 'bigram:PATH' of the paper's bigram draft fitted on the demo corpus's
    train targets (`Bigram.fit`, the target's vocab_size), written once per vocabulary,
    Python version and `top` under ~/.cache/speculative_t5 ($SPECULATIVE_T5_CACHE)."""
    import sys
    from speculative_t5.paper.rundir import fingerprint
    from speculative_t5.data.demo_corpus import build_corpus
    from speculative_t5.decoding.drafts import Bigram
    from speculative_t5.measure.plan import read_config
    root = os.environ.get("SPECULATIVE_T5_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "speculative_t5"))
    vocab_size = read_config(target).vocab_size
    name = (f"demo_bigram_{fingerprint(vocabulary)[:16]}_v{vocab_size}_top{top}_"
            f"py{sys.version_info[0]}{sys.version_info[1]}.npz")
    path = os.path.join(root, name)
    if not os.path.exists(path):
        vocab = Vocabulary(vocabulary)
        targets = [vocab.encode(e["target"]) for e in build_corpus() if e["split"] == "train"]
        os.makedirs(root, exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        Bigram.fit(targets, vocab_size, top=top).save(tmp)
        os.replace(tmp, path)              # whole or absent, even with two writers
    return f"bigram:{path}"


@gin.configurable
def demo_model_dir(which: str = gin.REQUIRED) -> str:
    """Path of the shipped demo 'target', 'draft' or 'vocabulary' (for gin configs)."""
    from speculative_t5.checkpoints.demo import demo_paths
    paths = demo_paths()
    if which not in paths:
        raise ValueError(f"demo_model_dir.which must be one of {sorted(paths)}, got {which!r}")
    return paths[which]


@gin.configurable
def task_examples(task: str = gin.REQUIRED, split: str = "validation", num_examples: int = 100,
                  input_length: int = 512, target_length: int = 128,
                  vocabulary: str = gin.REQUIRED, tfds_data_dir: Optional[str] = None,
                  mock_data: int = 0) -> List[Example]:
    """The first `num_examples` of a seqio task's split (file order, no shuffling).
    mock_data > 0 reads `tfds.testing.mock_data` with that many random examples instead
    (an offline smoke run; the numbers mean nothing)."""
    import contextlib
    from speculative_t5.data import tasks
    ctx = contextlib.nullcontext()
    if mock_data:
        import tensorflow_datasets as tfds
        ctx = tfds.testing.mock_data(num_examples=mock_data)
    with ctx:
        raw = tasks.examples(task, split=split, num=num_examples, input_len=input_length,
                             target_len=target_length, vocab_path=vocabulary,
                             tfds_data_dir=tfds_data_dir)
    return [{"id": f"{split}-{i}", "inputs": [int(t) for t in ex["inputs"]],
             "input_text": ex["inputs_pretokenized"], "reference": ex["targets_pretokenized"]}
            for i, ex in enumerate(raw)]


@gin.configurable
def file_examples(path: str = gin.REQUIRED, prefix: str = "", vocabulary: str = gin.REQUIRED,
                  num_examples: Optional[int] = None, input_length: int = 512) -> List[Example]:
    """A text file (one input a line) or TSV (input<TAB>reference); ids are line numbers."""
    vocab = Vocabulary(vocabulary)
    rows = read_inputs(path, prefix)[:num_examples]
    return [{"id": f"line-{i + 1}", "inputs": truncate(vocab.encode(text), input_length),
             "input_text": text, "reference": ref} for i, (text, ref) in enumerate(rows)]


@gin.configurable
def demo_examples(split: str = "test", num_examples: int = 32,
                  input_length: Optional[int] = None, vocabulary: Optional[str] = None,
                  task: Optional[str] = None) -> List[Example]:
    """The demo corpus (stdlib functions -> first docstring sentence) as the shipped pair
    reads it: its task and input length (`DEMO_TASK`, `DEMO_INPUT_LENGTH`) unless given;
    ids are the examples' positions in the split."""
    from speculative_t5.checkpoints.demo import DEMO_INPUT_LENGTH, DEMO_TASK
    from speculative_t5.data.demo_corpus import build_corpus
    vocab = Vocabulary(vocabulary or demo_model_dir("vocabulary"))
    rows = [e for e in build_corpus(task=task or DEMO_TASK) if e["split"] == split]
    rows = rows[:num_examples]
    if not rows:
        raise ValueError(f"demo corpus has no examples in split {split!r}")
    length = input_length or DEMO_INPUT_LENGTH
    return [{"id": f"{split}-{i}", "inputs": truncate(vocab.encode(e["input"]), length),
             "input_text": e["input"], "reference": e["target"]} for i, e in enumerate(rows)]


_MACRO = re.compile(r"In call to configurable 'macro'.*in scope '([^']+)'", re.S)


def build_cell(name: str, config_file: str) -> Cell:
    """paper_cell() under the gin config in force, gin's errors turned into messages that
    name the cell's config file and the missing binding or macro."""
    try:
        return paper_cell(name)
    except TypeError as e:
        m = _MACRO.search(str(e))
        if not m:
            raise
        macro = m.group(1)
        raise ValueError(f"{config_file}: gin macro {macro} is not set; bind it in a gin file "
                         f"or with --gin.{macro}=\"'...'\"") from None
    except RuntimeError as e:
        if "Required bindings" not in str(e):
            raise
        raise ValueError(f"{config_file}: {e}") from None
