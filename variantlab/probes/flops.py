"""FLOPs per token and the devices' peak FLOP/s (for MFU).

Per token of a forward+backward pass (Chowdhery et al. 2022, PaLM, appendix B; nanoGPT's
``estimate_mfu``):  6N + 12·L·H·Q·T  with N the non-embedding parameters a token uses (all
of them in a dense model; a mixture of experts counts the top_k routed experts of each layer,
not all n_experts: its active parameters), L layers, H heads,
Q head size, T sequence length. A forward pass alone is a third of it (2N + 4·L·H·Q·T); an
optimizer step adds O(N) FLOPs per step, not per token, and is left out.
"""

from __future__ import annotations

import torch

from ..model.specs import ModelSpec
from .params import active_non_embedding_params

FLOP_FORMULA = "6N + 12*L*H*Q*T per token (PaLM app. B; nanoGPT estimate_mfu); forward = 1/3"

# Dense peak FLOP/s from the vendors' data sheets (no sparsity). Keys are matched as
# substrings of torch.cuda.get_device_name(), most specific first.
# Columns: bf16/fp16 tensor cores, tf32 tensor cores, fp32 (CUDA cores).
PEAK_FLOPS: list[tuple[str, dict[str, float]]] = [
    ("GH200", {"half": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H200", {"half": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),
    ("H100 PCIe", {"half": 756.0e12, "tf32": 378.0e12, "fp32": 51.2e12}),
    ("H100 NVL", {"half": 835.0e12, "tf32": 417.5e12, "fp32": 60.0e12}),
    ("H100", {"half": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12}),  # SXM
    ("A100", {"half": 312.0e12, "tf32": 156.0e12, "fp32": 19.5e12}),
    ("L40S", {"half": 362.1e12, "tf32": 183.0e12, "fp32": 91.6e12}),
    ("L4", {"half": 121.0e12, "tf32": 60.0e12, "fp32": 30.3e12}),
    ("A10", {"half": 125.0e12, "tf32": 62.5e12, "fp32": 31.2e12}),
    ("V100", {"half": 125.0e12, "tf32": 15.7e12, "fp32": 15.7e12}),
    ("T4", {"half": 65.0e12, "tf32": 8.1e12, "fp32": 8.1e12}),
]


def flops_per_token(non_embedding: int, n_layers: int, n_heads: int, head_dim: int,
                    seq_len: int) -> float:
    """Training (forward+backward) FLOPs per token by the formula above."""
    return 6.0 * non_embedding + 12.0 * n_layers * n_heads * head_dim * seq_len


def model_flops_per_token(model: torch.nn.Module, spec: ModelSpec, seq_len: int) -> float:
    """Training FLOPs per token of ``model`` by the formula: N its active non-embedding
    parameters (all non-embedding parameters of a dense model),
    L its attention modules (self- and cross-; none in an ``mlp`` model), H and Q from the
    spec's ``n_heads`` and ``emb_dim``."""
    n_attn = sum(getattr(m, "variantlab_slot", None) == "attention" for m in model.modules())
    n_heads = getattr(spec, "n_heads", 1) or 1
    return flops_per_token(active_non_embedding_params(model), n_attn, n_heads,
                           getattr(spec, "emb_dim", 0) // n_heads, seq_len)


def pass_flops_per_token(train_flops: float, pass_name: str) -> float:
    """FLOPs per token of one timed pass: forward is a third of forward+backward."""
    return train_flops / 3.0 if pass_name == "forward" else train_flops


def precision_column(dtype: str) -> str:
    """Which peak applies: tensor-core half precision, TF32 (when float32 matmuls may use
    it), or plain fp32."""
    if dtype in ("bfloat16", "float16"):
        return "half"
    return "fp32" if torch.get_float32_matmul_precision() == "highest" else "tf32"


def peak_flops(device_name: str, dtype: str) -> float | None:
    """Dense peak FLOP/s of a CUDA device by name, or None if it is not in the table."""
    column = precision_column(dtype)
    for key, peaks in PEAK_FLOPS:
        if key.lower() in device_name.lower():
            return peaks[column]
    return None
