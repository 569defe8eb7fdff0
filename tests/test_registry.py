"""The registry: built-ins through the same hooks, every slot populated, no import side effects."""

import subprocess
import sys

import variantlab as vl
from variantlab.plugin.registry import ALL_SLOTS, BUILTIN_MODULES

EXPECTED = {
    "norm": {"layer", "batch", "rms", "dyt", "none"},
    "activation": {"gelu", "relu", "silu", "relu2"},
    "feedforward": {"mlp", "glu"},
    "attention": {"mha"},
    "residual": {"pre_norm", "post_norm", "sandwich", "post_sublayer", "deepnorm", "rezero",
                 "parallel"},
    "positional": {"learned", "sinusoidal", "none"},
    "init": {"default", "xavier", "normal", "deepnorm"},
    "family": {"block", "gpt", "encoder", "decoder", "encoder_decoder", "mlp"},
}


def test_builtins_cover_every_slot():
    reg = vl.build_registry(entry_points=False)
    for slot in ALL_SLOTS:
        assert EXPECTED[slot] <= set(reg.kinds(slot)), slot
    sources = dict(reg.plugins)
    assert [n for n, s in reg.plugins if s == "builtin"] == [
        f"variantlab_plugins.{m}" for m in BUILTIN_MODULES
    ]
    assert reg.get("norm", "layer").plugin == "variantlab_plugins.norms"
    assert sources["variantlab_plugins.families"] == "builtin"


def test_builtins_are_registered_through_pluggy_hooks():
    reg = vl.build_registry(entry_points=False)
    impls = reg.pm.hook.register_norms.get_hookimpls()
    assert [i.plugin_name for i in impls] == ["variantlab_plugins.norms"]


def run_python(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True)


def test_import_has_no_side_effects(tmp_path):
    code = (
        "import sys, variantlab, variantlab.plugin.registry as r; "
        "assert r._DEFAULT is None; "
        "assert 'variantlab_plugins.norms' not in sys.modules; print('ok')"
    )
    result = run_python(code, tmp_path)
    assert result.stdout.strip() == "ok", result.stderr


def test_builtins_are_not_a_bare_plugins_module(tmp_path):
    result = run_python("import plugins", tmp_path)
    assert "ModuleNotFoundError" in result.stderr
    assert run_python("import variantlab_plugins.norms", tmp_path).returncode == 0
