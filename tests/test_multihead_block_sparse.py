"""MultiheadBlockSparseAttention against the float64 reference (masked SDPA
with the pattern's dense mask, same weights), causal and not, gradients,
compile, refused key padding."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters

from dilcompile import MultiheadBlockSparseAttention
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import global_local, local_window

F64 = dict(dtype=torch.float64)


def _by_hand(mha, x, pattern, causal):
    """Projections, SDPA with the dense (causal) pattern mask in float64 (empty rows → 0), sub-LN, out proj."""
    e, h = mha.embed_dim, mha.num_heads
    q, k, v = (t.view(x.shape[0], x.shape[1], h, e // h).transpose(1, 2) for t in mha.qkv_proj(x).chunk(3, -1))
    n = x.shape[1]
    mask = (causal_of(pattern) if causal else pattern).with_heads(h).dense_mask(h, n).to(x.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=1 / math.sqrt(e // h))
    out = torch.where(mask.any(-1, keepdim=True), out, 0.0).transpose(1, 2).flatten(2)
    return mha.out_proj(mha.sub_ln(out))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", [local_window(9), global_local(5, 3)], ids=repr)
def test_matches_masked_sdpa_float64_with_parameter_gradients(pattern, causal, device):
    mha = MultiheadBlockSparseAttention(24, 3, pattern, block_size=16, **F64).to(device)
    x = torch.randn(2, 77, 24, **F64, device=device, requires_grad=True)  # 77: a partial last block
    got, none = mha(x, is_causal=causal)
    want = _by_hand(mha, x, pattern, causal)
    assert none is None
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    params = [x, *mha.parameters()]
    for g, w in zip(torch.autograd.grad(got.square().sum(), params), torch.autograd.grad(want.square().sum(), params)):
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9)


def test_spec_string_state_dict_and_prepare_build_nothing_numeric():
    a = MultiheadBlockSparseAttention(16, 2, "local_window(window=5)", block_size=8, **F64)
    b = MultiheadBlockSparseAttention(16, 2, local_window(5), block_size=8, **F64)
    b.load_state_dict(a.state_dict())
    assert set(a.state_dict()) == {"qkv_proj.weight", "qkv_proj.bias", "sub_ln.weight", "sub_ln.bias",
                                   "out_proj.weight", "out_proj.bias"}
    x = torch.randn(1, 30, 16, **F64)
    a.prepare(1, 30)  # builds the FlexAttention mask eagerly; the forward is unchanged
    torch.testing.assert_close(a(x)[0], b(x)[0], rtol=0, atol=0)


def test_bad_pattern_is_refused():
    with pytest.raises(ValueError, match="unknown pattern"):
        MultiheadBlockSparseAttention(16, 2, "no_such_pattern(1)")


def test_compiled_fullgraph_matches_eager():
    torch._dynamo.reset()
    counters.clear()
    mha = MultiheadBlockSparseAttention(16, 2, local_window(6), block_size=16)
    x = torch.randn(2, 50, 16, requires_grad=True)
    out, _ = torch.compile(mha, fullgraph=True)(x, is_causal=True)
    want, _ = mha(x, is_causal=True)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), x)[0], torch.autograd.grad(want.sum(), x)[0],
                               rtol=1e-5, atol=1e-5)
    assert not counters["graph_break"]
    torch._dynamo.reset()
