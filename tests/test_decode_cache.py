"""KV cache: the multihead module with a cache equals the full call's last
rows; LongNetDecoder.generate with the cache gives the recompute path's
greedy tokens, eager and compiled (fullgraph, no recompile per token); a
mismatched cache is a ValueError before any compute."""

import copy

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

from dilcompile import MultiheadBlockSparseAttention, MultiheadDilatedAttention
from dilcompile.kv_cache import KVCache
from dilcompile.models import LongNetConfig, LongNetDecoder
from dilcompile.testing import assert_within_low_precision_budget

SMALL = dict(vocab_size=19, max_seq_len=64, embed_dim=32, num_heads=4, num_layers=2, segment_lengths=(8, 16, 32),
             dilation_rates=(1, 2, 4))


@pytest.mark.parametrize("make", [
    lambda: MultiheadDilatedAttention(24, 3, (8, 16), (1, 2), dtype=torch.float64),
    lambda: MultiheadBlockSparseAttention(24, 3, "local_window(window=5)", block_size=8, dtype=torch.float64),
], ids=["dilated", "block_sparse"])
def test_module_with_cache_equals_full_call_rows(make):
    mha = make()
    x = torch.randn(2, 41, 24, dtype=torch.float64)
    full, _ = mha(x, is_causal=True)
    cache = KVCache(1, 2, 3, 41, 8, dtype=torch.float64)
    chunks = [(0, 20), (20, 21), (21, 30), (30, 41)]  # prefill, one token, chunked prefill, more
    outs = [mha(x[:, a:b], is_causal=True, cache=cache, start_pos=a)[0] for a, b in chunks]
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-10, atol=1e-10)


def test_greedy_generate_with_cache_equals_recompute():
    torch.manual_seed(0)
    model = LongNetDecoder(LongNetConfig(**SMALL)).eval()
    prompt = torch.randint(0, 19, (2, 5))
    want = model.generate(prompt, 40, temperature=0, use_cache=False)
    got = model.generate(prompt, 40, temperature=0, use_cache=True)
    assert torch.equal(got, want)
    with torch.no_grad():  # and the logits agree, not only their argmax
        cache = model.new_cache(2)
        model(want[:, :30], cache=cache)
        step, _ = model(want[:, 30:31], cache=cache, start_pos=30)
        full, _ = model(want[:, :31])
    torch.testing.assert_close(step[:, -1], full[:, -1], rtol=1e-5, atol=1e-5)


def test_compiled_generate_fullgraph_recompiles_do_not_grow_with_tokens():
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = LongNetDecoder(LongNetConfig(**(SMALL | {"num_layers": 1}))).eval()
    prompt = torch.randint(0, 19, (1, 4))
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend=counter)
    want = model.generate(prompt, 30, temperature=0, use_cache=False)
    got = model.generate(prompt, 30, temperature=0, forward=compiled)
    assert torch.equal(got, want)
    frames_after_30 = counter.frame_count
    got = model.generate(torch.randint(0, 19, (1, 7)), 50, temperature=0, forward=compiled)
    assert counter.frame_count == frames_after_30, "a longer generation compiled again"
    # Two compiles: the prefill graph (start_pos 0) and the decode step; the counter also
    # counts the prefill's one analysis restart inside Dynamo (compile id 0/0_1, not a recompile).
    assert frames_after_30 <= 3, frames_after_30
    torch._dynamo.reset()


@pytest.mark.parametrize("cache, match", [
    (lambda: KVCache(2, 3, 4, 64, 8), "batch"),
    (lambda: KVCache(2, 2, 5, 64, 8), "num_heads"),
    (lambda: KVCache(2, 2, 4, 64, 8, dtype=torch.float64), "dtype"),
    (lambda: KVCache(2, 2, 4, 64, 8, device="meta"), "device"),
    (lambda: KVCache(1, 2, 4, 64, 8), "layer"),
    (lambda: KVCache(2, 2, 4, 8, 8), "max_len"),
])
def test_mismatched_cache_is_a_value_error(cache, match):
    model = LongNetDecoder(LongNetConfig(**SMALL))
    with pytest.raises(ValueError, match=match):
        model(torch.zeros(2, 10, dtype=torch.long), cache=cache())


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(start_pos=True), TypeError, "start_pos must be an int"),  # ran as position 1
    (dict(start_pos=1.0), TypeError, "start_pos must be an int"),
    (dict(layer_idx=True), TypeError, "layer_idx must be an int"),  # an internal shape error
    (dict(layer_idx=False), TypeError, "layer_idx must be an int"),
])
def test_cache_positions_and_layers_are_ints(kwargs, error, match):
    mha = MultiheadDilatedAttention(32, 4, (8,), (1,), dtype=torch.float64).eval()
    x = torch.randn(1, 6, 32, dtype=torch.float64)
    with pytest.raises(error, match=match):
        mha(x, is_causal=True, cache=KVCache(2, 1, 4, 16, 8, dtype=torch.float64), **kwargs)


def test_use_cache_beyond_max_seq_len_is_a_value_error():
    model = LongNetDecoder(LongNetConfig(**SMALL))
    with pytest.raises(ValueError, match="use_cache=False"):
        model.generate(torch.zeros(1, 60, dtype=torch.long), 10, use_cache=True)


def _cached_logits(model, tokens, prompt_len, **cache_args):
    """Logits (B, N, vocab) of every position of tokens, the prompt in one
    call and then one token per call through a fresh cache."""
    cache = model.new_cache(tokens.shape[0], **cache_args)
    logits = [model(tokens[:, :prompt_len], cache=cache)[0]]
    for pos in range(prompt_len, tokens.shape[1]):
        logits.append(model(tokens[:, pos : pos + 1], cache=cache, start_pos=pos)[0])
    return torch.cat(logits, 1)


@pytest.mark.parametrize("explicit_dtype", [False, True], ids=["new_cache", "KVCache(dtype=bfloat16)"])
def test_generate_under_autocast_matches_the_uncached_forward_within_the_bf16_budget(explicit_dtype):
    """Under torch.autocast the projections give bf16 keys: the cache holds
    them in bf16 (built by new_cache under the autocast, or explicitly), greedy
    generation runs, and its logits are as close to the float64 model as the
    plain uncached forward under the same autocast (flash-attention's rule)."""
    torch.manual_seed(0)
    model = LongNetDecoder(LongNetConfig(**SMALL)).eval()
    model64 = copy.deepcopy(model).double()
    prompt = torch.randint(0, 19, (2, 20))  # longer than the segments 8 and 16: every branch dilates
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        tokens = model.generate(prompt, 12, temperature=0)
        cache_args = {"dtype": torch.bfloat16} if explicit_dtype else {}
        cached = _cached_logits(model, tokens, 20, **cache_args)
        plain, _ = model(tokens)
    with torch.no_grad():
        ref, _ = model64(tokens)
    assert torch.equal(tokens[:, :20], prompt) and tokens.shape == (2, 32)
    assert cached.dtype == torch.bfloat16
    assert_within_low_precision_budget(cached, plain, ref)
    # generate's tokens are the argmax of the cached logits at each step
    assert torch.equal(tokens[:, 20:], cached[:, 19:-1].argmax(-1))


def test_a_cache_of_another_dtype_than_the_keys_is_a_value_error_naming_autocast():
    model = LongNetDecoder(LongNetConfig(**SMALL))
    tokens = torch.zeros(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=r"bfloat16 but the keys are torch.float32; build the cache with dtype"):
        model(tokens, cache=KVCache(2, 2, 4, 64, 8, dtype=torch.bfloat16))
    with torch.autocast("cpu", dtype=torch.bfloat16), pytest.raises(ValueError, match="autocast's dtype"):
        model(tokens, cache=KVCache(2, 2, 4, 64, 8))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):  # the explicit bf16 cache is taken
        logits, _ = model(tokens, cache=KVCache(2, 2, 4, 64, 8, dtype=torch.bfloat16))
    assert logits.shape == (2, 4, 19)
