"""The recipe module alone, against numbers worked out by hand: the settings' defaults and
bounds, every schedule's learning rates, the step budget and its refusals, the weight-decay
groups of a handmade model and the optimizers built on them (no training run)."""

import math

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from variantlab.probes.common import param_index
from variantlab.probes.recipe import (
    Optimizers,
    RecipeSettings,
    groups,
    lr_at,
    make_optimizer,
    planned_steps,
    steps_problem,
    worked_out_steps,
)


def test_defaults():
    s = RecipeSettings()
    assert (s.steps, s.lr, s.warmup_steps, s.weight_decay) == (200, 3e-4, 0, 0.1)
    assert (s.schedule, s.decay_fraction, s.min_lr_ratio) == ("constant", 0.2, 0.0)
    assert (s.optimizer, s.betas, s.momentum, s.no_decay) == ("adamw", (0.9, 0.999), None, ())
    assert (s.tokens, s.tokens_per_param) == (None, None)


@pytest.mark.parametrize("ok", [
    {"steps": 1}, {"lr": 1e-12}, {"warmup_steps": 0}, {"weight_decay": 0.0},
    {"decay_fraction": 1.0}, {"decay_fraction": 1e-12}, {"min_lr_ratio": 0.0},
    {"min_lr_ratio": 1.0}, {"momentum": 0.0}, {"momentum": 0.999}, {"betas": (0.0, 0.0)},
    {"betas": (0.0, 0.9999)}, {"tokens": 1}, {"tokens_per_param": 1e-12},
    {"no_decay": ("norms", "biases", "embeddings")},
])
def test_values_at_the_bounds_are_accepted(ok):
    s = RecipeSettings(**ok)
    assert {k: getattr(s, k) for k in ok} == ok


@pytest.mark.parametrize("bad", [
    {"steps": 0}, {"lr": 0.0}, {"warmup_steps": -1}, {"weight_decay": -1e-12},
    {"decay_fraction": 0.0}, {"decay_fraction": 1.0 + 1e-12}, {"min_lr_ratio": -1e-12},
    {"min_lr_ratio": 1.0 + 1e-12}, {"momentum": -1e-12}, {"momentum": 1.0},
    {"betas": (-1e-12, 0.9)}, {"betas": (0.9, 1.0)}, {"betas": (0.9, 1.5)}, {"tokens": 0},
    {"tokens_per_param": 0.0},
])
def test_values_past_the_bounds_are_refused(bad):
    with pytest.raises(ValidationError):
        RecipeSettings(**bad)


def test_lists_become_tuples():
    s = RecipeSettings(betas=[0.5, 0.6], no_decay=["biases", "norms"])
    assert s.betas == (0.5, 0.6) and s.no_decay == ("biases", "norms")


@pytest.mark.parametrize("bad,message", [
    ({"betas": [0.9, 1.0]}, "each beta must be in [0, 1), got [0.9, 1.0]"),
    ({"betas": [-0.5, 0.9]}, "each beta must be in [0, 1), got [-0.5, 0.9]"),
    ({"steps": 5, "tokens": 10}, "give one of steps, tokens, tokens_per_param, not "
                                 "['steps', 'tokens']"),
    ({"steps": 5, "tokens_per_param": 1.0}, "not ['steps', 'tokens_per_param']"),
    ({"tokens": 5, "tokens_per_param": 1.0}, "not ['tokens', 'tokens_per_param']"),
    ({"no_decay": ["biases", "norms", "biases"]},
     "no_decay lists a kind twice: ['biases', 'norms', 'biases']"),
])
def test_refusals_name_the_problem(bad, message):
    with pytest.raises(ValidationError) as err:
        RecipeSettings(**bad)
    assert message in str(err.value)


@pytest.mark.parametrize("budget", [{"steps": 5}, {"tokens": 5}, {"tokens_per_param": 5.0}])
def test_one_budget_alone_is_accepted(budget):
    assert RecipeSettings(**budget).model_fields_set == set(budget)


def R(**kw):
    return RecipeSettings(lr=2.0, min_lr_ratio=0.25, **kw)  # floor 0.5


def test_warm_up_then_constant():
    s = R(steps=7, warmup_steps=4)
    assert [lr_at(i, s) for i in range(7)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0, 2.0]
    s = R(steps=3)
    assert [lr_at(i, s) for i in range(3)] == [2.0, 2.0, 2.0]


def test_cosine_by_hand():
    # warm-up 2 of 10 steps: p = (i - 2) / 8; lr = 0.5 + 1.5 (1 + cos(pi p)) / 2
    s = R(steps=10, warmup_steps=2, schedule="cosine")
    half = math.sqrt(0.5)
    want = [1.0, 2.0, 2.0, 0.5 + 0.75 * (1 + math.cos(math.pi / 8)), 0.5 + 0.75 * (1 + half),
            0.5 + 0.75 * (1 + math.cos(3 * math.pi / 8)), 1.25,
            0.5 + 0.75 * (1 - math.cos(3 * math.pi / 8)), 0.5 + 0.75 * (1 - half),
            0.5 + 0.75 * (1 - math.cos(math.pi / 8))]
    assert [lr_at(i, s) for i in range(10)] == pytest.approx(want, rel=1e-12)


def test_linear_by_hand_and_a_given_total():
    s = R(steps=4, schedule="linear")
    assert [lr_at(i, s) for i in range(4)] == pytest.approx([2.0, 1.625, 1.25, 0.875])
    s = R(steps=100, warmup_steps=2, schedule="linear")  # total 6 given: p = (i - 2) / 4
    assert [lr_at(i, s, 6) for i in range(6)] == pytest.approx(
        [1.0, 2.0, 2.0, 1.625, 1.25, 0.875])


def test_wsd_by_hand():
    s = R(steps=10, schedule="wsd", decay_fraction=0.3)  # the last 3 steps cool down
    assert [lr_at(i, s) for i in range(10)] == pytest.approx(
        [2.0] * 7 + [1.5, 1.0, 0.5])
    s = R(steps=10, schedule="wsd", decay_fraction=0.26)  # round(2.6) = 3
    assert [lr_at(i, s) for i in range(7, 10)] == pytest.approx([1.5, 1.0, 0.5])
    # the cool-down starts after the warm-up at the latest: 2 steps of cool-down
    s = R(steps=10, warmup_steps=8, schedule="wsd", decay_fraction=0.3)
    assert [lr_at(i, s) for i in range(10)] == pytest.approx(
        [0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75, 2.0, 1.25, 0.5])
    # 0.2 x 2 rounds to no step: one step of cool-down all the same
    s = R(steps=2, schedule="wsd", decay_fraction=0.2)
    assert [lr_at(i, s) for i in range(2)] == pytest.approx([2.0, 0.5])
    s = R(steps=4, schedule="wsd", decay_fraction=1.0)  # all steps cool down
    assert [lr_at(i, s) for i in range(4)] == pytest.approx([1.625, 1.25, 0.875, 0.5])


def test_worked_out_steps_by_hand():
    assert worked_out_steps(RecipeSettings(steps=7), 64, 1000) == 7
    for tokens, steps in [(1, 1), (63, 1), (64, 1), (65, 2), (300, 5), (320, 5), (321, 6)]:
        assert worked_out_steps(RecipeSettings(tokens=tokens), 64, 1000) == steps
    # ceil(0.5 x 1001) = 501 tokens over 100 a step: 6 steps
    assert worked_out_steps(RecipeSettings(tokens_per_param=0.5), 100, 1001) == 6
    assert worked_out_steps(RecipeSettings(tokens_per_param=0.5), 100, 1000) == 5
    assert worked_out_steps(RecipeSettings(tokens_per_param=0.001), 100, 1000) == 1
    assert worked_out_steps(RecipeSettings(tokens_per_param=0.0011), 1, 1000) == 2
    # no non-embedding parameter: a budget of 0 tokens still runs one step
    assert worked_out_steps(RecipeSettings(tokens_per_param=0.5), 100, 0) == 1


def test_the_step_bound_and_its_messages():
    assert steps_problem(RecipeSettings(steps=1_000_000), 64, 10) is None
    assert planned_steps(RecipeSettings(steps=1_000_000), 64, 10) == 1_000_000
    assert planned_steps(RecipeSettings(tokens=64_000_000), 64, 10) == 1_000_000
    bound = ("more than the bound of 1,000,000 steps a run may take "
             "(variantlab.probes.recipe.MAX_STEPS); use a smaller ")
    cases = [
        (RecipeSettings(steps=1_000_001), 64, 10, "steps",
         "the budget works out to 1,000,001 steps, " + bound + "steps"),
        (RecipeSettings(tokens=64_000_001), 64, 10, "tokens",
         "the budget works out to 1,000,001 steps (tokens=64,000,001 over 64 tokens per step, "
         "batch_size x seq_len), " + bound + "tokens or a larger batch"),
        (RecipeSettings(tokens_per_param=2.0), 64, 32_000_001, "tokens_per_param",
         "the budget works out to 1,000,001 steps (tokens_per_param=2.0 over 64 tokens per "
         "step, batch_size x seq_len, with 32,000,001 non-embedding parameters), " + bound
         + "tokens_per_param or a larger batch"),
    ]
    for settings, per_step, non_embedding, key, message in cases:
        assert steps_problem(settings, per_step, non_embedding) == (key, message)
        with pytest.raises(ValueError) as err:
            planned_steps(settings, per_step, non_embedding)
        assert str(err.value) == f"{key}: {message}"


class Tagged(nn.Module):
    def __init__(self, slot: str, **params: nn.Parameter) -> None:
        super().__init__()
        self.variantlab_slot = slot
        for name, p in params.items():
            setattr(self, name, p)


def P(*shape: int) -> nn.Parameter:
    return nn.Parameter(torch.randn(*shape))


def handmade() -> nn.Module:
    """Each kind of parameter once; names and the kinds written by hand in KINDS."""
    model = nn.Module()
    model.scale = P(4)  # untagged: slot "other"
    model.emb = Tagged("embedding", weight=P(10, 4))
    model.pos = Tagged("positional", table=P(8, 4))
    model.norm = Tagged("norm", weight=P(4), bias=P(4))
    model.attn = Tagged("attention", weight=P(4, 4), bias=P(4), alpha=P(4))
    model.ffn = Tagged("feedforward", w_up=P(4, 8), b_up=P(2, 8), bias_scale=P(4, 4),
                       w_experts=P(2, 4, 8))
    model.head = Tagged("head", weight=P(4, 10))
    return model


KINDS = {"scale": None, "emb.weight": "embeddings", "pos.table": "embeddings", "norm.weight": "norms",
         "norm.bias": "norms", "attn.weight": None, "attn.bias": "biases", "attn.alpha": None,
         "ffn.w_up": None, "ffn.b_up": "biases", "ffn.bias_scale": None,
         "ffn.w_experts": None, "head.weight": None}


def names(model: nn.Module, params) -> set[str]:
    by_id = {id(p): n for n, p in model.named_parameters()}
    return {by_id[id(p)] for p in params}


@pytest.mark.parametrize("no_decay", [(), ("norms",), ("biases",), ("embeddings",),
                                      ("norms", "biases", "embeddings")])
def test_groups_split_by_kind(no_decay):
    model = handmade()
    out = groups(param_index(model), RecipeSettings(weight_decay=0.05, no_decay=no_decay))
    free = {n for n, k in KINDS.items() if k in no_decay}
    assert [g["weight_decay"] for g in out] == [0.05] + ([0.0] if free else [])
    assert names(model, out[0]["params"]) == set(KINDS) - free
    if free:
        assert names(model, out[1]["params"]) == free


def test_groups_of_no_decayed_or_no_parameters():
    model = nn.Module()
    model.norm = Tagged("norm", weight=P(4))
    out = groups(param_index(model), RecipeSettings(no_decay=("norms",)))
    assert len(out) == 1 and out[0]["weight_decay"] == 0.0
    assert names(model, out[0]["params"]) == {"norm.weight"}
    assert groups([], RecipeSettings()) == []


def test_plain_adamw_is_one_group():
    model = handmade()
    opt = make_optimizer(model, RecipeSettings(lr=0.01, betas=(0.8, 0.7), weight_decay=0.05))
    assert type(opt) is torch.optim.AdamW and len(opt.param_groups) == 1
    g = opt.param_groups[0]
    assert (g["lr"], g["betas"], g["weight_decay"]) == (0.01, (0.8, 0.7), 0.05)
    assert names(model, g["params"]) == set(KINDS)


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_adamw_and_sgd_with_no_decay_groups(optimizer):
    model = handmade()
    opt = make_optimizer(model, RecipeSettings(optimizer=optimizer, lr=0.01, betas=(0.8, 0.7),
                                               weight_decay=0.05, no_decay=("biases",)))
    assert type(opt) is {"adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}[optimizer]
    decayed, free = opt.param_groups
    assert (decayed["weight_decay"], free["weight_decay"]) == (0.05, 0.0)
    assert names(model, free["params"]) == {"attn.bias", "ffn.b_up"}
    assert decayed["lr"] == free["lr"] == 0.01
    if optimizer == "adamw":
        assert decayed["betas"] == free["betas"] == (0.8, 0.7)
    else:
        assert decayed["momentum"] == 0.9


@pytest.mark.parametrize("optimizer,momentum,want", [
    ("sgd", None, 0.9), ("sgd", 0.5, 0.5), ("sgd", 0.0, 0.0), ("muon", None, 0.95),
    ("muon", 0.5, 0.5), ("muon", 0.0, 0.0)])
def test_momentum_and_its_defaults(optimizer, momentum, want):
    opt = make_optimizer(handmade(), RecipeSettings(optimizer=optimizer, momentum=momentum))
    first = opt.optimizers[0] if optimizer == "muon" else opt
    assert {g["momentum"] for g in first.param_groups} == {want}


def test_muon_takes_the_hidden_matrices_only():
    model = handmade()
    opt = make_optimizer(model, RecipeSettings(optimizer="muon", lr=0.01, betas=(0.8, 0.7),
                                               weight_decay=0.05, no_decay=("norms",)))
    assert type(opt) is Optimizers and len(opt.optimizers) == 2
    muon, adamw = opt.optimizers
    assert type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    hidden = {"attn.weight", "ffn.w_up", "ffn.bias_scale"}  # not the 3-D w_experts
    assert names(model, [p for g in muon.param_groups for p in g["params"]]) == hidden
    assert [g["weight_decay"] for g in muon.param_groups] == [0.05]
    assert {g["adjust_lr_fn"] for g in muon.param_groups} == {"match_rms_adamw"}
    rest = adamw.param_groups
    assert [g["weight_decay"] for g in rest] == [0.05, 0.0]
    assert names(model, rest[0]["params"]) == set(KINDS) - hidden - {"norm.weight",
                                                                      "norm.bias"}
    assert names(model, rest[1]["params"]) == {"norm.weight", "norm.bias"}
    assert all(g["betas"] == (0.8, 0.7) and g["lr"] == 0.01 for g in rest)
    assert opt.param_groups == muon.param_groups + adamw.param_groups


def test_muon_alone_when_every_parameter_is_a_hidden_matrix():
    model = nn.Module()
    model.attn = Tagged("attention", weight=P(4, 4))
    opt = make_optimizer(model, RecipeSettings(optimizer="muon"))
    assert type(opt) is Optimizers and len(opt.optimizers) == 1
    assert type(opt.optimizers[0]) is torch.optim.Muon


def test_optimizers_step_and_zero_each():
    a, b = nn.Parameter(torch.tensor([1.0, 2.0])), nn.Parameter(torch.tensor([3.0]))
    both = Optimizers(torch.optim.SGD([a], lr=0.5), torch.optim.SGD([b], lr=0.25))
    for g in both.param_groups:  # reaches the optimizers' own groups
        g["lr"] *= 2
    (a.sum() * 2 + b.sum() * 4).backward()
    both.step()  # a - 1.0 x 2, b - 0.5 x 4
    assert a.tolist() == [-1.0, 0.0] and b.tolist() == [1.0]
    both.zero_grad(set_to_none=False)
    assert a.grad.tolist() == [0.0, 0.0] and b.grad.tolist() == [0.0]
    both.zero_grad()
    assert a.grad is None and b.grad is None
