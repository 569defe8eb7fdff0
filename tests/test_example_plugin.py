"""Issue 5, "What it must show" 1: install the example plugin distribution, find its entry
point, run an experiment that uses its component, and find it in the stored results."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "plugin-scalenorm"

EXPERIMENT = """\
name: scalenorm-check
seeds: [0]
model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4,
        n_layers: 2, drop_rate: 0.0}
grid:
  norm.kind: [layer, scale]
measure:
  params: {}
  gradients: {batch_size: 2, seq_len: 8, batches: 1}
"""


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The example distribution installed into a private folder (the source is copied
    first so the build leaves nothing in the repository)."""
    root = tmp_path_factory.mktemp("scalenorm")
    shutil.copytree(EXAMPLE, root / "src", ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = root / "site"
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation",
         "--disable-pip-version-check", "--no-index", "--quiet", "--target", str(target),
         str(root / "src")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert (target / "variantlab_scalenorm.py").is_file()
    return target


def run_with(site: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    env.pop("VARIANTLAB_STRICT_PLUGINS", None)
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_entry_point_is_found(site, tmp_path):
    code = textwrap.dedent("""\
        import json, variantlab
        reg = variantlab.build_registry(strict=True)
        comp = reg.get("norm", "scale")
        print(json.dumps([comp.plugin, dict(reg.plugins)[comp.plugin]]))
        """)
    result = run_with(site, ["-c", code], tmp_path)
    assert result.returncode == 0, result.stderr
    plugin, source = json.loads(result.stdout)
    assert source == "entry point"
    assert plugin.replace("_", "-") == "variantlab-scalenorm:scalenorm"


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_cli_plugins_lists_scale(site, tmp_path):
    result = run_with(site, ["-m", "variantlab", "plugins", "--slot", "norm", "--json"],
                      tmp_path)
    assert result.returncode == 0, result.stderr
    listing = json.loads(result.stdout)
    rows = {r["kind"]: r for r in listing["components"]}
    assert rows["scale"]["source"] == "entry point"
    params = {p["name"]: p for p in rows["scale"]["params"]}
    assert params["eps"]["default"] == 1e-5 and params["init"]["default"] is None
    assert listing["failures"] == []


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_without_install_scale_is_unknown(tmp_path):
    code = "import variantlab; print('scale' in variantlab.build_registry().kinds('norm'))"
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True,
                            text=True, timeout=120)
    assert result.stdout.strip() == "False", result.stderr


@pytest.mark.slow
def test_experiment_with_scale_norm_runs_and_is_stored(site, tmp_path):
    from variantlab.store import store
    (tmp_path / "exp.yaml").write_text(EXPERIMENT)
    result = run_with(site, ["-m", "variantlab", "run", "exp.yaml", "--out", "runs",
                             "--no-report"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    run = store.load_run(tmp_path / "runs" / "scalenorm-check")
    specs = {row.name: row.spec for row in run.variants.itertuples()}
    (scale_variant,) = [n for n, s in specs.items() if s["norm"]["kind"] == "scale"]
    (layer_variant,) = [n for n, s in specs.items() if s["norm"]["kind"] == "layer"]
    assert specs[scale_variant]["norm"] == {"kind": "scale", "eps": 1e-5, "init": None}

    frame = store.results(tmp_path / "runs" / "scalenorm-check")
    assert set(frame.status) == {"ok"}
    assert {"params", "gradients"} == set(frame[frame.variant == scale_variant].probe)
    total = frame[(frame.probe == "params") & (frame.metric == "total")].set_index("variant").value
    # five norms (2 layers x 2 + final): LayerNorm has 2 x 32 parameters each, ScaleNorm one
    assert total[layer_variant] - total[scale_variant] == 5 * (2 * 32 - 1)
    norm_params = frame[(frame.probe == "params") & (frame.scope == "slot")
                        & (frame.name == "norm")].set_index("variant").value
    assert norm_params[scale_variant] == 5
    loss = frame[(frame.probe == "gradients") & (frame.metric == "loss")
                 & (frame.variant == scale_variant)].value
    assert len(loss) == 1 and 3.0 < float(loss.iloc[0]) < 5.5  # ~ln(64) = 4.16 at init
