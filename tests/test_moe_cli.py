"""Bad MoE sizes through the command (issue 19, "Done when"): top_k above n_experts, top_k 0
and no experts are refused as FILE:LINE:COL, exit 2, before anything is computed or stored;
a Mixtral-like MoE experiment validates."""

import re

import pytest
from click.testing import CliRunner
from conftest import exp

from variantlab.cli.main import main

MEASURE = "measure:\n  params: {}\n"
MOE = "  feedforward: {kind: moe, n_experts: %s, top_k: %s}\n"
CASES = {
    "top_k above n_experts": (exp(MOE % (2, 3) + MEASURE),
                              "model.feedforward: top_k (3) must not exceed n_experts (2)", 11),
    "top_k 0": (exp(MOE % (4, 0) + MEASURE), "model.feedforward: top_k must be at least 1", 11),
    "no experts": (exp(MOE % (0, 1) + MEASURE), "model.feedforward: n_experts must be at least 1", 11),
    "grid value": (exp("  feedforward: {kind: moe, n_experts: 4, top_k: 2}\n"
                       "grid:\n  feedforward.top_k: [2, 5]\n" + MEASURE),
                   "grid.feedforward.top_k[1]: top_k (5) must not exceed n_experts (4)", 13),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_moe_sizes_exit_2_located_and_nothing_stored(case, tmp_path):
    text, expected, line_no = CASES[case]
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    line = next(x for x in result.output.splitlines() if expected in x)
    where = re.match(rf"{re.escape(str(path))}:(\d+):(\d+): ", line)
    assert where, line
    assert int(where.group(1)) == line_no  # the feedforward line, or the grid axis's
    assert not out.exists()  # nothing computed, not even an empty store


def test_a_mixtral_like_experiment_validates(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(exp("  feedforward: {kind: moe, n_experts: 8, top_k: 2, aux_loss_coef: 0.02,"
                        " expert: {kind: glu, hidden_dim: 56}}\n" + MEASURE))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


@pytest.mark.slow  # a subprocess, a real pool or a browser: end to end
def test_moe_run_reports_active_params_and_expert_load(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text(exp(
        "  feedforward: {kind: moe, n_experts: 4, top_k: 1, expert: {hidden_dim: 16},"
        " capacity_factor: 1.0}\n"
        "measure:\n  params: {}\n"
        "  training: {steps: 3, batch_size: 2, seq_len: 8, device: cpu, eval_batches: 1}\n"
        "  dynamics: {steps: 3, batch_size: 2, seq_len: 8, every: 1, device: cpu}\n"))
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = (out / "demo" / "report" / "report.md").read_text()
    assert "| active per token | active non-embedding |" in report
    assert "### Expert load per layer over training" in report
    assert "### Routing balance over training" in report
    assert "final load imbalance" in report and "final dropped share" in report
    html = (out / "demo" / "report" / "report.html").read_text()
    assert "dropped assignments (share)" in html  # the capacity panel, inline SVG text
