"""compile: true in the training and timing probes: same losses as eager, compile time apart,
rows marked compiled, a clear failure (only that unit) when torch.compile fails."""

import pytest
import torch

import variantlab as vl
from variantlab.config.experiment import experiment_from_text
from variantlab.executors.runner import plan_units, run_experiment
from variantlab.probes import run_probe
from variantlab.probes.compiled import CompileError, compile_errors, compile_model
from variantlab.store.store import results

REG = vl.get_registry()

TRAIN = {"steps": 5, "lr": 3e-3, "batch_size": 4, "seq_len": 16, "eval_batches": 2,
         "device": "cpu"}
TIME = {"batch_size": 2, "seq_len": 16, "warmup": 1, "repeats": 2,
        "passes": ["forward", "backward"], "device": "cpu"}


def by_metric(rows, probe):
    return {r["metric"]: r["value"] for r in rows if r["probe"] == probe and r["step"] is None
            and r["scope"] == "model"}


def losses(rows):
    return [r["value"] for r in sorted((r for r in rows if r["metric"] == "loss"),
                                       key=lambda r: r["step"])]


@pytest.mark.slow
def test_compiled_training_matches_eager_within_1e4(tiny):
    eager = run_probe("training", tiny, TRAIN, seed=0, registry=REG)
    compiled = run_probe("training", tiny, {**TRAIN, "compile": True}, seed=0, registry=REG)
    assert len(losses(compiled)) == len(losses(eager)) == 5
    assert losses(compiled) == pytest.approx(losses(eager), abs=1e-4)
    assert losses(eager)[-1] != losses(eager)[0]  # the run really trained
    e, c = by_metric(eager, "training"), by_metric(compiled, "training")
    assert (e["compiled"], c["compiled"]) == (0.0, 1.0)
    # eval_loss runs the compiled model again, in eval mode without gradients
    assert c["eval_loss"] == pytest.approx(e["eval_loss"], abs=1e-4)
    assert c["final_loss"] == pytest.approx(e["final_loss"], abs=1e-4)


@pytest.mark.slow
def test_compiled_timing_rows_are_marked_and_compile_time_is_apart(tiny):
    rows = run_probe("timing", tiny, {**TIME, "compile": True}, seed=0, registry=REG)
    m = by_metric(rows, "timing")
    assert m["compiled"] == 1.0
    # the first forward traces and compiles: far longer than a measured (compiled) call
    assert m["forward_compile_s"] > 10 * m["forward_median_s"] > 0
    # the backward graph may be compiled with the forward one or at the first backward call
    # (AOTAutograd decides), so its first call is only known to be timed apart
    assert m["backward_compile_s"] > 0 and m["backward_median_s"] > 0
    eager = by_metric(run_probe("timing", tiny, TIME, seed=0, registry=REG), "timing")
    assert eager["compiled"] == 0.0
    assert not any(k.endswith("_compile_s") for k in eager)


def test_compile_is_in_the_unit_key(tiny):
    def keys(compile_):
        text = (f"name: k\nseeds: [0]\nmodel: {tiny}\nmeasure:\n"
                f"  training: {{steps: 2, seq_len: 16, compile: {str(compile_).lower()}}}\n"
                f"  timing: {{seq_len: 16, compile: {str(compile_).lower()}}}\n")
        return {u.probe: u.key for u in plan_units(experiment_from_text(text))}

    eager, compiled = keys(False), keys(True)
    assert eager["training"] != compiled["training"]
    assert eager["timing"] != compiled["timing"]


def test_dynamics_takes_no_compile_key(tiny):
    with pytest.raises(Exception, match="compile"):
        run_probe("dynamics", tiny, {"steps": 2, "compile": True}, seed=0, registry=REG)


def test_compile_model_off_returns_the_model_itself():
    model = torch.nn.Linear(2, 2)
    assert compile_model(model, False) is model


def test_compiler_failure_at_call_becomes_a_clear_error():
    with pytest.raises(CompileError, match="set compile: false"):
        with compile_errors(True):
            raise torch._dynamo.exc.TorchDynamoException("graph break storm")
    with pytest.raises(ValueError, match="model bug"):  # the model's own errors pass as they are
        with compile_errors(True):
            raise ValueError("model bug")


def test_failed_compile_fails_only_its_unit(tiny, tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setattr(torch, "compile", broken)
    text = (f"name: c\nseeds: [0]\nmodel: {tiny}\nmeasure:\n  params: {{}}\n"
            "  training: {steps: 2, batch_size: 2, seq_len: 8, device: cpu, compile: true}\n")
    summary = run_experiment(experiment_from_text(text), tmp_path)
    assert summary.done == 1
    assert [u.probe for u, _ in summary.failed] == ["training"]
    error = summary.failed[0][1]
    assert "CompileError" in error and "no C++ compiler found" in error
    assert "set compile: false" in error
    stored = results(summary.store)
    assert set(stored[stored["status"] == "ok"]["probe"]) == {"params"}
    failed = stored[stored["status"] == "failed"]
    assert list(failed["probe"]) == ["training"]
    assert "set compile: false" in failed["error"].iloc[0]


def test_report_tables_show_compiled_runs_and_compile_time(tiny, tmp_path):
    from variantlab.plugin.rows import row
    from variantlab.report import write_report

    def fake(name, spec, settings, **kwargs):  # rows of a compiled timing and training run
        if name == "timing":
            return [row("timing", "forward_median_s", 0.002, unit="s"),
                    row("timing", "forward_compile_s", 7.5, unit="s"),
                    row("timing", "compiled", float(settings.compile))]
        return [row("training", "final_loss", 3.0),
                row("training", "compiled", float(settings.compile))]

    text = (f"name: c\nseeds: [0]\nmodel: {tiny}\nmeasure:\n"
            "  timing: {seq_len: 16, passes: [forward], compile: true}\n"
            "  training: {steps: 2, seq_len: 16, compile: true}\n")
    summary = run_experiment(experiment_from_text(text), tmp_path / "runs", probe_fn=fake)
    write_report([summary.store], tmp_path / "report", registry=REG)
    md = (tmp_path / "report" / "report.md").read_text()
    assert md.count("compiled (torch.compile)") == 2  # the timing and the training table
    assert "forward compile time" in md and "7.5" in md


@pytest.mark.slow
def test_a_padded_gpt_compiles_as_one_graph_and_matches_eager(tiny):
    """The padding mask's dead-row check stays out of the compiled graph (no graph break),
    and the rows it protects (a left-padded row's pads see no key) come out as in eager."""
    import torch._dynamo as dynamo

    torch.manual_seed(0)
    model = vl.build_model(tiny, REG).eval()
    idx = torch.randint(0, tiny["vocab_size"], (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[0, :3] = 0  # row 0 left-padded by three: its first three queries see no key
    explained = dynamo.explain(model)(idx, attention_mask=mask)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    dynamo.reset()
    with torch.no_grad():
        eager = model(idx, attention_mask=mask)
        compiled = torch.compile(model)(idx, attention_mask=mask)
    assert torch.allclose(compiled, eager, atol=1e-5)


# -- compile: auto (issue 39, item 2) ------------------------------------------------------
def test_auto_compiles_from_the_stated_step_count():
    from variantlab.probes.compiled import AUTO_STEPS, use_compile

    assert AUTO_STEPS == 1000
    assert [use_compile("auto", n) for n in (1, 200, 999, 1000, 1500)] == \
        [False, False, False, True, True]
    assert use_compile(True, 1) and not use_compile(False, 5000)


def test_a_short_auto_run_stays_eager_with_the_key_and_rows_of_compile_false(tiny, monkeypatch):
    """The fast suite's runs are short: auto never starts torch.compile there, writes its
    settings as compile: false (the same unit key) and gives eager's rows bit for bit."""
    from variantlab.probes.training import TrainingSettings

    def no_compile(*args, **kwargs):
        raise AssertionError("torch.compile was called")

    monkeypatch.setattr(torch, "compile", no_compile)
    assert TrainingSettings().compile == "auto"
    assert TrainingSettings(**TRAIN).model_dump() == \
        TrainingSettings(**TRAIN, compile=False).model_dump()
    assert TrainingSettings(steps=1000).model_dump()["compile"] == "auto"  # may compile
    assert TrainingSettings(tokens=4096).model_dump()["compile"] == "auto"  # steps unknown yet
    auto = run_probe("training", tiny, TRAIN, seed=0, registry=REG)
    eager = run_probe("training", tiny, {**TRAIN, "compile": False}, seed=0, registry=REG)
    assert auto == eager and by_metric(auto, "training")["compiled"] == 0.0

    def keys(extra):
        text = (f"name: k\nseeds: [0]\nmodel: {tiny}\nmeasure:\n"
                f"  training: {{steps: 2, seq_len: 16{extra}}}\n")
        return [u.key for u in plan_units(experiment_from_text(text))]

    assert keys("") == keys(", compile: auto") == keys(", compile: false") != \
        keys(", compile: true")


def test_auto_falls_back_to_eager_on_a_compile_failure_and_says_so(tiny, monkeypatch):
    """A run long enough to compile whose compile fails runs eager from the start: eager's
    rows exactly, ``compiled`` 0, and a ``compile_fallback`` row with the compiler's error."""
    from variantlab.probes import compiled as compiled_mod

    class Broken(torch.nn.Module):
        def forward(self, *args, **kwargs):
            raise torch._dynamo.exc.TorchDynamoException("inductor: no C++ compiler")

    calls = []
    monkeypatch.setattr(compiled_mod, "AUTO_STEPS", 5)
    monkeypatch.setattr(torch, "compile", lambda model, **kw: calls.append(1) or Broken())
    auto = run_probe("training", tiny, TRAIN, seed=0, registry=REG)
    eager = run_probe("training", tiny, {**TRAIN, "compile": False}, seed=0, registry=REG)
    assert calls == [1]  # tried once, then eager
    fallback = [r for r in auto if r["metric"] == "compile_fallback"]
    assert len(fallback) == 1 and fallback[0]["value"] == 1.0 and fallback[0]["scope"] == "info"
    assert "no C++ compiler" in fallback[0]["name"]
    assert [r for r in auto if r["metric"] != "compile_fallback"] == eager
    assert by_metric(auto, "training")["compiled"] == 0.0
    # compile: true still fails the unit instead
    with pytest.raises(CompileError, match="no C\\+\\+ compiler"):
        run_probe("training", tiny, {**TRAIN, "compile": True}, seed=0, registry=REG)


@pytest.mark.slow
def test_a_long_auto_run_compiles_and_matches_eager_within_1e4(tiny, monkeypatch):
    from variantlab.probes import compiled as compiled_mod

    monkeypatch.setattr(compiled_mod, "AUTO_STEPS", 5)  # "long" at 5 steps
    eager = run_probe("training", tiny, {**TRAIN, "compile": False}, seed=0, registry=REG)
    auto = run_probe("training", tiny, TRAIN, seed=0, registry=REG)
    assert by_metric(auto, "training")["compiled"] == 1.0
    assert not [r for r in auto if r["metric"] == "compile_fallback"]
    assert losses(auto) == pytest.approx(losses(eager), abs=1e-4)
    assert by_metric(auto, "training")["val_loss"] == \
        pytest.approx(by_metric(eager, "training")["val_loss"], abs=1e-4)
