"""Every fast path equals its reference: outputs and gradients, same weights."""

import pytest
import torch

import variantlab as vl

REG = vl.get_registry()


def attention(impl: str, causal: bool, emb_dim: int = 32, n_heads: int = 4):
    comp = REG.get("attention", "mha")
    return comp.build(comp.spec_cls(impl=impl), emb_dim=emb_dim, n_heads=n_heads,
                      context_length=16, drop_rate=0.1, qkv_bias=True, causal=causal)


def run(module, *args, **kwargs):
    """Output and the gradient of every parameter and float input for a fixed loss."""
    for t in args:
        t.grad = None
    module.zero_grad()
    out = module(*args, **kwargs)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    grads = {n: p.grad.clone() for n, p in module.named_parameters()}
    grads.update({f"input{i}": t.grad.clone() for i, t in enumerate(args)})
    return out.detach(), grads


def assert_same(ref, fast, atol=1e-5):
    torch.testing.assert_close(fast[0], ref[0], atol=atol, rtol=1e-4)
    assert ref[1].keys() == fast[1].keys()
    for name in ref[1]:
        torch.testing.assert_close(fast[1][name], ref[1][name], atol=atol, rtol=1e-4, msg=name)


CASES = [
    # causal, T, S (None: self-attention), padded keys
    (True, 7, None, False),
    (False, 7, None, False),
    (True, 7, None, True),
    (False, 5, 9, True),
    (False, 5, 9, False),
    (True, 5, 9, False),
]


@pytest.mark.parametrize("causal, t, s, padded", CASES)
def test_sdpa_equals_naive(causal, t, s, padded):
    torch.manual_seed(0)
    naive = attention("naive", causal).eval()
    sdpa = attention("sdpa", causal).eval()
    sdpa.load_state_dict(naive.state_dict())  # one parameter layout for both impls
    x = torch.randn(3, t, 32, requires_grad=True)
    kwargs, args = {}, [x]
    if s is not None:
        memory = torch.randn(3, s, 32, requires_grad=True)
        kwargs["memory"], args = memory, [x, memory]
    n_keys = s or t
    if padded:
        mask = torch.zeros(3, n_keys, dtype=torch.bool)
        mask[0, -2:] = True  # right padding keeps every query with a visible key
        mask[2, -1:] = True
        kwargs["key_padding_mask"] = mask

    def call(module):
        def fn(*inputs):
            extra = dict(kwargs)
            if s is not None:
                extra["memory"] = inputs[1]
            return module(inputs[0], **extra)
        fn.named_parameters, fn.zero_grad = module.named_parameters, module.zero_grad
        return run(fn, *args)

    assert_same(call(naive), call(sdpa))


def test_padded_keys_receive_no_attention():
    torch.manual_seed(0)
    for impl in ("naive", "sdpa"):
        attn = attention(impl, causal=False).eval()
        x = torch.randn(2, 6, 32)
        mask = torch.zeros(2, 6, dtype=torch.bool)
        mask[:, 4:] = True
        y = x.clone()
        y[:, 4:] = 100 * torch.randn(2, 2, 32)  # change only the padded positions
        out_x = attn(x, key_padding_mask=mask)[:, :4]
        out_y = attn(y, key_padding_mask=mask)[:, :4]
        torch.testing.assert_close(out_x, out_y)


def test_causal_attention_ignores_the_future():
    torch.manual_seed(0)
    for impl in ("naive", "sdpa"):
        attn = attention(impl, causal=True).eval()
        x = torch.randn(1, 6, 32)
        y = x.clone()
        y[:, 3:] = torch.randn(1, 3, 32)
        torch.testing.assert_close(attn(x)[:, :3], attn(y)[:, :3])


@pytest.mark.parametrize("family", ["gpt", "encoder", "decoder", "encoder_decoder", "block"])
def test_whole_models_agree_across_attention_impls(tiny, family):
    spec = {**tiny, "family": family}
    torch.manual_seed(1)
    naive = vl.build_model({**spec, "attention": {"kind": "mha", "impl": "naive"}}, REG).eval()
    sdpa = vl.build_model({**spec, "attention": {"kind": "mha", "impl": "sdpa"}}, REG).eval()
    sdpa.load_state_dict(naive.state_dict())
    task = vl.task_for(naive.variantlab_spec, REG)
    batch = task.batch(naive.variantlab_spec, 2, 8, generator=torch.Generator().manual_seed(0))
    outs = []
    for model in (naive, sdpa):
        out = model(**batch.inputs)
        task.loss(model.variantlab_spec, out, batch).backward()
        outs.append((out.detach(), {n: p.grad for n, p in model.named_parameters()}))
    assert_same(*outs)


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_fused_gelu_equals_formula(approximate):
    comp = REG.get("activation", "gelu")
    ref = comp.build(comp.spec_cls(approximate=approximate, impl="naive"))
    fast = comp.build(comp.spec_cls(approximate=approximate, impl="fused"))
    x = torch.linspace(-6, 6, 1001, requires_grad=True)
    assert_same(run(ref, x), run(fast, x))


def test_gelu_formula_values():
    comp = REG.get("activation", "gelu")
    gelu = comp.build(comp.spec_cls(approximate="none"))
    x = torch.tensor([-1.0, 0.0, 1.0, 2.0])
    expected = x * 0.5 * (1 + torch.erf(x / 2**0.5))
    torch.testing.assert_close(gelu(x), expected)
    torch.testing.assert_close(gelu(torch.tensor([1.0])), torch.tensor([0.8413447]))


def test_fused_layernorm_equals_formula():
    comp = REG.get("norm", "layer")
    ref = comp.build(comp.spec_cls(impl="naive"), dim=32)
    fast = comp.build(comp.spec_cls(impl="fused"), dim=32)
    with torch.no_grad():
        ref.scale.uniform_(0.5, 1.5)
        ref.shift.uniform_(-0.5, 0.5)
    fast.load_state_dict(ref.state_dict())
    x = (3 * torch.randn(4, 5, 32) + 1).requires_grad_()
    assert_same(run(ref, x), run(fast, x), atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_sdpa_equals_naive_on_cuda(dtype, atol):
    """On a GPU, sdpa takes a fused kernel (flash / memory-efficient in bfloat16); the naive
    path in float32 is the oracle."""
    torch.manual_seed(0)
    naive = attention("naive", True, emb_dim=64).eval().cuda()
    sdpa = attention("sdpa", True, emb_dim=64).eval().cuda()
    sdpa.load_state_dict(naive.state_dict())
    x = torch.randn(2, 16, 64, device="cuda")
    with torch.no_grad():
        ref = naive(x)
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            fast = sdpa(x)
    torch.testing.assert_close(fast.float(), ref, atol=atol, rtol=atol)
