"""An experiment's ``kernels:``: fast (the default) switches every component whose impl the
experiment leaves unset to its fused kernel; reference keeps the written-out formulas."""

from pathlib import Path

import pytest
import torch
import yaml

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.errors import InputError
from variantlab.executors.runner import plan_units
from variantlab.model.kernels import components, with_kernels
from variantlab.probes import training
from variantlab.probes.training import TrainingSettings

REG = vl.get_registry()
ROOT = Path(__file__).resolve().parent.parent
TINY = {"family": "gpt", "vocab_size": 64, "context_length": 16, "emb_dim": 32, "n_heads": 4,
        "n_layers": 2, "drop_rate": 0.0}


def spec(**changes):
    return vl.parse_model_spec({**TINY, **changes}, REG)


def impls(model_spec) -> dict[tuple, str]:
    """path -> impl of every component with a fast kernel."""
    return {path: c.impl for path, c in components(model_spec) if type(c).fast_impl}


def test_fast_switches_every_unset_impl_and_reference_keeps_the_spec():
    base = spec()
    assert set(impls(base).values()) == {"naive"}
    fast = with_kernels(base, "fast", REG)
    assert impls(fast) == {("norm",): "fused", ("activation",): "fused",
                           ("attention",): "sdpa"}
    assert with_kernels(base, "reference", REG) is base
    # nothing else moved
    as_data = fast.model_dump(mode="json")
    for slot, impl in (("norm", "fused"), ("activation", "fused"), ("attention", "sdpa")):
        assert as_data[slot].pop("impl") == impl
    plain = base.model_dump(mode="json")
    for slot in ("norm", "activation", "attention"):
        plain[slot].pop("impl")
    assert as_data == plain
    with pytest.raises(ValueError, match="not one of fast, reference"):
        with_kernels(base, "turbo", REG)


def test_a_written_impl_wins_and_a_softcap_keeps_the_written_out_softmax():
    written = spec(attention={"kind": "mha", "impl": "naive"}, norm={"kind": "layer",
                                                                    "impl": "naive"})
    fast = with_kernels(written, "fast", REG)
    assert impls(fast) == {("norm",): "naive", ("activation",): "fused",
                           ("attention",): "naive"}
    capped = with_kernels(spec(attention={"kind": "mha", "softcap": 30.0}), "fast", REG)
    assert capped.attention.impl == "naive"  # sdpa cannot cap the scores
    assert capped.norm.impl == "fused"


def test_nested_components_switch_too():
    layout = {"kinds": {"local": {"attention": {"kind": "mha", "window": 4}},
                        "plain": {}}, "pattern": ["local", "plain"]}
    fast = with_kernels(spec(layout=layout), "fast", REG)
    found = impls(fast)
    assert found[("layout", "kinds", "local", "attention")] == "sdpa"
    assert found[("attention",)] == "sdpa"
    mla = spec(attention={"kind": "mla", "latent_norm": {"kind": "layer"}},
               positional={"kind": "rotary"})
    found = impls(with_kernels(mla, "fast", REG))
    assert found == {("norm",): "fused", ("activation",): "fused", ("attention",): "sdpa",
                     ("attention", "latent_norm"): "fused"}
    hybrid = spec(attention={"kind": "parallel_hybrid", "mixer": {"kind": "mamba2",
                                                                  "d_state": 4}})
    found = impls(with_kernels(hybrid, "fast", REG))
    assert found[("attention", "attention")] == "sdpa"


def test_the_fast_model_is_the_reference_model_up_to_rounding():
    """Same weights, same batch: the fused kernels' logits and gradients equal the written-out
    ones within float32 rounding."""
    base = spec(positional={"kind": "rotary"})
    models = []
    for kernels in ("reference", "fast"):
        torch.manual_seed(0)
        models.append(vl.build_model(with_kernels(base, kernels, REG), REG))
    reference, fast = models
    with torch.no_grad():  # the reference's weights, perturbed, in both
        for p in reference.parameters():
            p.add_(0.1 * torch.randn_like(p))
    fast.load_state_dict(reference.state_dict())
    idx = torch.randint(0, 64, (3, 16), generator=torch.Generator().manual_seed(1))
    out = [m(idx) for m in models]
    torch.testing.assert_close(out[1], out[0], rtol=1e-5, atol=1e-5)
    for o in out:
        o.square().mean().backward()
    for (name, a), b in zip(reference.named_parameters(), fast.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def experiment_text(extra: str = "") -> str:
    return yaml.safe_dump({
        "name": "k", "seeds": [0], "model": TINY,
        "measure": {"training": {"steps": 3, "batch_size": 2, "seq_len": 8,
                                 "eval_batches": 0}}}) + extra


def test_experiments_run_fast_by_default_and_say_so_in_their_unit_keys():
    fast = experiment_from_text(experiment_text())
    reference = experiment_from_text(experiment_text("kernels: reference\n"))
    assert fast.spec.kernels == "fast" and reference.spec.kernels == "reference"
    assert impls(fast.variants[0].spec) == {("norm",): "fused", ("activation",): "fused",
                                            ("attention",): "sdpa"}
    assert set(impls(reference.variants[0].spec).values()) == {"naive"}
    keys = [{u.key for u in plan_units(e, None)} for e in (fast, reference)]
    assert keys[0] and keys[1] and not keys[0] & keys[1]


def test_a_grid_over_impl_is_kept_under_fast_kernels():
    exp = experiment_from_text(experiment_text("grid:\n  attention.impl: [naive, sdpa]\n"))
    assert sorted(v.spec.attention.impl for v in exp.variants) == ["naive", "sdpa"]
    assert {v.spec.norm.impl for v in exp.variants} == {"fused"}


def test_an_unknown_kernels_value_is_refused_at_its_line():
    with pytest.raises(InputError) as info:
        experiment_from_text(experiment_text("kernels: turbo\n"), "exp.yaml")
    text = str(info.value)
    assert "kernels" in text and "'fast'" in text and "'reference'" in text


def test_fast_training_stays_within_rounding_of_the_reference_at_a_low_rate():
    """20 steps at lr 1e-3 on the same batches: the losses of the two kernels agree to 1e-5."""
    settings = TrainingSettings(steps=20, lr=1e-3, batch_size=4, seq_len=16, eval_batches=0)
    losses = {}
    for kernels in ("reference", "fast"):
        rows = training.run(with_kernels(spec(), kernels, REG), settings, seed=0,
                            data=None, registry=REG)
        losses[kernels] = [r["value"] for r in rows if r["metric"] == "loss"]
    assert len(losses["fast"]) == 20
    assert max(abs(a - b) for a, b in zip(losses["fast"], losses["reference"],
                                          strict=True)) < 1e-5


def test_every_committed_experiment_pins_the_kernels_its_results_were_computed_on():
    """The committed results were computed on the written-out kernels; a rerun of the file
    must reproduce them, so each experiment says so."""
    files = sorted((ROOT / "experiments").glob("*.yaml"))
    assert len(files) >= 20
    for path in files:
        assert yaml.safe_load(path.read_text()).get("kernels") == "reference", path.name


def test_validate_says_which_kernels_each_component_runs(tmp_path):
    from conftest import invoke

    path = tmp_path / "exp.yaml"
    path.write_text(experiment_text("grid:\n  attention.impl: [naive, sdpa]\n"))
    out = invoke("validate", path).output
    assert ("kernels: fast (activation: fused; attention: naive | sdpa; norm: fused; "
            "optimizer: fused)") in out
    path.write_text(experiment_text("kernels: reference\n"))
    out = invoke("validate", path).output
    assert ("kernels: reference (activation: naive; attention: naive; norm: naive; "
            "optimizer: default)") in out
    path.write_text(experiment_text("grid:\n  measure.training.fused: [false, true]\n"))
    assert "optimizer: fused | default)" in invoke("validate", path).output


def _refused_at_its_line(tmp_path, text: str, needle: str, key: str) -> None:
    """``validate`` and ``run`` of ``text`` exit 2 naming ``key`` at the line holding
    ``needle``, with no traceback; nothing is computed (no run folder)."""
    from conftest import invoke

    path = tmp_path / "exp.yaml"
    path.write_text(text)
    line = next(i for i, x in enumerate(text.splitlines(), 1) if needle in x)
    for command in (["validate", path], ["run", path, "--out", tmp_path / "runs"]):
        result = invoke(*command)
        assert result.exit_code == 2, result.output
        assert f"exp.yaml:{line}:" in result.output and key in result.output
        assert "Traceback" not in result.output
    assert not (tmp_path / "runs").exists()  # nothing computed, no run folder


def test_a_bad_kernels_value_exits_2_at_its_line_before_anything_runs(tmp_path):
    _refused_at_its_line(tmp_path, experiment_text("kernels: turbo\n"), "kernels: turbo",
                         "kernels")


def test_fast_kernels_fuse_the_optimizer_step_where_the_experiment_leaves_it_unset():
    fast = experiment_from_text(experiment_text("grid:\n  measure.training.lr: [0.001, 0.01]\n"))
    assert [fast.probes_of(v)["training"].fused for v in fast.variants] == [True, True]
    reference = experiment_from_text(experiment_text("kernels: reference\n"))
    settings = reference.probes_of(reference.variants[0])["training"]
    assert settings.fused is None
    assert "fused" not in settings.model_dump()  # the committed experiments' keys unchanged
    written = experiment_from_text(experiment_text().replace(
        "eval_batches: 0", "eval_batches: 0\n    fused: false"))
    assert written.probes_of(written.variants[0])["training"].fused is False
    keys = {e.spec.kernels + str(e.measure["training"].fused): {u.key for u in plan_units(e, None)}
            for e in (fast, written)}
    assert len(set().union(*keys.values())) == sum(map(len, keys.values()))  # never shared


@pytest.mark.parametrize("optimizer", ["adamw", "sgd", "muon"])
def test_the_fused_optimizer_step_trains_as_the_default_one_up_to_rounding(optimizer):
    """30 steps on the same batches: the losses with torch's fused step agree with the
    foreach step's to a relative 1e-5 (float32 rounding over 30 steps; the optimizer really
    is the fused one; SGD's fused step gives the same bits here)."""
    from variantlab.probes.recipe import Optimizers, make_optimizer

    losses = {}
    for fused in (None, True):
        settings = TrainingSettings(steps=30, lr=1e-3, batch_size=4, seq_len=16,
                                    eval_batches=0, optimizer=optimizer, fused=fused)
        rows = training.run(spec(), settings, seed=0, data=None, registry=REG)
        losses[fused] = [r["value"] for r in rows if r["metric"] == "loss"]
        opt = make_optimizer(vl.build_model(spec(), REG), settings)
        parts = opt.optimizers if isinstance(opt, Optimizers) else (opt,)
        fused_parts = [p.defaults.get("fused") for p in parts]
        assert fused_parts == ([None, True] if optimizer == "muon" else [True]) if fused \
            else all(not f for f in fused_parts)
    assert len(losses[True]) == 30
    for a, b in zip(losses[True], losses[None], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)


def test_the_fused_step_is_asked_only_where_the_device_has_it():
    from variantlab.probes.recipe import fused_kwargs

    settings = TrainingSettings(fused=True)
    assert fused_kwargs(settings, vl.build_model(spec(), REG)) == {"fused": True}
    with torch.device("meta"):  # no fused kernel there: torch's default step
        on_meta = vl.build_model(spec(), REG)
    assert fused_kwargs(settings, on_meta) == {}
    assert fused_kwargs(TrainingSettings(), vl.build_model(spec(), REG)) == {}


@pytest.mark.parametrize("where", ["setting", "axis"])
def test_a_bad_fused_value_exits_2_at_its_line_before_anything_runs(tmp_path, where):
    if where == "setting":
        text = experiment_text().replace("eval_batches: 0", "eval_batches: 0\n    fused: sometimes")
        needle = "fused: sometimes"
    else:
        text = experiment_text("grid:\n  measure.training.fused: [true, sometimes]\n")
        needle = "measure.training.fused: [true, sometimes]"
    _refused_at_its_line(tmp_path, text, needle, "fused")
