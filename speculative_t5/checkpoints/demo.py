"""The trained target/draft pair shipped inside the package (`demo_models/`)."""
from __future__ import annotations

import os
from typing import Tuple

from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.model.api import Model

# How the shipped T5 pair's inputs are built (configs/demo_target.gin trained it so): the
# corpus task (`demo_corpus.TASKS`) and the input pieces kept. Everything that feeds the pair
# demo inputs (`cells.demo_examples`, the benchmarks) reads them here.
DEMO_TASK = "summarize_named"
DEMO_INPUT_LENGTH = 32

DEMO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_models")


def demo_paths(family: str = "t5") -> dict:
    """{'target', 'draft', 'vocabulary'}: paths of a shipped pair and its vocabulary (T5: the
    SentencePiece model; GPT-2: the target directory, which holds vocab.json + merges.txt)."""
    if family == "gpt2":
        target = os.path.join(DEMO_DIR, "gpt2_target")
        return {"target": target, "draft": os.path.join(DEMO_DIR, "gpt2_draft"),
                "vocabulary": target}
    if family != "t5":
        raise ValueError(f"family must be 't5' or 'gpt2', got {family!r}")
    return {"target": os.path.join(DEMO_DIR, "target"), "draft": os.path.join(DEMO_DIR, "draft"),
            "vocabulary": os.path.join(DEMO_DIR, "target", "spiece.model")}


def load_demo(dtype: str = "float32", family: str = "t5") -> Tuple[Model, Model, str]:
    """(target, draft, vocabulary path) of a pair shipped inside the package: the T5 pair
    (docstrings), or family='gpt2' (code completion)."""
    paths = demo_paths(family)
    if not os.path.isdir(paths["target"]) or not os.path.isdir(paths["draft"]):
        raise FileNotFoundError(f"the demo pair is missing from this installation ({DEMO_DIR})")
    return (load_checkpoint(paths["target"], dtype=dtype),
            load_checkpoint(paths["draft"], dtype=dtype), paths["vocabulary"])
