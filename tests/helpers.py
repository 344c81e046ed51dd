"""Fixtures shared by several test files: the block-sparse pattern table, the
float64 comparison of out, lse and their gradients, and the tiny random
Hugging Face models."""

import copy

import torch

from dilcompile.patterns import (dilated, global_local, hierarchical, hilbert, intersection, local_window,
                                 random_blocks, union)

_HILBERT_SIDE = {100: 10, 128: 8, 1000: 25}

#: name → pattern for a sequence of n positions (n in 100, 128, 1000 for hilbert).
PATTERNS = {
    "local_window": lambda n: local_window(7),
    "dilated": lambda n: dilated((16, 48), (1, 3)),
    "global_local": lambda n: global_local(5, 3),
    "random_blocks": lambda n: random_blocks(0.3, 24, 1),
    "hierarchical": lambda n: hierarchical(((1, 4), (8, 3))),
    "hilbert": lambda n: hilbert(_HILBERT_SIDE[n], n // _HILBERT_SIDE[n], 1),
    "union": lambda n: union(local_window(3), random_blocks(0.1, 16, 2)),
    "intersection": lambda n: intersection(local_window(40), hierarchical()),
}


def assert_out_lse_and_gradients_match(out, lse, ref, ref_lse, inputs, msg=""):
    """out, lse equal ref, ref_lse to 1e-10 (lse where the reference is finite,
    non-finite at the same rows); gradients of a random loss through both with
    respect to ``inputs`` (q, k, v) equal to 1e-9 and free of NaN."""
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10, msg=msg or None)
    assert torch.equal(lse.isfinite(), ref_lse.isfinite()), msg
    covered = ref_lse.isfinite()
    torch.testing.assert_close(lse[covered], ref_lse[covered], rtol=1e-10, atol=1e-10, msg=msg or None)

    grad_out = torch.randn_like(out)
    grad_lse = torch.randn_like(lse) * covered
    def loss(o, l):
        return (o * grad_out).sum() + (l.nan_to_num(0.0, 0.0, 0.0) * grad_lse).sum()
    got = torch.autograd.grad(loss(out, lse), inputs)
    want = torch.autograd.grad(loss(ref, ref_lse), inputs)
    for name, g, w in zip("qkv", got, want):
        assert not g.isnan().any(), f"d{name} NaN: {msg}"
        torch.testing.assert_close(g, w, rtol=1e-9, atol=1e-9, msg=f"d{name}: {msg}")


def tiny_config(family: str = "llama", *, vocab: int = 61, hidden: int = 48, layers: int = 2, heads: int = 6,
                kv_heads: int = 2, positions: int = 256, **keys):
    """A tiny random Hugging Face config of a model ``family`` (llama, qwen2, mistral: grouped key /
    value heads; gpt2, bert: one per head) in the family's own field names, MLP twice the width,
    no dropout; ``keys`` go to the config as they are. No download: the HF tests build their models
    from these."""
    import transformers  # the [hf] extra: only the HF tests import it

    if family == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
                                       n_positions=positions, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0, **keys)
    if family == "bert":
        return transformers.BertConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                       num_hidden_layers=layers, num_attention_heads=heads,
                                       max_position_embeddings=positions, attention_probs_dropout_prob=0.0,
                                       hidden_dropout_prob=0.0, **keys)
    config = {"llama": transformers.LlamaConfig, "qwen2": transformers.Qwen2Config,
              "mistral": transformers.MistralConfig}[family]
    return config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=positions, **keys)


def tiny_model(impl: str, config, *, dtype: torch.dtype = torch.float64, state: dict | None = None):
    """The model of ``config`` (an encoder for bert, else a causal LM) with attention ``impl``, in
    ``dtype``, in eval mode: weights from seed 0, or ``state`` (another model's state_dict)."""
    from transformers import AutoModel, AutoModelForCausalLM

    torch.manual_seed(0)
    build = AutoModel if config.model_type == "bert" else AutoModelForCausalLM
    # a copy: from_config keeps the object and sets its attention, so a second model would switch the first
    model = build.from_config(copy.deepcopy(config), attn_implementation=impl, dtype=dtype).eval()
    if state is not None:
        model.load_state_dict(state)
    return model
