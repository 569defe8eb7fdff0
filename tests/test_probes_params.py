"""params probe: totals, per slot, per layer, tied weights once."""

from types import SimpleNamespace

import pytest
import torch

import variantlab as vl
from variantlab.probes import run_probe
from variantlab.probes.params import state_rows

REG = vl.get_registry()


def by(rows, metric, scope="model"):
    return {(r["name"], r["layer"]): r["value"] for r in rows
            if r["metric"] == metric and r["scope"] == scope}


def test_probe_names():
    assert vl.build_registry(entry_points=False).probe_names() == [
        "params", "gradients", "timing", "training", "dynamics"]
    with pytest.raises(ValueError, match="unknown probe 'flops'"):
        run_probe("flops", {"family": "gpt"}, None, seed=0, registry=REG)


def test_totals_match_unique_parameters(tiny):
    rows = run_probe("params", tiny, None, seed=0, registry=REG)
    assert all(r["probe"] == "params" and r["unit"] == ("bytes" if r["metric"].startswith(
        "state") else "count") for r in rows)
    model = vl.build_model(tiny, REG)
    total = sum(p.numel() for p in model.parameters())
    assert by(rows, "total")[("", None)] == total == 30_400
    assert by(rows, "trainable")[("", None)] == total
    # token embedding 64*32 and learned positions 32*32 are excluded
    assert by(rows, "non_embedding")[("", None)] == total - 64 * 32 - 32 * 32
    slots = by(rows, "params", "slot")
    assert sum(slots.values()) == total
    assert slots[("embedding", None)] == 64 * 32
    assert slots[("positional", None)] == 32 * 32
    assert slots[("head", None)] == 64 * 32
    assert slots[("norm", None)] == (2 * 2 + 1) * 2 * 32  # 2 per block + final, scale+shift
    layers = by(rows, "params", "layer")
    assert sorted(k[1] for k in layers) == [0, 1]
    per_block = 4 * 32 * 32 + 32 + (32 * 128 + 128 + 128 * 32 + 32) + 2 * 2 * 32
    assert all(v == per_block for v in layers.values())


@pytest.mark.parametrize("attention, per_layer, per_token", [
    ({"kind": "mha"}, 2 * 32 * 32 * 4, 2 * 32 * 4),  # K and V: emb_dim each per position
    ({"kind": "mha", "n_kv_heads": 1}, 2 * 8 * 32 * 4, 2 * 8 * 4),  # one KV head of 8
    ({"kind": "mha", "window": 4}, 2 * 32 * 4 * 4, 0),  # the window's 4 positions, full
    ({"kind": "linear_attention"}, 4 * 8 * (8 + 1) * 4, 0),  # S and z per head
    ({"kind": "retention"}, 4 * 8 * 8 * 4, 0),
    ({"kind": "short_conv", "width": 3}, 2 * 32 * 4, 0),  # the last 2 inputs
])
def test_state_bytes(tiny, attention, per_layer, per_token):
    rows = run_probe("params", {**tiny, "attention": attention, "positional": "learned"}, None,
                     seed=0, registry=REG)
    assert by(rows, "state_bytes", "layer") == {("", 0): per_layer, ("", 1): per_layer}
    assert by(rows, "state_bytes")[("", None)] == 2 * per_layer
    assert by(rows, "state_bytes_per_token")[("", None)] == 2 * per_token


def test_tied_weights_counted_once(tiny):
    untied = by(run_probe("params", tiny, None, seed=0, registry=REG), "total")[("", None)]
    tied_rows = run_probe("params", {**tiny, "tie_weights": True}, None, seed=0, registry=REG)
    assert by(tied_rows, "total")[("", None)] == untied - 64 * 32
    assert ("head", None) not in by(tied_rows, "params", "slot")
    assert sum(by(tied_rows, "params", "slot").values()) == untied - 64 * 32


def test_gpt2_124m_seed_counts():
    spec = {"family": "gpt", "n_layers": 12, "emb_dim": 768, "n_heads": 12}
    rows = run_probe("params", spec, None, seed=0, registry=REG)
    assert by(rows, "total")[("", None)] == 163_009_536
    assert by(rows, "non_embedding")[("", None)] == 163_009_536 - 50257 * 768 - 1024 * 768


def test_untagged_parameters_fall_under_other():
    rows = run_probe("params", {"family": "mlp", "norm": "none"}, None, seed=0, registry=REG)
    slots = by(rows, "params", "slot")
    # each Linear sits in a residual wrapper, the innermost tagged module
    assert set(k[0] for k in slots) == {"residual"}
    assert slots[("residual", None)] == 4 * (9 + 3) + (3 + 1)


class _Mixer(torch.nn.Module):
    """A slot module that keeps ``per_t * t`` numbers after t tokens (when ``sized``)."""

    def __init__(self, slot, causal, per_t, sized=True):
        super().__init__()
        self.variantlab_slot, self.lin = slot, torch.nn.Linear(2, 2)
        if causal is not None:
            self.causal = causal
        self.state_size = (lambda t: per_t * t) if sized else per_t


def test_state_bytes_count_only_causal_attention_with_a_state_size():
    """Of five state-keeping modules in layer 0, only the causal attention one counts: 3
    numbers a token, 8 tokens, 4 bytes each (float32) = 96 bytes, growing 12 a token. Not an
    attention marked non-causal (5), one with no ``causal`` flag (7), a causal feedforward
    (11), nor a causal attention whose ``state_size`` is a number, not a method."""
    layer = torch.nn.Module()
    layer.variantlab_layer = 0
    layer.a = _Mixer("attention", True, 3)
    layer.b = _Mixer("attention", False, 5)
    layer.c = _Mixer("attention", None, 7)
    layer.d = _Mixer("feedforward", True, 11)
    layer.e = _Mixer("attention", True, 13, sized=False)
    model = torch.nn.Module()
    model.layer = layer
    model.variantlab_spec = SimpleNamespace(context_length=8)
    rows = state_rows(model)
    assert by(rows, "state_bytes") == {("", None): 96}
    assert by(rows, "state_bytes_per_token") == {("", None): 12}
    assert by(rows, "state_bytes", "layer") == {("", 0): 96}


def test_no_state_rows_without_a_context_length_or_parameters():
    """A model with no spec, or with no parameter to read the dtype from, has no state rows
    (and never calls ``state_size``)."""
    layer = torch.nn.Module()
    layer.variantlab_layer = 0
    layer.a = _Mixer("attention", True, 3)
    model = torch.nn.Module()
    model.layer = layer
    assert state_rows(model) == []  # no variantlab_spec: context length unknown
    empty = torch.nn.Module()
    empty.variantlab_spec = SimpleNamespace(context_length=8)
    assert state_rows(empty) == []  # no parameters
