"""The conformance kit: passes good components, flags each kind of broken one."""

from pathlib import Path

import pytest
from torch import nn

import variantlab as vl
from variantlab.errors import SpecError
from variantlab.testing import check_component, component_problems

FIXTURES = Path(__file__).parent / "plugins_fixtures"


def fixture(name: str) -> str:
    return str(FIXTURES / name)


@pytest.fixture(scope="module")
def registry():
    return vl.build_registry(entry_points=False)


def kit_error(slot, spec, plugin, **kw) -> str:
    with pytest.raises(AssertionError) as info:
        check_component(slot, spec, [fixture(plugin)], **kw)
    return str(info.value)


def test_builtins_with_parameters_pass(registry):
    check_component("norm", {"kind": "layer", "eps": 1e-6}, registry=registry)
    check_component("attention", {"kind": "mha", "impl": "sdpa"}, registry=registry)
    check_component("feedforward", {"kind": "glu", "hidden_dim": 40}, registry=registry)
    check_component("residual", {"kind": "post_norm", "shortcut": False}, registry=registry)
    check_component("family", {"family": "gpt", "tie_weights": True}, registry=registry)
    check_component("family", {"family": "mlp", "layer_sizes": [3, 5, 5, 2]}, registry=registry)


def test_a_good_plugin_file_passes():
    assert component_problems("norm", {"kind": "centre"}, [fixture("local_norm.py")]) == []


def test_flags_a_component_that_changes_the_shape():
    message = kit_error("norm", {"kind": "wrong_shape"}, "wrong_shape.py", families=["gpt"])
    assert "norm 'wrong_shape' breaks 4 point(s)" in message
    assert "norm (standalone): forward (train mode): output shape (2, 8, 16), expected (2, 8, 32)" \
        in message
    assert "input (5, 32) gave output shape (5, 16)" in message
    assert "in family 'gpt': forward/backward (train mode): raised RuntimeError" in message


def test_flags_a_parameter_without_gradient():
    message = kit_error("norm", {"kind": "unused_param"}, "unused_param.py")
    assert "norm (standalone): gradients: 1 parameter(s) got no gradient" in message
    assert "forgotten_shift" in message
    # every family that has a norm reports it: gpt has 2 layers x 2 + the final norm
    assert "in family 'gpt': gradients: 5 parameter(s) got no gradient" in message
    assert "in family 'mlp': gradients: 5 parameter(s) got no gradient" in message
    assert "determinism" not in message and "shape" not in message


def test_flags_a_component_not_deterministic_under_a_seed():
    message = kit_error("norm", {"kind": "random_init"}, "random_init.py", families=["gpt"])
    assert "norm (standalone): determinism under a seed: two builds after torch.manual_seed(5) " \
           "differ in gain" in message
    assert "give different eval outputs" in message
    assert "in family 'gpt': determinism under a seed" in message
    assert "gradients" not in message


def test_flags_a_forward_that_raises_once_per_case():
    problems = component_problems("norm", {"kind": "explodes"}, [fixture("explodes.py")],
                                  families=["gpt", "encoder"])
    assert problems == [
        f"{where}: forward/backward (train mode): raised RuntimeError: explodes: forward fails "
        "on purpose" for where in ("norm (standalone)", "in family 'gpt'", "in family 'encoder'")
    ]


def test_slot_contracts_are_checked(registry, monkeypatch):
    """A causal attention that peeks ahead and a component that ignores dropout in eval
    are flagged by the slot's own checks."""
    mha = registry.get("attention", "mha")

    def leaky(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, causal):
        return mha.build(spec, emb_dim, n_heads, context_length, drop_rate, qkv_bias, False)

    monkeypatch.setitem(registry._components["attention"], "mha",
                        type(mha)(mha.slot, mha.kind, mha.spec_cls, leaky, mha.plugin))
    problems = component_problems("attention", {"kind": "mha"}, registry=registry,
                                  families=["gpt"])
    assert any("outputs at earlier positions change when later positions change" in p
               for p in problems)


def test_explicit_family_that_does_not_fit_is_a_problem(registry):
    problems = component_problems("attention", {"kind": "mha"}, registry=registry,
                                  families=["mlp"])
    assert problems == ["in family 'mlp': build: SpecError: attention: family 'mlp' has no "
                        "attention slot"]


def test_bad_spec_is_a_spec_error_with_its_key_path(registry):
    with pytest.raises(SpecError) as info:
        check_component("norm", {"kind": "layer", "epsilon": 1e-5}, registry=registry)
    assert info.value.issues[0].loc == ("norm", "epsilon")
    with pytest.raises(SpecError, match="did you mean 'layer'"):
        check_component("norm", {"kind": "layr"}, registry=registry)
    with pytest.raises(ValueError, match="unknown slot 'norms'"):
        check_component("norms", {"kind": "layer"}, registry=registry)


def test_accepts_a_component_spec_object(registry):
    spec_cls = registry.get("norm", "rms").spec_cls
    check_component("norm", spec_cls(eps=1e-6), registry=registry, families=["block"])


def test_state_dict_round_trip_is_checked(registry, monkeypatch):
    """A tensor kept as a plain attribute (not a buffer) escapes state_dict."""
    import torch

    class Hidden(nn.Module):
        def __init__(self, dim):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(dim))
            self.offset = torch.randn(dim)  # should be a buffer

        def forward(self, x):
            return self.scale * x + self.offset.to(x.device, x.dtype)

    rms = registry.get("norm", "rms")
    monkeypatch.setitem(registry._components["norm"], "rms",
                        type(rms)("norm", "rms", rms.spec_cls, lambda spec, dim: Hidden(dim), "t"))
    problems = component_problems("norm", {"kind": "rms"}, registry=registry, families=["gpt"])
    assert any("state_dict round-trip: a fresh build loaded with the state_dict gives different"
               in p for p in problems)
