"""The paper's analysis (Leviathan et al. 2023, section 3): tokens per target call, eq. (1);
expected walltime improvement, eq. (5), as written (v = 1) and with a measured verify-pass
cost v; the arithmetic-operations factor of Theorem 3.11; and the best gamma."""
from __future__ import annotations

from typing import Dict


def expected_tokens_per_call(alpha: float, gamma: int) -> float:
    """Eq. (1): E[tokens per target call] = (1 - alpha^(gamma+1)) / (1 - alpha)."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def walltime_improvement(alpha: float, gamma: int, c: float, v: float = 1.0) -> float:
    """Eq. (5) with the target's verify pass over gamma+1 tokens costing v one-token passes:
    E[tokens per call] / (c * gamma + v). v = 1 is the paper's assumption."""
    return expected_tokens_per_call(alpha, gamma) / (c * gamma + v)


def operations_factor(alpha: float, gamma: int, c_hat: float) -> float:
    """Theorem 3.11: expected arithmetic operations relative to plain decoding,
    (1 - alpha) (gamma c_hat + gamma + 1) / (1 - alpha^(gamma+1)); c_hat = draft/target
    operations per token."""
    return (gamma * c_hat + gamma + 1) / expected_tokens_per_call(alpha, gamma)


def best_gamma(alpha: float, c: float, v: float = 1.0, max_gamma: int = 32) -> int:
    """The gamma in 1..max_gamma that maximises eq. (5)."""
    return max(range(1, max_gamma + 1), key=lambda g: walltime_improvement(alpha, g, c, v))


def alpha_from_acceptance(accepted: float, reached: float) -> float:
    """Estimate alpha from speculative runs: accepted drafts / drafts that were evaluated
    (a draft is evaluated when all before it in its round were accepted)."""
    return accepted / reached if reached else 0.0


def predictions(alpha: float, gamma: int, c: float, v: float) -> Dict[str, float]:
    return {"tokens_per_call_predicted": expected_tokens_per_call(alpha, gamma),
            "speedup_predicted": walltime_improvement(alpha, gamma, c, v),
            "speedup_predicted_paper": walltime_improvement(alpha, gamma, c, 1.0)}


def decode_macs_per_token(config) -> int:
    """Multiply-accumulates of one decoder position with cross-attention K/V cached:
    self-attention q/k/v/o, cross-attention q/o, the MLP and the output layer (attention
    over the cache itself is left out: it is small at these lengths). The ratio of two
    models' values is the c_hat of Theorem 3.11."""
    e, hd = config.emb_dim, config.num_heads * config.head_dim
    layer = 6 * e * hd + (len(config.mlp_activations) + 1) * e * config.mlp_dim
    return config.num_decoder_layers * layer + e * config.vocab_size
