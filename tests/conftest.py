import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The commands keep compiled programs in a persistent cache (~/.cache/speculative_t5/jax by
# default). Tests get one of their own per run, so a run never loads programs written by
# another run going on beside it (a half-written entry crashed XLA's deserializer once).
os.environ.setdefault("SPECULATIVE_T5_COMPILE_CACHE", tempfile.mkdtemp(prefix="st5_test_jax_"))
