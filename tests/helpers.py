"""Small configs and reference-model builders shared by the tests."""
import json
import os
import socket
import subprocess
import sys

import numpy as np

import speculative_t5 as st

# Shapes chosen to catch layout mistakes: heads*head_dim != emb_dim, vocab not a multiple
# of 8, encoder and decoder depths differ, a non-default max distance.
HF_CONFIGS = {
    "t5_1_0": dict(vocab_size=101, d_model=40, d_kv=16, d_ff=56, num_layers=3,
                   num_decoder_layers=2, num_heads=3, feed_forward_proj="relu",
                   tie_word_embeddings=True, relative_attention_max_distance=20,
                   dropout_rate=0.0),
    "t5_1_1": dict(vocab_size=101, d_model=40, d_kv=16, d_ff=56, num_layers=2,
                   num_decoder_layers=3, num_heads=3, feed_forward_proj="gated-gelu",
                   tie_word_embeddings=False, dropout_rate=0.0),
}


def tiny_config(variant="t5_1_1", **overrides):
    base = dict(vocab_size=53, emb_dim=32, num_heads=3, head_dim=8, mlp_dim=40,
                num_encoder_layers=2, num_decoder_layers=3)
    if variant == "t5_1_0":
        base.update(mlp_activations=("relu",), logits_via_embedding=True)
    base.update(overrides)
    return st.T5Config(**base)


def gpt2_pair(max_decode_len=20, **overrides):
    """A GPT-2 target whose greedy output stops inside some rows (EOS = a token it emits),
    a 1-layer draft (the target's first block), 6 prompts of lengths 1..9 right-padded to 9
    -> (target, draft, prompts, lengths). overrides: GPT2Config fields."""
    config = st.GPT2Config(**{**dict(vocab_size=61, n_positions=64, n_embd=32, n_layer=3,
                                     n_head=4, eos_id=60, pad_id=60), **overrides})
    target = st.init_model(config, seed=0)
    rng = np.random.RandomState(0)
    lengths = np.array([3, 9, 5, 1, 7, 4])
    prompts = rng.randint(0, 60, (6, 9)).astype(np.int32)
    prompts[np.arange(9)[None, :] >= lengths[:, None]] = config.pad_id
    free = st.generate(target, prompts, prompt_lengths=lengths, max_decode_len=max_decode_len)
    emitted = np.concatenate([row[3:min(n, max_decode_len - 3)]
                              for row, n in zip(free.tokens, free.lengths)])
    values, counts = np.unique(emitted[emitted != config.eos_id], return_counts=True)
    target = st.Model(config.replace(eos_id=int(values[np.argmax(counts)])), target.params)
    draft = st.Model(target.config.replace(n_layer=1), {
        k: v for k, v in target.params.items() if k == "h_0" or not k.startswith("h_")})
    return target, draft, prompts, lengths


def random_ids(rng, batch, length, vocab, pad_tail=None):
    """Token ids in [2, vocab); rows' tails padded with 0 where pad_tail[b] > 0."""
    ids = rng.randint(2, vocab, size=(batch, length)).astype(np.int32)
    for b, n in enumerate(pad_tail or []):
        if n:
            ids[b, -n:] = 0
    return ids


def decoder_inputs(rng, batch, length, vocab):
    ids = random_ids(rng, batch, length, vocab)
    ids[:, 0] = 0  # start token
    return ids


def make_hf_model(variant, seed=0):
    """A transformers T5ForConditionalGeneration with every weight random (norms too)."""
    import torch
    from transformers import T5Config, T5ForConditionalGeneration
    torch.manual_seed(seed)
    model = T5ForConditionalGeneration(T5Config(**HF_CONFIGS[variant])).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("layer_norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            elif "relative_attention_bias" in name or name == "shared.weight":
                p.copy_(torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / np.sqrt(p.shape[-1]))
        if variant == "t5_1_1":  # untie: T5.1.1 has its own output layer
            model.lm_head.weight = torch.nn.Parameter(
                torch.randn_like(model.lm_head.weight) / np.sqrt(model.lm_head.weight.shape[-1]))
    return model


def save_hf_dir(model, path, fmt):
    """Write config.json and the weights as 'safetensors' or 'bin', every tensor explicit."""
    import torch
    os.makedirs(path, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    cfg = dict(HF_CONFIGS["t5_1_1" if "lm_head.weight" in state and not torch.equal(
        state["lm_head.weight"], state["shared.weight"]) else "t5_1_0"])
    cfg.update(model_type="t5", architectures=["T5ForConditionalGeneration"])
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f)
    if fmt == "safetensors":
        from safetensors.torch import save_file
        save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    else:
        torch.save(state, os.path.join(path, "pytorch_model.bin"))
    return path


def hf_logits(model, input_ids, decoder_input_ids):
    import torch
    with torch.no_grad():
        out = model(input_ids=torch.tensor(input_ids, dtype=torch.long),
                    attention_mask=torch.tensor(input_ids != 0, dtype=torch.long),
                    decoder_input_ids=torch.tensor(decoder_input_ids, dtype=torch.long))
    return out.logits.float().numpy()


def train_sentencepiece(directory, vocab_size=48):
    """A T5-style SentencePiece model (pad 0, eos 1, unk 2) trained on a tiny corpus."""
    import sentencepiece as spm
    words = ("the quick brown fox jumps over a lazy dog while seven small birds sing "
             "translate english to german summarize this text about models and data").split()
    rng = np.random.RandomState(0)
    corpus = os.path.join(directory, "corpus.txt")
    with open(corpus, "w") as f:
        for _ in range(400):
            f.write(" ".join(rng.choice(words, size=rng.randint(3, 12))) + "\n")
    prefix = os.path.join(directory, "spiece")
    spm.SentencePieceTrainer.Train(
        input=corpus, model_prefix=prefix, vocab_size=vocab_size, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False,
        minloglevel=2)
    return prefix + ".model"


def tiny_decode_pair(d):
    """In directory d: a tiny T5 target exported as a Hugging Face directory carrying a
    SentencePiece vocabulary trained here, and a 1-decoder-layer native draft -> (target
    dir, draft dir, vocabulary path)."""
    import shutil
    spm_path = train_sentencepiece(str(d))
    hf = os.path.join(str(d), "target_hf")
    st.export_hf(st.init_model(tiny_config(), seed=0), hf)
    shutil.copy(spm_path, os.path.join(hf, "spiece.model"))
    draft = os.path.join(str(d), "draft")
    st.save_checkpoint(st.init_model(tiny_config(num_decoder_layers=1), seed=4), draft)
    return hf, draft, spm_path


def xla_flags(devices: int) -> str:
    """XLA_FLAGS for a subprocess with `devices` host CPU devices, keeping the run's own
    flags (conftest)."""
    return f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count={devices}"


def run_on_eight_devices(script, *args, timeout=300):
    """Python source `script` run in a subprocess with 8 host CPU devices (`python -c
    script ARGS`, the run's compile cache with it, conftest) -> the JSON object it printed
    last on a line starting "RESULT ", after checking it exited 0."""
    env = dict(os.environ, XLA_FLAGS=xla_flags(8), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def run_processes(args, n=2, devices=4, timeout=600):
    """`speculative-t5 ARGS` as n processes on localhost joined by JAX's distributed runtime
    (CPU backend, `devices` devices each); returns each process's (stdout, stderr) after
    checking every one exited 0."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ,  # the run's compile cache (conftest)
               XLA_FLAGS=xla_flags(devices))
    procs = [subprocess.Popen(
        [sys.executable, "-m", "speculative_t5.commands", "--coordinator_address",
         f"127.0.0.1:{port}", "--num_processes", str(n), "--process_id", str(i), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for i in range(n)]
    try:
        outs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-3000:]
    return outs
