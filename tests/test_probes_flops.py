"""variantlab/probes/flops.py by hand: the formula's terms, the forward third, the precision
column and every peak of the table as the vendors' data sheets print it (issue 30, item 4)."""

import pytest
import torch

import variantlab as vl
from variantlab.probes import flops

REG = vl.get_registry()

# Dense FLOP/s from the data sheets (no sparsity): bf16/fp16 tensor, TF32 tensor, FP32;
# compared exactly (a peak one FLOP/s off fails).
SHEETS = {
    "NVIDIA H200": (989.4e12, 494.7e12, 66.9e12),
    "NVIDIA H100 PCIe": (756.0e12, 378.0e12, 51.2e12),
    "NVIDIA H100 NVL": (835.0e12, 417.5e12, 60.0e12),
    "NVIDIA H100 80GB HBM3": (989.4e12, 494.7e12, 66.9e12),
    "NVIDIA GH200 480GB": (989.4e12, 494.7e12, 66.9e12),
    "NVIDIA A100-SXM4-80GB": (312.0e12, 156.0e12, 19.5e12),
    "NVIDIA L40S": (362.1e12, 183.0e12, 91.6e12),
    "NVIDIA L4": (121.0e12, 60.0e12, 30.3e12),
    "NVIDIA A10G": (125.0e12, 62.5e12, 31.2e12),
    "Tesla V100-SXM2-16GB": (125.0e12, 15.7e12, 15.7e12),
    "Tesla T4": (65.0e12, 8.1e12, 8.1e12),
}


@pytest.fixture
def precision():
    before = torch.get_float32_matmul_precision()
    yield torch.set_float32_matmul_precision
    torch.set_float32_matmul_precision(before)


@pytest.mark.parametrize("device", sorted(SHEETS))
def test_every_peak_of_the_table(device, precision):
    half, tf32, fp32 = SHEETS[device]
    assert flops.peak_flops(device, "bfloat16") == half
    assert flops.peak_flops(device.lower(), "float16") == half
    precision("high")
    assert flops.peak_flops(device, "float32") == tf32
    precision("highest")
    assert flops.peak_flops(device.upper(), "float32") == fp32


def test_table_rows_and_an_unknown_device():
    assert len(flops.PEAK_FLOPS) == 11
    # most specific first: a name that holds another key comes before it, so every row is
    # reachable (GH200 once sat below H200, which every GH200 name contains)
    keys = [key for key, _ in flops.PEAK_FLOPS]
    for i, key in enumerate(keys):
        assert not any(earlier.lower() in key.lower() for earlier in keys[:i]), key
    assert flops.peak_flops("Tesla K80", "bfloat16") is None


def test_precision_column(precision):
    assert flops.precision_column("bfloat16") == flops.precision_column("float16") == "half"
    precision("highest")
    assert flops.precision_column("float32") == "fp32"
    for setting in ("high", "medium"):
        precision(setting)
        assert flops.precision_column("float32") == "tf32"


def test_flops_per_token_and_the_forward_third():
    # 6 * 100 + 12 * 2 layers * 4 heads * 8 * 16 positions
    assert flops.flops_per_token(100, 2, 4, 8, 16) == 600 + 12 * 2 * 4 * 8 * 16 == 12_888
    assert flops.flops_per_token(7, 0, 4, 8, 16) == 42
    assert flops.pass_flops_per_token(12_888.0, "forward") == 4_296.0
    assert flops.pass_flops_per_token(12_888.0, "backward") == 12_888.0
    assert flops.pass_flops_per_token(12_888.0, "step") == 12_888.0


def test_model_flops_per_token_counts_attention_modules_and_head_size(tiny):
    spec = vl.parse_model_spec({**tiny, "n_heads": 2}, REG)
    model = vl.build_model(spec, REG)
    emb = 64 * 32 + 32 * 32  # token and learned position embeddings
    n = sum(p.numel() for p in model.parameters()) - emb
    # 2 attention modules, 2 heads of 16
    assert flops.model_flops_per_token(model, spec, 16) == 6 * n + 12 * 2 * 2 * 16 * 16
    mlp = vl.parse_model_spec({"family": "mlp", "layer_sizes": [3, 3, 1], "norm": "none"}, REG)
    net = vl.build_model(mlp, REG)
    # no attention, no heads: 6N alone
    assert flops.model_flops_per_token(net, mlp, 16) == 6 * (3 * 3 + 3 + 3 * 1 + 1)


def test_a_spec_without_heads_or_width():
    """A family spec may lack ``n_heads`` (one head) or ``emb_dim`` (head size 0, no
    attention term): one attention module, N = 6 parameters, 16 positions."""
    from types import SimpleNamespace

    model = torch.nn.Module()
    model.att = torch.nn.Linear(2, 2)
    model.att.variantlab_slot = "attention"
    # emb_dim 33, one head of 33 (not two of 16)
    assert flops.model_flops_per_token(model, SimpleNamespace(emb_dim=33), 16) == \
        6 * 6 + 12 * 1 * 1 * 33 * 16
    for heads in (1, 3):
        assert flops.model_flops_per_token(model, SimpleNamespace(n_heads=heads), 16) == 6 * 6
