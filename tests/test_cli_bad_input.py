"""Issue 3, "What it must show" 3, through the command: every kind of bad input is a
``FILE:LINE:COL: key.path: message`` on stderr, exit 2, no traceback, and nothing computed
(no results store is created)."""

import re

import pytest
from click.testing import CliRunner
from conftest import exp

from variantlab.cli.main import main

MEASURE = "measure:\n  params: {}\n  gradients: {batch_size: 2, seq_len: 8, batches: 1}\n"
CASES = {
    "yaml syntax": ("name: demo\nmodel: {family: gpt\n", "YAML syntax error"),
    "duplicate key": (exp("measure:\n  params: {}\n  params: {}\n"), "duplicate key 'params'"),
    "wrong type": (exp(MEASURE).replace("n_layers: 2", "n_layers: two"),
                   "model.n_layers: Input should be a valid integer"),
    "unknown key": (exp(MEASURE).replace("n_heads: 4", "n_head: 4"),
                    "did you mean 'n_heads'?"),
    "unknown kind": (exp(MEASURE).replace("kind: gelu", "kind: gelu2"),
                     "did you mean 'gelu'?"),
    "python tag": (exp("description: !!python/object/apply:os.system ['echo pwned']\n" + MEASURE),
                   "tag !!python/object/apply:os.system"),
    "grid path": (exp("grid:\n  nrom.kind: [layer, rms]\n" + MEASURE),
                  "did you mean 'norm.kind'?"),
    "seq_len": (exp("measure:\n  gradients: {batch_size: 2, seq_len: 48, batches: 1}\n"),
                "seq_len is above context_length=32"),
    "resources of a probe not run": (exp(MEASURE + "resources:\n  timing: {num_cpus: 2}\n"),
                                     "resources.timing: no probe 'timing' runs"),
    "resources zero cpus": (exp(MEASURE + "resources:\n  params: {num_cpus: 0}\n"),
                            "resources.params.num_cpus:"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_is_located_exit_2_and_nothing_runs(case, tmp_path):
    text, expected = CASES[case]
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "pwned" not in result.output
    line = next(x for x in result.output.splitlines() if expected in x)
    assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line), line
    assert not out.exists()  # nothing computed, not even an empty store
