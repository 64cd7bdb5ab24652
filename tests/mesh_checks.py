"""Run by tests/test_partitioning.py in a subprocess with 8 host CPU devices (JAX fixes
the device count at start-up, and the test process already has 1): partitioned decodes
against unpartitioned ones on several meshes. Prints one JSON object. Arguments: the
checks to run (`decodes`, `errors`, `exactness`, `gpt2`; `decodes:4x2,1x8` for some meshes)."""
import json
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import numpy as np  # noqa: E402

import speculative_t5 as st  # noqa: E402
from speculative_t5.commands import enable_compile_cache  # noqa: E402
from speculative_t5.model.api import cache_axes, init_cache, prefill_cache  # noqa: E402

MESHES = {"1x8": 8, "2x4": 4, "8x1": 1, "4x2": 2}  # data x model -> num_partitions
SLOW = ("spec block top-k top-p", "spec tree T=1")    # run on the slow tier's 2x4 mesh only


def decodes(results, meshes=",".join(MESHES)):
    cfg = st.T5Config.preset("t5_1_1_tiny").replace(vocab_size=512, num_heads=8, head_dim=16)
    target = st.init_model(cfg, 0)
    draft = st.init_model(cfg.replace(num_decoder_layers=1, mlp_dim=64), 1)
    rng = np.random.RandomState(0)
    ids = rng.randint(2, cfg.vocab_size, (5, 12))        # 5 rows: not a multiple of 'data'
    ids[1, 7:] = 0
    ids[3, 3:] = 0                                         # padded rows of different lengths
    dec = np.concatenate([np.zeros((5, 1), int), rng.randint(2, 512, (5, 6))], 1)
    # token-wise top-k is checked through a partitioned mesh by the exactness chi-square
    runs = {"plain greedy": {}, "spec greedy": dict(draft=draft, gamma=3),
            "spec T=1": dict(draft=draft, gamma=3, temperature=1.0),
            "plain T=1": dict(temperature=1.0),
            "spec block top-k top-p": dict(draft=draft, gamma=3, temperature=0.9, top_k=30,
                                           top_p=0.95, verification="block"),
            "spec tree T=1": dict(draft=draft, tree=(2, 2, 1), temperature=1.0)}
    # greedy and sampled share a program (the temperature is traced); the other settings
    # compile programs of their own, so they run on one mesh only, 2x4 (the slow tier's):
    # block verification and a token tree with a replicated draft, a partitioned draft
    # token-wise
    extra = "2x4"
    if extra not in meshes.split(","):
        runs.pop("spec block top-k top-p")
        runs.pop("spec tree T=1")
    refs = {name: st.generate(target, ids, max_decode_len=24, rng=jax.random.PRNGKey(3), **kw)
            for name, kw in runs.items()}
    logits = np.asarray(st.forward(target, ids, dec))
    for mesh in meshes.split(","):
        parts = MESHES[mesh]
        for draft_mode in ("replicated", "partitioned"):
            p = st.Partitioner(num_partitions=parts, draft=draft_mode)
            for name, kw in runs.items():
                if (draft_mode == "partitioned" or name in SLOW) and mesh != extra \
                        or draft_mode == "partitioned" and ("draft" not in kw or name in SLOW):
                    continue
                out = st.generate(target, ids, max_decode_len=24, rng=jax.random.PRNGKey(3),
                                  partitioner=p, **kw)
                results[f"{mesh} {draft_mode} {name}"] = _same(out, refs[name])
        sharded = p.shard(target)
        results[f"{mesh} logits max diff"] = float(np.abs(
            np.asarray(st.forward(sharded, ids, dec)) - logits).max())
        # each device holds 1/num_partitions of a partitioned parameter, all of a replicated one
        wi = sharded.params["decoder"]["layers_0"]["mlp"]["wi_0"]["kernel"]
        norm = sharded.params["decoder"]["layers_0"]["pre_mlp_layer_norm"]["scale"]
        results[f"{mesh} shard shapes"] = [list(wi.addressable_shards[0].data.shape),
                                           list(norm.addressable_shards[0].data.shape)]
        # caches: rows over 'data', heads over 'model'
        def setup(m, x):
            cache = init_cache(m, x, 16)
            return p.constrain(cache, cache_axes(cache))
        rows = np.concatenate([ids, ids[:3]])                                  # 8 rows
        cache = jax.jit(setup)(sharded, jax.device_put(rows, p.sharding(("batch", "length"))))
        results[f"{mesh} cache shards"] = [
            list(cache["self"][0]["k"].addressable_shards[0].data.shape),
            list(cache["cross"][0][0].addressable_shards[0].data.shape)]


def gpt2(results):
    """A GPT-2 target (8 heads, vocabulary 64: both divide 'model') and its 1-layer draft,
    6 prompts of lengths 1..9 (padded to 8 rows on 4x2): each draft kind partitioned gives
    the unpartitioned tokens and stats; T = 1 the same samples from the same row keys."""
    from helpers import gpt2_pair
    target, draft, prompts, lengths = gpt2_pair(20, vocab_size=64, n_head=8)
    keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.PRNGKey(5), i))(np.arange(6))
    lookup = st.drafts.PromptLookup(2, 1)
    runs = {"plain greedy": {}, "spec greedy": dict(draft=draft),
            "spec T=1": dict(draft=draft, temperature=1.0),
            "fallback block T=1": dict(draft=st.drafts.Fallback(lookup, draft),
                                       verification="block", temperature=1.0)}
    refs = {name: st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=20,
                              gamma=3, rng=keys, **kw) for name, kw in runs.items()}
    # each setting compiles its own program: the model draft on both meshes, the others on
    # 4x2 (where rows are padded, which the fallback's lookup reads through the mask)
    for mesh, parts, names in (("1x8", 8, ("spec greedy",)),
                               ("4x2", 2, ("plain greedy", "spec T=1", "fallback block T=1"))):
        p = st.Partitioner(num_partitions=parts)
        for name in names:
            out = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=20,
                              gamma=3, rng=keys, partitioner=p, **runs[name])
            results[f"gpt2 {mesh} {name}"] = _same(out, refs[name])
    # the prefill cache on 4x2: rows over 'data', heads over 'model'
    def setup(m, x, n):
        cache = prefill_cache(m, x, n, 4)
        return p.constrain(cache, cache_axes(cache))
    rows = np.concatenate([prompts, prompts[:2]])                                # 8 rows
    cache = jax.jit(setup)(p.shard(target), *(jax.device_put(x, p.sharding(a)) for x, a in (
        (rows, ("batch", "length")), (np.concatenate([lengths, lengths[:2]]), ("batch",)))))
    results["gpt2 4x2 cache shards"] = [list(x.addressable_shards[0].data.shape)
                                        for x in (cache["layers"][0]["k"], cache["offset"])]
    results["gpt2 stops"] = int((refs["plain greedy"].lengths < 20).sum())
    results["gpt2 T=1 sampled other tokens"] = bool(
        (refs["spec T=1"].tokens != refs["plain greedy"].tokens).any())


def _same(out, ref) -> bool:
    """Identical tokens, lengths and per-row stats."""
    return bool((out.tokens == ref.tokens).all() and (out.lengths == ref.lengths).all()
                and all((out.stats[k] == ref.stats[k]).all() for k in ref.stats
                        if isinstance(ref.stats[k], np.ndarray)))


def errors(results):
    cfg = st.T5Config.preset("t5_1_1_tiny")                # 4 heads
    model = st.init_model(cfg, 0)
    for name, make in {"not dividing devices": lambda: st.Partitioner(num_partitions=3),
                       "heads": lambda: st.Partitioner(num_partitions=8).shard(model),
                       "submesh disagrees": lambda: st.Partitioner(
                           num_partitions=2, model_parallel_submesh=(2, 2, 1, 1))}.items():
        try:
            make()
            results[f"error {name}"] = None
        except ValueError as e:
            results[f"error {name}"] = str(e)
    results["submesh"] = st.Partitioner(model_parallel_submesh=(2, 2, 1, 1)).num_partitions


def exactness(results):
    """The exactness chi-square of tests/test_exactness.py, reduced, through a 4x2 mesh."""
    import test_exactness as tx
    from speculative_t5.decoding.sampling import SamplingConfig
    target, draft = st.init_model(tx._cfg(), seed=0), st.init_model(tx._cfg(), seed=1)
    p = st.Partitioner(num_partitions=2)
    n = 24_000
    for name, sampling in (("top-k 3", SamplingConfig(1.0, top_k=3)),):  # T = 1: test_exactness
        out = st.generate(target, np.repeat(tx.INPUT, n, 0), draft=draft, gamma=2,
                          max_decode_len=tx.STEPS, sampling=sampling,
                          rng=jax.random.PRNGKey(11), partitioner=p)
        pvalue, cells = tx.chi_square_pvalue(out.tokens[:, :tx.STEPS],
                                             tx.exact_distribution(target, sampling))
        results[f"chi-square {name}"] = [pvalue, cells]


if __name__ == "__main__":
    enable_compile_cache()  # the test run's cache ($SPECULATIVE_T5_COMPILE_CACHE, conftest)
    out = {"devices": jax.device_count()}
    for part in sys.argv[1:] or ["decodes", "errors", "exactness", "gpt2"]:
        name, _, arg = part.partition(":")  # decodes:4x2,1x8 -> those meshes only
        globals()[name](out, *([arg] if arg else []))
    print("RESULTS " + json.dumps(out))
