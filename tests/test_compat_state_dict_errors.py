"""Loading a seed checkpoint that does not fit reports the seed's own key
names (dilcompile/compat/state_dict.py), not the keys it is converted to."""

import warnings

import pytest
import torch

from dilcompile import compat

E, H = 16, 2
CLASSES = ["MultiheadDilatedAttention", "ImprovedMultiheadDilatedAttention"]


def _module(name, layer_norm=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(compat, name)(E, H, [1, 2], [8, 16], layer_norm=layer_norm, dtype=torch.float64)


def _seed_state_dict(module) -> dict:
    """The module's weights under the seed's names: q/k/v_proj and q_ln."""
    sd = dict(module.state_dict())
    for suffix in ("weight", "bias"):
        for name, part in zip("qkv", sd.pop(f"qkv_proj.{suffix}").chunk(3)):
            sd[f"{name}_proj.{suffix}"] = part.clone()
        if f"sub_ln.{suffix}" in sd:
            sd[f"q_ln.{suffix}"] = sd.pop(f"sub_ln.{suffix}")
    return sd


@pytest.mark.parametrize("name", CLASSES)
def test_a_seed_checkpoint_loads_and_round_trips(name):
    source, target = _module(name), _module(name)
    target.load_state_dict(_seed_state_dict(source))
    for key, value in source.state_dict().items():
        torch.testing.assert_close(target.state_dict()[key], value, rtol=0, atol=0)


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("key", ["q_proj.weight", "k_proj.weight", "v_proj.weight", "v_proj.bias"])
def test_a_projection_of_the_wrong_shape_is_a_size_mismatch_of_that_key(name, key):
    sd = _seed_state_dict(_module(name))
    rows = sd[key].shape[0]
    sd[key] = torch.zeros(rows, E + 1, dtype=torch.float64) if key.endswith("weight") else torch.zeros(rows + 1)
    with pytest.raises(RuntimeError, match=rf"size mismatch for {key}: copying a param with shape"):
        _module(name).load_state_dict(sd)


@pytest.mark.parametrize("name", CLASSES)
@pytest.mark.parametrize("key", ["q_proj.weight", "v_proj.weight", "k_proj.bias"])
def test_a_missing_projection_is_reported_by_its_seed_name(name, key):
    sd = _seed_state_dict(_module(name))
    del sd[key]
    result = _module(name).load_state_dict(sd, strict=False)
    assert key in result.missing_keys
    assert not any(k.startswith("qkv_proj.") for k in result.missing_keys), result.missing_keys
    with pytest.raises(RuntimeError) as err:
        _module(name).load_state_dict(sd)
    assert f'"{key}"' in str(err.value) and "qkv_proj" not in str(err.value)


@pytest.mark.parametrize("name", CLASSES)
def test_layer_norm_keys_into_a_module_without_them_are_unexpected_by_their_seed_names(name):
    sd = _seed_state_dict(_module(name, layer_norm=True))
    result = _module(name, layer_norm=False).load_state_dict(sd, strict=False)
    assert {"q_ln.weight", "q_ln.bias"} <= set(result.unexpected_keys)
    assert not any(k.startswith("sub_ln.") for k in result.unexpected_keys), result.unexpected_keys


def test_nested_modules_report_with_their_prefix():
    outer = torch.nn.ModuleDict({"attn": _module(CLASSES[1])})
    sd = {f"attn.{k}": v for k, v in _seed_state_dict(outer["attn"]).items()}
    del sd["attn.v_proj.weight"]
    result = outer.load_state_dict(sd, strict=False)
    assert "attn.v_proj.weight" in result.missing_keys and "attn.qkv_proj.weight" not in result.missing_keys
