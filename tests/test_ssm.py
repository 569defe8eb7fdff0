"""Issue 20 items 2 and 6 (part): Mamba-2 (SSD), Mamba-1 (selective scan, as Jamba) and Gated
DeltaNet as attention-slot mixers. Chunked forms equal the token-by-token references in
float64; each mixer equals HF transformers' own (Mamba2Mixer, JambaMambaMixer,
Qwen3NextGatedDeltaNet) on the same perturbed weights, with and without left padding."""

import pytest
import torch

import variantlab as vl
from variantlab.errors import SpecError
from variantlab_plugins.deltanet import GatedDeltaNet, GatedDeltaNetSpec
from variantlab_plugins.ssm import Mamba2Mixer, Mamba2Spec, MambaMixer, MambaSpec

D = 32
REG = vl.build_registry()


def _mixers():
    return [
        ("mamba2", lambda c: Mamba2Mixer(D, 4, Mamba2Spec(d_state=4, n_groups=2, chunk_size=c))),
        ("mamba2-1group", lambda c: Mamba2Mixer(D, 2, Mamba2Spec(d_state=8, chunk_size=c,
                                                                bias=True, conv_width=3))),
        ("mamba", lambda c: MambaMixer(D, MambaSpec(d_state=4, chunk_size=c))),
        ("mamba-norms", lambda c: MambaMixer(D, MambaSpec(d_state=4, chunk_size=c, dt_rank=3,
                                                           inner_norms=True))),
        ("gated_deltanet", lambda c: GatedDeltaNet(D, 4, GatedDeltaNetSpec(
            n_k_heads=2, n_v_heads=4, head_v_dim=6, chunk_size=c))),
    ]


def _perturb(module: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.2 * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("name,make", _mixers(), ids=[n for n, _ in _mixers()])
@pytest.mark.parametrize("chunk", [1, 4, 5, 64])
def test_chunked_equals_recurrent_float64(name, make, chunk):
    torch.manual_seed(0)
    module = make(chunk).double()
    _perturb(module)
    x = torch.randn(2, 13, D, dtype=torch.float64)
    pad = torch.zeros(2, 13, dtype=torch.bool)
    pad[1, :4] = True  # left padding in one row
    for mask in (None, pad):
        module.impl = "chunked"
        fast = module(x, key_padding_mask=mask)
        module.impl = "recurrent"
        slow = module(x, key_padding_mask=mask)
        assert fast.shape == (2, 13, D)
        assert torch.allclose(fast, slow, atol=1e-12, rtol=1e-10), (fast - slow).abs().max()
        assert fast.abs().mean() > 1e-3  # not trivially zero


@pytest.mark.parametrize("name,make", _mixers(), ids=[n for n, _ in _mixers()])
def test_padding_anywhere_leaves_real_positions_alone(name, make):
    """A padded position in the middle, whatever its input, changes no real position."""
    torch.manual_seed(1)
    module = make(4).double()
    _perturb(module, 1)
    x = torch.randn(1, 10, D, dtype=torch.float64)
    pad = torch.zeros(1, 10, dtype=torch.bool)
    pad[0, 5] = True
    with_pad = module(x, key_padding_mask=pad)
    noisy = x.clone()
    noisy[0, 5] = 50 * torch.randn(D, dtype=torch.float64)
    assert torch.allclose(module(noisy, key_padding_mask=pad)[:, ~pad[0]],
                          with_pad[:, ~pad[0]], atol=1e-10)


def _hf_pair(name):
    transformers = pytest.importorskip("transformers")
    if name == "mamba2":
        from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer as HF
        cfg = transformers.Mamba2Config(hidden_size=D, state_size=8, num_heads=8, head_dim=8,
                                        n_groups=2, expand=2, conv_kernel=4, chunk_size=5,
                                        num_hidden_layers=1, layer_norm_epsilon=1e-5)
        ours = Mamba2Mixer(D, 4, Mamba2Spec(d_state=8, n_groups=2, head_dim=8, chunk_size=7))
        return HF(cfg, layer_idx=0), ours
    if name == "jamba":
        from transformers.models.jamba.modeling_jamba import JambaMambaMixer as HF
        cfg = transformers.JambaConfig(hidden_size=D, mamba_d_state=4, mamba_d_conv=4,
                                       mamba_expand=2, mamba_dt_rank=3, num_hidden_layers=1,
                                       rms_norm_eps=1e-6)
        ours = MambaMixer(D, MambaSpec(d_state=4, dt_rank=3, inner_norms=True, chunk_size=3))
        return HF(cfg, layer_idx=0), ours
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet as HF
    cfg = transformers.Qwen3NextConfig(hidden_size=D, linear_num_value_heads=4,
                                       linear_num_key_heads=2, linear_key_head_dim=8,
                                       linear_value_head_dim=6, linear_conv_kernel_dim=4,
                                       num_hidden_layers=1, rms_norm_eps=1e-6)
    ours = GatedDeltaNet(D, 4, GatedDeltaNetSpec(n_k_heads=2, n_v_heads=4, head_k_dim=8,
                                                 head_v_dim=6, chunk_size=5))
    return HF(cfg, layer_idx=0), ours


@pytest.mark.parametrize("name", ["mamba2", "jamba", "qwen3_next"])
def test_equals_hf_mixer(name):
    torch.manual_seed(0)
    hf, ours = _hf_pair(name)
    _perturb(hf, 3)
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())
    from variantlab.hf.mamba import mixer_name

    ours.load_state_dict({mixer_name(k): v for k, v in hf.state_dict().items()})
    x = torch.randn(2, 11, D)
    mask = torch.ones(2, 11, dtype=torch.long)
    mask[1, :3] = 0  # left padding, as HF pads batched generation
    hf.eval()
    with torch.no_grad():
        for attn in (None, mask):
            theirs = hf(x, attention_mask=attn)
            theirs = theirs[0] if isinstance(theirs, tuple) else theirs
            pad = None if attn is None else attn == 0
            for impl in ("chunked", "recurrent"):
                ours.impl = impl
                got = ours(x, key_padding_mask=pad)
                real = slice(None) if attn is None else attn.bool()
                assert torch.allclose(got[real], theirs[real], atol=1e-5), \
                    (impl, (got - theirs)[real].abs().max())


@pytest.mark.parametrize("attention,loc,words", [
    ({"kind": "mamba2", "conv_width": 9}, "conv_width", "exceeds context_length"),
    ({"kind": "mamba2", "n_groups": 3}, "n_groups", "does not divide"),
    ({"kind": "mamba2", "head_dim": 5}, "head_dim", "not a multiple"),
    ({"kind": "gated_deltanet", "n_k_heads": 3, "n_v_heads": 4}, "n_v_heads", "multiple"),
    ({"kind": "mamba", "conv_width": 9}, "conv_width", "exceeds context_length"),
])
def test_bad_settings_refused(attention, loc, words):
    spec = {"family": "gpt", "vocab_size": 11, "context_length": 8, "emb_dim": D,
            "n_heads": 4, "n_layers": 1, "attention": attention}
    with pytest.raises(SpecError) as err:
        vl.parse_model_spec(spec, REG)
    assert loc in str(err.value) and words in str(err.value)


@pytest.mark.parametrize("kind", ["mamba2", "mamba", "gated_deltanet"])
def test_refused_in_encoder_and_with_memory(kind):
    spec = {"family": "encoder", "vocab_size": 11, "context_length": 8, "emb_dim": D,
            "n_heads": 4, "n_layers": 1, "attention": {"kind": kind}}
    with pytest.raises(SpecError, match="causal"):
        vl.parse_model_spec(spec, REG)
    model = vl.build_model(vl.parse_model_spec({**spec, "family": "gpt"}, REG), REG)
    mixer = model.trf_blocks[0].att.sublayer
    with pytest.raises(ValueError, match="memory"):
        mixer(torch.randn(1, 4, D), memory=torch.randn(1, 3, D))


@pytest.mark.parametrize("attention,col,words", [
    ("{kind: mamba2, d_state: 0}", 38, "greater than 0"),
    ("{kind: mamba, conv_width: 9}", 40, "exceeds context_length=8"),
])
def test_cli_refuses_bad_mixer_settings_before_running(tmp_path, attention, col, words):
    from click.testing import CliRunner

    from variantlab.cli.main import main

    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nseeds: [0]\nmodel:\n  family: gpt\n  vocab_size: 64\n"
                    "  context_length: 8\n  emb_dim: 32\n  n_heads: 4\n  n_layers: 2\n"
                    f"  attention: {attention}\nmeasure: {{params: {{}}}}\n")
    out = tmp_path / "runs"
    result = CliRunner().invoke(main, ["run", str(path), "--out", str(out)])
    assert result.exit_code == 2, result.output
    assert f"bad.yaml:10:{col}:" in result.output and words in result.output
    assert not out.exists()  # nothing computed, not even an empty store
