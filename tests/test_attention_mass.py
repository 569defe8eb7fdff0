"""The attention mass on the first token and on a learned sink (the dynamics probe's
``first_token_mass`` and ``sink_mass``), checked on attention whose weights are known."""

import math
from fractions import Fraction

import pytest
import torch

import variantlab as vl
from variantlab import build_model, parse_model_spec
from variantlab.probes import run_probe

REG = vl.get_registry()
T = 16


def stats_of_uniform(tiny, attention, sink=None):
    """``last_stats`` of each attention of a tiny model whose queries and keys are zero
    (every visible key weighs the same), with every sink logit set to ``sink``."""
    spec = parse_model_spec({**tiny, "attention": attention}, REG)
    torch.manual_seed(0)
    model = build_model(spec, REG).eval()
    attn = [m for m in model.modules() if hasattr(m, "record_stats")]
    with torch.no_grad():
        for m in attn:
            for param in (*m.W_query.parameters(), *m.W_key.parameters()):
                param.zero_()
            if sink is not None:
                m.sinks.fill_(sink)
            m.record_stats = True
        model(torch.randint(0, 64, (2, T)))
    return [m.last_stats for m in attn]


def mean(values):
    values = list(values)
    return float(sum(values, Fraction(0)) / len(values))


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
@pytest.mark.parametrize("window", [None, 5])
def test_uniform_attention_puts_one_over_t_plus_one_on_the_first_token(tiny, impl, window):
    got = stats_of_uniform(tiny, {"kind": "mha", "impl": impl, "window": window})
    # query t sees keys max(0, t - w + 1) .. t, each 1 / (its count); key 0 while t < w
    w = window or T
    expected = mean(Fraction(1, t + 1) for t in range(1, min(w, T)))
    assert len(got) == 2
    for stats in got:
        assert stats["first_token_mass"] == pytest.approx(expected, rel=1e-6)
        assert "sink_mass" not in stats


@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_a_sink_takes_its_share_of_the_softmax(tiny, impl):
    e = 3.0  # sink logit log 3: the sink weighs as much as three keys
    got = stats_of_uniform(tiny, {"kind": "mha", "impl": impl, "sinks": True}, math.log(e))
    sink = mean(Fraction(3, t + 1 + 3) for t in range(T))  # every query
    first = mean(Fraction(1, t + 1 + 3) for t in range(1, T))  # queries after position 0
    for stats in got:
        assert stats["sink_mass"] == pytest.approx(sink, rel=1e-6)
        assert stats["first_token_mass"] == pytest.approx(first, rel=1e-6)


def test_a_large_sink_logit_takes_almost_all_the_mass(tiny):
    for stats in stats_of_uniform(tiny, {"kind": "mha", "sinks": True}, 30.0):
        assert stats["sink_mass"] > 1 - 1e-9
        assert stats["first_token_mass"] < 1e-9


def test_the_dynamics_probe_records_sink_mass_per_layer_for_both_impls(tiny):
    settings = {"steps": 3, "every": 2, "batch_size": 2, "seq_len": 16, "device": "cpu"}
    out = {}
    for impl in ("naive", "sdpa"):
        spec = parse_model_spec({**tiny, "attention": {"kind": "mha", "impl": impl,
                                                       "sinks": True, "window": 6}}, REG)
        rows = run_probe("dynamics", spec, settings, seed=3, registry=REG)
        out[impl] = {(r["metric"], r["layer"], r["step"]): r["value"] for r in rows
                     if r["metric"] in ("sink_mass", "first_token_mass")}
    assert {k for k in out["naive"] if k[0] == "sink_mass"} == {
        ("sink_mass", i, s) for i in (0, 1) for s in (0, 2)}
    # sinks start at logit 0: one more unit in the softmax's denominator
    assert all(0 < v < 1 for v in out["naive"].values())
    assert out["naive"].keys() == out["sdpa"].keys()
    for key, v in out["naive"].items():
        assert out["sdpa"][key] == pytest.approx(v, rel=1e-4, abs=1e-7), key


def test_the_heatmaps_leave_a_blank_panel_where_a_variant_has_no_sink():
    from types import SimpleNamespace

    import pandas as pd

    from variantlab.report.builtin.dynamics import heatmaps

    rows = [{"probe": "dynamics", "scope": "layer", "name": "", "layer": layer, "step": step,
             "variant": variant, "metric": metric, "value": 0.1 * layer + step}
            for variant in ("plain", "sinks") for layer in (0, 1) for step in (0, 10)
            for metric in ("first_token_mass", "sink_mass")
            if metric != "sink_mass" or variant == "sinks"]
    data = SimpleNamespace(rows=pd.DataFrame(rows), order=["plain", "sinks"], runs=[],
                           variants=pd.DataFrame(columns=["run", "variant", "overrides"]))
    (plot,) = heatmaps(data)
    assert not plot.skipped and plot.figure is not None
    texts = [t.get_text() for ax in plot.figure.axes for t in ax.texts]
    assert texts == ["none"]  # plain's sink panel


def test_the_heatmaps_rows_come_condition_by_condition_named_by_it(monkeypatch):
    from types import SimpleNamespace

    import pandas as pd

    from variantlab.report import panels
    from variantlab.report.builtin.dynamics import heatmaps

    order = ["w32-plain", "w64-plain", "w32-sinks", "w64-sinks"]
    rows = [{"probe": "dynamics", "scope": "layer", "name": "", "layer": layer, "step": step,
             "variant": variant, "metric": "first_token_mass", "value": 0.1 * layer + step}
            for variant in order for layer in (0, 1) for step in (0, 10)]
    monkeypatch.setattr(panels, "condition_groups", lambda data: [
        ("emb_dim=32", ["w32-plain", "w32-sinks"]), ("emb_dim=64", ["w64-plain", "w64-sinks"])])
    monkeypatch.setattr(panels, "line_labels", lambda data: {v: v.split("-")[1] for v in order})
    (plot,) = heatmaps(SimpleNamespace(rows=pd.DataFrame(rows), order=order))
    labels = [ax.get_ylabel() for ax in plot.figure.axes if ax.get_ylabel()]
    assert labels == ["emb_dim=32\nplain\nlayer", "emb_dim=32\nsinks\nlayer",
                      "emb_dim=64\nplain\nlayer", "emb_dim=64\nsinks\nlayer"]
    assert "grouped by condition" in plot.caption
