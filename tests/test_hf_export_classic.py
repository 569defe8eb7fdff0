"""Export of the GPT-2-era and state-space families, Mamba-2 among them (issue 41.2): a perturbed transformers
model of each imported and exported again gives the same class, equal parameter counts,
equal weights and logits within 1e-5 (left padding too where transformers supports it); a
spec built in variantlab exports to the class its components name, logits equal; what a
class cannot hold is refused by its spec path."""

import warnings

import pytest
import torch
from conftest import left_padded_diff, n_params, perturbed

transformers = pytest.importorskip("transformers")

import variantlab as vl  # noqa: E402
from variantlab.hf import ConversionError, ExportWarning, choose_class  # noqa: E402

REG = vl.get_registry()
TOKENS = dict(bos_token_id=1, eos_token_id=2)
FALCON = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
              max_position_embeddings=64, ffn_hidden_size=48, **TOKENS)
GPTJ = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=64, rotary_dim=4,
            **TOKENS)
OPT = dict(hidden_size=32, num_attention_heads=4, num_hidden_layers=2, vocab_size=64,
           max_position_embeddings=64, ffn_dim=48, word_embed_proj_dim=32, pad_token_id=0,
           **TOKENS)
BIGCODE = dict(n_embd=32, n_head=4, n_layer=2, vocab_size=64, n_positions=64, **TOKENS)
MAMBA = dict(hidden_size=32, state_size=8, num_hidden_layers=2, vocab_size=64, pad_token_id=0,
             **TOKENS)
BAMBA = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=4,
             vocab_size=64, max_position_embeddings=64, intermediate_size=48,
             attn_layer_indices=[1], mamba_n_heads=8, mamba_d_state=8, mamba_n_groups=2,
             mamba_chunk_size=4)
#: case -> (class, config class, config, transformers runs left padding right)
CASES = {
    "falcon-multi-query": ("FalconForCausalLM", "FalconConfig", FALCON, True),
    "falcon-per-head-biased": ("FalconForCausalLM", "FalconConfig", dict(
        FALCON, multi_query=False, bias=True, tie_word_embeddings=False), True),
    "falcon-new-two-norms": ("FalconForCausalLM", "FalconConfig", dict(
        FALCON, new_decoder_architecture=True, num_kv_heads=2), True),
    "falcon-new-one-norm": ("FalconForCausalLM", "FalconConfig", dict(
        FALCON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1),
        True),
    "falcon-sequential": ("FalconForCausalLM", "FalconConfig", dict(
        FALCON, parallel_attn=False, bias=True), True),
    "gptj": ("GPTJForCausalLM", "GPTJConfig", GPTJ, True),
    "gptj-whole-head-tied": ("GPTJForCausalLM", "GPTJConfig", dict(
        GPTJ, rotary_dim=8, tie_word_embeddings=True), True),
    "opt-pre-norm": ("OPTForCausalLM", "OPTConfig", OPT, True),
    "opt-post-norm": ("OPTForCausalLM", "OPTConfig", dict(
        OPT, do_layer_norm_before=False, enable_bias=False, tie_word_embeddings=False), True),
    "opt-350m-projected": ("OPTForCausalLM", "OPTConfig", dict(
        OPT, do_layer_norm_before=False, word_embed_proj_dim=16), True),
    "bloom": ("BloomForCausalLM", "BloomConfig", dict(
        hidden_size=48, n_head=6, n_layer=2, vocab_size=64), True),
    "mpt": ("MptForCausalLM", "MptConfig", dict(
        d_model=48, n_heads=6, n_layers=2, vocab_size=64, max_seq_len=64,
        attn_config={"softmax_scale": 0.3}, tie_word_embeddings=False), True),
    "bigcode-multi-query": ("GPTBigCodeForCausalLM", "GPTBigCodeConfig", BIGCODE, True),
    "mamba": ("MambaForCausalLM", "MambaConfig", MAMBA, True),
    "mamba-biased": ("MambaForCausalLM", "MambaConfig", dict(
        MAMBA, use_bias=True, use_conv_bias=False, time_step_rank=5,
        tie_word_embeddings=False), False),
    "mamba2": ("Mamba2ForCausalLM", "Mamba2Config", dict(
        hidden_size=32, state_size=8, num_heads=8, head_dim=8, n_groups=2, conv_kernel=4,
        chunk_size=4, num_hidden_layers=2, vocab_size=64), True),
    "mamba2-tied-bias": ("Mamba2ForCausalLM", "Mamba2Config", dict(
        hidden_size=32, state_size=4, num_heads=4, head_dim=16, n_groups=1, chunk_size=8,
        num_hidden_layers=2, vocab_size=64, tie_word_embeddings=True, use_bias=True), False),
    "bamba": ("BambaForCausalLM", "BambaConfig", BAMBA, True),
    "bamba-biased-tied": ("BambaForCausalLM", "BambaConfig", dict(
        BAMBA, num_key_value_heads=4, num_hidden_layers=3, attn_layer_indices=[0, 2],
        attention_bias=True, mlp_bias=True, tie_word_embeddings=True, mamba_proj_bias=True),
        False),
}


def hf_model(case):
    cls, config_cls, kwargs, _ = CASES[case]
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(**kwargs, attn_implementation="eager")
    return perturbed(getattr(transformers, cls)(config))


@pytest.mark.parametrize("case", list(CASES))
def test_round_trip_gives_the_same_class_weights_and_logits(case):
    hf = hf_model(case)
    spec, model = vl.from_transformers(hf, REG)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # an imported model needs no zeros
        back = vl.to_transformers(spec, model)
    assert type(back).__name__ == CASES[case][0] == choose_class(spec)
    assert n_params(back) == n_params(hf)
    theirs, ours = hf.state_dict(), back.state_dict()
    assert set(theirs) == set(ours)
    for key, value in theirs.items():
        assert torch.equal(ours[key], value), key
    back.config._attn_implementation = "eager"  # BLOOM and MPT have no other
    idx = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        assert (back(idx).logits - hf(idx).logits).abs().max().item() < 1e-5
        assert (model.eval()(idx) - back(idx).logits).abs().max().item() < 1e-5
    if CASES[case][3]:
        assert left_padded_diff(hf, back, 12) < 1e-5
        assert left_padded_diff(hf, model, 12) < 1e-5


TINY = dict(family="gpt", vocab_size=64, context_length=32, emb_dim=32, n_heads=4, n_layers=2,
            drop_rate=0.0)
ROTARY_LN = dict(positional="rotary", residual={"kind": "parallel"})
NATIVE = {
    "falcon-gqa-pre-norm": ("FalconForCausalLM", dict(
        positional="rotary", attention={"kind": "mha", "n_kv_heads": 1}, ffn_bias=False)),
    "falcon-shared-parallel": ("FalconForCausalLM", ROTARY_LN),
    "gptj-head-bias": ("GPTJForCausalLM", dict(
        ROTARY_LN, head_bias=True, positional={"kind": "rotary", "fraction": 0.25},
        attn_out_bias=False)),
    "opt-offset": ("OPTForCausalLM", dict(positional={"kind": "learned", "offset": 2})),
    "bloom-embedding-norm": ("BloomForCausalLM", dict(positional="alibi", embedding_norm=True)),
    "mpt-alibi": ("MptForCausalLM", dict(
        positional="alibi", norm_bias=False, attn_out_bias=False, ffn_bias=False,
        activation={"kind": "gelu", "approximate": "none"})),
    "bigcode-multi-query": ("GPTBigCodeForCausalLM", dict(
        attention={"kind": "mha", "n_kv_heads": 1}, qkv_bias=True)),
    "mamba": ("MambaForCausalLM", dict(
        norm="rms", positional="none", feedforward="none",
        attention={"kind": "mamba", "d_state": 4, "conv_width": 3})),
    "mamba2": ("Mamba2ForCausalLM", dict(
        norm="rms", positional="none", feedforward="none",
        attention={"kind": "mamba2", "d_state": 4, "head_dim": 16, "n_groups": 2,
                   "chunk_size": 4})),
    "bamba": ("BambaForCausalLM", dict(
        norm="rms", positional={"kind": "rotary", "fraction": 0.5}, feedforward="glu",
        activation="silu", attn_out_bias=False, n_layers=3,
        layout={"kinds": {"ssm": {"attention": {"kind": "mamba2", "d_state": 4, "head_dim": 8,
                                                "chunk_size": 4}}, "att": {}},
                "pattern": ["ssm", "att", "ssm"]})),
}


@pytest.mark.parametrize("case", list(NATIVE))
def test_a_spec_built_in_variantlab_exports_with_equal_logits(case):
    cls, extra = NATIVE[case]
    spec = vl.parse_model_spec({**TINY, **extra}, REG)
    torch.manual_seed(0)
    model = perturbed(vl.build_model(spec, REG), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExportWarning)  # biases the variant lacks: zeros
        hf = vl.to_transformers(spec, model)
    assert type(hf).__name__ == cls
    hf.config._attn_implementation = "eager"
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-5


def test_a_bias_the_class_has_and_the_variant_lacks_is_zeros_with_a_warning():
    spec = vl.parse_model_spec({**TINY, **NATIVE["falcon-gqa-pre-norm"][1]}, REG)
    model = vl.build_model(spec, REG)
    with pytest.warns(ExportWarning, match="feed-forward biases"):
        hf = vl.to_transformers(spec, model)
    assert hf.config.bias and not hf.transformer.h[0].mlp.dense_h_to_4h.bias.any()


#: specs next to a GPT-2-era class that another family holds: extra spec data, the class
HANDED_ON = {
    "gpt-j with attention biases is phi": (dict(NATIVE["gptj-head-bias"][1], qkv_bias=True,
                                                attn_out_bias=True), "PhiForCausalLM"),
    "sequential groups are starcoder2": (dict(positional="rotary", qkv_bias=True, attention={
        "kind": "mha", "n_kv_heads": 2}), "Starcoder2ForCausalLM"),
}


@pytest.mark.parametrize("case", list(HANDED_ON))
def test_what_falcon_and_gptj_cannot_hold_goes_to_the_family_that_can(case):
    extra, cls = HANDED_ON[case]
    spec = vl.parse_model_spec({**TINY, **extra}, REG)
    torch.manual_seed(0)
    model = perturbed(vl.build_model(spec, REG), seed=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # every weight has its place
        hf = vl.to_transformers(spec, model)
    assert type(hf).__name__ == vl.hf.choose_class(spec) == cls
    idx = torch.randint(0, 64, (2, 10))
    with torch.no_grad():
        assert (model(idx) - hf(idx).logits).abs().max().item() < 1e-5


REFUSED = {
    "gptj theta": (dict(NATIVE["gptj-head-bias"][1], positional={
        "kind": "rotary", "fraction": 0.25, "theta": 500.0}), "positional.theta", "10000"),
    "gptj scaled rotary": (dict(NATIVE["gptj-head-bias"][1], positional={
        "kind": "rotary", "fraction": 0.25, "scaling": "linear", "factor": 2.0}),
        "positional.scaling", "unscaled"),
    "gptj two norms": (dict(NATIVE["gptj-head-bias"][1], residual={
        "kind": "parallel", "shared_norm": False}), "residual.shared_norm", "one norm"),
    "head bias elsewhere": (dict(head_bias=True), "head_bias", "GPT-J and Phi only"),
    "embedding norm elsewhere": (dict(embedding_norm=True), "embedding_norm", "BLOOM only"),
    "token dim elsewhere": (dict(token_dim=16), "token_dim", "OPT only"),
    "offset in gpt-2": (dict(positional={"kind": "learned", "offset": 1}),
                        "positional.offset", "OPTForCausalLM"),
    "opt without a final norm": (dict(NATIVE["opt-offset"][1], final_norm=False), "final_norm",
                                 "OPTForCausalLM"),
    "mpt norm shift": (dict(NATIVE["mpt-alibi"][1], norm_bias=True), "norm_bias", "shift"),
    "mpt 2x mlp": (dict(NATIVE["mpt-alibi"][1], feedforward={"kind": "mlp", "hidden_mult": 2}),
                   "feedforward.hidden_dim", "4 x emb_dim"),
    "bloom exact gelu": (dict(NATIVE["bloom-embedding-norm"][1], activation={
        "kind": "gelu", "approximate": "none"}), "activation.kind", "tanh"),
    "mamba with a feed-forward": (dict(NATIVE["mamba"][1], feedforward="mlp"),
                                  "feedforward.kind", "MambaForCausalLM"),
    "mamba2 gate before norm": (dict(NATIVE["mamba2"][1], attention={
        "kind": "mamba2", "gate_norm": "norm_before_gate"}), "attention.gate_norm",
        "Mamba2ForCausalLM"),
    "bamba whole-head rotary": (dict(NATIVE["bamba"][1], positional="rotary"),
                                "positional.fraction", "0.5"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_the_class_cannot_hold_is_refused_by_name(case):
    extra, loc, words = REFUSED[case]
    spec = vl.parse_model_spec({**TINY, **extra}, REG)
    model = vl.build_model(spec, REG)
    with pytest.raises(ConversionError) as info:
        vl.to_transformers(spec, model)
    (issue,) = info.value.issues
    assert ".".join(map(str, issue.loc)) == loc
    assert words in issue.message and "exporting to" in issue.message
