"""impl="triton" with packed sequences (``cu_seqlens``): the kernels read a
table of every sequence's segments on the device (``impl.triton.segment_table``),
so a packed batch is one launch per branch whatever the number of sequences —
not a Python loop over them — and each sequence still equals itself alone
(docs/design.md, "Variable-length batches"). Against the float64 reference of
each sequence alone, forward, lse and gradients, on random documents and
configurations. On CPU the kernels run under TRITON_INTERPRET=1."""

import random

import pytest
import torch

from dilcompile import dilated_attention
from dilcompile.dilated.api import HAS_TRITON
from dilcompile.testing import random_qkv

pytestmark = [
    pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),  # interpreter
]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random_case(seed: int):
    """Documents of 0–90 tokens (empty ones too), 1–3 branches of any length and rate 1–5, both modes,
    causal or not, head dims that are not powers of two."""
    rng = random.Random(seed)
    lengths = [rng.choice([0, 1, rng.randint(2, 90)]) for _ in range(rng.randint(1, 6))]
    m = rng.randint(1, 3)
    segments, rates = tuple(sorted(rng.sample(range(1, 100), m))), tuple(rng.randint(1, 5) for _ in range(m))
    mode = rng.choice(["longnet", "groups"])
    heads = max(rng.randint(1, 5), m if mode == "groups" else 1)
    return lengths, heads, rng.choice([8, 24, 40]), dict(segment_lengths=segments, dilation_rates=rates,
                                                         mode=mode, causal=rng.random() < 0.5)


@pytest.mark.parametrize("seed", range(8))
def test_packed_sequences_each_equal_themselves_alone_with_gradients(seed):
    lengths, heads, head_dim, kw = _random_case(seed)
    total = sum(lengths)
    if total == 0:
        lengths, total = lengths + [7], total + 7
    cu = torch.tensor([0] + lengths, device=DEVICE).cumsum(0)
    q, k, v = random_qkv(1, heads, total, head_dim, dtype=torch.float32, device=DEVICE, requires_grad=True,
                         seed=seed)
    out, lse = dilated_attention(q, k, v, impl="triton", cu_seqlens=cu, return_lse=True, **kw)
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    grad_out = torch.randn(out.shape, generator=g, device=DEVICE)
    grad_lse = torch.randn(lse.shape, generator=g, device=DEVICE) * lse.isfinite()
    grads = torch.autograd.grad((out * grad_out).sum() + (lse.nan_to_num(0.0, 0.0, 0.0) * grad_lse).sum(), (q, k, v))
    for i in range(len(lengths)):
        rows = slice(int(cu[i]), int(cu[i + 1]))
        if rows.start == rows.stop:
            continue
        alone = [t[:, :, rows].detach().double().requires_grad_() for t in (q, k, v)]
        ref, ref_lse = dilated_attention(*alone, impl="reference", return_lse=True, **kw)
        covered = ref_lse.isfinite()
        assert torch.equal(lse[:, :, rows].isfinite(), covered), f"sequence {i}"
        torch.testing.assert_close(out[:, :, rows].double(), ref, rtol=1e-5, atol=1e-5, msg=f"sequence {i}")
        torch.testing.assert_close(lse[:, :, rows].double()[covered], ref_lse[covered], rtol=1e-5, atol=1e-5)
        loss = (ref * grad_out[:, :, rows].double()).sum() \
            + (ref_lse.nan_to_num(0.0, 0.0, 0.0) * grad_lse[:, :, rows].double()).sum()
        for name, got, want in zip("qkv", grads, torch.autograd.grad(loss, alone)):
            torch.testing.assert_close(got[:, :, rows].double(), want, rtol=1e-4, atol=1e-5,
                                       msg=f"d{name} of sequence {i}")


def test_one_launch_per_branch_whatever_the_number_of_sequences(monkeypatch):
    """60 documents: three branches, three forward launches (the per-sequence op ran each document)."""
    from dilcompile.dilated.impl import triton as launcher

    launches = []
    real = launcher.wrap_triton
    monkeypatch.setattr(launcher, "wrap_triton", lambda kernel: launches.append(kernel.__name__) or real(kernel))
    lengths = [1 + (5 * i) % 7 for i in range(60)]
    cu = torch.tensor([0] + lengths, device=DEVICE).cumsum(0)
    q, k, v = random_qkv(1, 2, sum(lengths), 8, dtype=torch.float32, device=DEVICE, seed=0)
    out = dilated_attention(q, k, v, segment_lengths=(4, 8, 16), dilation_rates=(1, 2, 4), impl="triton",
                            cu_seqlens=cu)
    assert launches == ["_fwd_kernel"] * 3, launches
    first = slice(0, lengths[0] + lengths[1])  # two documents alone, through the per-sequence path
    two = dilated_attention(q[:, :, first], k[:, :, first], v[:, :, first], segment_lengths=(4, 8, 16),
                            dilation_rates=(1, 2, 4), impl="reference", cu_seqlens=cu[:3])
    torch.testing.assert_close(out[:, :, first].double(), two.double(), rtol=1e-5, atol=1e-5)


def test_the_segment_table_cuts_each_sequence_from_its_own_start():
    from dilcompile.dilated.impl.triton import segment_table

    cu = torch.tensor([0, 5, 5, 6, 20])  # lengths 5, 0, 1, 14
    table = segment_table(cu, 4, 20).tolist()
    real = [(0, 4), (4, 5), (5, 6), (6, 10), (10, 14), (14, 18), (18, 20)]
    assert [tuple(row) for row in table[:len(real)]] == real
    assert len(table) == 5 + 4 and all(row == [0, 0] for row in table[len(real):])  # ⌈20 / 4⌉ + S rows
    with pytest.raises(RuntimeError, match="rise from 0 to the total"):  # on a GPU an asynchronous assert;
        segment_table(torch.tensor([0, 50, 7]), 4, 20)  # its segments are clamped into the tensor meanwhile


def test_equal_q_and_k_boundaries_take_the_one_launch_path_and_bad_ones_fail_on_the_device(monkeypatch):
    """transformers passes packed rows as cu_seq_lens_q and cu_seq_lens_k (equal values, two tensors): the
    one-launch path too. The op checks the boundaries itself (a compiled call reads no value on the host)."""
    lengths = [3, 9, 4]
    cu = torch.tensor([0] + lengths, device=DEVICE).cumsum(0)
    q, k, v = random_qkv(1, 2, sum(lengths), 8, dtype=torch.float32, device=DEVICE, seed=1)
    kw = dict(segment_lengths=(4, 8), dilation_rates=(1, 2), impl="triton")
    calls = []
    real = torch.ops.dilcompile.dilated_triton_varlen_fwd
    monkeypatch.setattr(torch.ops.dilcompile, "dilated_triton_varlen_fwd", lambda *a: calls.append(1) or real(*a))
    two = dilated_attention(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu.clone(), **kw)
    one = dilated_attention(q, k, v, cu_seqlens=cu, **kw)
    assert calls == [1, 1] and torch.equal(one, two)
    bad = torch.tensor([0, 3, 20], device=DEVICE)  # past the total: what a compiled call would not have read
    with pytest.raises(RuntimeError, match="cu_seqlens must rise from 0 to the total length"):
        real(q, k, v, [4, 8], [1, 2], "longnet", False, 8 ** -0.5, bad)
