"""Hugging Face integration: every keyword transformers' models pass their
attention function is honoured as transformers' own sdpa attention honours
it, cannot change the result, or is refused when set, in one line naming
the module and the keyword — none is dropped silently."""

import ast
import collections
import pathlib

import pytest
import torch
import transformers
from transformers import AutoModel, AutoModelForCausalLM, CLIPTextConfig, CLIPTextModel, LlamaConfig

from dilcompile.integrations import transformers as ours
from dilcompile.integrations.transformers import configure, register

register()

IMPLS = ["dilcompile_dilated", "dilcompile_block_sparse"]
VOCAB = 61
# Dense-equivalent settings for inputs shorter than 64: one segment covering them, rate 1; a window wider.
DENSE = {"segment_lengths": [64], "dilation_rates": [1], "pattern": "local_window(window=64)", "block_size": 16}
POSITIONAL = {"query", "key", "value", "attention_mask"}  # the function's named parameters, passed by keyword


_ATTENTION = ("attention_interface", "ALL_ATTENTION_FUNCTIONS")  # in the called expression's names


def _names(node):
    """The identifiers and string constants of an expression: where ``_ATTENTION`` can occur in its source
    (both are identifier characters only, so no match spans punctuation)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            yield sub.id
        elif isinstance(sub, ast.Attribute):
            yield sub.attr
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            yield sub.value


def _attention_calls(tree):
    """(call, enclosing function) for each call of an attention function in a modeling file."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, ast.Call) and any(a in name for name in _names(node.func) for a in _ATTENTION):
                    yield node, fn


def _dict_keys(fn, name):
    """Keys of a dict literal (or dict(...) call) assigned to ``name`` in ``fn``: what ``**name`` passes."""
    keys = set()
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            if isinstance(node.value, ast.Dict):
                keys |= {k.value for k in node.value.keys if isinstance(k, ast.Constant)}
            elif isinstance(node.value, ast.Call) and ast.unparse(node.value.func) == "dict":
                keys |= {k.arg for k in node.value.keywords if k.arg}
    return keys


def _passed_keywords():
    """keyword → model families passing it to an attention function in the installed transformers, plus
    what reaches the attention through a model's **kwargs (TransformersKwargs, FlashAttentionKwargs)."""
    from transformers.modeling_flash_attention_utils import FlashAttentionKwargs
    from transformers.utils.generic import TransformersKwargs

    found, calls = collections.defaultdict(set), 0
    for path in sorted(pathlib.Path(transformers.__file__).parent.glob("models/*/modeling_*.py")):
        text = path.read_text()
        if not any(a in text for a in _ATTENTION):
            continue  # no call of an attention function: not worth parsing
        for call, fn in _attention_calls(ast.parse(text)):
            calls += 1
            for keyword in call.keywords:
                if keyword.arg is not None:
                    found[keyword.arg].add(path.parent.name)
                elif isinstance(keyword.value, ast.Name) and keyword.value.id != "kwargs":
                    for key in _dict_keys(fn, keyword.value.id):
                        found[key].add(path.parent.name)
    for typed in (TransformersKwargs, FlashAttentionKwargs):
        for key in typed.__annotations__:
            found[key].add(typed.__name__)
    return found, calls


def test_every_keyword_a_model_passes_is_honoured_inert_or_refused():
    found, calls = _passed_keywords()
    assert calls > 400  # the walk reads the call sites (500 in transformers 5.24)
    assert {"is_causal", "softcap", "s_aux", "scaling", "dropout"} <= set(found)
    known = POSITIONAL | set(ours.HONOURED) | set(ours.INERT) | set(ours.REFUSED)
    unknown = {key: sorted(families)[:5] for key, families in found.items() if key not in known}
    assert not unknown, f"keywords neither honoured nor refused (keyword: some families): {unknown}"


class _Module(torch.nn.Module):
    is_causal = True


@pytest.mark.parametrize("keyword, value", [
    ("softcap", 50.0), ("s_aux", torch.zeros(4)), ("sinks", torch.zeros(1, 4, 5, 1)),
    ("position_bias", torch.zeros(1, 4, 5, 5)), ("indices", torch.zeros(1, 5, 2, dtype=torch.long)),
    ("block_indices", torch.zeros(1, 5, 2, dtype=torch.long)), ("sliding_window", 4),
    ("output_attentions", True), ("deterministic", True),
])
@pytest.mark.parametrize("impl", IMPLS)
def test_each_refused_keyword_is_one_line_naming_module_and_keyword(impl, keyword, value):
    module = _Module()
    module.config = configure(LlamaConfig(), **DENSE)
    q = torch.randn(1, 4, 5, 8)
    forward = ours.dilated_forward if impl == "dilcompile_dilated" else ours.block_sparse_forward
    with pytest.raises(ValueError, match=rf"^_Module passes {keyword}=.*use attn_implementation=|^_Module passes "
                                         rf"{keyword}=.*deterministic_flash_attn=False") as caught:
        forward(module, q, q, q, None, **{keyword: value})
    assert "\n" not in str(caught.value)
    forward(module, q, q, q, None, **{keyword: None if keyword not in ("output_attentions", "deterministic") else
                                      False})  # unset: runs


def _clip_text(impl):
    config = CLIPTextConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                            num_attention_heads=4, max_position_embeddings=40, bos_token_id=1, eos_token_id=2,
                            pad_token_id=0)
    configure(config, **DENSE)
    torch.manual_seed(0)
    return CLIPTextModel._from_config(config, attn_implementation=impl, dtype=torch.float64).eval()


@pytest.mark.parametrize("impl", IMPLS)
def test_clip_text_encoder_is_causal_through_the_keyword_and_equals_sdpa(impl):
    """CLIP's text attention modules say is_causal = False; the model passes is_causal=True. Ours ran
    non-causal: hidden states 3.6 off sdpa's in float64. Padded batch, real tokens compared."""
    ids = torch.randint(3, VOCAB, (3, 23), generator=torch.Generator().manual_seed(4))
    mask = torch.ones_like(ids)
    mask[1, 15:], mask[2, 7:] = 0, 0
    got = _clip_text(impl)(ids, attention_mask=mask).last_hidden_state
    want = _clip_text("sdpa")(ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(got[mask.bool()], want[mask.bool()], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_a_decoder_run_with_is_causal_false_is_bidirectional_like_sdpa(impl):
    """transformers lets a decoder run as an encoder (TransformersKwargs' is_causal=False); the module
    says is_causal = True, and ours ran causal."""
    def llama(name):
        config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        torch.manual_seed(0)
        return AutoModel.from_config(configure(config, **DENSE), attn_implementation=name,
                                     dtype=torch.float64).eval()

    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(5))
    sdpa, model = llama("sdpa"), llama(impl)
    want = sdpa(ids, is_causal=False).last_hidden_state
    assert (want - sdpa(ids).last_hidden_state).abs().max() > 0.1  # the keyword matters
    torch.testing.assert_close(model(ids, is_causal=False).last_hidden_state, want, rtol=1e-10, atol=1e-10)


def _gemma2():
    from transformers import Gemma2Config

    return Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=["full_attention"],
                        attn_logit_softcapping=50.0)


def _gpt_oss():
    from transformers import GptOssConfig

    return GptOssConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                        num_experts_per_tok=1, layer_types=["full_attention"])


@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("family, keyword", [(_gemma2, "softcap"), (_gpt_oss, "s_aux")])
def test_softcapping_and_sinks_are_refused_eager_and_compiled(family, keyword, compiled):
    """Gemma 2 passes softcap, GPT-OSS s_aux (sinks). With full-attention layers only, compiled (where the
    mask function cannot see the sliding mask these models also build) the models ran without soft-capping
    or sinks; eagerly that sliding mask is refused first."""
    config = configure(family(), **DENSE)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="dilcompile_dilated").eval()
    torch._dynamo.reset()
    run = torch.compile(model, backend="eager", fullgraph=True) if compiled else model
    error = Exception if compiled else ValueError  # Dynamo reports our ValueError inside its own exception
    says = rf"(Gemma2|GptOss)Attention passes {keyword}="
    if not compiled:
        says += "|expresses only plain causal or bidirectional masks"
    with pytest.raises(error, match=says):
        run(torch.randint(0, VOCAB, (1, 9)))
