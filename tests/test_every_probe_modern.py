"""Issue 19, "Done when": a Gemma-3-like layout (5 local : 1 global, its own rotary base per
kind, sandwich norms, soft-capped scores and logits, scaled embeddings) and a Mixtral-like
mixture of experts validate, run every built-in probe through the command and report."""

import textwrap

import pytest
from click.testing import CliRunner

import variantlab as vl
from variantlab.cli.main import main

MODELS = {
    "gemma3-like": """\
        family: gpt
        vocab_size: 64
        context_length: 16
        emb_dim: 32
        n_heads: 4
        n_layers: 6
        drop_rate: 0.0
        norm: rms
        activation: {kind: gelu, approximate: tanh}
        feedforward: {kind: glu}
        residual: sandwich
        positional: {kind: rotary, theta: 1000000.0}
        scale_embeddings: true
        logit_softcap: 30.0
        attention: {kind: mha, n_kv_heads: 2, qk_norm: {kind: rms}, softcap: 50.0}
        layout:
          kinds:
            local: {attention: {kind: mha, n_kv_heads: 2, qk_norm: {kind: rms}, softcap: 50.0,
                                window: 4},
                    positional: {kind: rotary, theta: 10000.0}}
            global: {}
          pattern: [local, local, local, local, local, global]
        """,
    "mixtral-like": """\
        family: gpt
        vocab_size: 64
        context_length: 16
        emb_dim: 32
        n_heads: 4
        n_layers: 2
        drop_rate: 0.0
        norm: rms
        activation: silu
        positional: rotary
        attention: {kind: mha, n_kv_heads: 2, window: 8}
        feedforward: {kind: moe, n_experts: 4, top_k: 2, aux_loss_coef: 0.02,
                      expert: {kind: glu, hidden_dim: 24}}
        """,
}
MEASURE = """\
    measure:
      params: {}
      gradients: {batch_size: 2, seq_len: 16, batches: 1}
      timing: {batch_size: 2, seq_len: 16, repeats: 1, warmup: 0}
      training: {steps: 3, batch_size: 2, seq_len: 16, eval_batches: 1}
      dynamics: {steps: 3, batch_size: 2, seq_len: 16, every: 1}
    """


@pytest.mark.parametrize("name", list(MODELS))
def test_every_probe_runs_and_reports(name, tmp_path):
    model = textwrap.indent(textwrap.dedent(MODELS[name]), "  ")
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: {name}\nseeds: [0]\nmodel:\n{model}"
                    "data: {source: synthetic, task: random}\n" + textwrap.dedent(MEASURE))
    runner = CliRunner()
    checked = runner.invoke(main, ["validate", str(path)])
    assert checked.exit_code == 0, checked.output
    out = tmp_path / "runs"
    result = runner.invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    df = vl.results(out / name)
    assert set(df.status) == {"ok"}
    assert set(df.probe) == {"params", "gradients", "timing", "training", "dynamics"}
    grads = df[(df.probe == "gradients") & (df.scope == "layer")]
    assert grads.layer.nunique() == (6 if name == "gemma3-like" else 2)  # rows per layer
    report = (out / name / "report" / "report.md").read_text()
    for section in ("Parameters", "Gradients", "Timing", "Training"):
        assert f"## {section}" in report or f"### {section}" in report, section
    if name == "mixtral-like":
        assert "### Expert load per layer over training" in report
        active = df[(df.probe == "params") & (df.metric == "active")]["value"].iloc[0]
        total = df[(df.probe == "params") & (df.metric == "total")]["value"].iloc[0]
        assert active < total  # two of four experts per token
