"""timing probe: rows, FLOP formula, SDPA backend, dtype/device errors. Never asserts speed."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.probes import flops, run_probe

REG = vl.get_registry()

TINY_TIMING = {"batch_size": 2, "seq_len": 16, "warmup": 1, "repeats": 3,
               "passes": ["forward", "backward", "step"], "device": "cpu"}
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def model_rows(rows):
    return {r["metric"]: r["value"] for r in rows if r["scope"] == "model"}


def info_rows(rows):
    return {r["metric"]: r["name"] for r in rows if r["scope"] == "info"}


def test_rows_on_cpu(tiny):
    rows = run_probe("timing", tiny, TINY_TIMING, seed=0, registry=REG)
    m = model_rows(rows)
    for p in ("forward", "backward", "step"):
        assert m[f"{p}_median_s"] > 0
        assert m[f"{p}_iqr_s"] >= 0
        assert m[f"{p}_tokens_per_s"] == pytest.approx(32 / m[f"{p}_median_s"])
        assert f"{p}_mfu" not in m  # CUDA only
    assert m["peak_memory_bytes"] >= 0
    non_emb = 30_400 - 64 * 32 - 32 * 32
    assert m["flops_per_token"] == 6 * non_emb + 12 * 2 * 4 * 8 * 16
    info = info_rows(rows)
    assert info["device"].startswith("cpu")
    assert info["dtype"] == "float32"
    assert info["torch_version"] == torch.__version__
    assert info["sdpa_backend"] == "n/a"  # naive attention
    assert "6N + 12*L*H*Q*T" in info["flop_formula"]
    assert all(math.isnan(r["value"]) for r in rows if r["scope"] == "info")


def test_only_the_passes_asked_for(tiny):
    rows = run_probe("timing", tiny, {**TINY_TIMING, "passes": ["forward"]}, seed=0, registry=REG)
    assert not any(r["metric"].startswith(("backward", "step")) for r in rows)


def test_sdpa_backend_is_reported(tiny):
    spec = {**tiny, "attention": {"kind": "mha", "impl": "sdpa"}}
    rows = run_probe("timing", spec, {**TINY_TIMING, "passes": ["forward"]}, seed=0, registry=REG)
    assert info_rows(rows)["sdpa_backend"] in {"flash", "efficient", "math", "cudnn"}


def test_mlp_family_has_no_attention_term():
    spec = {"family": "mlp", "layer_sizes": [8, 8, 8, 1], "norm": "none"}
    rows = run_probe("timing", spec, {**TINY_TIMING, "passes": ["backward"]}, seed=0, registry=REG)
    assert model_rows(rows)["flops_per_token"] == 6 * (3 * (64 + 8) - 64 - 8 + 8 + 1)


def test_bfloat16_autocast_on_cpu(tiny):
    rows = run_probe("timing", tiny, {**TINY_TIMING, "dtype": "bfloat16",
                                      "passes": ["backward"]}, seed=0, registry=REG)
    assert info_rows(rows)["dtype"] == "bfloat16"
    assert model_rows(rows)["backward_median_s"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_missing_cuda_is_a_clear_error(tiny):
    with pytest.raises(RuntimeError, match="no CUDA device"):
        run_probe("timing", tiny, TINY_TIMING, seed=0, device="cuda", registry=REG)


def test_peak_table():
    assert flops.peak_flops("NVIDIA H100 80GB HBM3", "bfloat16") == 989.4e12
    assert flops.peak_flops("NVIDIA H100 PCIe", "bfloat16") == 756.0e12
    assert flops.peak_flops("NVIDIA A100-SXM4-40GB", "float16") == 312.0e12
    assert flops.peak_flops("Some Unknown GPU", "bfloat16") is None


@pytest.mark.gpu
@gpu
def test_cuda_rows(tiny):
    spec = {**tiny, "attention": {"kind": "mha", "impl": "sdpa"}}
    rows = run_probe("timing", spec, {**TINY_TIMING, "dtype": "bfloat16", "device": "auto"},
                     seed=0, registry=REG)
    m = model_rows(rows)
    for p in ("forward", "backward", "step"):
        assert m[f"{p}_flops_per_s"] > 0
    assert m["peak_memory_bytes"] > 0
    info = info_rows(rows)
    assert info["device"] == torch.cuda.get_device_name()
    assert info["sdpa_backend"] in {"flash", "efficient", "cudnn", "math"}
    if flops.peak_flops(info["device"], "bfloat16"):
        assert 0 < m["backward_mfu"] < 1
