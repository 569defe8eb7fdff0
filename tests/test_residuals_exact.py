"""variantlab_plugins/residuals.py by exact values (issue 30, mutation triage): pre- and
post-norm against their formulas with and without the shortcut, DeepNorm's warnings for an
init kind of any name and for the encoder-decoder families, and ReZero's refusals. The
LayerNorm of the references is written out."""

import types
from typing import Literal

import conftest
import pytest
import torch
from torch import nn

import variantlab as vl
from variantlab import ComponentSpec, hookimpl
from variantlab.testing import check_component

REG = vl.build_registry(entry_points=False)
TINY = dict(conftest.TINY)


def ln(x):
    """LayerNorm at its initial scale 1 and shift 0: biased variance, eps 1e-5."""
    mu = x.mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(((x - mu) ** 2).mean(-1, keepdim=True) + 1e-5)


def wrap(kind: str, sublayer: nn.Module, in_dim: int = 4, out_dim: int = 4, **options):
    comp = REG.get("residual", kind)
    norm = REG.get("norm", "layer")
    return comp.build(comp.spec_cls(**options), sublayer,
                      lambda dim: norm.build(norm.spec_cls(), dim=dim), in_dim, out_dim, 0.0)


def sample():
    torch.manual_seed(0)
    return nn.Linear(4, 4), torch.tensor([[[1.0, -2.0, 0.5, 3.0], [0.0, 1.0, -1.0, 2.0]]])


@pytest.mark.parametrize("shortcut", [True, False])
def test_pre_norm_is_x_plus_f_of_norm_x(shortcut):
    f, x = sample()
    want = f(ln(x)) + (x if shortcut else 0)
    torch.testing.assert_close(wrap("pre_norm", f, shortcut=shortcut)(x), want)


@pytest.mark.parametrize("shortcut", [True, False])
def test_post_norm_is_norm_of_x_plus_f_x(shortcut):
    f, x = sample()
    want = ln(f(x) + (x if shortcut else 0))
    torch.testing.assert_close(wrap("post_norm", f, shortcut=shortcut)(x), want)


class BSpec(ComponentSpec):
    kind: Literal["b_init"] = "b_init"  # sorts before "deepnorm"


def test_deepnorm_warns_for_any_other_init_and_for_encoder_decoder_families():
    plugin = types.ModuleType("b_init_plugin")

    @hookimpl
    def register_inits(register):
        register("b_init", BSpec, lambda spec: lambda model: None)

    plugin.register_inits = register_inits
    reg = vl.build_registry(entry_points=False)
    reg.load_module(plugin, "b_init_plugin", "module")
    spec = vl.parse_model_spec({**TINY, "residual": "deepnorm", "init": "b_init"}, reg)
    assert [w for w in spec.warnings() if "set init: deepnorm" in w] != []
    for family in ("decoder", "encoder_decoder"):
        data = {**TINY, "family": family, "residual": "deepnorm", "init": "deepnorm"}
        found = vl.parse_model_spec(data, REG).warnings()
        assert len(found) == 1 and "not DeepNet's encoder-decoder ones" in found[0]
        data["residual"] = {"kind": "deepnorm", "alpha": 2.0}
        assert vl.parse_model_spec(data, REG).warnings() == []


@pytest.mark.parametrize("in_dim, out_dim", [(4, 8), (8, 4)])
def test_rezero_refuses_a_width_change_either_way(in_dim, out_dim):
    with pytest.raises(ValueError, match=f"in_dim == out_dim, got {in_dim}, {out_dim}"):
        wrap("rezero", nn.Linear(in_dim, out_dim), in_dim, out_dim)


def test_rezero_passes_the_conformance_kit_as_a_zero_init_branch():
    """Its sublayer gets an all-zero gradient on the first step by design: the kit must be
    told (``zero_init_branch``), else it reports that gradient as a bug."""
    check_component("residual", {"kind": "rezero"}, registry=REG, families=["gpt"])
