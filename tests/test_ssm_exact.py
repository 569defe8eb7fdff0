"""Mamba-2 and Mamba-1 (variantlab_plugins/ssm.py) against numbers worked out here, not by their
own code: the state a recurrent decoder keeps (the params probe's state_bytes) by formula,
the authors' inits (Mamba-1's A = 1..N per channel, D = 1, the step floored at 1e-4), which
form ``impl`` runs, and which settings the spec refuses (the mutation triage of
docs/mutation.md)."""

import math

import pytest
import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.probes import run_probe

REG = vl.get_registry()
TINY = {"family": "gpt", "vocab_size": 64, "context_length": 32, "emb_dim": 32, "n_heads": 4,
        "n_layers": 2, "drop_rate": 0.0}


def _rows(rows, metric, scope="model"):
    return {(r["name"], r["layer"]): r["value"] for r in rows
            if r["metric"] == metric and r["scope"] == scope}


@pytest.mark.parametrize("attention, numbers", [
    # inner 2 x 32 = 64 in 4 heads of 16, N 16, one group: h 4 x 16 x 16, conv window
    # 3 x (64 + 2 x 16)
    ({"kind": "mamba2"}, 4 * 16 * 16 + 3 * (64 + 2 * 16)),
    # 8 heads of 8, N 4 in 2 groups, width 2: h 8 x 8 x 4, window 1 x (64 + 2 x 2 x 4)
    ({"kind": "mamba2", "d_state": 4, "n_groups": 2, "head_dim": 8, "conv_width": 2},
     8 * 8 * 4 + 1 * (64 + 16)),
    # inner 48 (Falcon-H1's mamba_d_ssm) in heads of 6: 8 heads, window 3 x (48 + 32)
    ({"kind": "mamba2", "inner_dim": 48, "head_dim": 6}, 8 * 6 * 16 + 3 * (48 + 32)),
    # inner 64 channels of N 16, window 3 x 64
    ({"kind": "mamba"}, 64 * 16 + 3 * 64),
    ({"kind": "mamba", "d_state": 4, "expand": 1, "conv_width": 2}, 32 * 4 + 1 * 32),
])
def test_state_bytes_by_formula(attention, numbers):
    rows = run_probe("params", {**TINY, "attention": attention}, None, seed=0, registry=REG)
    per_layer = numbers * 4  # float32
    assert _rows(rows, "state_bytes", "layer") == {("", 0): per_layer, ("", 1): per_layer}
    assert _rows(rows, "state_bytes")[("", None)] == 2 * per_layer
    assert _rows(rows, "state_bytes_per_token")[("", None)] == 0  # fixed-size state


@pytest.mark.parametrize("kind, forms", [
    ("mamba2", ("ssd_chunked", "ssd_recurrent")),
    ("mamba", ("selective_chunked", "selective_recurrent")),
])
@pytest.mark.parametrize("impl", ["chunked", "recurrent"])
def test_impl_picks_the_form_it_names(monkeypatch, kind, forms, impl):
    """The forms agree up to rounding, so only which one ran tells the setting was read."""
    import variantlab_plugins.ssm as ssm

    ran = []
    for name in forms:
        real = getattr(ssm, name)
        monkeypatch.setattr(ssm, name, lambda *a, _f=real, _n=name: ran.append(_n) or _f(*a))
    torch.manual_seed(0)
    if kind == "mamba2":
        mixer = ssm.Mamba2Mixer(32, 4, ssm.Mamba2Spec(impl=impl, chunk_size=2, d_state=4))
    else:
        mixer = ssm.MambaMixer(32, ssm.MambaSpec(impl=impl, chunk_size=2, d_state=4))
    assert mixer(torch.randn(1, 5, 32)).shape == (1, 5, 32)
    assert ran == [forms[impl == "recurrent"]]


def test_mamba1_starts_from_the_authors_init():
    """Mamba-1 / Jamba (state-spaces/mamba, S4D-real): A_log = log(1..N) in every channel,
    D = 1, softplus(dt_proj.bias) log-uniform in [dt_min, dt_max]; a rank-ceil(D/16) dt."""
    from variantlab_plugins.ssm import MambaMixer, MambaSpec

    torch.manual_seed(0)
    mixer = MambaMixer(1024, MambaSpec(d_state=5, expand=2))
    assert mixer.A_log.shape == (2048, 5)
    want = torch.log(torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]))
    assert torch.equal(mixer.A_log.detach(), want.expand(2048, 5))
    assert torch.equal(mixer.D.detach(), torch.ones(2048))
    assert mixer.dt_proj.weight.shape == (2048, 64)  # rank ceil(1024 / 16)
    assert MambaMixer(33, MambaSpec()).dt_proj.weight.shape == (66, 3)  # ceil(33 / 16)
    log_dt = F.softplus(mixer.dt_proj.bias.detach()).double().log()
    lo, hi = math.log(0.001), math.log(0.1)
    assert log_dt.min() >= lo - 1e-5 and log_dt.max() <= hi + 1e-5
    assert abs(log_dt.mean().item() - (lo + hi) / 2) < 0.1  # U(lo, hi): mean and sd
    assert abs(log_dt.std().item() - (hi - lo) / math.sqrt(12)) < 0.07


@pytest.mark.parametrize("kind", ["mamba", "mamba2"])
def test_a_step_below_the_floor_starts_at_1e_4(kind):
    """Mamba's dt_init_floor: a step drawn below 1e-4 starts at 1e-4 exactly."""
    from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec, MambaMixer, MambaSpec

    torch.manual_seed(0)
    if kind == "mamba":
        bias = MambaMixer(32, MambaSpec(dt_min=1e-6, dt_max=1e-5)).dt_proj.bias
    else:
        bias = Mamba2Mixer(32, 4, Mamba2Spec(dt_min=1e-6, dt_max=1e-5)).dt_bias
    assert torch.allclose(F.softplus(bias.detach().double()),
                          torch.full(bias.shape, 1e-4, dtype=torch.float64), rtol=1e-5)


def test_mamba2_d_skip_starts_at_one_per_head():
    from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec

    mixer = Mamba2Mixer(32, 4, Mamba2Spec(head_dim=8))
    assert torch.equal(mixer.D.detach(), torch.ones(8))


@pytest.mark.parametrize("attention, issues", [
    ({"kind": "mamba2", "dt_min": 0.2, "dt_max": 0.1},
     [("dt_max", "dt_max=0.1 is below dt_min=0.2: the step's init range [dt_min, dt_max] is "
       "empty; swap them or raise dt_max")]),
    ({"kind": "mamba", "dt_min": 0.01, "dt_max": 0.001},
     [("dt_max", "dt_max=0.001 is below dt_min=0.01: the step's init range [dt_min, dt_max] "
       "is empty; swap them or raise dt_max")]),
    ({"kind": "mamba2", "conv_width": 9},
     [("conv_width", "conv_width=9 exceeds context_length=8; choose at most the context")]),
    ({"kind": "mamba2", "inner_dim": 30},
     [("head_dim", "the inner width 30 is not a multiple of head_dim=7; set head_dim to a "
       "divisor of 30")]),
    ({"kind": "mamba2", "inner_dim": 30, "head_dim": 4},
     [("head_dim", "the inner width 30 is not a multiple of head_dim=4; set head_dim to a "
       "divisor of 30")]),
    ({"kind": "mamba2", "n_groups": 3},
     [("n_groups", "n_groups=3 does not divide the 4 SSM heads")]),
    ({"kind": "mamba2", "head_dim": 4, "n_groups": 3},
     [("n_groups", "n_groups=3 does not divide the 16 SSM heads")]),
    # 8 heads of 6: 3 divides inner x head_dim = 288 but not the 8 heads
    ({"kind": "mamba2", "inner_dim": 48, "head_dim": 6, "n_groups": 3},
     [("n_groups", "n_groups=3 does not divide the 8 SSM heads")]),
])
def test_bad_settings_refused_exactly(attention, issues):
    spec = {**TINY, "context_length": 8, "attention": attention}
    with pytest.raises(SpecError) as err:
        vl.parse_model_spec(spec, REG)
    assert [(i.loc, i.message) for i in err.value.issues] == \
        [(("attention", loc), words) for loc, words in issues]


@pytest.mark.parametrize("attention", [
    {"kind": "mamba2", "dt_min": 0.1, "dt_max": 0.1},  # an empty range is refused, one point not
    {"kind": "mamba2", "conv_width": 8},  # the whole context
    {"kind": "mamba2", "inner_dim": 30, "head_dim": 5},  # 6 heads of 5
    {"kind": "mamba2", "inner_dim": 48, "head_dim": 6, "n_groups": 4},  # 8 heads in 4 groups
    {"kind": "mamba2", "head_dim": 8, "n_groups": 8},  # 8 heads of 8, one per group
    {"kind": "mamba", "conv_width": 8, "dt_min": 0.01, "dt_max": 0.01},
])
def test_settings_at_the_bounds_accepted(attention):
    spec = vl.parse_model_spec({**TINY, "context_length": 8, "attention": attention}, REG)
    model = vl.build_model(spec, REG)
    assert model(torch.randint(0, 64, (1, 8))).shape == (1, 8, 64)


@pytest.mark.parametrize("kind", ["mamba2", "mamba"])
def test_the_walk_examples_are_settings_the_spec_accepts(kind):
    """tests/test_registry_walk.py builds these; an example made invalid fails here too."""
    from variantlab_plugins.ssm import Mamba2Spec, MambaSpec

    for example in (Mamba2Spec if kind == "mamba2" else MambaSpec).walk_examples:
        spec = vl.parse_model_spec({**TINY, "attention": example}, REG)
        assert {key: getattr(spec.attention, key) for key in example} == example


def test_the_documented_chunk_sizes_reach_the_scans(monkeypatch):
    """docs/mixers.md: chunks of 64 positions for Mamba-2, of 16 for Mamba-1 (its chunk holds
    (B, L, L, E, N) in memory) unless set."""
    import variantlab_plugins.ssm as ssm

    chunks = []
    for name in ("ssd_chunked", "selective_chunked"):
        real = getattr(ssm, name)
        monkeypatch.setattr(ssm, name, lambda *a, _f=real: chunks.append(a[-1]) or _f(*a))
    torch.manual_seed(0)
    ssm.Mamba2Mixer(32, 4, ssm.Mamba2Spec(d_state=4))(torch.randn(1, 3, 32))
    ssm.MambaMixer(32, ssm.MambaSpec(d_state=4))(torch.randn(1, 3, 32))
    assert chunks == [64, 16]


def test_jambas_inner_norms_compute_in_float32_for_half_inputs():
    """Jamba's dt, B and C RMSNorms cast a bfloat16 input up to float32, normalise, and cast
    the result back (then the float32 scale): not bfloat16 arithmetic throughout."""
    from variantlab_plugins.ssm import MambaMixer, MambaSpec

    mixer = MambaMixer(32, MambaSpec(d_state=8, dt_rank=8, inner_norms=True))
    y = (3 * torch.randn(64, 8, generator=torch.Generator().manual_seed(9))).to(torch.bfloat16)
    up = y.float()
    want = (up / torch.sqrt(up.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16).float()
    for norm in (mixer.dt_layernorm, mixer.b_layernorm, mixer.c_layernorm):
        assert torch.equal(norm(y), want)


def test_mamba2_step_starts_log_uniform_in_the_default_range():
    """Mamba-2's dt_bias: softplus(dt_bias) log-uniform in [0.001, 0.1] unless set."""
    from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec

    torch.manual_seed(0)
    mixer = Mamba2Mixer(32, 4, Mamba2Spec(expand=64, head_dim=1, d_state=1))  # 2048 heads
    log_dt = F.softplus(mixer.dt_bias.detach()).double().log()
    lo, hi = math.log(0.001), math.log(0.1)
    assert log_dt.shape == (2048,)
    assert log_dt.min() >= lo - 1e-5 and log_dt.max() <= hi + 1e-5
    assert abs(log_dt.mean().item() - (lo + hi) / 2) < 0.1  # U(lo, hi): mean and sd
    assert abs(log_dt.std().item() - (hi - lo) / math.sqrt(12)) < 0.07


def test_gated_rmsnorm_defaults_gate_first_in_one_group():
    """GatedRMSNorm(dim) alone is Mamba-2's: norm(y * silu(z)) over the whole width, eps
    1e-6 (values of size 1e-3, so that the eps shows)."""
    from variantlab_plugins.ssm import GatedRMSNorm

    gen = torch.Generator().manual_seed(3)
    y, z = 1e-3 * torch.randn(2, 3, 8, generator=gen, dtype=torch.float64), \
        torch.randn(2, 3, 8, generator=gen, dtype=torch.float64)
    gated = y * z / (1 + torch.exp(-z))
    want = gated / torch.sqrt(gated.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(GatedRMSNorm(8)(y, z), want, rtol=1e-9, atol=0)


def test_default_parameters_are_hfs_without_the_options():
    """Unset options build the plain mixers: Mamba-1 without Jamba's inner norms and without
    in/out biases, Mamba-2 with its gated norm (HF's parameter names, one to one)."""
    from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec, MambaMixer, MambaSpec

    plain = {"in_proj.weight", "conv1d.weight", "conv1d.bias", "A_log", "D", "out_proj.weight"}
    mamba = dict(MambaMixer(32, MambaSpec()).named_parameters())
    assert set(mamba) == plain | {"x_proj.weight", "dt_proj.weight", "dt_proj.bias"}
    mamba2 = dict(Mamba2Mixer(32, 4, Mamba2Spec()).named_parameters())
    assert set(mamba2) == plain | {"dt_bias", "norm.weight"}
