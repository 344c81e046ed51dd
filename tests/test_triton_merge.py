"""impl="sdpa"'s CUDA forward: each piece's attention on strided views, then one
Triton kernel merging every piece (``kernels/triton_merge.py``), against the
float64 reference on random configurations — awkward N, short last segments,
rows no part covers, padding, NaN keys, both modes. On CPU the kernel runs
under TRITON_INTERPRET=1 (tests/conftest.py) on the CPU kernel's pieces; with
DILCOMPILE_TEST_DEVICE=cuda the same tests run cuDNN / flash and the compiled
kernel."""

import random

import pytest
import torch

from dilcompile.dilated.api import HAS_TRITON
from dilcompile.dilated.geometry import plan_parts
from dilcompile.dilated.impl.reference import dilated_reference
from dilcompile.dilated.impl.sdpa import _forward_merged_once

pytestmark = [
    pytest.mark.skipif(not HAS_TRITON, reason="triton not installed (pip install 'dilcompile[triton]')"),
    pytest.mark.filterwarnings("ignore:Conversion of an array with ndim > 0:DeprecationWarning"),  # interpreter
]


def _config(seed: int):
    rng = random.Random(seed)
    branches = rng.randint(1, 4)
    segments = tuple(rng.choice([8, 12, 16, 31, 64, 100, 128]) for _ in range(branches))
    rates = tuple(rng.randint(1, 5) for _ in range(branches))
    return dict(n=rng.randint(5, 260), heads=rng.randint(1, 6), batch=rng.randint(1, 2),
                dim=rng.choice([8, 16, 24, 64]), segments=segments, rates=rates, causal=rng.random() < 0.5,
                mode=rng.choice(["longnet", "groups"]), padded=rng.random() < 0.3)


@pytest.mark.parametrize("seed", range(12))
def test_merged_once_equals_float64_reference_on_random_configs(seed, device):
    c = _config(seed)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(c["batch"], c["heads"], c["n"], c["dim"], generator=gen, dtype=torch.float64)
               for _ in range(3))
    if seed % 2:  # as a projection leaves them: (B, N, H, D) memory seen transposed (pieces segments outer)
        q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    mask = (torch.rand(c["batch"], c["n"], generator=gen) < 0.2) if c["padded"] else None
    parts = plan_parts(c["heads"], c["segments"], c["rates"], c["mode"])
    scale = c["dim"] ** -0.5
    want, want_lse = dilated_reference(q, k, v, parts, c["causal"], scale, mask)
    to = dict(device=device, dtype=torch.float32)
    got, got_lse = _forward_merged_once(*(_moved(t, **to) for t in (q, k, v)), parts, c["causal"], scale,
                                        None if mask is None else mask.to(device))
    assert got.dtype == torch.float32 and got_lse.dtype == torch.float32
    assert torch.equal(got_lse.cpu().isneginf(), want_lse.isneginf()), c  # the same rows covered
    torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=2e-6, msg=str(c))
    finite = want_lse.isfinite()
    torch.testing.assert_close(got_lse.cpu().double()[finite], want_lse[finite], rtol=0, atol=2e-6, msg=str(c))


def _moved(t, **to):
    """``t`` on the device in the dtype, its memory layout kept."""
    return torch.empty_strided(t.shape, t.stride(), **to).copy_(t)


def test_rows_no_part_covers_are_zero_and_a_nan_key_stays_in_its_rows(device):
    # rates 2 and 4 only: rows of the other classes belong to no part (out 0, lse −inf)
    heads, n, segments, rates = 4, 70, (16, 32), (2, 4)
    q, k, v = (torch.randn(1, heads, n, 8, dtype=torch.float64) for _ in range(3))
    k[0, 1, 6] = float("nan")
    parts = plan_parts(heads, segments, rates, "longnet")
    want, want_lse = dilated_reference(q, k, v, parts, False, 0.5, None)
    got, got_lse = _forward_merged_once(*(t.to(device, torch.float32) for t in (q, k, v)), parts, False, 0.5, None)
    got, got_lse = got.cpu().double(), got_lse.cpu().double()
    assert want_lse.isneginf().any() and torch.equal(got_lse.isneginf(), want_lse.isneginf())
    assert (got[want_lse.isneginf()] == 0).all()
    assert want.isnan().any() and torch.equal(got.isnan(), want.isnan())
    ok = ~want.isnan()
    torch.testing.assert_close(got[ok], want[ok], rtol=0, atol=2e-6)
