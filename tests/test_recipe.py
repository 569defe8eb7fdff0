"""The training recipe: schedules, optimizers, weight-decay groups, token budgets, FLOPs."""

import math

import pytest
import torch
from pydantic import ValidationError
from torch.utils.flop_counter import FlopCounterMode

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData
from variantlab.model.build import make_model, resolve_spec
from variantlab.model.tasks import task_for
from variantlab.probes import training
from variantlab.probes.flops import model_flops_per_token
from variantlab.probes.params import non_embedding_params
from variantlab.probes.recipe import Optimizers, lr_at, make_optimizer
from variantlab.probes.training import TrainingSettings
from variantlab.sweep.units import plain

REG = vl.get_registry()
RECALL = SyntheticData(task="recall")


def S(**kw):
    return TrainingSettings(device="cpu", batch_size=4, seq_len=16, **kw)


def test_schedules():
    cos = S(steps=10, lr=1.0, warmup_steps=2, schedule="cosine", min_lr_ratio=0.1)
    got = [lr_at(i, cos) for i in range(10)]
    assert got[:2] == [0.5, 1.0]  # warm-up, then p = 0 at step 2
    assert got[6] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 4 / 8)))
    assert got == sorted(got[:2]) + sorted(got[2:], reverse=True)
    lin = S(steps=10, lr=1.0, schedule="linear")
    assert [lr_at(i, lin) for i in (0, 5, 9)] == pytest.approx([1.0, 0.5, 0.1])
    wsd = S(steps=10, lr=1.0, schedule="wsd", decay_fraction=0.4, min_lr_ratio=0.0)
    assert [lr_at(i, wsd) for i in range(10)] == pytest.approx(
        [1, 1, 1, 1, 1, 1, 0.75, 0.5, 0.25, 0.0])
    const = S(steps=10, lr=2.0, warmup_steps=4)
    assert [lr_at(i, const) for i in range(6)] == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]


@pytest.mark.parametrize("bad", [
    {"steps": 10, "tokens": 100}, {"tokens": 10, "tokens_per_param": 1.0},
    {"betas": [0.9, 1.0]}, {"betas": [0.9]}, {"optimizer": "adam"}, {"schedule": "step"},
    {"no_decay": ["norms", "norms"]}, {"no_decay": ["weights"]}, {"decay_fraction": 0.0},
    {"min_lr_ratio": 1.5}, {"momentum": 1.0},
])
def test_bad_recipes_are_refused(bad):
    with pytest.raises(ValidationError):
        TrainingSettings(**bad)


def test_defaults_stay_out_of_the_serialised_settings():
    data = plain(TrainingSettings())
    assert set(data) == {"steps", "lr", "batch_size", "seq_len", "warmup_steps", "grad_clip",
                         "weight_decay", "eval_batches", "dtype", "device", "compile"}
    data = plain(TrainingSettings(schedule="wsd", betas=[0.9, 0.95], no_decay=["norms"]))
    assert data["schedule"] == "wsd" and data["betas"] == [0.9, 0.95]
    assert data["no_decay"] == ["norms"] and "optimizer" not in data


def curve(rows, metric="loss"):
    return [r["value"] for r in sorted((r for r in rows if r["metric"] == metric),
                                       key=lambda r: r["step"])]


def test_default_recipe_is_the_plain_adamw_loop(tiny):
    spec = resolve_spec(tiny, REG)
    rows = training.run(spec, S(steps=6, lr=1e-3), seed=2, data=RECALL, registry=REG)
    model = make_model(spec, 2, REG, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)
    by_hand = []
    for batch in datalib.batches(RECALL, spec, 4, 16, 6, seed=2, registry=REG):
        opt.zero_grad()
        loss = task_for(spec, REG).loss(spec, model(**batch.inputs), batch)
        by_hand.append(float(loss.detach()))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    assert curve(rows) == by_hand


def test_lr_tokens_and_flops_rows(tiny):
    spec = resolve_spec(tiny, REG)
    settings = S(tokens=300, lr=1e-3, schedule="cosine", eval_batches=0)
    rows = training.run(spec, settings, seed=0, data=RECALL, registry=REG)
    assert len(curve(rows)) == 5  # ceil(300 / (4 x 16))
    assert curve(rows, "lr") == [lr_at(i, settings, 5) for i in range(5)]
    m = {r["metric"]: r["value"] for r in rows if r["step"] is None}
    assert m["tokens"] == 5 * 64
    model = make_model(spec, 0, REG)
    assert m["flops"] == pytest.approx(320 * model_flops_per_token(model, spec, 16))
    per_param = S(tokens_per_param=0.01, eval_batches=0)
    rows = training.run(spec, per_param, seed=0, data=RECALL, registry=REG)
    n = math.ceil(math.ceil(0.01 * non_embedding_params(model)) / 64)
    assert len(curve(rows)) == n and 2 < n < 10


def test_flop_formula_matches_torch_flop_counter(tiny):
    spec = resolve_spec({**tiny, "qkv_bias": False, "context_length": 64}, REG)
    model = make_model(spec, 0, REG)
    batch = datalib.batches(None, spec, 2, 64, 1, seed=0, registry=REG)[0]
    with FlopCounterMode(display=False) as counter:
        task_for(spec, REG).loss(spec, model(**batch.inputs), batch).backward()
    counted = counter.get_total_flops() / batch.n_tokens
    formula = model_flops_per_token(model, spec, 64)
    # the formula also counts the few parameters (biases, norms) that do no matmul
    assert formula == pytest.approx(counted, rel=0.03)


def test_no_decay_groups_and_optimizers(tiny):
    spec = resolve_spec(tiny, REG)
    model = make_model(spec, 0, REG)
    opt = make_optimizer(model, S(no_decay=["norms", "biases", "embeddings"]))
    decayed, free = opt.param_groups
    assert decayed["weight_decay"] == 0.1 and free["weight_decay"] == 0.0
    assert all(p.ndim == 2 for p in decayed["params"])
    assert id(model.embed.tok_emb.weight) in {id(p) for p in free["params"]}
    assert len(decayed["params"]) + len(free["params"]) == len(list(model.parameters()))
    sgd = make_optimizer(model, S(optimizer="sgd"))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["momentum"] == 0.9
    muon = make_optimizer(model, S(optimizer="muon", momentum=0.9))
    assert isinstance(muon, Optimizers)
    hidden = [p for g in muon.optimizers[0].param_groups for p in g["params"]]
    assert isinstance(muon.optimizers[0], torch.optim.Muon)
    assert len(hidden) == 2 * 6 and all(p.ndim == 2 for p in hidden)  # 4 attn + 2 ffn x 2
    assert id(model.out_head.weight) not in {id(p) for p in hidden}


@pytest.mark.slow
@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.3), ("muon", 3e-3)])
def test_other_optimizers_learn(tiny, optimizer, lr):
    spec = resolve_spec(tiny, REG)
    rows = training.run(spec, S(steps=30, lr=lr, optimizer=optimizer, schedule="wsd"),
                        seed=0, data=RECALL, registry=REG)
    losses = curve(rows)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.1
