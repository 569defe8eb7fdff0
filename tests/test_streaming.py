"""Training batches are drawn when a step needs them (issue 27.1): the same numbers as the
old up-front drawing, and memory that does not grow with the steps."""

import math

import pytest
import torch

import variantlab as vl
from variantlab.data import sources as datalib
from variantlab.data.sources import SyntheticData
from variantlab.model.build import build_model
from variantlab.model.specs import parse_model_spec
from variantlab.model.tasks import task_for
from variantlab.probes import run_probe

REG = vl.get_registry()


def curve(rows):
    return [r["value"] for r in sorted((r for r in rows if r["metric"] == "loss"),
                                       key=lambda r: r["step"])]


def upfront_losses(spec_data, steps, batch_size, seq_len, lr, seed, recall):
    """The old way, written out here: every step's batch drawn first from one generator
    seeded with ``seed``, then plain AdamW steps with clipping at 1.0."""
    spec = parse_model_spec(spec_data, REG)
    task = task_for(spec, REG)
    gen = torch.Generator().manual_seed(seed)
    drawn = []
    for _ in range(steps):
        if recall:
            tokens = datalib.recall_tokens(batch_size, seq_len + 1, spec.vocab_size,
                                           generator=gen)
        else:
            tokens = torch.randint(0, spec.vocab_size, (batch_size, seq_len + 1), generator=gen)
        drawn.append(task.batch(spec, batch_size, seq_len, tokens=tokens, generator=gen))
    torch.manual_seed(seed)
    model = build_model(spec, REG)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.1)
    out = []
    for batch in drawn:
        opt.zero_grad(set_to_none=True)
        logits = model(**batch.inputs)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch.target.flatten())
        out.append(float(loss.detach()))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return out


@pytest.mark.parametrize("recall", [False, True], ids=["random", "recall"])
def test_streamed_batches_give_the_losses_of_drawing_them_all_first(tiny, recall):
    settings = {"steps": 6, "lr": 3e-3, "batch_size": 3, "seq_len": 12, "device": "cpu",
                "eval_batches": 0}
    data = SyntheticData(task="recall") if recall else None
    rows = run_probe("training", tiny, settings, seed=4, data=data, registry=REG)
    want = upfront_losses(tiny, 6, 3, 12, 3e-3, 4, recall)
    assert curve(rows) == want  # bit for bit
    tokens = next(r["value"] for r in rows if r["metric"] == "tokens")
    assert tokens == 6 * 3 * 12


def test_a_stream_of_a_billion_batches_holds_one_at_a_time(tiny):
    spec = parse_model_spec(tiny, REG)
    stream = datalib.BatchStream(None, spec, 2, 8, 10**9, seed=1, registry=REG)
    assert len(stream) == 10**9
    first = [stream.next() for _ in range(3)]
    assert stream.drawn == 3 and stream.tokens == 3 * 2 * 8
    listed = datalib.batches(None, spec, 2, 8, 3, seed=1, registry=REG)
    for a, b in zip(first, listed):
        assert a.inputs.keys() == b.inputs.keys()
        assert all(torch.equal(a.inputs[k], b.inputs[k]) for k in a.inputs)
        assert torch.equal(a.target, b.target)


def test_a_stream_restored_from_its_state_draws_what_it_would_have(tiny):
    spec = parse_model_spec(tiny, REG)
    one = datalib.BatchStream(None, spec, 2, 8, 5, seed=7, registry=REG)
    one.next()
    one.next()
    state = one.state()
    rest = [b.target for b in one]
    two = datalib.BatchStream(None, spec, 2, 8, 5, seed=7, registry=REG)
    two.load_state(state)
    assert two.drawn == 2 and two.tokens == 2 * 2 * 8
    again = [b.target for b in two]
    assert len(again) == 3 and all(torch.equal(a, b) for a, b in zip(rest, again))
    with pytest.raises(IndexError, match="all 5 batches"):
        two.next()
    assert math.isfinite(float(again[0].float().mean()))
