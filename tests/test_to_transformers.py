"""to_transformers: every supported class round-trips (from_transformers, then back) to
equal logits and weights; natively built variants export with equal logits; what HF cannot
hold is refused, naming the spec path."""

import warnings

import pytest
import torch
from conftest import left_padded_diff, n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab import from_transformers, to_transformers  # noqa: E402
from variantlab.hf import ConversionError, ExportWarning, choose_class  # noqa: E402

REG = vl.get_registry()
BASE = dict(hidden_size=32, num_attention_heads=4, intermediate_size=48, num_hidden_layers=2,
            vocab_size=64, max_position_embeddings=32)
GEMMA = dict(BASE, num_key_value_heads=2, head_dim=16, num_hidden_layers=5,
             max_position_embeddings=64, sliding_window=4, query_pre_attn_scalar=24)
GPT2 = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=32, bos_token_id=0,
            eos_token_id=0)
CASES = {
    "gpt2-tied": ("GPT2LMHeadModel", "GPT2Config", dict(GPT2)),
    "gpt2-untied-relu": ("GPT2LMHeadModel", "GPT2Config", dict(
        GPT2, tie_word_embeddings=False, activation_function="relu", n_inner=48)),
    "neox-parallel-partial": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        BASE, rotary_pct=0.25, use_parallel_residual=True)),
    "neox-sequential-nobias-tied": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        BASE, use_parallel_residual=False, attention_bias=False, tie_word_embeddings=True,
        rotary_pct=0.5, rotary_emb_base=500.0)),
    "neox-odd-rotary-head12": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        BASE, hidden_size=48, rotary_pct=0.25, use_parallel_residual=True)),
    "llama-gqa-biases": ("LlamaForCausalLM", "LlamaConfig", dict(
        BASE, num_key_value_heads=2, attention_bias=True, mlp_bias=True,
        hidden_act="gelu_pytorch_tanh", tie_word_embeddings=False, rope_theta=500000.0)),
    "llama-mqa-headdim-tied": ("LlamaForCausalLM", "LlamaConfig", dict(
        BASE, num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)),
    "mistral-window-gqa": ("MistralForCausalLM", "MistralConfig", dict(
        BASE, num_key_value_heads=2, sliding_window=4, tie_word_embeddings=False)),
    "qwen3-gqa-headdim-bias": ("Qwen3ForCausalLM", "Qwen3Config", dict(
        BASE, num_key_value_heads=2, head_dim=16, attention_bias=True,
        tie_word_embeddings=False)),
    "olmo2-gqa-bias": ("Olmo2ForCausalLM", "Olmo2Config", dict(
        BASE, num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False)),
    "gemma2-caps": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        GEMMA, attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "gemma3-local-base": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        GEMMA, sliding_window_pattern=3, rope_theta=50_000.0, rope_local_base_freq=100.0,
        final_logit_softcapping=5.0)),
}


def hf_model(case):
    cls, config_cls, kwargs = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs, attn_implementation="eager")
    return perturbed(getattr(transformers, cls)(config))


def max_diff(a, b, idx, **kw):
    with torch.no_grad():
        return (a(idx, **kw).logits - b(idx, **kw).logits).abs().max().item()


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_gives_the_same_class_weights_and_logits(case):
    hf = hf_model(case)
    spec, model = from_transformers(hf, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # an imported model needs no zeros
        back = to_transformers(spec, model)
    assert type(back).__name__ == CASES[case][0] == choose_class(spec)
    assert n_params(back) == n_params(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(theirs) == set(ours)
    for key, value in theirs.items():  # Gemma's norms pass through 1 + w and back
        assert torch.allclose(ours[key], value, atol=1e-6), key
    idx = torch.randint(0, 64, (2, 12))  # longer than Gemma's window: sliding layers differ
    assert max_diff(hf, back, idx) < 1e-4
    assert left_padded_diff(hf, back, 12) < 1e-4


TINY = dict(family="gpt", vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=3,
            drop_rate=0.0)
NATIVE = {
    "gpt-default": ("GPT2LMHeadModel", {}),
    "gpt-exact-gelu-tied": ("GPT2LMHeadModel", dict(
        activation={"kind": "gelu", "approximate": "none"}, tie_weights=True, qkv_bias=True,
        feedforward={"kind": "mlp", "hidden_mult": 2})),
    "neox-shared-parallel": ("GPTNeoXForCausalLM", dict(
        positional={"kind": "rotary", "fraction": 0.5}, residual={"kind": "parallel"})),
    "llama": ("LlamaForCausalLM", dict(
        norm={"kind": "rms", "eps": 1e-6}, positional={"kind": "rotary", "theta": 500.0},
        feedforward={"kind": "glu"}, activation="silu", attn_out_bias=False,
        attention={"kind": "mha", "n_kv_heads": 2})),
    "mistral": ("MistralForCausalLM", dict(
        norm="rms", positional="rotary", feedforward="glu", activation="silu",
        attn_out_bias=False, attention={"kind": "mha", "n_kv_heads": 2, "window": 3})),
    "qwen3": ("Qwen3ForCausalLM", dict(
        norm="rms", positional="rotary", feedforward="glu", activation="silu",
        qkv_bias=True, attention={"kind": "mha", "qk_norm": {"kind": "rms"}, "head_dim": 12})),
    "olmo2": ("Olmo2ForCausalLM", dict(
        norm="rms", positional="rotary", feedforward="glu", activation="relu2",
        attn_out_bias=False, residual="post_sublayer",
        attention={"kind": "mha", "qk_norm": {"kind": "rms"}, "qk_norm_scope": "projection"})),
    "gemma-layout": ("Gemma2ForCausalLM", dict(
        norm="rms", positional="rotary", feedforward="glu", activation="gelu",
        attn_out_bias=False, residual="sandwich", scale_embeddings=True,
        attention={"kind": "mha", "scale": 0.25, "softcap": 3.0}, logit_softcap=4.0,
        layout={"kinds": {"local": {"attention": {"kind": "mha", "scale": 0.25, "softcap": 3.0,
                                                  "window": 3}}, "global": {}},
                "pattern": ["local", "global"]})),
}


@pytest.mark.parametrize("case", list(NATIVE))
def test_a_spec_built_in_variantlab_exports_with_equal_logits(case):
    cls, extra = NATIVE[case]
    spec = vl.parse_model_spec({**TINY, **extra}, REG)
    torch.manual_seed(0)
    model = perturbed(vl.build_model(spec, REG), seed=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hf = to_transformers(spec, model)
    assert type(hf).__name__ == cls
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-4
    said = [str(w.message) for w in caught if issubclass(w.category, ExportWarning)]
    if case == "gpt-default":  # no q/k/v biases in the variant: exported as zeros
        assert any("q/k/v biases" in s for s in said)
        assert n_params(hf) == n_params(model) + 3 * 32 * 3
    if case == "neox-shared-parallel":
        assert any("two equal norms" in s for s in said)
    if case in ("llama", "mistral"):
        assert not said and n_params(hf) == n_params(model)


REFUSED = {
    "batch norm": (dict(norm="batch"), "norm.kind", "'batch'"),
    "post_norm": (dict(residual="post_norm"), "residual.kind", "'post_norm'"),
    "sinusoidal": (dict(positional="sinusoidal"), "positional.kind", "'sinusoidal'"),
    "no final norm": (dict(final_norm=False), "final_norm", "final norm"),
    "arcee mlp window": (dict(norm="rms", positional="rotary", attention={
        "kind": "mha", "window": 4}), "attention.window", "ArceeForCausalLM"),
    "glu bias in qwen3": (dict(norm="rms", positional="rotary", feedforward={
        "kind": "glu", "bias": True}, attention={"kind": "mha", "qk_norm": "rms"}),
        "feedforward.bias", "Qwen3ForCausalLM"),
    "gpt2 window": (dict(attention={"kind": "mha", "window": 4}), "attention.window",
                    "Gemma"),
    "mistral biases": (dict(norm="rms", positional="rotary", feedforward="glu", qkv_bias=True,
                            attention={"kind": "mha", "window": 4}), "qkv_bias",
                       "MistralForCausalLM"),
    "odd neox rotary": (dict(positional={"kind": "rotary", "fraction": 0.4}),
                        "positional.fraction", "odd"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_transformers_cannot_hold_is_refused_by_name(case):
    extra, loc, words = REFUSED[case]
    spec = vl.parse_model_spec({**TINY, **extra}, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", vl.VariantWarning)  # batch norm in a causal model
        model = vl.build_model(spec, REG)
    with pytest.raises(ConversionError) as info:
        to_transformers(spec, model)
    (issue,) = info.value.issues
    assert ".".join(map(str, issue.loc)) == loc
    assert words in issue.message and "exporting to" in issue.message


def test_an_encoder_is_refused():
    spec = vl.parse_model_spec({**TINY, "family": "encoder"}, REG)
    with pytest.raises(ConversionError, match="family 'encoder'"):
        to_transformers(spec, vl.build_model(spec, REG))


# -- variantlab export RUN --variant NAME --to DIR ---------------------------------------------
def test_cli_export_loads_with_automodel_and_gives_the_variants_logits(tmp_path):
    import json

    from conftest import invoke, store_of

    from variantlab.testing.sample import sample_run

    run = store_of(sample_run(seeds=(3, 4), fail=None, diverge=None), tmp_path / "sample")
    out = tmp_path / "hf"
    result = invoke("export", run, "--variant", "pre_norm", "--to", out, "--seed", 4)
    assert result.exit_code == 0, result.output
    assert "GPT2LMHeadModel" in result.output and "seed 4" in result.output
    loaded = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert type(loaded).__name__ == "GPT2LMHeadModel"
    spec = vl.parse_model_spec(json.loads((out / "variantlab.json").read_text())["spec"], REG)
    torch.manual_seed(4)  # the initialisation every probe of the run built
    model = vl.build_model(spec, REG).eval()
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - loaded(idx).logits).abs().max().item() < 1e-4
    again = invoke("export", run, "--variant", "pre_norm", "--to", tmp_path / "hf2")
    assert again.exit_code == 0 and "seed 3" in again.output  # default: the first seed


def test_cli_export_refuses_by_name_with_exit_2(tmp_path):
    from conftest import invoke, store_of

    from variantlab.testing.sample import sample_run

    run = store_of(sample_run(fail=None, diverge=None), tmp_path / "sample")
    result = invoke("export", run, "--variant", "post_norm", "--to", tmp_path / "hf")
    assert result.exit_code == 2
    assert "residual.kind" in result.output and "'post_norm'" in result.output
    assert not (tmp_path / "hf").exists()
    result = invoke("export", run, "--variant", "nope", "--to", tmp_path / "hf")
    assert result.exit_code == 2 and "pre_norm, post_norm, batch" in result.output
