"""Explicit impl="flex" with float64 on CPU: FlexAttention's CPU kernel takes
no float64, and Inductor said so only after compiling, in a 75-line
InductorError (packed and padded input too). One ValueError naming impl, the
dtype and the way out, before any compute."""

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.block_sparse import choose_impl, dispatch
from dilcompile.patterns import local_window
from dilcompile.testing import random_qkv

CASES = {
    "plain": dict(),
    "packed": dict(cu_seqlens=torch.tensor([0, 4, 10])),
    "padded": dict(key_padding_mask=torch.zeros(1, 10, dtype=torch.bool)),
    "decode": dict(),  # q of 1 row against 10 keys
}


@pytest.mark.parametrize("case", list(CASES))
def test_flex_float64_on_cpu_raises_one_line_before_any_compute(case, monkeypatch):
    def computed(*args, **kwargs):
        raise AssertionError("FlexAttention was called")

    monkeypatch.setattr(dispatch, "flex_forward", computed)
    q, k, v = random_qkv(1, 2, 10, 4, seed=0)
    if case == "decode":
        q = q[:, :, -1:]
    with torch.no_grad(), pytest.raises(ValueError) as info:
        block_sparse_attention(q, k, v, local_window(2), impl="flex", **CASES[case])
    message = str(info.value)
    assert "\n" not in message
    for words in ("impl='flex'", "torch.float64", "impl='gather'", "impl='reference'"):
        assert words in message, message


def test_choose_impl_refuses_flex_float64_on_cpu_and_auto_avoids_it():
    q = torch.zeros(1, 2, 10, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="impl='flex'.*torch.float64"):
        choose_impl(q, local_window(2), "flex", needs_grad=False)
    assert choose_impl(q, local_window(2), "auto", needs_grad=False) == "gather"
    assert choose_impl(q.float(), local_window(2), "flex", needs_grad=False) == "flex"


def test_float64_ways_out_give_the_answer():
    """The two impls the error names serve float64 on CPU, and agree."""
    q, k, v = random_qkv(1, 2, 10, 4, seed=1)
    got = block_sparse_attention(q, k, v, local_window(2), impl="gather")
    want = block_sparse_attention(q, k, v, local_window(2), impl="reference")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
