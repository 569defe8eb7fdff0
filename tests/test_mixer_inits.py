"""The mixers start from their authors' training inits, not from transformers' loading
placeholders (issue 29.3), checked by the statistics of many heads: Gated DeltaNet's (fla)
A ~ U(0, 16) and softplus(dt_bias) log-uniform in [0.001, 0.1]; Mamba-2's (state-spaces/mamba)
A ~ U(1, 16)."""

import math

import torch
import torch.nn.functional as F

from variantlab_plugins.deltanet import GatedDeltaNet, GatedDeltaNetSpec
from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec

HEADS = 4096


def test_gated_deltanet_dt_and_decay_start_as_fla_draws_them():
    torch.manual_seed(0)
    mixer = GatedDeltaNet(8, 1, GatedDeltaNetSpec(n_k_heads=1, n_v_heads=HEADS, head_k_dim=2,
                                                  head_v_dim=1))
    dt = F.softplus(mixer.dt_bias.detach()).double()
    assert dt.min() >= 0.001 * (1 - 1e-5) and dt.max() <= 0.1 * (1 + 1e-5)
    log_dt = dt.log()
    lo, hi = math.log(0.001), math.log(0.1)
    assert abs(log_dt.mean().item() - (lo + hi) / 2) < 0.06  # log-uniform: mean, sd of U(lo, hi)
    assert abs(log_dt.std().item() - (hi - lo) / math.sqrt(12)) < 0.05
    a = mixer.A_log.detach().exp().double()
    assert a.min() >= 0 and a.max() <= 16
    assert abs(a.mean().item() - 8) < 0.3 and abs(a.std().item() - 16 / math.sqrt(12)) < 0.2
    assert (a < 1).float().mean().item() > 0.04  # below transformers' placeholder range [1, 16]


def test_mamba2_a_starts_uniform_in_1_16():
    torch.manual_seed(0)
    mixer = Mamba2Mixer(HEADS // 2, 1, Mamba2Spec(head_dim=1, d_state=1, expand=2))
    a = mixer.A_log.detach().exp().double()
    assert a.numel() == HEADS
    assert a.min() >= 1 and a.max() <= 16
    assert abs(a.mean().item() - 8.5) < 0.3 and abs(a.std().item() - 15 / math.sqrt(12)) < 0.2
    assert (a - a.round()).abs().gt(1e-3).float().mean().item() > 0.99  # not 1 .. n_heads
