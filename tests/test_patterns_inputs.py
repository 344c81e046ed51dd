"""Pattern constructors refuse what they cannot serve when built, with one
line naming the argument — not an OverflowError at the first call, nor an
error row in a profile (integers beyond int64 used to pass construction)."""

import random

import pytest
import torch

from dilcompile import block_sparse_attention
from dilcompile.patterns import dilated, global_local, hierarchical, hilbert, local_window, random_blocks

# constructor, its int arguments by name, and a valid value for each.
CONSTRUCTORS = {
    "local_window": (local_window, {"window": 8}),
    "global_local": (global_local, {"window": 8, "global_tokens": 4}),
    "random_blocks": (lambda block_size: random_blocks(0.5, block_size), {"block_size": 16}),
    "hilbert": (hilbert, {"height": 8, "width": 8, "radius": 1}),
    "hierarchical": (lambda stride, window: hierarchical(((stride, window),)),
                     {"level stride": 1, "level window": 8}),
}
HUGE = [2**40 + 1, 2**62, 2**63, 2**64 + 7, 10**20, 10**23]


def _call(name, args):
    fn, _ = CONSTRUCTORS[name]
    if name == "hierarchical":
        return fn(args["level stride"], args["level window"])
    return fn(**args)


@pytest.mark.parametrize("seed", range(6))
def test_out_of_range_ints_are_refused_at_construction_naming_the_argument(seed):
    rng = random.Random(seed)
    for name, (_, valid) in CONSTRUCTORS.items():
        for arg in valid:
            bad = rng.choice(HUGE + [-1, -(2**70)] if not (name == "hierarchical" and arg == "level stride") else HUGE)
            with pytest.raises(ValueError, match=arg):
                _call(name, {**valid, arg: bad})
            with pytest.raises(TypeError, match=arg):
                _call(name, {**valid, arg: rng.choice([True, 2.0, "3", None])})


@pytest.mark.parametrize("name", list(CONSTRUCTORS))
def test_largest_accepted_sizes_still_run(name):
    _, valid = CONSTRUCTORS[name]
    q = torch.randn(1, 1, 64, 8)
    sizes = {**valid, **{arg: 2**40 for arg in valid if arg not in ("height", "width", "block_size")}}
    if name == "hierarchical":
        sizes["level stride"] = 1
    out = block_sparse_attention(q, q, q, _call(name, sizes), block_size=16)
    assert out.shape == q.shape and torch.isfinite(out).all()


@pytest.mark.parametrize("seed", [2**33, 2**40 - 1, 2**63, 2**64 + 12345, 10**30])
def test_any_seed_is_served_as_its_residue_modulo_2_31(seed):
    """The hash reduces seed·S modulo 2^31 (S odd): a seed is its residue,
    which the pattern keeps (seeds below 2^31 are unchanged)."""
    assert random_blocks(0.5, 16, seed=seed).seed == seed % 2**31
    q, k, v = (torch.randn(1, 2, 96, 8, dtype=torch.float64) for _ in range(3))
    big = block_sparse_attention(q, k, v, random_blocks(0.5, 16, seed=seed), block_size=16)
    small = block_sparse_attention(q, k, v, random_blocks(0.5, 16, seed=seed % 2**31), block_size=16)
    torch.testing.assert_close(big, small, rtol=0, atol=0)


def test_the_reported_probes():
    for make, arg in ((lambda: local_window(10**23), "window"), (lambda: hierarchical(((1, 10**20),)), "level window"),
                      (lambda: global_local(4, 10**20), "global_tokens")):
        with pytest.raises(ValueError, match=arg):
            make()
    with pytest.raises(ValueError, match="segment_lengths"):
        dilated((10**20,), (1,))
    random_blocks(0.5, 16, seed=2**40 - 1)  # served now (equal to its residue, above)
