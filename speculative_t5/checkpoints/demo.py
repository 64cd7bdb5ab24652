"""The trained target/draft pair shipped inside the package (`demo_models/`)."""
from __future__ import annotations

import os
from typing import Tuple

from speculative_t5.checkpoints import load_checkpoint
from speculative_t5.model.api import Model

DEMO_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "demo_models")


def demo_paths() -> dict:
    """{'target', 'draft', 'vocabulary'}: paths of the shipped pair and its SentencePiece model."""
    return {"target": os.path.join(DEMO_DIR, "target"), "draft": os.path.join(DEMO_DIR, "draft"),
            "vocabulary": os.path.join(DEMO_DIR, "target", "spiece.model")}


def load_demo(dtype: str = "float32") -> Tuple[Model, Model, str]:
    """(target, draft, vocabulary path) of the pair shipped inside the package."""
    paths = demo_paths()
    if not os.path.isdir(paths["target"]) or not os.path.isdir(paths["draft"]):
        raise FileNotFoundError(f"the demo pair is missing from this installation ({DEMO_DIR})")
    return (load_checkpoint(paths["target"], dtype=dtype),
            load_checkpoint(paths["draft"], dtype=dtype), paths["vocabulary"])
