"""The plugin's own tests: the formula, and variantlab's conformance kit."""

import math
from pathlib import Path

import torch

from variantlab.testing import check_component

# Installed, the entry point registers the plugin; from a checkout, name the file instead.
PLUGIN = str(Path(__file__).resolve().parents[1] / "variantlab_scalenorm.py")


def plugins() -> list[str]:
    from variantlab import build_registry

    return [] if "scale" in build_registry().kinds("norm") else [PLUGIN]


def test_formula():
    import importlib.util

    spec = importlib.util.spec_from_file_location("scalenorm_under_test", PLUGIN)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    norm = mod.ScaleNorm(dim=4, eps=1e-5, init=None)
    assert norm.g.item() == 2.0  # sqrt(4)
    x = torch.tensor([[3.0, 4.0, 0.0, 0.0]])
    assert torch.allclose(norm(x), torch.tensor([[1.2, 1.6, 0.0, 0.0]]))
    assert torch.allclose(norm(torch.zeros(1, 4)), torch.zeros(1, 4))
    assert math.isclose(norm(torch.randn(5, 4)).norm(dim=-1)[0].item(), 2.0, rel_tol=1e-6)


def test_conformance():
    check_component("norm", {"kind": "scale"}, plugins=plugins())
    check_component("norm", {"kind": "scale", "init": 1.0, "eps": 1e-6}, plugins=plugins(),
                    families=["gpt", "encoder_decoder"])
