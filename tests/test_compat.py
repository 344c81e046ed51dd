"""dilcompile.compat: the seed system's names and signatures, (b, n, h, d)
layout, numbers equal to the head-group reference, one warning per name,
ring names refusing clearly without a process group, block-sparse names
equal to masked SDPA with the pattern their seed config describes."""

import inspect
import warnings

import pytest
import torch

from dilcompile import (
    MultiheadBlockSparseAttention, MultiheadDilatedAttention, block_sparse_attention, compat, dilated_attention,
)
from dilcompile.compat import _deprecation

# Not a seed name at f6094f7 (an earlier seed version's); its parameters, in order.
RING_MULTIHEAD_PARAMETERS = ["embed_dim", "num_heads", "segment_lengths", "dilation_rates", "dropout", "bias",
                             "layer_norm", "layer_norm_eps", "gamma_init", "block_size", "ring_size",
                             "use_checkpointing", "use_tf32", "use_flash_attention", "compile_model", "device", "dtype"]
SEG, RATES = [16, 40, 200], [1, 3, 4]
BUILD = {  # name → constructor call with the seed's positional order
    "DilatedAttention": lambda: compat.DilatedAttention(SEG, RATES),
    "ImprovedDilatedAttention": lambda: compat.ImprovedDilatedAttention(SEG, RATES, dropout=0.0),
    "MultiheadDilatedAttention": lambda: compat.MultiheadDilatedAttention(30, 5, RATES, SEG),
    "ImprovedMultiheadDilatedAttention": lambda: compat.ImprovedMultiheadDilatedAttention(30, 5, RATES, SEG),
}
DISTRIBUTED_OR_SPARSE = {  # name → (constructor, text of the modern equivalent)
    "RingDilatedAttention": (lambda: compat.RingDilatedAttention(SEG, RATES), "dilcompile.distributed"),
    "RingDilatedAttentionV2": (lambda: compat.RingDilatedAttentionV2(SEG, RATES), "ring_dilated_attention"),
    "RingMultiheadDilatedAttention": (lambda: compat.RingMultiheadDilatedAttention(30, 5, SEG, RATES),
                                      "RingMultiheadDilatedAttention"),
    "DistributedImprovedDilatedAttention": (lambda: compat.DistributedImprovedDilatedAttention(SEG, RATES),
                                            "dilcompile.distributed"),
    "BlockSparseRingDilatedAttention": (lambda: compat.BlockSparseRingDilatedAttention(
        SEG, RATES, compat.SparsePatternConfig()), "block_sparse_attention"),
    "BlockSparseRingMultiheadDilatedAttention": (lambda: compat.BlockSparseRingMultiheadDilatedAttention(
        30, 5, SEG, RATES), "MultiheadBlockSparseAttention"),
    "BlockSparseHierarchical": (lambda: compat.BlockSparseHierarchical(SEG, RATES, compat.HierarchicalConfig()),
                                "patterns.hierarchical"),
    "BlockSparseAdaptive": (lambda: compat.BlockSparseAdaptive(SEG, RATES, 5, 6, compat.AdaptiveConfig()),
                            "block_sparse_attention"),
    "create_block_sparse_attention": (lambda: compat.create_block_sparse_attention(0.9, "local_window", 30, 5),
                                      "MultiheadBlockSparseAttention"),
    "create_adaptive_sparse_attention": (lambda: compat.create_adaptive_sparse_attention(30, 5),
                                         "block_sparse_attention"),
    "create_dilated_attention('ring')": (lambda: compat.create_dilated_attention("ring", SEG, RATES),
                                         "dilcompile.distributed"),
}


@pytest.fixture(autouse=True)
def _quiet_and_fresh():
    _deprecation._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", compat.SeedAPIDeprecationWarning)
        yield


def test_ring_multihead_signature():
    assert list(inspect.signature(compat.RingMultiheadDilatedAttention).parameters) == RING_MULTIHEAD_PARAMETERS


@pytest.mark.parametrize("name", sorted(BUILD))
def test_implemented_names_construct_and_warn_once_with_the_modern_name(name):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        BUILD[name]()
        BUILD[name]()
    future = [w for w in seen if issubclass(w.category, compat.SeedAPIDeprecationWarning)]
    assert len(future) == 1 and "dilcompile." in str(future[0].message) and name in str(future[0].message)
    assert future[0].filename == __file__  # points at the caller's line


@pytest.mark.parametrize("name", sorted(DISTRIBUTED_OR_SPARSE))
def test_ring_and_sparse_names_construct_without_a_group_and_warn_with_the_modern_name(name):
    build, modern = DISTRIBUTED_OR_SPARSE[name]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        module = build()
    assert isinstance(module, torch.nn.Module)
    assert any(modern in str(w.message) for w in seen if issubclass(w.category, compat.SeedAPIDeprecationWarning)), name


@pytest.mark.parametrize("name", ["RingDilatedAttention", "RingDilatedAttentionV2", "RingMultiheadDilatedAttention",
                                  "DistributedImprovedDilatedAttention"])
def test_ring_forward_without_a_process_group_computes_on_one_device(name):
    module = DISTRIBUTED_OR_SPARSE[name][0]()
    if "Multihead" in name:
        x = torch.randn(1, 40, 30)
        want = MultiheadDilatedAttention(30, 5, SEG, RATES, mode="groups")
        want.load_state_dict(module.state_dict())
        torch.testing.assert_close(module(x, is_causal=True), want(x, is_causal=True)[0])
    else:
        q, k, v = (torch.randn(1, 40, 5, 6, dtype=torch.float64) for _ in range(3))
        torch.testing.assert_close(module(q, k, v, is_causal=True), _groups_reference(q, k, v, True))


def _masked_sdpa_bnhd(q, k, v, pattern, causal):  # (b, n, h, d) in and out, float64, empty rows → 0
    from dilcompile.patterns import causal as causal_of

    h, n = q.shape[2], q.shape[1]
    mask = (causal_of(pattern) if causal else pattern).with_heads(h).dense_mask(h, n)
    out = torch.nn.functional.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)), attn_mask=mask)
    return torch.where(mask.any(-1, keepdim=True), out, 0.0).transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kind, want", [
    ("local_window", "dilated(segment_lengths=(16,), dilation_rates=(1,), num_heads=None, mode='groups')"),
    ("global_local", "global_local(window=12, global_tokens=3)"),
    ("random", "random_blocks(density=0.3, block_size=16, seed=0)"),
    ("dilated_sparse", "dilated(segment_lengths=(16, 40, 200), dilation_rates=(1, 3, 4), num_heads=None, "
                       "mode='groups')"),
    ("hierarchical", "hierarchical(levels=((1, 64), (8, 64), (64, 64)))"),
])
def test_block_sparse_names_equal_masked_sdpa_with_the_mapped_pattern(kind, want, causal):
    cfg = compat.SparsePatternConfig(pattern_type=kind, sparsity_ratio=0.3, block_size=16, local_window_size=24,
                                     global_tokens=3)
    module = compat.BlockSparseRingDilatedAttention(SEG, RATES, cfg)
    assert repr(module.pattern) == want
    q, k, v = (torch.randn(2, 83, 5, 8, dtype=torch.float64) for _ in range(3))
    out = module(q, k, v, is_causal=causal)
    assert out.shape == q.shape and out.is_contiguous()
    torch.testing.assert_close(out, _masked_sdpa_bnhd(q, k, v, module.pattern, causal), rtol=1e-10, atol=1e-10)


def test_block_sparse_multihead_hierarchical_adaptive_and_factories():
    cfg = compat.SparsePatternConfig(pattern_type="local_window", local_window_size=40, block_size=16)
    seed = compat.BlockSparseRingMultiheadDilatedAttention(30, 5, SEG, RATES, sparse_config=cfg, dtype=torch.float64)
    modern = MultiheadBlockSparseAttention(30, 5, "local_window(window=20)", block_size=16, sub_ln=False,
                                           dtype=torch.float64)
    modern.load_state_dict(seed.state_dict())
    x = torch.randn(2, 61, 30, dtype=torch.float64)
    torch.testing.assert_close(seed(x, is_causal=True), modern(x, is_causal=True)[0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="batch_first"):
        compat.BlockSparseRingMultiheadDilatedAttention(30, 5, SEG, RATES, batch_first=False)
    made = compat.create_block_sparse_attention(0.75, "random", 30, 5)
    assert repr(made.pattern) == "random_blocks(density=0.25, block_size=128, seed=0)"
    with pytest.raises(ValueError, match="pattern_type"):
        compat.create_block_sparse_attention(0.9, "axial", 30, 5)

    levels = ({"stride": 1, "window_size": 8, "block_size": 16}, {"stride": 4, "window_size": -1, "block_size": 16})
    hier = compat.BlockSparseHierarchical(SEG, RATES, compat.HierarchicalConfig(levels))
    assert hier.pattern.levels == ((1, 8), (4, 1 << 30))
    q, k, v = (torch.randn(1, 50, 2, 4, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(hier(q, k, v), _masked_sdpa_bnhd(q, k, v, hier.pattern, False), rtol=1e-10,
                               atol=1e-10)

    adaptive = compat.BlockSparseAdaptive(SEG, RATES, 2, 4, block_size=8, top_k=2).double().eval()
    want = block_sparse_attention(*(t.transpose(1, 2) for t in (q, k, v)), adaptive.pattern, impl="reference")
    torch.testing.assert_close(adaptive(q, k, v), want.transpose(1, 2), rtol=1e-10, atol=1e-10)
    assert sum(p.numel() for p in adaptive.parameters()) > 0  # the scorer trains with the module
    assert type(compat.create_adaptive_sparse_attention(30, 5)).__name__ == "BlockSparseAdaptive"


def _groups_reference(q, k, v, causal):  # (b, n, h, d) in, (b, n, h, d) out
    out = dilated_attention(*(t.transpose(1, 2) for t in (q, k, v)), segment_lengths=SEG, dilation_rates=RATES,
                            mode="groups", causal=causal, impl="reference")
    return out.transpose(1, 2)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("name", ["DilatedAttention", "ImprovedDilatedAttention"])
def test_single_device_numbers_equal_the_groups_reference(name, causal):
    q, k, v = (torch.randn(2, 97, 5, 8, dtype=torch.float64) for _ in range(3))  # (b, n, h, d), N % w != 0
    out = BUILD[name]()(q, k, v, is_causal=causal)
    assert out.shape == q.shape and out.is_contiguous()
    torch.testing.assert_close(out, _groups_reference(q, k, v, causal), rtol=1e-10, atol=1e-10)


def test_multihead_maps_to_modern_groups_module_with_seed_argument_order():
    seed = compat.ImprovedMultiheadDilatedAttention(30, 5, RATES, SEG, dtype=torch.float64)
    modern = MultiheadDilatedAttention(30, 5, SEG, RATES, mode="groups", dtype=torch.float64)
    modern.load_state_dict(seed.state_dict())
    x = torch.randn(2, 97, 30, dtype=torch.float64)
    mask = torch.rand(2, 97) < 0.2
    out, _ = seed(x, key_padding_mask=mask, is_causal=True)  # the seed's improved class returns (out, None)
    torch.testing.assert_close(out, modern(x, key_padding_mask=mask, is_causal=True)[0], rtol=0, atol=0)
    out2, weights = seed(x, need_weights=True)
    assert weights is None and out2.shape == x.shape
    with pytest.raises(ValueError, match="attn_mask"):
        seed(x, attn_mask=torch.zeros(97, 97))
    with pytest.raises(ValueError, match="attention_mask"):
        BUILD["DilatedAttention"]()(*(torch.randn(1, 8, 5, 4) for _ in range(3)), attention_mask=torch.ones(1))


def test_factories_and_configs():
    assert type(compat.create_dilated_attention()).__name__ == "ImprovedDilatedAttention"
    std = compat.create_dilated_attention("standard", SEG, RATES, dropout=0.1)
    assert type(std).__name__ == "DilatedAttention" and std.dropout == 0.1
    mh = compat.create_multihead_dilated_attention(
        "standard", multihead_config=compat.MultiheadConfig(30, 5, layer_norm=False),
        attention_config=compat.DilatedAttentionConfig(SEG, RATES))
    assert type(mh).__name__ == "MultiheadDilatedAttention" and mh.sub_ln is None
    assert mh.config.segment_lengths == tuple(SEG) and mh.config.mode == "groups"
    with pytest.raises(ValueError, match="Unknown attention type"):
        compat.create_dilated_attention("nope")
    with pytest.raises(TypeError, match="unexpected"):
        compat.DilatedAttention(SEG, RATES, not_a_seed_arg=1)
    cfg = compat.RingAttentionConfig([8, 16], [1, 2], block_size=64)
    assert cfg.num_groups == 2 and cfg.to_modern().mode == "groups"
    assert compat.HierarchicalConfig().num_levels == 3
    for bad in (lambda: compat.DilatedAttentionConfig([8], [1, 2]), lambda: compat.MultiheadConfig(30, 4),
                lambda: compat.SparseAttentionConfig([8], [1], pattern_type="x"),
                lambda: compat.DistributedConfig(backend="tcp"), lambda: compat.SparsePatternConfig(block_size=0)):
        with pytest.raises(ValueError):
            bad()
