"""Families' tasks: batching and loss live with the family plugin, looked up in the registry."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData, TextData
from variantlab.errors import PluginLoadError
from variantlab.model.tasks import NEXT_TOKEN, Batch
from variantlab.probes import run_probe

REG = vl.get_registry()

FAMILY = '''
from typing import Literal
from variantlab import ModelSpec, hookimpl
from variantlab.model.tasks import Task
from variantlab_plugins.models import GPTModel

class DoubledLoss(Task):
    """Next-token cross-entropy, doubled: a task the core knows nothing of."""
    def loss(self, spec, output, batch):
        return 2 * super().loss(spec, output, batch)

class TwiceSpec(ModelSpec):
    family: Literal["twice"] = "twice"

@hookimpl
def register_families(register):
    register("twice", TwiceSpec, GPTModel, task=DoubledLoss())
'''


def plugin(tmp_path, text, name="fam.py"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_probes_score_with_the_family_plugins_task(tmp_path, tiny):
    registry = vl.build_registry([plugin(tmp_path, FAMILY)], entry_points=False)
    settings = {"batch_size": 2, "seq_len": 8, "batches": 1}
    gpt = run_probe("gradients", tiny, settings, seed=3, registry=registry)
    twice = run_probe("gradients", {**tiny, "family": "twice"}, settings, seed=3,
                      registry=registry)
    loss = {r["probe"]: r["value"] for r in gpt if r["metric"] == "loss"}["gradients"]
    doubled = {r["probe"]: r["value"] for r in twice if r["metric"] == "loss"}["gradients"]
    assert doubled == pytest.approx(2 * loss, rel=1e-6)  # same weights, same batch, its loss


def test_task_for_names_the_family_and_data_uses_its_batches(tiny):
    spec = vl.parse_model_spec({**tiny, "family": "encoder"}, REG)
    task = vl.task_for(spec, REG)
    assert type(task).__name__ == "MaskedTokens"
    (batch,) = datalib.batches(None, spec, 2, 8, 1, seed=0, registry=REG)
    masked = batch.target != -100  # only masked positions are scored
    assert masked[:, 0].all() and (batch.inputs["idx"][masked] == spec.vocab_size - 1).all()
    assert task.output_shape(spec, batch) == (2, 8, spec.vocab_size)


def test_float_tasks_ignore_the_data_source(tiny):
    spec = vl.parse_model_spec({**tiny, "family": "block"}, REG)
    text = datalib.batches(TextData(path="nothing/*.txt"), spec, 2, 8, 1, seed=4, registry=REG)
    synthetic = datalib.batches(SyntheticData(), spec, 2, 8, 1, seed=4, registry=REG)
    assert text[0].inputs["x"].shape == (2, 8, tiny["emb_dim"])
    assert torch.equal(text[0].inputs["x"], synthetic[0].inputs["x"])


@pytest.mark.parametrize("hook, call, message", [
    ("register_families", "register('bare', S, GPTModel)", "task= needs family kinds"),
    ("register_norms", "register('tasked', N, lambda spec, dim: None, task=NEXT_TOKEN)",
     "task= is only for families, not norm kinds"),
    ("register_families", "register('bare', S, GPTModel, task=object())",
     "must be a variantlab.model.tasks.Task"),
])
def test_registry_refuses_a_family_without_a_task_and_a_task_elsewhere(tmp_path, hook, call,
                                                                         message):
    text = f'''
from typing import Literal
from variantlab import ComponentSpec, ModelSpec, hookimpl
from variantlab.model.tasks import NEXT_TOKEN
from variantlab_plugins.models import GPTModel

class S(ModelSpec):
    family: Literal["bare"] = "bare"

class N(ComponentSpec):
    kind: Literal["tasked"] = "tasked"

@hookimpl
def {hook}(register):
    {call}
'''
    with pytest.raises(PluginLoadError, match=message):
        vl.build_registry([plugin(tmp_path, text)], entry_points=False)


def test_no_registry_means_the_default_one_but_validation_alone_needs_one(tiny):
    assert vl.build_model(tiny).variantlab_spec == vl.parse_model_spec(tiny, vl.get_registry())
    with pytest.raises(TypeError, match="needs a registry"):
        vl.ModelSpec.model_validate(tiny)


def test_next_token_batch_shifts_the_given_rows_by_one():
    spec = vl.parse_model_spec({"family": "gpt", "vocab_size": 7, "context_length": 8,
                                "emb_dim": 32, "n_heads": 4, "n_layers": 2}, REG)
    tokens = torch.tensor([[1, 2, 3, 4], [6, 5, 0, 1]])
    batch = vl.task_for(spec, REG).batch(spec, 2, 3, tokens=tokens)
    assert batch.inputs["idx"].tolist() == [[1, 2, 3], [6, 5, 0]]
    assert batch.target.tolist() == [[2, 3, 4], [5, 0, 1]]
    assert batch.n_tokens == 6 and batch.extra == {}
    # random rows: seq_len + 1 ids from the whole vocabulary, 0 and vocab_size - 1 included
    drawn = vl.task_for(spec, REG).batch(spec, 50, 9, generator=torch.Generator().manual_seed(0))
    ids = torch.cat([drawn.inputs["idx"], drawn.target[:, -1:]], 1)
    assert ids.shape == (50, 10) and drawn.n_tokens == 450
    assert set(ids.unique().tolist()) == set(range(7))
    assert torch.equal(drawn.target[:, :-1], drawn.inputs["idx"][:, 1:])


def test_batch_to_moves_inputs_and_target_and_keeps_the_rest():
    batch = Batch({"idx": torch.ones(2, 3, dtype=torch.long)}, torch.zeros(2, 3), n_tokens=5,
                  extra={"note": 1})
    moved = batch.to(torch.device("meta"))
    assert moved.inputs["idx"].device.type == "meta" and moved.target.device.type == "meta"
    assert (moved.n_tokens, moved.extra) == (5, {"note": 1})
    # a batch that does not say how many tokens it holds counts none (tokens/s reads 0)
    assert Batch({}, torch.zeros(1)).n_tokens == 0


def test_tokens_and_generator_are_keyword_only_and_the_sizes_may_be_named(tiny):
    spec = vl.parse_model_spec(tiny, REG)
    tokens = torch.arange(8).reshape(2, 4)
    named = NEXT_TOKEN.batch(spec=spec, batch_size=2, seq_len=3, tokens=tokens)
    assert named.inputs["idx"].tolist() == [[0, 1, 2], [4, 5, 6]]
    with pytest.raises(TypeError, match="positional"):
        NEXT_TOKEN.batch(spec, 2, 3, tokens)  # a positional tokens could be a generator's


def test_next_token_loss_is_the_mean_cross_entropy_over_scored_positions(tiny):
    spec = vl.parse_model_spec(tiny, REG)
    logits = torch.tensor([[[0.0, 1.0], [2.0, 0.0], [0.5, 0.5]]])  # (1, 3, 2)
    batch = Batch({}, torch.tensor([[1, 1, -100]]))  # the last position not scored
    want = (math.log(1 + math.exp(-1.0)) + math.log(1 + math.exp(2.0))) / 2
    assert NEXT_TOKEN.loss(spec, logits, batch).item() == pytest.approx(want, rel=1e-6)
    assert NEXT_TOKEN.output_shape(spec, batch) == (1, 3, tiny["vocab_size"])


def test_the_aux_loss_is_none_for_a_dense_model_and_the_weighted_terms_for_a_routed_one(tiny):
    spec = vl.parse_model_spec(tiny, REG)
    dense = vl.build_model(spec, REG)
    dense(torch.zeros(1, 4, dtype=torch.long))
    assert NEXT_TOKEN.aux_loss(spec, dense) is None
    moe = vl.parse_model_spec({**tiny, "feedforward": {
        "kind": "moe", "n_experts": 4, "top_k": 1, "aux_loss_coef": 0.5}}, REG)
    model = vl.build_model(moe, REG)
    model(torch.arange(8)[None])
    terms = [m.aux_terms()["aux_loss"] for m in model.modules() if hasattr(m, "aux_terms")]
    assert len(terms) == 2
    want = 0.5 * (terms[0] + terms[1]) / 2
    assert vl.task_for(moe).aux_loss(moe, model).item() == pytest.approx(want.item(), rel=1e-12)
