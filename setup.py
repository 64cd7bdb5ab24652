"""speculative_t5: exact speculative decoding for T5 encoder-decoder models in JAX/Flax."""
import os

from setuptools import find_namespace_packages, find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

INSTALL_REQUIRES = [
    "jax>=0.4.30", "flax>=0.10", "optax", "gin-config", "sentencepiece",
    "orbax-checkpoint", "tensorstore", "safetensors", "msgpack", "ml_dtypes", "numpy",
    "tqdm", "rich", "matplotlib", "scipy",
    "rouge-score",  # the demo's report scores its summaries (the main command needs it)
    "tokenizers",   # GPT-2's byte-level BPE (vocab.json + merges.txt)
    "filelock",     # JAX locks its bounded compile cache with it (commands.enable_compile_cache)
]
EXTRAS = {
    "data": ["seqio", "tensorflow-datasets", "sacrebleu"],
    # torch 2.13.0 has a CPU wheel on these machines; an unpinned torch pulls a CUDA build.
    "test": ["pytest", "pytest-xdist", "torch==2.13.0", "transformers>=4.40"],
    # the TPU compiler (libtpu) for `speculative-t5 compile`: jax's own extra, so pip picks
    # the libtpu of the jax it resolves
    "tpu": ["jax[tpu]"],
}
EXTRAS["test"] += EXTRAS["data"] + EXTRAS["tpu"]  # seqio tasks under tfds mock data; compile
EXTRAS["all"] = sorted({r for reqs in EXTRAS.values() for r in reqs})

# The reusable gin blocks live in the repo's top-level gin/ and ship as speculative_t5/gin.
GIN_PACKAGES = ["speculative_t5.gin"] + [
    "speculative_t5.gin." + p for p in find_namespace_packages(where=os.path.join(HERE, "gin"))]

setup(
    name="speculative_t5",
    version="0.1.0",
    description=__doc__,
    long_description=open(os.path.join(HERE, "README.md")).read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=find_packages(include=["speculative_t5", "speculative_t5.*"]) + GIN_PACKAGES,
    package_dir={"speculative_t5.gin": "gin"},
    package_data={"speculative_t5": ["demo_models/*/*"], **{p: ["*.gin"] for p in GIN_PACKAGES}},
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
    entry_points={"console_scripts": ["speculative-t5=speculative_t5.commands:main"]},
)
