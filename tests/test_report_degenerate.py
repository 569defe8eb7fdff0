"""A report always gets written (issue 26.3): every report part against degenerate frames
(missing probes, one seed, one variant, one size, NaN values, losses <= 0, failed units),
a part that raises becoming a notice with the rest written (exit 1, one line), and the
issue's size sweep (activation x emb_dim on synthetic recall data, training only) through
the CLI."""

from __future__ import annotations

import math
import textwrap

import pytest
import torch
from conftest import invoke, store_of

from variantlab.model.build import make_model
from variantlab.model.specs import parse_model_spec
from variantlab.plugin.registry import build_registry, get_registry
from variantlab.probes.params import ParamsSettings
from variantlab.probes.params import run as params_run
from variantlab.report import build_context, gather, write_report
from variantlab.report.builtin.training import spec_non_embedding
from variantlab.report.render import render_html, render_markdown
from variantlab.testing.sample import DEFAULT_VARIANTS, sample_grid, sample_run

SIZE = {"activation.kind": ["gelu", "relu"], "emb_dim": [16, 32, 48]}


def _nan(run):
    run.rows["value"] = math.nan
    return run


def _nonpositive(run):
    training = run.rows["probe"] == "training"
    run.rows.loc[training, "value"] = -run.rows.loc[training, "value"].abs()
    return run


def _all_failed(run):
    run.units["status"] = "failed"
    run.units["error"] = "RuntimeError: <b>out of memory</b>"
    run.rows = run.rows.iloc[0:0]
    return run


FRAMES = {
    "failed unit and a diverged seed": lambda: sample_run(),
    "one seed": lambda: sample_run(seeds=(0,)),
    "one variant": lambda: sample_run(DEFAULT_VARIANTS[:1], seeds=(0,), fail=None,
                                      diverge=None),
    "size grid without params": lambda: sample_grid(SIZE, probes=["training"]),
    "size grid without training": lambda: sample_grid(SIZE, probes=["params"]),
    "one size": lambda: sample_grid({"activation.kind": ["gelu", "relu"], "emb_dim": [16]},
                                    seeds=(0,)),
    "NaN everywhere": lambda: _nan(sample_grid(SIZE, seeds=(0,))),
    "losses <= 0": lambda: _nonpositive(sample_grid(SIZE, probes=["training"], seeds=(0,))),
    "every unit failed": lambda: _all_failed(sample_run()),
}


@pytest.mark.parametrize("name", list(FRAMES))
def test_every_part_gives_its_part_on_a_degenerate_frame(name):
    """No part raises: build_context collects failures instead of raising, so an empty
    ``failed`` list means every table, piece, view and plot built."""
    context, plots = build_context(gather([FRAMES[name]()]), get_registry())
    assert [f.notice() for f in context["failed"]] == []
    assert "## Reading" in render_markdown(context)
    render_html(context, {p.key: "<svg></svg>" for p in plots if p.figure is not None})
    for plot in plots:
        assert plot.figure is not None or plot.skipped, plot.key


def test_loss_vs_size_without_params_counts_the_spec_and_keeps_log_axes_positive(tmp_path):
    run = sample_grid(SIZE, probes=["training"], seeds=(0,))
    files = write_report([run], tmp_path, registry=get_registry())
    assert files.failed == ()
    assert (tmp_path / "loss_vs_size.svg").is_file() and files.by_size is not None
    context, plots = build_context(gather([run]), get_registry())
    plot = next(p for p in plots if p.key == "loss_vs_size")
    assert plot.figure is not None
    params_axes = plot.figure.axes[0]
    assert (params_axes.get_xscale(), params_axes.get_yscale()) == ("log", "log")
    xs = sorted(x for line in params_axes.get_lines() if line.get_gid() != "guide"
                for x in line.get_xdata())  # the points, not the fitted power laws
    counts = sorted(spec_non_embedding(s) for s in gather([run]).variants["spec"])
    assert xs == pytest.approx(counts)  # sizes from the specs, the params probe absent
    negative = _nonpositive(sample_grid(SIZE, probes=["training"], seeds=(0,)))
    _, plots = build_context(gather([negative]), get_registry())
    plot = next(p for p in plots if p.key == "loss_vs_size")
    params_axes = plot.figure.axes[0]
    assert (params_axes.get_xscale(), params_axes.get_yscale()) == ("log", "linear")


@pytest.mark.parametrize("over", [{}, {"emb_dim": 48, "n_layers": 3},
                                  {"attention": {"kind": "mamba2"}}])
def test_spec_counts_equal_the_params_probe(over):
    """The count from a stored spec (meta build) equals the params probe's row (a real
    build), so a run without the params probe sizes its variants the same."""
    registry = get_registry()
    spec = parse_model_spec({**sample_run().variants["spec"][0], **over}, registry)
    rows = params_run(spec, ParamsSettings(), seed=0, registry=registry)
    want = next(r["value"] for r in rows if r["metric"] == "non_embedding")
    assert spec_non_embedding(spec.model_dump(mode="json")) == want
    model = make_model(spec, 0, registry)
    assert want < sum(p.numel() for p in model.parameters())  # embeddings left out


BROKEN_VIEWS = '''
from variantlab import hookimpl, ProbeSettings
from variantlab.plugin.probe import ProbeView


class Settings(ProbeSettings):
    pass


def run(spec, settings, **kw):
    return []


def section(data, summary):
    raise ValueError("section <b>exploded</b> & more")


def plots(data):
    raise RuntimeError("no figure today")


def reading(data, summary):
    return ["The broken probe says <i>hello</i>."]


@hookimpl
def register_probes(register):
    register("broken", Settings, run,
             views=[ProbeView(section=section, plots=plots, reading=reading, rank=5)])
'''


def test_a_part_that_raises_is_a_notice_and_the_rest_is_written(tmp_path):
    plugin = tmp_path / "broken_views.py"
    plugin.write_text(BROKEN_VIEWS)
    registry = build_registry([str(plugin)], entry_points=False)
    files = write_report([sample_run()], tmp_path / "report", registry=registry)
    assert sorted(f.part for f in files.failed) == ["probe broken: plots",
                                                    "probe broken: section"]
    md = files.markdown.read_text()
    html = files.html.read_text()
    assert "## Parts that failed" in md and "<h2>Parts that failed</h2>" in html
    assert "section &lt;b&gt;exploded&lt;/b&gt; &amp; more" in html  # escaped
    assert "<b>exploded" not in html and "<b>exploded" not in md
    assert "Skipped: probe broken: plots failed: RuntimeError: no figure today." in md
    assert "The broken probe says &lt;i&gt;hello&lt;/i&gt;." in html  # its reading stays
    assert "### Parameters" in md and (tmp_path / "report" / "gradients.svg").is_file()

    store = store_of(sample_run(), tmp_path / "run")
    result = invoke("report", store, "--plugin", plugin, "--out", tmp_path / "cli")
    assert result.exit_code == 1
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("report: 2 part(s) failed")
    assert "probe broken: section failed: ValueError" in lines[0]
    assert (tmp_path / "cli" / "report.html").is_file()


def test_the_issue_size_sweep_gives_a_report(tmp_path):
    """Issue 26.3's repro: activation x emb_dim [16, 32, 48], synthetic recall data, only a
    training probe (no params probe), a few steps: run and report both exit 0."""
    exp = tmp_path / "size.yaml"
    exp.write_text(textwrap.dedent("""\
        name: size-recall
        model: {family: gpt, vocab_size: 64, context_length: 16, emb_dim: 16, n_heads: 2,
                n_layers: 1, drop_rate: 0.0}
        grid: {activation.kind: [gelu, relu], emb_dim: [16, 32, 48]}
        data: {source: synthetic, task: recall}
        measure:
          training: {steps: 2, batch_size: 2, seq_len: 16, eval_batches: 1}
        """))
    torch.set_num_threads(1)
    result = invoke("run", exp, "--out", tmp_path / "runs")
    assert result.exit_code == 0, result.output
    report = tmp_path / "runs" / "size-recall" / "report"
    assert (report / "loss_vs_size.svg").is_file()
    assert "Parts that failed" not in (report / "report.md").read_text()
    again = invoke("report", tmp_path / "runs" / "size-recall", "--out", tmp_path / "again")
    assert again.exit_code == 0, again.output
