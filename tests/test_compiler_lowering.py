"""The Inductor lowering of dilated_fwd and the measured choice it uses on CUDA."""

import pytest
import torch

from dilcompile import compiler, dilated_attention
from dilcompile.compiler import lowering
from dilcompile.testing import random_qkv


@pytest.fixture(autouse=True, scope="module")
def _passes_and_lowering_enabled():
    """These tests are about what the opt-in passes and lowering do."""
    with compiler.enabled():
        yield


def test_cpu_lowering_uses_the_sdpa_decomposition():
    torch._dynamo.reset()
    lowering.LOWERED.clear()
    q, k, v = random_qkv(1, 4, 70, 8, dtype=torch.float32)
    fn = lambda q, k, v: dilated_attention(q, k, v, segment_lengths=(16, 32), dilation_rates=(1, 2))  # noqa: E731
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        got = torch.compile(fn, fullgraph=True)(q, k, v)
    assert lowering.LOWERED == ["sdpa"]
    torch.testing.assert_close(got, fn(q, k, v))
    torch._dynamo.reset()


def test_tuned_op_picks_a_candidate_once_and_matches():
    lowering.TUNED.clear()
    q, k, v = random_qkv(1, 3, 33, 16, dtype=torch.float32)
    args = (q, k, v, [8, 16], [1, 2], "longnet", True, 0.25, None)
    out, lse = torch.ops.dilcompile.dilated_fwd_tuned(*args)
    want, want_lse = torch.ops.dilcompile.dilated_fwd(*args)
    assert len(lowering.TUNED) == 1 and set(lowering.TUNED.values()) <= {"sdpa", "triton"}
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse, want_lse, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.dilcompile.dilated_fwd_tuned.default, args,
                          test_utils=("test_schema", "test_faketensor"))
