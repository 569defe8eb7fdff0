"""The training recipe: learning-rate schedules, optimizers, weight-decay groups, token budgets.

Schedules (after ``warmup_steps`` of linear warm-up, step i using lr·(i+1)/warmup_steps; p is
the fraction of the post-warm-up steps done, ``min`` = ``min_lr_ratio`` x lr):

- ``constant``: lr;
- ``cosine``: min + (lr - min)·(1 + cos(pi·p))/2 (Loshchilov & Hutter 2017, SGDR);
- ``linear``: lr - (lr - min)·p;
- ``wsd``: warm-up, stable at lr, then a linear cool-down to min over the last
  ``decay_fraction`` of all steps (Hägele et al. 2024, "Scaling Laws and Compute-Optimal
  Training Beyond Fixed Training Durations"; Hu et al. 2024, MiniCPM).

Optimizers: ``adamw`` (torch's AdamW with ``betas``), ``sgd`` (SGD with momentum, weight decay
as an L2 term), ``muon`` (``torch.optim.Muon``, Jordan et al. 2024, for the 2-D weights of the
hidden layers, with ``adjust_lr_fn="match_rms_adamw"`` (Liu et al. 2025, "Muon is scalable")
so that one learning rate suits both; AdamW for embeddings, output head, norms and biases,
as modded-nanogpt does). ``fused: true`` steps AdamW and SGD (Muon's AdamW part too) with
torch's fused kernel, one update over all parameters, instead of its default (the foreach
lists): the same update up to float rounding, where the parameters' device has that kernel
(CPU, CUDA, MPS, XPU in torch 2.13; elsewhere the default, and the device is in the unit key).
An experiment on ``kernels: fast`` sets it where it leaves it unset
(:func:`variantlab.model.kernels.settings_with_kernels`). ``no_decay`` lists parameter kinds
that get no weight decay:
``norms`` (parameters of norm modules), ``biases`` (other parameters named ``*bias``, and
``b_*``: the stacked per-expert biases of the ``moe`` feed-forward),
``embeddings`` (the embedding and positional slots).

A run takes at most ``MAX_STEPS`` optimizer steps: a budget (``steps``, or ``tokens`` /
``tokens_per_param`` over the tokens of one step) that works out to more is refused before
anything runs (``validate`` and ``run``), naming the steps it works out to. Batches are drawn
one per step as the step needs them, but each step leaves rows (its loss and learning rate),
so a run's memory still grows with its steps; the bound keeps that under about 1 GiB.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Literal

import torch
from pydantic import Field, PositiveFloat, PositiveInt, field_validator, model_validator

from ..plugin.settings import Strict
from .common import EMBEDDING_SLOTS, param_index

Schedule = Literal["constant", "cosine", "linear", "wsd"]
OptimizerName = Literal["adamw", "sgd", "muon"]
NoDecay = Literal["norms", "biases", "embeddings"]
#: momentum when ``momentum`` is null: torch's Muon default, and 0.9 for SGD
DEFAULT_MOMENTUM = {"sgd": 0.9, "muon": 0.95}
#: the recipe's options: left out of serialised settings while at their defaults, so runs
#: set up before they existed keep their unit keys
RECIPE_OPTIONS = ("schedule", "decay_fraction", "min_lr_ratio", "optimizer", "betas",
                  "momentum", "no_decay", "tokens", "tokens_per_param", "fused")
#: the most optimizer steps a training run may take (see the module docstring)
MAX_STEPS = 1_000_000
#: the settings that give a run's length: one of them
BUDGET_KEYS = ("steps", "tokens", "tokens_per_param")


class RecipeSettings(Strict):
    """Schedule, optimizer, weight-decay groups and token budget of a training run."""

    steps: PositiveInt = Field(200, description="optimizer steps (one fresh batch each)")
    lr: PositiveFloat = Field(3e-4, description="peak learning rate")
    warmup_steps: int = Field(0, ge=0, description="steps of linear learning-rate warm-up")
    weight_decay: float = Field(0.1, ge=0, description="weight decay")
    schedule: Schedule = Field("constant", description="constant, cosine, linear or wsd")
    decay_fraction: float = Field(
        0.2, gt=0, le=1, description="wsd: the share of all steps spent cooling down")
    min_lr_ratio: float = Field(
        0.0, ge=0, le=1, description="cosine, linear, wsd: the final lr as a share of lr")
    optimizer: OptimizerName = Field("adamw", description="adamw, sgd or muon")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW's betas")
    momentum: float | None = Field(
        None, ge=0, lt=1, description="sgd and muon momentum (null: 0.9 sgd, 0.95 muon)")
    no_decay: tuple[NoDecay, ...] = Field(
        (), description="parameter kinds without weight decay: norms, biases, embeddings")
    fused: bool | None = Field(
        None, description="step AdamW and SGD with torch's fused kernel where the device has "
                          "it (null: torch's default, the foreach lists; kernels: fast sets "
                          "true where unset)")
    tokens: PositiveInt | None = Field(
        None, description="train on this many tokens instead of a number of steps")
    tokens_per_param: PositiveFloat | None = Field(
        None, description="train on this many tokens per non-embedding parameter")

    @field_validator("betas", "no_decay", mode="before")
    @classmethod
    def _list_to_tuple(cls, value: Any) -> Any:
        return tuple(value) if isinstance(value, list) else value

    @field_validator("betas")
    @classmethod
    def _betas_range(cls, value: tuple[float, float]) -> tuple[float, float]:
        if not all(0 <= b < 1 for b in value):
            raise ValueError(f"each beta must be in [0, 1), got {list(value)}")
        return value

    @model_validator(mode="after")
    def _one_budget(self) -> RecipeSettings:
        given = [k for k in ("steps", "tokens", "tokens_per_param") if k in self.model_fields_set]
        if len(given) > 1:
            raise ValueError(f"give one of steps, tokens, tokens_per_param, not {given}")
        if len(set(self.no_decay)) != len(self.no_decay):
            raise ValueError(f"no_decay lists a kind twice: {list(self.no_decay)}")
        return self


def lr_at(step: int, settings: RecipeSettings, total: int | None = None) -> float:
    """The learning rate of ``step`` (0-based) of a ``total``-step run (default: ``steps``)."""
    lr, warm = settings.lr, settings.warmup_steps
    total = settings.steps if total is None else total
    if warm and step < warm:
        return lr * (step + 1) / warm
    floor = settings.min_lr_ratio * lr
    if settings.schedule == "constant":
        return lr
    if settings.schedule == "wsd":
        n_decay = max(1, round(settings.decay_fraction * total))
        start = max(warm, total - n_decay)
        if step < start:
            return lr
        return lr - (lr - floor) * (step - start + 1) / max(1, total - start)
    p = (step - warm) / max(1, total - warm)
    if settings.schedule == "cosine":
        return floor + (lr - floor) * 0.5 * (1 + math.cos(math.pi * p))
    return lr - (lr - floor) * p  # linear


def worked_out_steps(settings: RecipeSettings, tokens_per_step: int, non_embedding: int) -> int:
    """Steps of the run, unbounded: ``steps``, or the token budget over the tokens of one
    step (rounded up)."""
    budget = settings.tokens
    if settings.tokens_per_param is not None:
        budget = math.ceil(settings.tokens_per_param * non_embedding)
    if budget is None:
        return settings.steps
    return max(1, math.ceil(budget / tokens_per_step))


def steps_problem(settings: RecipeSettings, tokens_per_step: int,
                  non_embedding: int) -> tuple[str, str] | None:
    """(budget setting, message) when the run works out to more than ``MAX_STEPS`` steps;
    None when it is within the bound."""
    n = worked_out_steps(settings, tokens_per_step, non_embedding)
    if n <= MAX_STEPS:
        return None
    key = next((k for k in ("tokens_per_param", "tokens") if getattr(settings, k) is not None),
               "steps")
    how = "" if key == "steps" else (
        f" ({key}={getattr(settings, key):,} over {tokens_per_step:,} tokens per step, "
        f"batch_size x seq_len" + (f", with {non_embedding:,} non-embedding parameters)"
                                   if key == "tokens_per_param" else ")"))
    return key, (f"the budget works out to {n:,} steps{how}, more than the bound of "
                 f"{MAX_STEPS:,} steps a run may take (variantlab.probes.recipe.MAX_STEPS); "
                 f"use a smaller {key}" + ("" if key == "steps" else " or a larger batch"))


def planned_steps(settings: RecipeSettings, tokens_per_step: int, non_embedding: int) -> int:
    """Steps of the run (:func:`worked_out_steps`); ``ValueError`` above ``MAX_STEPS``."""
    problem = steps_problem(settings, tokens_per_step, non_embedding)
    if problem is not None:
        raise ValueError(f"{problem[0]}: {problem[1]}")
    return worked_out_steps(settings, tokens_per_step, non_embedding)


def _kind(info: Any) -> str | None:
    if info.slot in EMBEDDING_SLOTS:
        return "embeddings"
    if info.slot == "norm":
        return "norms"
    last = info.name.rsplit(".", 1)[-1]
    if last == "bias" or last.startswith("b_"):
        return "biases"
    return None


def groups(infos: Iterable[Any], settings: RecipeSettings) -> list[dict[str, Any]]:
    """Parameter groups: the decayed ones, then (if any) those of the ``no_decay`` kinds."""
    decay: list[torch.nn.Parameter] = []
    plain: list[torch.nn.Parameter] = []
    for info in infos:
        (plain if _kind(info) in settings.no_decay else decay).append(info.param)
    out = [{"params": decay, "weight_decay": settings.weight_decay}] if decay else []
    return out + ([{"params": plain, "weight_decay": 0.0}] if plain else [])


class Optimizers:
    """Several torch optimizers stepped as one (Muon for hidden matrices, AdamW for the rest);
    ``param_groups`` are theirs, so setting ``group["lr"]`` reaches them."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers
        self.param_groups = [g for opt in optimizers for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def fused_kwargs(settings: RecipeSettings, model: torch.nn.Module) -> dict[str, bool]:
    """``{"fused": True}`` where ``settings`` ask for the fused step and every parameter of
    ``model`` is a floating-point tensor on a device torch has that kernel for; else nothing
    (torch's default)."""
    if not settings.fused:
        return {}
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        devices = set(_get_fused_kernels_supported_devices())
    except ImportError:  # a torch before the list existed: its fused step is CUDA's
        devices = {"cuda"}
    params = list(model.parameters())
    if params and all(p.device.type in devices and torch.is_floating_point(p) for p in params):
        return {"fused": True}
    return {}


def make_optimizer(model: torch.nn.Module, settings: RecipeSettings) -> Any:
    """The optimizer of ``settings`` over ``model``'s parameters."""
    lr, betas = settings.lr, settings.betas
    fused = fused_kwargs(settings, model)
    if settings.optimizer == "adamw" and not settings.no_decay:
        # one group, as before the recipe options existed: same numbers as then
        return torch.optim.AdamW(model.parameters(), lr=lr, betas=betas,
                                 weight_decay=settings.weight_decay, **fused)
    infos = param_index(model)
    momentum = settings.momentum
    if settings.optimizer == "adamw":
        return torch.optim.AdamW(groups(infos, settings), lr=lr, betas=betas, **fused)
    if settings.optimizer == "sgd":
        return torch.optim.SGD(groups(infos, settings), lr=lr, **fused,
                               momentum=DEFAULT_MOMENTUM["sgd"] if momentum is None else momentum)
    # 2-D weights of the hidden layers; the moe's stacked biases b_* (E, H) are 2-D but biases
    hidden = [i for i in infos if i.param.ndim == 2 and i.slot not in EMBEDDING_SLOTS | {"head"}
              and _kind(i) != "biases"]
    ids = {id(i.param) for i in hidden}
    rest = [i for i in infos if id(i.param) not in ids]
    muon = torch.optim.Muon(groups(hidden, settings), lr=lr, adjust_lr_fn="match_rms_adamw",
                            momentum=DEFAULT_MOMENTUM["muon"] if momentum is None else momentum)
    if not rest:
        return Optimizers(muon)
    return Optimizers(muon, torch.optim.AdamW(groups(rest, settings), lr=lr, betas=betas,
                                              **fused))
