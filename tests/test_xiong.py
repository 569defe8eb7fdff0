"""Issue 3, "What it must show" 5: experiments/xiong-fig3.yaml reproduces the shape of
Xiong et al. 2020 Fig. 3 on a small model: at initialisation, post-norm's feed-forward
gradient norm rises toward the output layer; pre-norm's stays flat."""

from pathlib import Path

from click.testing import CliRunner

import variantlab as vl
from variantlab.cli.main import main
from variantlab.config.experiment import load_experiment

EXPERIMENT = Path(__file__).resolve().parent.parent / "experiments" / "xiong-fig3.yaml"


def ffn_profile(df, residual: str):
    """Per-layer feed-forward grad norm (mean over seeds) of the variant with ``residual``."""
    exp = load_experiment(EXPERIMENT)
    name = next(v.name for v in exp.variants if v.spec.residual.kind == residual)
    sel = df[(df.variant == name) & (df.probe == "gradients") & (df.metric == "grad_norm")
             & (df.scope == "layer") & (df.name == "feedforward")]
    assert sel.seed.nunique() == len(exp.seeds)
    return sel.groupby("layer").value.mean().sort_index()


def test_post_norm_rises_with_depth_pre_norm_stays_flat(tmp_path):
    result = CliRunner().invoke(main, ["run", str(EXPERIMENT), "--out", str(tmp_path),
                                       "--no-report"])
    assert result.exit_code == 0, result.output
    df = vl.results(tmp_path / "xiong-fig3")
    post, pre = ffn_profile(df, "post_norm"), ffn_profile(df, "pre_norm")
    assert len(post) == len(pre) == 8
    post_ratio = post.iloc[-1] / post.iloc[0]
    pre_ratio = pre.iloc[-1] / pre.iloc[0]
    assert post_ratio > 1.4  # measured 1.71 (seeds 0-2)
    assert 0.85 < pre_ratio < 1.1  # measured 0.95
    assert abs(post_ratio - 1) > 5 * abs(pre_ratio - 1)
    # rising, not just a last-layer spike: the upper half above the lower half
    assert post.iloc[4:].mean() > 1.2 * post.iloc[:4].mean()
    assert abs(pre.iloc[4:].mean() / pre.iloc[:4].mean() - 1) < 0.1
