"""variantlab_plugins/families.py by exact values (issue 30, mutation triage): each family's
task (inputs, target, token count, loss, shapes) rebuilt from the same generator by hand,
the family specs' defaults, bounds and refusals, and which task each family registers."""

import conftest
import pytest
import torch
import torch.nn.functional as F

import variantlab as vl
from variantlab.model.tasks import NEXT_TOKEN, Task

REG = vl.get_registry()
TINY = dict(conftest.TINY)
B, T = 3, 5


def spec(family: str, **more):
    data = {"family": "mlp", **more} if family == "mlp" else {**TINY, "family": family, **more}
    return vl.parse_model_spec(data, REG)


def batch_of(s, seed: int = 0, **kw):
    return vl.task_for(s, REG).batch(s, B, T, generator=torch.Generator().manual_seed(seed), **kw)


def test_each_family_registers_its_task():
    names = {f: type(vl.task_for(spec(f), REG)).__name__ for f in
             ("block", "gpt", "encoder", "decoder", "encoder_decoder", "mlp")}
    assert names == {"block": "FloatsToZero", "gpt": "Task", "encoder": "MaskedTokens",
                     "decoder": "NextTokenOverMemory", "encoder_decoder": "Reverse",
                     "mlp": "MLPRows"}
    assert vl.task_for(spec("gpt"), REG) is NEXT_TOKEN
    assert vl.task_for(spec("block"), REG).inputs == "floats"


def test_block_task_is_uniform_floats_scored_by_mse_to_zero():
    s = spec("block")
    task, b = vl.task_for(s, REG), batch_of(s)
    want = torch.rand(B, T, 32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(b.inputs["x"], want) and list(b.inputs) == ["x"]
    assert torch.equal(b.target, torch.zeros(B, T, 32)) and b.n_tokens == B * T
    assert task.input_shape(s, B, T) == (B, T, 32)
    assert task.output_shape(s, b) == (B, T, 32)
    out = torch.full((B, T, 32), 0.5)
    assert task.loss(s, out, b).item() == pytest.approx(0.25)


def test_mlp_task_rows_random_or_the_fixed_inputs():
    s = spec("mlp", layer_sizes=[3, 4, 2])
    task, b = vl.task_for(s, REG), batch_of(s)
    assert torch.equal(b.inputs["x"], torch.rand(B, 3, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(b.target, torch.zeros(B, 2))
    assert task.input_shape(s, B, T) == (B, 3) and task.target_shape(s, (7, 3)) == (7, 2)
    fixed = spec("mlp", layer_sizes=[3, 4, 2], inputs=[[1, 0, -1], [2, 2, 2]])
    b = batch_of(fixed)
    assert torch.equal(b.inputs["x"], torch.tensor([[1.0, 0.0, -1.0], [2.0, 2.0, 2.0]]))
    assert torch.equal(b.target, torch.zeros(2, 2)) and b.n_tokens == 2


def test_masked_tokens_replace_and_score_exactly_the_drawn_positions():
    s = spec("encoder", mask_prob=0.4)
    gen = torch.Generator().manual_seed(0)
    base = Task().batch(s, B, T, generator=gen)  # the same draws, in the same order
    masked = torch.rand(B, T, generator=gen) < 0.4
    masked[:, 0] = True
    b = batch_of(s)
    idx = base.inputs["idx"]
    assert torch.equal(b.inputs["idx"], torch.where(masked, torch.full_like(idx, 63), idx))
    assert torch.equal(b.target, torch.where(masked, idx, torch.full_like(idx, -100)))
    assert b.n_tokens == B * T and 0 < int(masked[:, 1:].sum()) < B * (T - 1)


def test_decoder_task_adds_a_gaussian_memory_of_the_sequence_length():
    s = spec("decoder")
    gen = torch.Generator().manual_seed(0)
    base = Task().batch(s, B, T, generator=gen)
    memory = torch.randn(B, T, 32, generator=gen)
    b = batch_of(s)
    assert set(b.inputs) == {"idx", "memory"}
    assert torch.equal(b.inputs["idx"], base.inputs["idx"])
    assert torch.equal(b.inputs["memory"], memory) and torch.equal(b.target, base.target)
    assert b.n_tokens == B * T


def test_reverse_task_is_the_flipped_source_teacher_forced_behind_token_zero():
    s = spec("encoder_decoder")
    tokens = torch.tensor([[1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]])
    b = vl.task_for(s, REG).batch(s, 2, 5, tokens=tokens)
    assert torch.equal(b.inputs["src"], torch.tensor([[1, 2, 3, 4, 5], [7, 8, 9, 10, 11]]))
    assert torch.equal(b.target, torch.tensor([[5, 4, 3, 2, 1], [11, 10, 9, 8, 7]]))
    assert torch.equal(b.inputs["tgt"], torch.tensor([[0, 5, 4, 3, 2], [0, 11, 10, 9, 8]]))
    assert b.n_tokens == 2 * 2 * 5
    logits = torch.zeros(2, 5, 64)
    assert vl.task_for(s, REG).loss(s, logits, b).item() == pytest.approx(
        F.cross_entropy(logits.flatten(0, 1), b.target.flatten()).item())


def test_family_spec_defaults_and_causality():
    assert spec("block").causal_attention is True and spec("block").causal is True
    assert spec("block", causal_attention=False).causal is False
    mlp = spec("mlp")
    assert mlp.layer_sizes == [3, 3, 3, 3, 3, 1] and mlp.drop_rate == 0.0
    assert mlp.inputs is None and mlp.causal is False
    gpt = spec("gpt")
    assert gpt.scale_embeddings is False and gpt.logit_softcap is None and gpt.causal is True
    assert {"scale_embeddings", "logit_softcap"} <= set(type(gpt).added_options)
    assert spec("encoder").mask_prob == 0.15 and spec("encoder").causal is False
    assert spec("encoder_decoder").share_embeddings is False


@pytest.mark.parametrize("family, data, match", [
    ("mlp", {"layer_sizes": [3]}, "layer_sizes"),
    ("mlp", {"drop_rate": 1.0}, "drop_rate"),
    ("mlp", {"drop_rate": -0.1}, "drop_rate"),
    ("mlp", {"layer_sizes": [3, 4], "residual": "rezero"}, "no 'shortcut' option"),
    ("mlp", {"layer_sizes": [4, 3], "residual": "rezero"}, "no 'shortcut' option"),
    ("mlp", {"layer_sizes": [3, 3, 4], "residual": "rezero"}, "no 'shortcut' option"),
    ("mlp", {"layer_sizes": [3, 4, 3], "residual": "rezero"}, "no 'shortcut' option"),
    ("mlp", {"layer_sizes": [3, 2], "inputs": [[1.0, 2.0]]}, "layer_sizes\\[0\\]=3"),
    ("mlp", {"layer_sizes": [3, 2], "inputs": [[1.0, 2.0, 3.0], [1.0, 2.0, 3.0, 4.0]]},
     "layer_sizes\\[0\\]=3"),
    ("mlp", {"layout": {"kinds": {"a": {}}}}, "builds no stack of layers"),
    ("block", {"layout": {"kinds": {"a": {}}}}, "builds no stack of layers"),
    ("decoder", {"attention": "mamba"}, "also cross-attends"),
    ("encoder_decoder", {"attention": "mamba"}, "also cross-attends"),
    ("encoder", {"mask_prob": 0.0}, "mask_prob"),
    ("encoder", {"mask_prob": 1.0}, "mask_prob"),
    ("decoder", {"residual": "parallel"}, "family 'decoder' has three sublayers"),
    ("encoder_decoder", {"residual": "parallel"}, "per decoder layer"),
    ("mlp", {"residual": "parallel"}, "has no attention"),
])
def test_family_specs_refuse(family, data, match):
    with pytest.raises(vl.SpecError, match=match):
        spec(family, **data)


def test_family_specs_accept_the_edges():
    assert spec("mlp", layer_sizes=[3, 3], residual="rezero").layer_sizes == [3, 3]
    assert spec("mlp", layer_sizes=[2, 5], inputs=[[1.0, 2.0]]).inputs == [[1.0, 2.0]]
    assert spec("mlp", drop_rate=0.0).drop_rate == 0.0
    assert spec("encoder", mask_prob=0.999).mask_prob == 0.999


@pytest.mark.parametrize("family", ["block", "encoder", "decoder", "encoder_decoder", "mlp"])
def test_family_tasks_take_the_base_tasks_keyword_call(family):
    """Every task keeps ``Task.batch``'s signature: the spec, sizes and generator by keyword."""
    s = spec(family)
    b = vl.task_for(s, REG).batch(spec=s, batch_size=2, seq_len=4,
                                  generator=torch.Generator().manual_seed(0))
    assert b.target.shape[0] == 2
