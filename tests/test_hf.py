"""Hugging Face transformers integration on a tiny, randomly initialised
Llama-style model built from a config (no downloads)."""

import copy

import pytest
import torch

from transformers import AutoModelForCausalLM  # the [hf] extra, installed by the test command

from dilcompile.integrations.transformers import register
from helpers import tiny_config, tiny_model

register()


def _config(**extra):
    cfg = tiny_config()
    for key, value in extra.items():
        setattr(cfg, key, value)
    return cfg


def test_dense_config_equals_sdpa_logits():
    """Segments as long as the sequence, rate 1: exactly causal attention (GQA, scaling included)."""
    cfg = _config(dilcompile_segment_lengths=[256], dilcompile_dilation_rates=[1],
                  dilcompile_pattern="local_window(window=256)")
    sdpa = tiny_model("sdpa", cfg)
    ids = torch.randint(0, 61, (2, 37))
    want = sdpa(ids).logits
    for impl in ("dilcompile_dilated", "dilcompile_block_sparse"):
        got = tiny_model(impl, cfg, state=sdpa.state_dict())(ids).logits
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, msg=impl)


def test_left_padding_equals_sdpa_on_real_tokens():
    cfg = _config(dilcompile_segment_lengths=[256], dilcompile_dilation_rates=[1])
    sdpa = tiny_model("sdpa", cfg)
    ours = tiny_model("dilcompile_dilated", cfg, state=sdpa.state_dict())
    ids = torch.randint(0, 61, (2, 20))
    mask = torch.ones(2, 20, dtype=torch.long)
    mask[0, :5] = 0  # left padding
    want, got = sdpa(ids, attention_mask=mask).logits, ours(ids, attention_mask=mask).logits
    assert sdpa.config._attn_implementation == "sdpa"  # it compared ours with ours while they shared a config
    keep = mask.bool()
    torch.testing.assert_close(got[keep], want[keep], rtol=1e-9, atol=1e-9)


class _Recorder:
    """Wraps our attention functions to recompute each call with the float64 reference."""

    def __init__(self, fn):
        self.fn, self.calls = fn, 0

    def __call__(self, q, k, v, *args, **kwargs):
        out = self.fn(q, k, v, *args, **kwargs)
        want = self.fn(q, k, v, *args, **(kwargs | {"impl": "reference"}))
        torch.testing.assert_close(out, want, rtol=1e-9, atol=1e-9)
        self.calls += 1
        return out


@pytest.mark.parametrize("impl, module_fn", [("dilcompile_dilated", "dilated_attention"),
                                             ("dilcompile_block_sparse", "block_sparse_attention")])
def test_real_dilation_logits_equal_our_reference(monkeypatch, impl, module_fn):
    """Real dilation / sparsity: every attention call of the model equals our float64 reference on the
    inputs HF passes (repeated kv heads, scaling), and the logits equal a model built on the reference."""
    import dilcompile

    cfg = _config(dilcompile_segment_lengths=[8, 16, 32], dilcompile_dilation_rates=[1, 2, 4],
                  dilcompile_pattern="union(local_window(window=5), dilated(segment_lengths=(16,), "
                                     "dilation_rates=(2,)))", dilcompile_block_size=16)
    ids = torch.randint(0, 61, (2, 45))
    model = tiny_model(impl, cfg)
    got = model(ids).logits
    original = getattr(dilcompile, module_fn)
    recorder = _Recorder(original)
    def on_reference(q, k, v, *a, **kw):
        return original(q, k, v, *a, **(kw | {"impl": "reference"}))
    monkeypatch.setattr(dilcompile, module_fn, on_reference)
    want = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)
    monkeypatch.setattr(dilcompile, module_fn, recorder)
    model(ids)
    assert recorder.calls == cfg.num_hidden_layers


def test_training_step_finite_gradients():
    cfg = _config(dilcompile_segment_lengths=[8, 16], dilcompile_dilation_rates=[1, 2])
    model = tiny_model("dilcompile_dilated", cfg).train()
    ids = torch.randint(0, 61, (2, 30))
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    assert all(g is not None and g.isfinite().all() for g in grads)
    assert any(g.abs().sum() > 0 for g in grads if g.dim() == 2 and g.shape[0] != 61)
    torch.optim.SGD(model.parameters(), lr=1e-2).step()
    assert model(ids, labels=ids).loss.isfinite()


@pytest.mark.parametrize("impl", ["dilcompile_dilated", "dilcompile_block_sparse"])
def test_greedy_generate_with_cache_equals_without(impl):
    cfg = _config(dilcompile_segment_lengths=[8, 16, 32], dilcompile_dilation_rates=[1, 2, 4],
                  dilcompile_pattern="local_window(window=6)", dilcompile_block_size=16)
    model = tiny_model(impl, cfg)
    prompt = torch.randint(0, 61, (1, 9))
    kw = dict(max_new_tokens=25, min_new_tokens=25, do_sample=False, pad_token_id=0)
    with_cache = model.generate(prompt, use_cache=True, **kw)
    without = model.generate(prompt, use_cache=False, **kw)
    assert with_cache.shape == (1, 34)
    assert torch.equal(with_cache, without)


def test_missing_config_key_is_a_clear_error():
    model = tiny_model("dilcompile_dilated", _config(dilcompile_dilation_rates=[1]))
    with pytest.raises(ValueError, match="dilcompile_segment_lengths"):
        model(torch.randint(0, 61, (1, 5)))


def test_dropout_is_refused():
    cfg = _config(dilcompile_segment_lengths=[8], dilcompile_dilation_rates=[1], attention_dropout=0.1)
    model = tiny_model("dilcompile_dilated", cfg).train()
    with pytest.raises(ValueError, match="attention_dropout"):
        model(torch.randint(0, 61, (1, 5)))


@pytest.mark.parametrize("arch", ["bloom", "codegen"])
def test_models_with_their_own_attention_code_are_refused(arch):
    """BLOOM and CodeGen never call transformers' AttentionInterface: they ran silently non-causal with our
    name (they got our padding mask instead of the causal one). Refused, naming the model."""
    import transformers as tf

    config = {"bloom": lambda: tf.BloomConfig(vocab_size=61, hidden_size=32, n_layer=1, n_head=4),
              "codegen": lambda: tf.CodeGenConfig(vocab_size=61, n_embd=32, n_layer=1, n_head=4, rotary_dim=4,
                                                  n_positions=64, n_ctx=64)}[arch]()
    config.dilcompile_segment_lengths, config.dilcompile_dilation_rates = [64], [1]
    if getattr(AutoModelForCausalLM.from_config(copy.deepcopy(config)), "_supports_attention_backend", False):
        # CodeGen moved onto the interface in transformers 5.24: ours serves it, causal (one covering
        # segment equals the causal attention it had)
        torch.manual_seed(0)
        ours = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="dilcompile_dilated",
                                                dtype=torch.float64).eval()
        eager = AutoModelForCausalLM.from_config(copy.deepcopy(config), attn_implementation="eager",
                                                 dtype=torch.float64).eval()
        eager.load_state_dict(ours.state_dict())
        ids = torch.randint(0, 61, (2, 17))
        torch.testing.assert_close(ours(ids).logits, eager(ids).logits, rtol=1e-9, atol=1e-9)
        return
    with pytest.raises(ValueError, match="runs its own attention code"):
        AutoModelForCausalLM.from_config(config, attn_implementation="dilcompile_dilated")
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    model.set_attn_implementation("dilcompile_block_sparse")  # transformers warns and keeps eager: correct
    assert model.config._attn_implementation == "eager"
