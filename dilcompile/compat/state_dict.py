"""Loading the seed system's multihead state dicts into compat modules.

The seed keeps separate ``q_proj`` / ``k_proj`` / ``v_proj`` (E, E) linears
(the improved class a fused ``qkv_proj`` like ours) and two LayerNorms,
``q_ln`` and ``k_ln``; ``q_ln`` is also its LayerNorm before the output
projection, which is our ``sub_ln``. A load pre-hook rewrites those keys to
ours, so ``load_state_dict(seed_module.state_dict())`` works as it is, and
our own state dicts still load.
"""

from __future__ import annotations

import torch
from torch import nn


def seed_keys_to_ours(state_dict: dict, prefix: str, keep_k_ln: bool) -> None:
    """In place: ``{q,k,v}_proj.{weight,bias}`` → ``qkv_proj.*`` (rows q | k | v),
    ``q_ln.*`` → ``sub_ln.*``; ``k_ln.*`` dropped unless ``keep_k_ln`` (the
    seed's improved class never used its ``k_ln``)."""
    for suffix in ("weight", "bias"):
        names = [f"{prefix}{p}_proj.{suffix}" for p in "qkv"]
        if all(n in state_dict for n in names):
            state_dict[f"{prefix}qkv_proj.{suffix}"] = torch.cat([state_dict.pop(n) for n in names])
        src = f"{prefix}q_ln.{suffix}"
        if src in state_dict:
            state_dict[f"{prefix}sub_ln.{suffix}"] = state_dict.pop(src)
        if not keep_k_ln:
            state_dict.pop(f"{prefix}k_ln.{suffix}", None)


def accept_seed_state_dicts(module: nn.Module, keep_k_ln: bool = False) -> None:
    def hook(mod, state_dict, prefix, *args):
        seed_keys_to_ours(state_dict, prefix, keep_k_ln)

    module.register_load_state_dict_pre_hook(hook)
