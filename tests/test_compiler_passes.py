"""Graph passes: the post-grad rewrite of hand-written dilated attention, the
switches, explain(), and the FX-graph cache tag."""

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.utils import counters
from torch.fx.experimental.proxy_tensor import make_fx

from dilcompile import dilated_attention
import dilcompile.compiler.passes as passes_module
from dilcompile import compiler
from dilcompile.compiler import explain, set_pass, switches
from dilcompile.compiler.passes import DilcompilePass
from dilcompile.compiler.rewrite_dilated import rewrite_dilated
from dilcompile.testing import random_qkv


@pytest.fixture(autouse=True, scope="module")
def _passes_and_lowering_enabled():
    """These tests are about what the opt-in passes and lowering do."""
    with compiler.enabled():
        yield


def seed_dilated(q, k, v, segment_lengths=(16, 32), dilation_rates=(1, 2), causal=False):
    """The canonical form: the seed system's DilatedAttention written with
    public ops. Head group i takes branch i (offset i % r), gathers its rows
    with views, runs SDPA, scatters back into zeros; sum over groups / m."""
    b, h, n, d = q.shape
    m = len(segment_lengths)
    out = torch.zeros_like(q)
    h0 = 0
    for i, (w, r) in enumerate(zip(segment_lengths, dilation_rates)):
        size = h // m + (1 if i < h % m else 0)
        o = i % r

        def gather(x):
            return x[:, h0:h0 + size].unflatten(2, (n // w, w))[:, :, :, o::r].flatten(1, 2)

        y = F.scaled_dot_product_attention(gather(q), gather(k), gather(v), is_causal=causal)
        out[:, h0:h0 + size].unflatten(2, (n // w, w))[:, :, :, o::r] = y.unflatten(1, (size, n // w))
        h0 += size
    return out / m


def longnet_by_hand(q, k, v, w=16, r=2):
    """One LongNet branch written by hand: every head, offset h // ceil(H / r)."""
    b, h, n, d = q.shape
    out = torch.zeros_like(q)
    block = -(-h // r)
    for o in range(r):
        hs = slice(o * block, min((o + 1) * block, h))
        def gather(x):
            return x[:, hs].unflatten(2, (n // w, w))[:, :, :, o::r].flatten(1, 2)
        y = F.scaled_dot_product_attention(gather(q), gather(k), gather(v))
        out[:, hs].unflatten(2, (n // w, w))[:, :, :, o::r] = y.unflatten(1, (hs.stop - hs.start, n // w))
    return out


def _trace(fn):
    """A functional aten graph with fake-tensor metadata, like the post-grad graphs Inductor hands the pass."""
    return make_fx(torch.func.functionalize(fn, remove="mutations"), tracing_mode="fake")


def _targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


@pytest.mark.parametrize("fn, causal, mode", [
    (seed_dilated, False, "groups"),
    (lambda q, k, v: seed_dilated(q, k, v, (8, 16, 64), (1, 2, 3), causal=True), True, "groups"),
    (longnet_by_hand, False, "longnet"),
])
def test_rewrite_replaces_hand_written_graph_and_stays_equal(fn, causal, mode):
    q, k, v = random_qkv(2, 5, 64, 8, dtype=torch.float32)
    gm = _trace(lambda q, k, v: fn(q, k, v))(q, k, v)
    want = gm(q, k, v)
    log = rewrite_dilated(gm.graph)
    gm.recompile()
    assert len(log.rewritten) == 1, log.skipped
    assert log.rewritten[0]["mode"] == mode and log.rewritten[0]["causal"] == causal
    targets = _targets(gm)
    assert torch.ops.dilcompile.dilated_fwd.default in targets
    assert not any("scaled_dot_product" in str(t) for t in targets), targets
    torch.testing.assert_close(gm(q, k, v), want, rtol=1e-5, atol=1e-5)
    # and equal to the library call it names
    rw = log.rewritten[0]
    ref = dilated_attention(q, k, v, segment_lengths=rw["segment_lengths"], dilation_rates=rw["dilation_rates"],
                            causal=causal, mode=mode)
    torch.testing.assert_close(gm(q, k, v), ref, rtol=1e-6, atol=1e-6)


def test_rewrite_leaves_other_attention_alone():
    def not_dilated(q, k, v):  # rows gathered by a permutation: no dilated config
        idx = torch.tensor([3, 1, 2, 0] * 16) + torch.arange(64) // 4 * 4
        return F.scaled_dot_product_attention(q[:, :, idx], k[:, :, idx], v[:, :, idx])

    def masked(q, k, v):  # a mask the rewrite cannot carry
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.ones(64, 64, dtype=torch.bool).tril())

    for fn in (not_dilated, masked):
        q, k, v = random_qkv(1, 2, 64, 8, dtype=torch.float32)
        gm = _trace(fn)(q, k, v)
        log = rewrite_dilated(gm.graph)
        assert not log.rewritten
        assert torch.ops.dilcompile.dilated_fwd.default not in _targets(gm)


def test_switch_turns_the_pass_off_and_changes_the_cache_key():
    q, k, v = random_qkv(1, 4, 64, 8, dtype=torch.float32)
    graph_pass = DilcompilePass()
    on_key = graph_pass.uuid()
    with switches(rewrite_dilated=False):
        assert graph_pass.uuid() != on_key
        gm = _trace(lambda q, k, v: seed_dilated(q, k, v))(q, k, v)
        graph_pass(gm.graph)
        assert torch.ops.dilcompile.dilated_fwd.default not in _targets(gm)
    assert graph_pass.uuid() == on_key
    gm = _trace(lambda q, k, v: seed_dilated(q, k, v))(q, k, v)
    graph_pass(gm.graph)
    assert torch.ops.dilcompile.dilated_fwd.default in _targets(gm)
    with pytest.raises(ValueError, match="unknown pass"):
        set_pass("fuse_everything", True)


def test_explain_reports_rewrite_through_inductor_with_no_breaks():
    q, k, v = random_qkv(1, 4, 64, 8, dtype=torch.float32)
    with torch.no_grad():
        report = explain(seed_dilated, q, k, v)
        got = torch.compile(seed_dilated)(q, k, v)
    assert report.graph_breaks == 0 and report.recompiles == 0 and report.graphs == 1
    assert report.compile_s > 0
    assert [r["mode"] for r in report.rewritten] == ["groups"], report.skipped
    torch.testing.assert_close(got, seed_dilated(q, k, v), rtol=1e-5, atol=1e-5)
    assert report.to_dict()["passes"] == {"rewrite_dilated": True, "rewrite_block_sparse": True}


def test_cache_tag_changes_with_sources_so_no_stale_graph_is_served(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def compile_once():
        torch._dynamo.reset()
        counters.clear()
        # config.patch, not monkeypatch: undoing a monkeypatch deletes config attributes
        with torch._inductor.config.patch(fx_graph_cache=True, fx_graph_remote_cache=False):
            torch.compile(lambda x: x * 2 + 1)(torch.randn(8))
        return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]

    graph_pass = torch._inductor.config.post_grad_custom_post_pass  # our pass: part of the FX-graph cache key
    assert graph_pass.uuid().startswith(f"dilcompile-{passes_module.source_hash()}-")
    assert compile_once() == (0, 1)
    assert compile_once() == (1, 0)  # same sources: served from the cache
    monkeypatch.setattr(passes_module, "source_hash", lambda: "0123456789abcdef")
    try:
        assert "dilcompile-0123456789abcdef" in graph_pass.uuid()
        assert compile_once() == (0, 1)  # an edited lowering must not be served the old graph
    finally:
        monkeypatch.undo()
        torch._dynamo.reset()


def test_dense_sdpa_is_not_rewritten():
    q, k, v = random_qkv(1, 2, 64, 8, dtype=torch.float32)
    for fn in (lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
               lambda q, k, v: F.scaled_dot_product_attention(q[:, :1], k[:, :1], v[:, :1], is_causal=True)):
        gm = _trace(fn)(q, k, v)
        assert not rewrite_dilated(gm.graph).rewritten
