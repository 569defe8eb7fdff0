"""variantlab/probes/common.py on hand-built modules: stacks, parameter attribution, layer
order, devices, dtypes, hooks, first tensors and variant descriptions (issue 30: each case
is one the mutation run of common.py showed no test telling apart)."""

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from variantlab.probes import common
from variantlab.probes.common import (
    ParamInfo,
    autocast,
    check_dtype,
    describe,
    first_tensor,
    forward_hooks,
    layer_stacks,
    param_index,
    resolve_device,
    stack_roots,
    stacked,
)


def layer(i: int) -> nn.Module:
    m = nn.Linear(2, 2)
    m.variantlab_layer = i
    return m


def holders(n: int) -> nn.Module:
    """A model of ``n`` children holding numbered layers (two each), a head without layers
    and a numbered layer as a direct child."""
    model = nn.Module()
    for k in range(n):
        setattr(model, f"stack{k}", nn.ModuleList([layer(2 * k), layer(2 * k + 1)]))
    model.head = nn.Linear(2, 2)
    model.top = layer(9)
    return model


def test_stacks_are_the_children_holding_layers_when_more_than_one_does():
    assert stack_roots(holders(0)) == {}
    assert stack_roots(holders(1)) == {}  # one stack: rows keep their plain names
    assert stack_roots(holders(2)) == {"stack0": "stack0", "stack1": "stack1"}
    assert stack_roots(holders(3)) == {"stack0": "stack0", "stack1": "stack1",
                                       "stack2": "stack2"}


def test_tagged_stacks_win_over_the_children():
    model = holders(2)
    model.stack1.variantlab_stack = "decoder"
    model.stack1[0].variantlab_stack = "inner"
    assert stack_roots(model) == {"stack1": "decoder", "stack1.0": "inner"}


def test_param_index_names_slots_layers_and_stacks_with_tied_weights_once():
    model = holders(2)
    model.stack0.variantlab_slot = "attention"
    model.head.weight = model.stack1[1].weight  # tied: listed once, under its first name
    rows = [(p.name, p.slot, p.layer, p.stack) for p in param_index(model)]
    assert rows == [
        ("stack0.0.weight", "attention", 0, "stack0"),
        ("stack0.0.bias", "attention", 0, "stack0"),
        ("stack0.1.weight", "attention", 1, "stack0"),
        ("stack0.1.bias", "attention", 1, "stack0"),
        ("stack1.0.weight", "other", 2, "stack1"),
        ("stack1.0.bias", "other", 2, "stack1"),
        ("stack1.1.weight", "other", 3, "stack1"),
        ("stack1.1.bias", "other", 3, "stack1"),
        ("head.bias", "other", None, ""),
        ("top.weight", "other", 9, ""),
        ("top.bias", "other", 9, ""),
    ]


def test_param_info_is_frozen():
    info = param_index(nn.Linear(1, 1))[0]
    assert isinstance(info, ParamInfo)
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.slot = "norm"  # type: ignore[misc]


def test_layers_are_sorted_by_index_not_by_order_of_registration():
    model = nn.Module()
    model.second, model.first = layer(1), layer(0)
    assert [(i, stack) for i, _, stack in layer_stacks(model)] == [(0, ""), (1, "")]
    assert layer_stacks(model)[0][1] is model.first


def test_stacked_names():
    assert stacked("decoder", "feedforward") == "decoder/feedforward"
    assert stacked("encoder", "") == "encoder/"
    assert stacked("", "feedforward") == "feedforward"


def test_resolve_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device(None) == resolve_device("auto") == torch.device("cpu")
    assert resolve_device("meta") == torch.device("meta")  # named devices pass through
    assert resolve_device("xpu") == torch.device("xpu")
    with pytest.raises(RuntimeError, match="'cuda:1' asked for, but torch .* sees no CUDA"):
        resolve_device("cuda:1")
    with pytest.raises(RuntimeError, match="'mps' asked for, but MPS is not available"):
        resolve_device("mps")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device(None) == resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda:1") == torch.device("cuda:1")
    assert resolve_device("mps") == torch.device("mps")


def test_check_dtype_on_devices_with_and_without_autocast():
    cpu, meta = torch.device("cpu"), torch.device("meta")
    for dtype in ("float32", "bfloat16", "float16"):
        check_dtype(dtype, cpu)  # no error
    check_dtype("float32", meta)  # float32 needs no autocast
    with pytest.raises(RuntimeError, match="dtype bfloat16: torch.autocast does not support 'meta'"):
        check_dtype("bfloat16", meta)
    with pytest.raises(ValueError, match="dtype 'half' is not one of"):
        check_dtype("half", cpu)


def test_bfloat16_refused_only_on_a_cuda_device_without_it(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Old GPU")
    with pytest.raises(RuntimeError, match="dtype bfloat16: Old GPU does not support bfloat16"):
        check_dtype("bfloat16", torch.device("cuda"))
    check_dtype("float16", torch.device("cuda"))
    check_dtype("bfloat16", torch.device("cpu"))
    check_dtype("float16", torch.device("cpu"))
    check_dtype("bfloat16", torch.device("mps"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: True)
    check_dtype("bfloat16", torch.device("cuda"))


def test_autocast_is_nothing_for_float32_and_casts_otherwise():
    cpu = torch.device("cpu")
    a = torch.ones(2, 2)
    assert isinstance(autocast("float32", cpu), contextlib.nullcontext)
    with autocast("float32", cpu):
        assert (a @ a).dtype == torch.float32
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        with autocast(name, cpu):
            assert (a @ a).dtype == dtype


def test_forward_hooks_see_each_output_until_the_block_ends():
    lin = nn.Linear(2, 3)
    seen = []
    with forward_hooks([(7, lin)], lambda i, out: seen.append((i, out.shape))):
        lin(torch.ones(4, 2))
    lin(torch.ones(5, 2))  # hook removed
    assert seen == [(7, torch.Size([4, 3]))]
    assert not lin._forward_hooks


def test_first_tensor():
    a, b = torch.zeros(1), torch.ones(1)
    assert first_tensor(a) is a
    assert first_tensor((None, [b, a])) is b
    assert first_tensor(["x", (None,), (a,)]) is a
    assert first_tensor((None, "x")) is None
    assert first_tensor({"out": a}) is None  # a dict is not read


def test_describe_names_each_slot_kind_and_its_settings():
    class Comp:
        def __init__(self, kind, **settings):
            self.kind, self.settings = kind, settings

        def model_dump(self):
            return {"kind": self.kind, **self.settings}

    spec = SimpleNamespace(family="toy", components=lambda: {
        "norm": Comp("rms", eps=1e-5, window=2), "positional": Comp("learned")})
    assert describe(spec) == (  # type: ignore[arg-type]
        "family toy, norm rms {'eps': 1e-05, 'window': 2}, positional learned")


def test_dtypes_table():
    assert common.DTYPES == {"float32": torch.float32, "bfloat16": torch.bfloat16,
                             "float16": torch.float16}
