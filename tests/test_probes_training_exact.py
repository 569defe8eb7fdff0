"""variantlab/probes/training.py without training: its settings, the objective and the
divergence rule on loss curves whose noise is known by hand (issue 30, item 4)."""

from types import SimpleNamespace

import pytest
import torch
from pydantic import ValidationError

from variantlab.probes.training import Objective, TrainingSettings, diverged, tail_size


def test_defaults_and_the_serialised_settings():
    s = TrainingSettings()
    assert (s.batch_size, s.seq_len, s.grad_clip, s.eval_batches) == (16, 128, 1.0, None)
    # options added after the first runs are left out at their defaults (unit keys unchanged)
    assert s.model_dump() == {
        "steps": 200, "lr": 0.0003, "warmup_steps": 0, "weight_decay": 0.1, "batch_size": 16,
        "seq_len": 128, "grad_clip": 1.0, "eval_batches": None, "dtype": "float32",
        "device": "auto", "compile": False}
    assert TrainingSettings(eval_every=5).model_dump()["eval_every"] == 5
    assert TrainingSettings(eval_batches=0).eval_batches == 0
    with pytest.raises(ValidationError, match="eval_batches"):
        TrainingSettings(eval_batches=-1)


def test_eval_lengths_sorted_once_each():
    assert TrainingSettings(eval_lengths=[64, 16, 64]).eval_lengths == [16, 64]
    assert TrainingSettings().eval_lengths is None


def test_the_objective_adds_the_auxiliary_loss():
    task = SimpleNamespace(loss=lambda spec, out, batch: out.sum(),
                           aux_loss=lambda spec, model: torch.tensor(0.5))
    objective = Objective(task, spec=None)  # type: ignore[arg-type]
    assert float(objective.total(torch.tensor(2.0), model=None)) == 2.5
    dense = Objective(SimpleNamespace(aux_loss=lambda spec, model: None), spec=None)  # type: ignore[arg-type]
    loss = torch.tensor(2.0)
    assert dense.total(loss, model=None) is loss
    with pytest.raises(AttributeError):
        objective.spec = "other"  # type: ignore[misc]  # frozen


def test_tail_size():
    assert [tail_size(n) for n in (0, 1, 9, 10, 19, 20, 25)] == [1, 1, 1, 1, 1, 2, 2]


def curve(first: float, a: float, rise: float) -> list[float]:
    """Ten losses: steps of -a and +a in turn, then a last step of ``rise``: the sorted
    differences are four -a, four +a and ``rise`` (> a), so their IQR is 2a, one step's
    noise 2a / 1.349 / sqrt(2), and with a final loss of one step (10 // 10) the rule's
    margin is S x 2a / 1.349 for S standard deviations."""
    out = [first]
    for d in [-a, a] * 4:
        out.append(out[-1] + d)
    out.append(out[-1] + rise)
    return out


def test_a_rise_counts_past_three_sigma_of_the_measured_noise():
    a = 0.01
    sigma = 2 * a / 1.349  # margin per standard deviation, here 0.0148
    assert not diverged(curve(0.1, a, 2.7 * sigma))  # between 2 and 3 sigma: noise
    assert diverged(curve(0.1, a, 3.4 * sigma))  # between 3 and 4: a real rise
    assert not diverged(curve(0.1, a, 0.0))


def test_a_small_rise_of_a_noiseless_curve_is_under_the_floor():
    """No noise: the margin is 5% of the first loss (0.05), not 0."""
    assert not diverged([1.0] * 9 + [1.04])
    assert diverged([1.0] * 9 + [1.06])


def test_a_blow_up_past_twice_the_first_loss_counts_whatever_the_noise():
    """Steps of +-4 make the noise margin about 18: a final loss of 2.1 x the first is a
    blow-up all the same, 1.9 x is not."""
    wild = [1.0, 5.0] * 4 + [1.0]
    assert diverged(wild + [2.1])
    assert not diverged(wild + [1.9])


def test_the_blow_up_rule_holds_for_positive_first_losses_only_and_strictly():
    wild = [1.0, 5.0] * 4 + [1.0]
    assert not diverged(wild + [2.0])  # exactly twice: not over it
    small = [0.5, 2.5] * 4 + [0.5]  # a first loss below 1
    assert diverged(small + [1.2])
    # a first loss of 0 or below (a float family's loss may be negative): no blow-up rule,
    # only the rise over the noise
    assert not diverged([0.0, 4.0] * 4 + [0.0, 0.5])
    assert not diverged([-0.5] * 9 + [-0.6])


def test_the_noise_margin_grows_with_a_shorter_final_average():
    """Twenty losses (final = mean of the last 2): the margin is 3 sigma x sqrt(1 + 1/2) of
    one step's noise; a rise of 3.0 units (unit 2a / 1.349) passes it (2.60), though not
    3 sigma x sqrt(1 + 2) (3.67)."""
    a, first = 0.01, 0.1
    unit = 2 * a / 1.349
    losses = [first]
    for d in [-a, a] * 9:
        losses.append(losses[-1] + d)
    losses.append(losses[-1] + 6.0 * unit)  # final: first + 3.0 units
    assert diverged(losses)
    losses[-1] = losses[-2] + 4.8 * unit  # final: first + 2.4 units
    assert not diverged(losses)


def test_the_floor_is_five_percent_of_the_first_loss_and_a_rise_must_pass_it():
    assert not diverged([2.0] * 9 + [2.08])  # floor 0.1
    assert diverged([2.0] * 9 + [2.12])
    assert not diverged([20.0] * 9 + [21.0])  # a rise of exactly the floor (1.0) is not over it


def test_setup_devices_and_a_token_budget(monkeypatch):
    """``device`` None falls back to the settings' device, a named one wins; a budget of
    1,000 tokens at 2 x 8 tokens a step is 63 steps (rounded up)."""
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.probes import training

    asked = []

    def spy(requested):
        asked.append(requested)
        return torch.device("cpu")

    monkeypatch.setattr(training, "resolve_device", spy)
    reg = vl.get_registry()
    spec = vl.parse_model_spec(TINY, reg)
    settings = TrainingSettings(tokens=1000, batch_size=2, seq_len=8, device="cpu")
    batches = training.setup(spec, settings, 0, None, ".", None, reg)[3]
    training.setup(spec, settings, 0, None, ".", "cuda:5", reg)
    assert asked == ["cpu", "cuda:5"]
    assert len(batches) == 63


def test_eval_lengths_above_the_context_are_refused_before_training():
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.probes import run_probe

    settings = {"steps": 1, "batch_size": 1, "seq_len": 8, "eval_batches": 1,
                "eval_lengths": [16, 32, 64, 128], "device": "cpu"}
    with pytest.raises(ValueError, match=r"eval_lengths: 64 is above context_length=32"):
        run_probe("training", TINY, settings, seed=0, registry=vl.get_registry())


def test_no_validation_curve_when_held_out_scoring_is_off():
    """``eval_batches: 0``: no held-out row; asking for a curve as well is refused rather
    than recording nothing (issue 38, C8)."""
    import pydantic

    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.probes import run_probe

    off = {"steps": 2, "batch_size": 1, "seq_len": 8, "eval_batches": 0, "device": "cpu"}
    with pytest.raises(pydantic.ValidationError, match="eval_every asks for validation curves"):
        run_probe("training", TINY, {**off, "eval_every": 1}, seed=0,
                  registry=vl.get_registry())
    rows = run_probe("training", TINY, off, seed=0, registry=vl.get_registry())
    assert not [r for r in rows if r["metric"].startswith(("val_", "test_"))]
    assert [r["step"] for r in rows if r["metric"] == "loss"] == [0, 1]
    m = {r["metric"]: r["value"] for r in rows if r["scope"] == "model" and r["step"] is None}
    # 2 steps of 1 x 8 tokens; per token 6N + 12 L H Q T, N = 30,400 - 64*32 - 32*32
    assert m["tokens"] == 16
    assert m["flops"] == 16 * (6 * (30_400 - 64 * 32 - 32 * 32) + 12 * 2 * 4 * 8 * 8)


def test_a_validation_curve_when_held_out_scoring_is_on():
    """``eval_every: 1`` over 2 steps: val_loss_curve after steps 1 and 2 (steps done)."""
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.probes import run_probe

    rows = run_probe("training", TINY, {"steps": 2, "batch_size": 1, "seq_len": 8,
                                        "eval_batches": 1, "eval_every": 1, "device": "cpu",
                                        "eval_lengths": [16]},
                     seed=0, registry=vl.get_registry())
    assert [r["step"] for r in rows if r["metric"] == "val_loss_curve"] == [1, 2]
    assert len([r for r in rows if r["metric"] == "test_loss_at_16"]) == 1


@pytest.mark.parametrize("eval_batches, noise_rows", [(1, 1), (0, 0)])
def test_recall_noise_over_the_test_set_only_when_it_is_scored(eval_batches, noise_rows):
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.data.sources import SyntheticData
    from variantlab.probes import run_probe

    rows = run_probe("training", TINY, {"steps": 1, "batch_size": 1, "seq_len": 8,
                                        "eval_batches": eval_batches, "device": "cpu"},
                     seed=0, registry=vl.get_registry(),
                     data=SyntheticData(task="recall", n_pairs=2))
    assert len([r for r in rows if r["metric"] == "recall_noise"]) == noise_rows


def test_each_step_takes_its_scheduled_learning_rate():
    """Two steps of a 4-step warm-up: the optimizer ends at lr x 2 / 4, not its initial lr."""
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.data import sources as datalib
    from variantlab.model.tasks import task_for
    from variantlab.probes import training

    reg = vl.get_registry()
    spec = vl.parse_model_spec(TINY, reg)
    model = vl.build_model(spec, reg)
    opt = torch.optim.AdamW(model.parameters(), lr=1.0)
    settings = TrainingSettings(steps=2, lr=0.01, warmup_steps=4, batch_size=1, seq_len=8)
    batches = datalib.batches(None, spec, 1, 8, 2, seed=0, registry=reg)
    losses = training.train(model, model, opt, Objective(task_for(spec, reg), spec), batches,
                            torch.device("cpu"), settings)
    assert len(losses) == 2
    assert opt.param_groups[0]["lr"] == 0.01 * 2 / 4


def test_a_checkpoint_after_every_due_step_but_the_last(monkeypatch):
    """With checkpoints due after every step, a 4-step unit writes them after steps 1, 2
    and 3; a training loop given a plain list of batches (no stream to resume) writes none."""
    import variantlab as vl
    from tests.conftest import TINY
    from variantlab.probes import checkpoint, run_probe

    asked, saved = [], []

    class Due:
        def due(self, done):
            asked.append(done)
            return True

    monkeypatch.setattr(checkpoint, "current", lambda: Due())
    monkeypatch.setattr(checkpoint, "resume_unit", lambda *args: 0)
    monkeypatch.setattr(checkpoint, "save_unit", lambda saver, done, *args: saved.append(done))
    run_probe("training", TINY, {"steps": 4, "batch_size": 1, "seq_len": 8, "eval_batches": 0,
                                 "device": "cpu"}, seed=0, registry=vl.get_registry())
    assert asked == saved == [1, 2, 3]
