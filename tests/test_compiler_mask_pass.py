"""The mask pass: dense-mask SDPA whose mask is a known block pattern is
rewritten into ``dilcompile.block_sparse_fwd``; anything else stays as written."""

import pytest
import torch
import torch.nn.functional as F

import dilcompile.compiler.passes as passes_module
from dilcompile import compiler
from dilcompile.compiler import explain, switches
from dilcompile.compiler.rewrite_block_sparse import identify
from dilcompile.patterns import causal as causal_of
from dilcompile.patterns import dilated, global_local, local_window
from dilcompile.testing import random_qkv


@pytest.fixture(autouse=True, scope="module")
def _passes_and_lowering_enabled():
    """These tests are about what the opt-in passes and lowering do."""
    with compiler.enabled():
        yield


def _dense(pattern, heads, n, causal=False):
    return (causal_of(pattern) if causal else pattern).dense_mask(heads, n)


@pytest.mark.parametrize("n", [128, 200])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("pattern", [local_window(7), global_local(5, 3), dilated((16, 32), (1, 2)),
                                     dilated((8, 40, 200), (1, 4, 8))])
def test_identify_recovers_the_pattern_exactly(pattern, causal, n):
    mask = _dense(pattern, 4, n, causal)
    found = identify(mask)
    assert not isinstance(found, str), found
    got, got_causal = found
    assert got_causal == causal
    assert torch.equal(_dense(got, 4, n, causal), mask)  # exact, whatever parameters it picked


def test_identify_refuses_near_misses_and_empty_rows():
    mask = local_window(6).dense_mask(2, 128).clone()
    mask[1, 40, 47] = True  # one extra pair: no pattern equals it
    assert "matches no known pattern" in identify(mask)
    empty = local_window(6).dense_mask(1, 128).clone()
    empty[0, 5] = False
    assert "fully masked row" in identify(empty)
    assert "dense" in identify(torch.ones(1, 64, 64, dtype=torch.bool))


def window_masked(q, k, v):
    """The canonical form: a user-built arange mask, 2-D."""
    i = torch.arange(q.shape[2], device=q.device)
    mask = (i[:, None] - i[None, :]).abs() <= 9
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


DIL = dilated((16, 50), (1, 2)).with_heads(4)


def dilated_causal_masked(q, k, v):
    """A pattern's own mask_mod on aranges, per head (4-D mask), causal."""
    i = torch.arange(q.shape[2], device=q.device)
    h = torch.arange(q.shape[1], device=q.device)[:, None, None]
    mask = DIL.mask_mod(None, h, i[:, None], i[None, :]) & (i[None, :] <= i[:, None])
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[None], scale=0.3)


@pytest.mark.parametrize("fn, dtype, n, want, causal", [
    (window_masked, torch.float32, 200, "local_window(window=9)", False),
    (dilated_causal_masked, torch.float64, 200, "dilated(segment_lengths=(16, 50)", True),
])
def test_masked_sdpa_is_rewritten_and_equal_to_eager(fn, dtype, n, want, causal):
    q, k, v = random_qkv(2, 4, n, 16, dtype=dtype)
    with torch.no_grad():
        report = explain(fn, q, k, v, fullgraph=True)
        got = torch.compile(fn, fullgraph=True)(q, k, v)
    ours = [r for r in report.rewritten if r.get("pass") == "rewrite_block_sparse"]
    assert len(ours) == 1, report.skipped
    assert ours[0]["pattern"].startswith(want) and ours[0]["causal"] == causal
    assert report.graph_breaks == 0 and report.passes["rewrite_block_sparse"]
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    torch.testing.assert_close(got, fn(q, k, v), rtol=tol, atol=tol)


def unknown_and_input_masks(q, k, v, given):
    i = torch.arange(q.shape[2], device=q.device)
    odd = ((i[:, None] * 7 + i[None, :] * 3) % 5 != 0) | (i[:, None] == i[None, :])  # no pattern of ours
    a = F.scaled_dot_product_attention(q, k, v, attn_mask=odd)
    return a + F.scaled_dot_product_attention(q, k, v, attn_mask=given)  # values unknown when compiling


def test_unknown_or_runtime_masks_are_left_alone_with_a_reason():
    q, k, v = random_qkv(1, 2, 128, 8, dtype=torch.float32)
    given = local_window(4).dense_mask(1, 128)[0]
    with torch.no_grad():
        report = explain(unknown_and_input_masks, q, k, v, given, fullgraph=True)
        got = torch.compile(unknown_and_input_masks, fullgraph=True)(q, k, v, given)
    assert not [r for r in report.rewritten if r.get("pass") == "rewrite_block_sparse"]
    reasons = " ".join(s for s in report.skipped if s.startswith("block_sparse"))
    assert "matches no known pattern" in reasons and "graph input" in reasons, report.skipped
    torch.testing.assert_close(got, unknown_and_input_masks(q, k, v, given), rtol=1e-5, atol=1e-5)


def test_switch_off_leaves_masked_sdpa_and_changes_the_cache_tag():
    q, k, v = random_qkv(1, 2, 128, 8, dtype=torch.float32)
    on_tag = passes_module._cache_tag()
    with switches(rewrite_block_sparse=False), torch.no_grad():
        assert passes_module._cache_tag() != on_tag
        report = explain(window_masked, q, k, v, fullgraph=True)
        got = torch.compile(window_masked, fullgraph=True)(q, k, v)
    assert report.passes["rewrite_block_sparse"] is False
    assert not [r for r in report.rewritten if r.get("pass") == "rewrite_block_sparse"]
    assert passes_module._cache_tag() == on_tag
    torch.testing.assert_close(got, window_masked(q, k, v), rtol=1e-5, atol=1e-5)


def test_graph_constant_mask_is_rewritten_in_float64():
    """A mask held by the graph (``get_attr``, as in frozen graphs) is known at compile time."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from dilcompile.compiler.rewrite_block_sparse import rewrite_block_sparse

    const = global_local(6, 4).dense_mask(1, 200)[0]
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=const)  # noqa: E731
    q, k, v = random_qkv(1, 2, 200, 8, dtype=torch.float64)
    gm = make_fx(fn, tracing_mode="fake", _allow_non_fake_inputs=True)(q, k, v)
    assert any(n.op == "get_attr" for n in gm.graph.nodes)
    log = rewrite_block_sparse(gm.graph)
    gm.recompile()
    assert [r["pattern"] for r in log.rewritten] == ["global_local(window=6, global_tokens=4)"], log.skipped
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.dilcompile.block_sparse_fwd.default in targets
    assert not any("scaled_dot_product" in str(t) for t in targets)
    torch.testing.assert_close(gm(q, k, v), fn(q, k, v), rtol=1e-12, atol=1e-12)


def test_training_graph_keeps_sdpa_saved_for_backward():
    q, k, v = random_qkv(1, 2, 128, 8, dtype=torch.float32)
    q.requires_grad_(True)
    report = explain(window_masked, q, k, v, fullgraph=True)
    assert not [r for r in report.rewritten if r.get("pass") == "rewrite_block_sparse"]
    assert any("auxiliary outputs" in s for s in report.skipped), report.skipped
