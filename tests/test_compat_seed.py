"""dilcompile.compat against the seed library (dilated-attention-pytorch at
f6094f7), written down as data: its public names and constructor signatures,
its multihead math (restated in plain torch from a seed-layout state dict),
its return conventions, messages and warnings. docs/compat.md lists every
deliberate difference; the tests here pin the rest."""

import math
import warnings

import pytest
import torch
import torch.nn.functional as F

from dilcompile import compat, dilated_attention
from dilcompile.compat import _deprecation

# Every public name of the seed package, its parameters in order ("name" = required,
# "name=default" with the default's repr, "**kwargs"). Read from the seed's public source.
SEED_SIGNATURES = {
    "AdaptiveConfig": ["base_sparsity=0.9", "temperature=1.0", "learnable_temperature=True", "min_temperature=0.1",
                       "hidden_dim=128", "num_layers=2", "share_across_heads=False", "sparsity_reg_weight=0.01",
                       "hard_sparsity=False"],
    "BlockSparseAdaptive": ["segment_lengths", "dilation_rates", "num_heads", "head_dim", "adaptive_config=None",
                            "**kwargs"],
    "BlockSparseHierarchical": ["segment_lengths", "dilation_rates", "hierarchical_config=None", "sparse_config=None",
                                "**kwargs"],
    "BlockSparseRingDilatedAttention": ["segment_lengths", "dilation_rates", "sparse_config=None", "**kwargs"],
    "BlockSparseRingMultiheadDilatedAttention": ["embed_dim", "num_heads", "segment_lengths", "dilation_rates",
                                                 "dropout=0.0", "bias=True", "sparse_config=None", "batch_first=True",
                                                 "**kwargs"],
    "DilatedAttention": ["segment_lengths", "dilation_rates", "softmax_scale=None", "attention_dropout=0.0", "op=None",
                         "enable_memory_pool=False", "enable_profiling=False", "lightweight_pool=True", "**kwargs"],
    "DistributedImprovedDilatedAttention": ["segment_lengths", "dilation_rates", "dropout=0.0", "use_tf32=True",
                                            "sequence_parallel=False", "model_parallel=False",
                                            "use_flash_attention=True", "dtype=None", "device=None"],
    "HierarchicalConfig": ["level_configs=None"],
    "ImprovedDilatedAttention": ["segment_lengths", "dilation_rates", "dropout=0.0", "use_tf32=True",
                                 "enable_memory_pool=False", "enable_profiling=False", "lightweight_pool=True",
                                 "**kwargs"],
    "ImprovedMultiheadDilatedAttention": ["embed_dim", "num_heads", "dilation_rates", "segment_lengths", "dropout=0.0",
                                          "bias=True", "layer_norm=True", "layer_norm_eps=1e-05", "gamma_init=1.0",
                                          "device=None", "dtype=None", "use_tf32=True"],
    "MultiheadDilatedAttention": ["embed_dim", "num_heads", "dilation_rates", "segment_lengths", "dropout=0.0",
                                  "bias=True", "layer_norm=True", "layer_norm_eps=1e-05", "gamma_init=1.0",
                                  "device=None", "dtype=None", "op=None"],
    "RingDilatedAttention": ["segment_lengths", "dilation_rates", "dropout=0.0", "ring_size=None", "device=None",
                             "dtype=None", "enable_memory_pool=False", "enable_profiling=False",
                             "lightweight_pool=True", "use_pattern_cache=True", "memory_pool_threshold_mb=16.0"],
    "RingDilatedAttentionV2": ["segment_lengths", "dilation_rates", "dropout=0.0", "ring_size=None", "device=None",
                               "dtype=None", "enable_memory_pool=False", "enable_profiling=False",
                               "lightweight_pool=True", "use_pattern_cache=True"],
    "RingDilatedAttentionV2Collective": ["segment_lengths", "dilation_rates", "dropout=0.0", "ring_size=None",
                                         "device=None", "dtype=None", "enable_memory_pool=False",
                                         "enable_profiling=False", "lightweight_pool=True", "use_pattern_cache=True",
                                         "memory_pool_threshold_mb=16.0"],
    "SparsePatternConfig": ["pattern_type='dilated_sparse'", "sparsity_ratio=0.1", "block_size=128",
                            "local_window_size=512", "global_tokens=64"],
    "create_adaptive_sparse_attention": ["embed_dim=768", "num_heads=12", "min_sparsity=0.1", "max_sparsity=0.9",
                                         "**kwargs"],
    "create_block_sparse_attention": ["sparsity_ratio=0.9", "pattern_type='dilated_sparse'", "embed_dim=768",
                                      "num_heads=12", "**kwargs"],
    "create_dilated_attention": ["attention_type='auto'", "segment_lengths=None", "dilation_rates=None", "**kwargs"],
    "create_multihead_dilated_attention": ["attention_type='auto'", "embed_dim=768", "num_heads=12",
                                           "segment_lengths=None", "dilation_rates=None", "**kwargs"],
    # the seed's dilated_attention_pytorch.core configs (compat has one namespace for every module path)
    "DilatedAttentionConfig": ["segment_lengths", "dilation_rates", "dropout=0.0", "use_tf32=True", "device=None",
                               "dtype=None"],
    "MultiheadConfig": ["embed_dim", "num_heads", "bias=True", "layer_norm=True", "layer_norm_eps=1e-05",
                        "gamma_init=1.0", "device=None", "dtype=None"],
    "SparseAttentionConfig": ["segment_lengths", "dilation_rates", "dropout=0.0", "use_tf32=True", "device=None",
                              "dtype=None", "pattern_type='dilated_sparse'", "sparsity_ratio=0.25", "block_size=128",
                              "enable_adaptive=False", "min_sparsity=0.1", "max_sparsity=0.9"],
    "DistributedConfig": ["world_size=None", "rank=None", "backend='nccl'", "sequence_parallel=False",
                          "model_parallel=False", "pipeline_parallel=False", "gradient_checkpointing=False",
                          "communication_optimization=True", "bucket_size_mb=25", "enable_async_communication=True",
                          "gradient_compression_ratio=None", "zero_stage=0"],
    "RingAttentionConfig": ["segment_lengths", "dilation_rates", "dropout=0.0", "use_tf32=True", "device=None",
                            "dtype=None", "block_size=1024", "ring_size=None", "use_checkpointing=True",
                            "use_memory_pool=True", "max_cached_buffers=50"],  # core's; the top-level one differs
}
# Seed public names compat does not provide (docs/compat.md says why and what to use instead).
NOT_PROVIDED = [
    "AdaptiveSparsityTrainer", "BlockSparseOptimized", "BlockSparseRingDistributedDilatedAttention",
    "BlockSparseTorchSparse", "DilatedTransformerDecoderLayer", "DilatedTransformerEncoderLayer",
    "DistributedImprovedMultiheadDilatedAttention", "DistributedSparseConfig", "DistributedSparsePattern",
    "ImportanceScorer", "LongNet", "PatternConfig", "PatternOptimizer", "PatternQualityAnalyzer", "PatternType",
    "RingDilatedAttentionProduction", "RingDilatedAttentionV2Flash", "SparsePatternGenerator",
    "create_adaptive_block_sparse", "create_hierarchical_attention", "create_production_ring_attention",
    "get_hierarchical_presets",
]
OURS_ONLY = ["RingMultiheadDilatedAttention", "SeedAPIDeprecationWarning", "pattern_from_seed_config"]

E, H = 32, 4
SEG, RATES = [8, 16], [1, 2]


@pytest.fixture(autouse=True)
def _quiet_and_fresh():
    _deprecation._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", compat.SeedAPIDeprecationWarning)
        yield


def _render(obj) -> list[str]:
    import inspect

    out = []
    for p in inspect.signature(obj).parameters.values():
        if p.kind is p.VAR_KEYWORD:
            out.append(f"**{p.name}")
        else:
            out.append(p.name if p.default is p.empty else f"{p.name}={p.default!r}")
    return out


# -- names and signatures -----------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(SEED_SIGNATURES))
def test_every_provided_seed_name_has_the_seed_signature(name):
    assert _render(getattr(compat, name)) == SEED_SIGNATURES[name]


def test_every_public_name_is_a_seed_name_or_listed():
    assert set(compat.__all__) == set(SEED_SIGNATURES) | set(OURS_ONLY)
    assert not any(hasattr(compat, n) for n in NOT_PROVIDED)
    assert compat.RingDilatedAttention is compat.RingDilatedAttentionV2Collective  # the seed's alias


def test_compat_table_names_every_seed_name_and_the_filter_line():
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "compat.md").read_text()
    for name in [*SEED_SIGNATURES, *NOT_PROVIDED]:
        assert f"`{name}`" in doc, name
    assert 'warnings.filterwarnings("ignore", category=SeedAPIDeprecationWarning)' in doc


@pytest.mark.parametrize("build, attr, want", [
    (lambda: compat.RingDilatedAttention([64], [1], 0.0, 1), "ring_size", 1),  # 4th positional is ring_size
    (lambda: compat.RingDilatedAttentionV2([64], [1], 0.0, 2), "ring_size", 2),
    (lambda: compat.RingDilatedAttention([64], [1], enable_memory_pool=False, use_pattern_cache=True), "ring_size",
     None),
    (lambda: compat.RingDilatedAttentionV2Collective([64], [1], use_pattern_cache=True, memory_pool_threshold_mb=16.0),
     "dropout", 0.0),
    (lambda: compat.ImprovedDilatedAttention([64], [1], enable_memory_pool=True), "dropout", 0.0),
    (lambda: compat.ImprovedDilatedAttention([64], [1], 0.1, False, True, True, False), "dropout", 0.1),
    (lambda: compat.DilatedAttention([64], [1], None, 0.2, None, True, True, False, use_tf32=False), "dropout", 0.2),
    (lambda: compat.create_dilated_attention("improved", [64], [1], enable_memory_pool=True), "dropout", 0.0),
    (lambda: compat.create_dilated_attention("distributed", [64], [1], enable_memory_pool=True), "dropout", 0.0),
    (lambda: compat.create_multihead_dilated_attention("improved", 32, 4, [64], [1], enable_memory_pool=True,
                                                       lightweight_pool=True), "embed_dim", 32),
])
def test_seed_constructor_keywords_are_accepted(build, attr, want):
    assert getattr(build(), attr) == want


# -- the seed's multihead math, restated from a seed-layout state dict -------------------------
def _seed_state_dict(kind: str, layer_norm: bool, seed: int = 0) -> dict:
    """Random parameters in the seed's layout (float64): separate q/k/v projections
    ('standard', 'block_sparse') or a fused one ('improved'); q_ln / k_ln LayerNorms."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64) / math.sqrt(shape[-1])

    sd = {}
    if kind == "improved":
        sd["qkv_proj.weight"], sd["qkv_proj.bias"] = rnd(3 * E, E), rnd(3 * E)
    else:
        for p in "qkv":
            sd[f"{p}_proj.weight"], sd[f"{p}_proj.bias"] = rnd(E, E), rnd(E)
    sd["out_proj.weight"], sd["out_proj.bias"] = rnd(E, E), rnd(E)
    if layer_norm:
        for ln in ("q_ln", "k_ln"):
            sd[f"{ln}.weight"], sd[f"{ln}.bias"] = 1 + rnd(E), rnd(E)
    return sd


def _heads(t):  # (B, N, E) → (B, H, N, D)
    return t.unflatten(-1, (H, E // H)).transpose(1, 2)


def _seed_multihead(sd, kind, query, key, value, causal):
    """The seed's forward: project; 'standard' with LayerNorms normalises q with
    q_ln and k with k_ln; head-group dilated attention; q_ln on the attention
    output (both multihead classes); output projection."""
    if kind == "improved":
        wq, wk, wv = sd["qkv_proj.weight"].chunk(3)
        bq, bk, bv = sd["qkv_proj.bias"].chunk(3)
    else:
        (wq, bq), (wk, bk), (wv, bv) = ((sd[f"{p}_proj.weight"], sd[f"{p}_proj.bias"]) for p in "qkv")
    q, k, v = F.linear(query, wq, bq), F.linear(key, wk, bk), F.linear(value, wv, bv)
    ln = "q_ln.weight" in sd
    if ln and kind == "standard":
        q = F.layer_norm(q, (E,), sd["q_ln.weight"], sd["q_ln.bias"])
        k = F.layer_norm(k, (E,), sd["k_ln.weight"], sd["k_ln.bias"])
    out = dilated_attention(_heads(q), _heads(k), _heads(v), segment_lengths=SEG, dilation_rates=RATES,
                            mode="groups", causal=causal, impl="reference").transpose(1, 2).flatten(2)
    if ln:
        out = F.layer_norm(out, (E,), sd["q_ln.weight"], sd["q_ln.bias"])
    return F.linear(out, sd["out_proj.weight"], sd["out_proj.bias"])


MULTIHEAD = {"standard": "MultiheadDilatedAttention", "improved": "ImprovedMultiheadDilatedAttention"}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("layer_norm", [True, False])
@pytest.mark.parametrize("kind", sorted(MULTIHEAD))
def test_multihead_loads_seed_state_dict_and_gives_the_seed_math(kind, layer_norm, causal):
    module = getattr(compat, MULTIHEAD[kind])(E, H, RATES, SEG, layer_norm=layer_norm, dtype=torch.float64)
    sd = _seed_state_dict(kind, layer_norm)
    module.load_state_dict(sd)  # strict: the seed's keys as they are
    g = torch.Generator().manual_seed(1)
    x, kv = (torch.randn(2, 37, E, generator=g, dtype=torch.float64) for _ in range(2))  # N % 16 != 0
    for query, key in ((x, x), (x, kv)):  # self- and cross-attention
        out = module(query, key, key, is_causal=causal)
        out = out[0] if kind == "improved" else out
        torch.testing.assert_close(out, _seed_multihead(sd, kind, query, key, key, causal), rtol=1e-10, atol=1e-10)


def test_multihead_q_and_k_layernorm_changes_the_output():
    # the seed's q/k LayerNorm is not a no-op: skipping it changes the output by O(1)
    module = compat.MultiheadDilatedAttention(E, H, RATES, SEG, dtype=torch.float64)
    sd = _seed_state_dict("standard", True)
    module.load_state_dict(sd)
    fused = {"qkv_proj.weight": torch.cat([sd[f"{p}_proj.weight"] for p in "qkv"]),
             "qkv_proj.bias": torch.cat([sd[f"{p}_proj.bias"] for p in "qkv"]),
             **{k: v for k, v in sd.items() if k.startswith(("out_proj", "q_ln"))}}
    x = torch.randn(1, 32, E, dtype=torch.float64)
    assert (module(x) - _seed_multihead(fused, "improved", x, x, x, False)).abs().max() > 0.1


def test_seed_value_defaults_to_query_not_key():
    module = compat.MultiheadDilatedAttention(E, H, RATES, SEG, dtype=torch.float64)
    sd = _seed_state_dict("standard", True)
    module.load_state_dict(sd)
    x, kv = (torch.randn(1, 32, E, dtype=torch.float64) for _ in range(2))
    torch.testing.assert_close(module(x, kv), _seed_multihead(sd, "standard", x, kv, x, False), rtol=1e-10,
                               atol=1e-10)


@pytest.mark.parametrize("causal", [False, True])
def test_block_sparse_multihead_loads_seed_state_dict_and_matches_its_block_diagonal_case(causal):
    # local_window_size < 2 * block_size: each query block sees only its own key block,
    # the one case where the seed's per-block softmax is the exact softmax
    cfg = compat.SparsePatternConfig(pattern_type="local_window", block_size=16, local_window_size=16)
    module = compat.BlockSparseRingMultiheadDilatedAttention(E, H, [16], [1], sparse_config=cfg, dtype=torch.float64)
    sd = _seed_state_dict("block_sparse", False)
    module.load_state_dict(sd)
    x = torch.randn(2, 64, E, dtype=torch.float64)
    q, k, v = (_heads(F.linear(x, sd[f"{p}_proj.weight"], sd[f"{p}_proj.bias"])) for p in "qkv")
    blocks = torch.arange(64) // 16
    mask = blocks[:, None] == blocks[None, :]
    if causal:
        mask &= torch.ones(64, 64, dtype=torch.bool).tril()
    attn = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).flatten(2)
    want = F.linear(attn, sd["out_proj.weight"], sd["out_proj.bias"])
    torch.testing.assert_close(module(x, x, x, is_causal=causal), want, rtol=1e-10, atol=1e-10)
    assert module.sub_ln is None  # the seed's block-sparse multihead has no LayerNorm


def test_our_own_state_dicts_still_load():
    for cls in (compat.MultiheadDilatedAttention, compat.ImprovedMultiheadDilatedAttention):
        a, b = cls(E, H, RATES, SEG), cls(E, H, RATES, SEG)
        b.load_state_dict(a.state_dict())
        x = torch.randn(1, 16, E)
        torch.testing.assert_close(cls.forward(b, x, need_weights=True)[0], cls.forward(a, x, need_weights=True)[0])


# -- return conventions --------------------------------------------------------------------------
def test_return_conventions_follow_the_seed():
    x = torch.randn(2, 16, E)
    improved = compat.ImprovedMultiheadDilatedAttention(E, H, RATES, SEG)
    out, weights = improved(x, x, x)  # the seed idiom
    assert out.shape == x.shape and weights is None
    for factory_kind in ("improved", "auto"):
        made = compat.create_multihead_dilated_attention(factory_kind, E, H, SEG, RATES)
        out, weights = made(x, x, x)
        assert out.shape == x.shape and weights is None
    standard = compat.MultiheadDilatedAttention(E, H, RATES, SEG)
    assert isinstance(standard(x), torch.Tensor)
    out, weights = standard(x, need_weights=True)
    assert weights is None
    sparse = compat.BlockSparseRingMultiheadDilatedAttention(E, H, SEG, RATES)
    assert isinstance(sparse(x, x, x), torch.Tensor)


# -- messages ------------------------------------------------------------------------------------
def test_single_device_shape_errors_describe_the_input_as_given():
    attention = compat.DilatedAttention([256], [1])
    x = torch.randn(10, 256, 64)
    with pytest.raises(ValueError, match=r"expected 4D tensor .* got 3D with shape \(10, 256, 64\).*x\.view"):
        attention(x, x, x)
    with pytest.raises(ValueError, match="Shape mismatch at dimension 3: query has size 64, key has size 32"):
        attention(torch.randn(2, 256, 8, 64), torch.randn(2, 256, 8, 32), torch.randn(2, 256, 8, 64))
    for cls in (compat.ImprovedDilatedAttention, compat.RingDilatedAttention, compat.BlockSparseRingDilatedAttention):
        with pytest.raises(ValueError, match=r"got 3D with shape \(10, 256, 64\)"):
            cls([256], [1])(x, x, x)


@pytest.mark.parametrize("build, pattern", [
    (lambda: compat.DilatedAttention([], []), "segment_lengths cannot be empty"),
    (lambda: compat.DilatedAttention([512], [1, 2]), "must have the same length"),
    (lambda: compat.DilatedAttention([512, -256], [1, 2]), r"segment_lengths\[1\] must be positive"),
    (lambda: compat.DilatedAttention([512, 256], [1, 0]), r"dilation_rates\[1\] must be positive"),
    (lambda: compat.DilatedAttention([512], [1], attention_dropout=1.5), "must be between 0.0 and 1.0"),
    (lambda: compat.MultiheadDilatedAttention(100, 12, [1], [512]), "must be divisible by"),
    (lambda: compat.SparsePatternConfig(block_size=0), "block_size must be positive"),
    (lambda: compat.create_dilated_attention("nope"), "Unknown attention type"),
])
def test_seed_validation_messages_are_kept(build, pattern):
    with pytest.raises(ValueError, match=pattern):
        build()


def test_multihead_input_messages():
    attention = compat.MultiheadDilatedAttention(512, 8, [1], [128])
    with pytest.raises(ValueError, match="Expected 3D tensors"):
        attention(torch.randn(2, 128, 512, 1))
    with pytest.raises(ValueError, match="embedding dimension"):
        attention(torch.randn(2, 128, 256))


@pytest.mark.parametrize("build", [
    lambda e, h: compat.MultiheadDilatedAttention(e, h, [1], [512]),
    lambda e, h: compat.ImprovedMultiheadDilatedAttention(e, h, [1], [512]),
    lambda e, h: compat.MultiheadConfig(e, h),
])
def test_head_dim_performance_hints_are_kept(build):
    for (e, h), text in (((84, 12), "should be divisible by 8"), ((2048, 8), "> 128")):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            build(e, h)
        hints = [w for w in seen if w.category is UserWarning]
        assert len(hints) == 1 and text in str(hints[0].message) and "head_dim" in str(hints[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        build(64, 8)


# -- the deprecation warning ---------------------------------------------------------------------
def test_the_warning_is_a_deprecation_warning_one_filter_silences():
    assert issubclass(compat.SeedAPIDeprecationWarning, DeprecationWarning)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        compat.ImprovedDilatedAttention([64], [1])
    assert [w.category for w in seen] == [compat.SeedAPIDeprecationWarning]
    assert seen[0].filename == __file__
    _deprecation._warned.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the seed's pytest config: every other warning is an error
        warnings.filterwarnings("ignore", category=compat.SeedAPIDeprecationWarning)
        compat.ImprovedDilatedAttention([64], [1])
        compat.RingDilatedAttention([64], [1])


# -- the seed's behaviour tests, restated --------------------------------------------------------
def test_ring_without_a_process_group_is_the_single_device_attention():
    q, k, v = (torch.randn(1, 64, 4, 8, dtype=torch.float64) for _ in range(3))
    want = compat.ImprovedDilatedAttention([16, 32], [1, 2])(q, k, v, is_causal=True)
    for ring_size in (None, 1, 4):  # the seed simulated any ring size on one device
        ring = compat.RingDilatedAttention([16, 32], [1, 2], ring_size=ring_size)
        torch.testing.assert_close(ring(q, k, v, is_causal=True), want, rtol=1e-12, atol=1e-12)


def test_seed_boundary_cases():
    one = compat.DilatedAttention([1], [1])(*(torch.randn(1, 1, 1, 32) for _ in range(3)))
    assert one.shape == (1, 1, 1, 32)
    q = torch.randn(1, 1024, 5, 16)  # as many heads as groups
    out = compat.DilatedAttention([64, 128, 256, 512, 1024], [1, 2, 4, 8, 16])(q, q, q)
    assert out.shape == q.shape
    q = torch.randn(1, 256, 6, 8)  # rates far above the segment length
    out = compat.DilatedAttention([32, 32, 32], [1, 100, 1000])(q, q, q)
    assert torch.isfinite(out).all()


def test_seed_causal_property_future_tokens_do_not_leak():
    attention = compat.DilatedAttention([32, 64], [1, 2])
    q, k, v = (torch.randn(1, 64, 4, 8) for _ in range(3))
    base = attention(q, k, v, is_causal=True)
    k2, v2 = k.clone(), v.clone()
    k2[:, 40:], v2[:, 40:] = torch.randn(1, 24, 4, 8), torch.randn(1, 24, 4, 8)
    torch.testing.assert_close(attention(q, k2, v2, is_causal=True)[:, :40], base[:, :40])


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e3])
def test_seed_numerical_stability_extreme_inputs(scale):
    module = compat.MultiheadDilatedAttention(E, H, RATES, SEG)
    x = (torch.randn(2, 32, E) * scale).requires_grad_()
    out = module(x, x, x)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()


def test_seed_single_hot_attention_picks_the_matching_key():
    attention = compat.DilatedAttention([16], [1])
    q, k = torch.zeros(1, 16, 1, 8), torch.zeros(1, 16, 1, 8)
    q[0, :, 0, 0], k[0, 5, 0, 0] = 100.0, 1.0
    v = torch.randn(1, 16, 1, 8)
    torch.testing.assert_close(attention(q, k, v), v[:, 5:6].expand(1, 16, 1, 8))
