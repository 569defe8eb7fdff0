"""Issue 10, items 5 and 6: hostile input through `variantlab run`. Every case ends before
anything is computed: exit 2, a message naming the file (with LINE:COL where the input has a
place), no traceback, and no run folder or store."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from variantlab.cli.main import main

MODEL = ("model: {family: gpt, vocab_size: 64, context_length: 32, emb_dim: 32, n_heads: 4, "
         "n_layers: 2, drop_rate: 0.0}\n")
GRAD = "measure:\n  gradients: {batch_size: 2, seq_len: 8, batches: 1}\n"
TRAIN = "measure:\n  training: {steps: 2, batch_size: 2, seq_len: 8}\n"


def doc(*parts: str, name: str = "demo", model: str = MODEL) -> str:
    return f"name: {name}\n" + model + "".join(parts)


def model_with(**kv: object) -> str:
    return MODEL.replace("drop_rate: 0.0}", "drop_rate: 0.0, " + ", ".join(
        f"{k}: {v}" for k, v in kv.items()) + "}") if kv else MODEL


def swap(key: str, value: str) -> str:
    """MODEL with ``key: VALUE`` written instead of the tiny model's."""
    return re.sub(rf"{key}: [^,}}]+", f"{key}: {value}", MODEL)


@dataclass
class Case:
    text: str | bytes
    expected: str
    located: bool = True  # the message has LINE:COL
    args: tuple[str, ...] = ()
    files: dict[str, str | bytes] = field(default_factory=dict)
    skip: Callable[[], bool] = lambda: False


NO_CUDA = torch.cuda.is_available
DEEP_FLOW = "description: " + "[" * 60 + "]" * 60 + "\n"
DEEP_BLOCK = "extra:\n" + "".join("  " * i + f"k{i}:\n" for i in range(1, 60)) + "  " * 60 + "v\n"
BOMB = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
    for p, c in zip("abcde", "bcdef"))

CASES: dict[str, Case] = {
    # -- YAML: syntax, tags, characters, depth, size, aliases ---------------------------------
    "unclosed flow": Case("name: demo\nmodel: {family: gpt\n", "YAML syntax error"),
    "tab indent": Case(doc("measure:\n\tparams: {}\n"), "YAML syntax error"),
    "bad indent": Case(doc("measure:\n  params: {}\n gradients: {}\n"), "YAML syntax error"),
    "duplicate key": Case(doc("measure:\n  params: {}\n  params: {}\n"), "duplicate key 'params'"),
    "python tag": Case(doc("description: !!python/object/apply:os.system ['echo pwned']\n", GRAD),
                       "tag !!python/object/apply:os.system"),
    "custom tag": Case(doc("description: !custom x\n", GRAD), "tag !custom is not allowed"),
    "binary tag": Case(doc("description: !!binary aGVsbG8=\n", GRAD), "tag !!binary"),
    "set tag": Case(doc("seeds: !!set {1: null}\n", GRAD), "tag !!set"),
    "NUL": Case(doc("description: a\x00b\n", GRAD), "control character U+0000"),
    "ESC": Case(doc("description: \x1b[31mred\n", GRAD), "control character U+001B"),
    "DEL": Case(doc("description: a\x7fb\n", GRAD), "control character U+007F"),
    "C1": Case(doc("description: a\x90b\n", GRAD), "control character U+0090"),
    "deep flow": Case(doc(DEEP_FLOW, GRAD), "nested more than 50 levels"),
    "deep block": Case(doc(DEEP_BLOCK), "nested more than 50 levels"),
    "very deep": Case(doc("description: " + "[" * 100_000 + "\n"), "nested more than 50"),
    "too large": Case(doc("description: '" + "x" * (1 << 20) + "'\n"),
                      "too large for an experiment file (limit 1 MiB", located=False),
    "alias bomb": Case(doc(BOMB), "expands to more than", located=False),
    "recursive alias": Case(doc("description: &a [*a]\n"), "refers to its own ancestor"),
    "empty file": Case("", "expected a mapping"),
    "top-level list": Case("- name: demo\n", "expected a mapping"),
    "not UTF-8": Case(b"name: d\xe9mo\n" + MODEL.encode(), "not UTF-8", located=False),
    "merge non-mapping": Case(doc("description: {<<: [1]}\n"), "'<<' merges mappings only"),
    "mapping key": Case(doc("? [a]\n: 1\n"), "keys must be plain strings"),
    # -- types: nothing is coerced ----------------------------------------------------------
    "int from bool": Case(doc(GRAD, model=swap("n_layers", "true")), "got true (a boolean)"),
    "int from string": Case(doc(GRAD, model=swap("n_layers", '"16"')), "got '16' (a string)"),
    "int from float": Case(doc(GRAD, model=swap("n_layers", "2.0")), "got 2.0 (a number)"),
    "int from fraction": Case(doc(GRAD, model=swap("emb_dim", "32.5")), "valid integer"),
    "float from string": Case(doc(TRAIN.replace("steps: 2", 'steps: 2, lr: "1e-3"')),
                              "got '1e-3' (a string)"),
    "float from bool": Case(doc(GRAD, model=swap("drop_rate", "true")), "valid number"),
    "bool from string": Case(doc(GRAD, model=model_with(qkv_bias='"yes"')), "valid boolean"),
    "bool from int": Case(doc(GRAD, model=model_with(qkv_bias=1)), "valid boolean"),
    "seed from bool": Case(doc("seeds: [true]\n", GRAD), "got true (a boolean)"),
    "seed from string": Case(doc('seeds: ["1"]\n', GRAD), "got '1' (a string)"),
    "batch from string": Case(doc(GRAD.replace("batch_size: 2", 'batch_size: "2"')),
                              "measure.gradients.batch_size: Input should be a valid integer"),
    "name from int": Case(doc(GRAD, name="123"), "name: Input should be a valid string"),
    "grid value string": Case(doc('grid:\n  n_layers: [1, "16"]\n', GRAD), "grid.n_layers[1]"),
    "set value string": Case(doc('variants:\n  - {name: v, set: {n_heads: "4"}}\n', GRAD),
                             "variants[0].set.n_heads"),
    "component string": Case(doc(GRAD, model=model_with(norm='{kind: layer, eps: "1e-5"}')),
                             "model.norm.eps: Input should be a valid number"),
    "literal": Case(doc(GRAD, model=model_with(activation="{kind: gelu, approximate: true}")),
                    "model.activation.approximate"),
    "model list": Case("name: demo\nmodel: [1, 2]\n" + GRAD, "model"),
    # -- numbers that are not finite --------------------------------------------------------
    "lr inf": Case(doc(TRAIN.replace("steps: 2", "steps: 2, lr: .inf")), "inf is not a finite"),
    "drop_rate nan": Case(doc(GRAD, model=swap("drop_rate", ".nan")), "nan is not a finite"),
    "component inf": Case(doc(GRAD, model=model_with(norm="{kind: layer, eps: .inf}")),
                          "model.norm.eps: inf is not a finite"),
    "grid nan": Case(doc("grid:\n  drop_rate: [0.0, .nan]\n", GRAD),
                     "grid.drop_rate[1]: nan is not a finite"),
    "peak_flops -inf": Case(doc("measure:\n  timing: {batch_size: 1, seq_len: 8, "
                                "peak_flops: -.inf}\n"), "-inf is not a finite"),
    "overflow": Case(doc(TRAIN.replace("steps: 2", "steps: 2, lr: 1e999")), "not a finite"),
    "set inf": Case(doc("variants:\n  - {name: v, set: {norm.eps: .inf}}\n", GRAD),
                    "variants[0].set.norm.eps: inf is not a finite"),
    # -- sizes ------------------------------------------------------------------------------
    "vocab 1e9": Case(doc(TRAIN, model=swap("vocab_size", "1000000000")),
                      "the largest vocab_size that fits is"),
    "n_layers 1e6": Case(doc(TRAIN, model=swap("n_layers", "1000000")),
                         "the largest n_layers that fits is"),
    "batch 1e8": Case(doc(TRAIN.replace("batch_size: 2", "batch_size: 100000000")),
                      "the largest batch_size that fits is"),
    "grid 200000": Case(doc("grid:\n  seq_a: [" + ",".join(map(str, range(20))) + "]\n"
                            "  seq_b: [" + ",".join(map(str, range(100))) + "]\n"
                            "  seq_c: [" + ",".join(map(str, range(100))) + "]\n", GRAD),
                        "200,000 variants"),
    "grid over --max-variants": Case(doc("grid:\n  n_layers: [1, 2, 3, 4]\n", GRAD),
                                     "4 variants (4 (n_layers)) is more than the limit of 3",
                                     args=("--max-variants", "3")),
    "seq_len above context": Case(doc(GRAD.replace("seq_len: 8", "seq_len: 48")),
                                  "seq_len is above context_length=32"),
    # -- names ------------------------------------------------------------------------------
    "name too long": Case(doc(GRAD, name="x" * 101), "101 characters long"),
    "name with slash": Case(doc(GRAD, name="a/b"), "cannot name a results folder"),
    "name dot-dot": Case(doc(GRAD, name="'..'"), "cannot name a results folder"),
    "name empty": Case(doc(GRAD, name="''"), "cannot name a results folder"),
    "name unicode": Case(doc(GRAD, name="préactivé"), "cannot name a results folder"),
    "variant twice": Case(doc("variants:\n  - {name: v, set: {n_layers: 1}}\n"
                              "  - {name: v, set: {n_layers: 3}}\n", GRAD), "used twice"),
    "baseline unknown": Case(doc("baseline: bsae\n", GRAD), "names no variant"),
    # -- seeds ------------------------------------------------------------------------------
    "duplicate seed": Case(doc("seeds: [0, 1, 0]\n", GRAD), "seeds[2]: seed 0 is listed twice"),
    "seed 2**63": Case(doc(f"seeds: [{2**63}]\n", GRAD), "outside the range"),
    "seed below": Case(doc(f"seeds: [{-2**63 - 1}]\n", GRAD), "outside the range"),
    "no seeds": Case(doc("seeds: []\n", GRAD), "seeds: List should have at least 1 item"),
    # -- data -------------------------------------------------------------------------------
    "path matches nothing": Case(doc("data: {source: text, path: 'nothing/*.txt'}\n", GRAD),
                                 "data.path: 'nothing/*.txt': no file matches"),
    "path is a folder": Case(doc("data: {source: text, path: corpus}\n", GRAD), "is a folder",
                             files={"corpus/a.txt": "hello " * 100}),
    "corpus too short": Case(doc("data: {source: text, path: tiny.txt}\n", GRAD),
                             "fewer than one batch of measure.gradients needs",
                             files={"tiny.txt": "hi"}),
    "recall vocab 3": Case(doc("data: {source: synthetic, task: recall}\n", GRAD,
                               model=swap("vocab_size", "3")), "recall task needs vocab_size"),
    "unknown source": Case(doc("data: {source: web}\n", GRAD), "data"),
    "text without path": Case(doc("data: {source: text}\n", GRAD), "path"),
    # -- devices ----------------------------------------------------------------------------
    "--device cuda": Case(doc(GRAD), "sees no CUDA device", located=False,
                          args=("--device", "cuda"), skip=NO_CUDA),
    "--device tpu": Case(doc(GRAD), "'tpu' is not a device", located=False,
                         args=("--device", "tpu")),
    "device cuda": Case(doc("measure:\n  timing: {batch_size: 1, seq_len: 8, device: cuda}\n"),
                        "measure.timing.device: device 'cuda'", skip=NO_CUDA),
    "device cuda:7": Case(doc("measure:\n  training: {steps: 1, batch_size: 1, seq_len: 8, "
                              "device: 'cuda:7'}\n"), "device 'cuda:7'",
                          skip=lambda: torch.cuda.device_count() > 7),
    "device mps": Case(doc("measure:\n  timing: {batch_size: 1, seq_len: 8, device: mps}\n"),
                       "MPS is not available", skip=torch.backends.mps.is_available),
    "device tpu": Case(doc("measure:\n  timing: {batch_size: 1, seq_len: 8, device: tpu}\n"),
                       "measure.timing.device"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_input_is_refused_before_compute(name: str, tmp_path: Path) -> None:
    case = CASES[name]
    if case.skip():
        pytest.skip("this machine has the device")
    for rel, content in case.files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        getattr(tmp_path / rel, "write_bytes" if isinstance(content, bytes) else "write_text")(
            content)
    path = tmp_path / "exp.yaml"
    if isinstance(case.text, bytes):
        path.write_bytes(case.text)
    else:
        path.write_text(case.text, encoding="utf-8")
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out), *case.args])
    text = result.output
    assert result.exit_code == 2, text
    assert "Traceback" not in text and "pwned" not in text, text
    line = next((x for x in text.splitlines() if case.expected in x), None)
    assert line is not None, text
    if case.located:
        assert re.match(rf"{re.escape(str(path))}:\d+:\d+: ", line), line
    elif not line.startswith("--device"):
        assert line.startswith(str(path)), line
    assert not out.exists()  # nothing computed, not even an empty store


def test_there_are_enough_cases() -> None:
    assert len(CASES) >= 55
