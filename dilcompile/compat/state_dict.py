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


def _has(module: nn.Module, name: str) -> bool:
    return isinstance(getattr(module, name, None), nn.Module)


def seed_keys_to_ours(module: nn.Module, state_dict: dict, prefix: str, keep_k_ln: bool,
                      error_msgs: list) -> list[str]:
    """In place: ``{q,k,v}_proj.{weight,bias}`` → ``qkv_proj.*`` (rows q | k | v),
    ``q_ln.*`` → ``sub_ln.*``; ``k_ln.*`` dropped unless ``keep_k_ln`` (the
    seed's improved class never used its ``k_ln``).

    Whatever can't be converted keeps the seed's own key names, so errors
    name what the checkpoint holds: a projection of the wrong shape is a size
    mismatch of that key (in ``error_msgs``), and an incomplete q/k/v triple
    is left as it is — returned, with the prefix, are the seed keys missing
    from such a triple, which ``fix_reported_keys`` reports in place of ``qkv_proj``."""
    missing = []
    qkv = getattr(module, "qkv_proj", None)
    for suffix in ("weight", "bias"):
        names = [f"{prefix}{p}_proj.{suffix}" for p in "qkv"]
        present = [n in state_dict for n in names]
        ours = getattr(qkv, suffix, None) if qkv is not None else None
        if all(present) and ours is not None:
            want = (ours.shape[0] // 3, *ours.shape[1:])
            wrong = [n for n in names if tuple(state_dict[n].shape) != want]
            for n in wrong:
                error_msgs.append(f"size mismatch for {n}: copying a param with shape {tuple(state_dict[n].shape)} "
                                  f"from checkpoint, the shape in current model is {want}.")
            if not wrong:
                state_dict[f"{prefix}qkv_proj.{suffix}"] = torch.cat([state_dict.pop(n) for n in names])
        elif any(present):
            missing += [n for n, there in zip(names, present) if not there]
        src = f"{prefix}q_ln.{suffix}"
        if src in state_dict and _has(module, "sub_ln"):  # no sub_ln (layer_norm=False): q_ln stays unexpected
            state_dict[f"{prefix}sub_ln.{suffix}"] = state_dict.pop(src)
        if not keep_k_ln:
            state_dict.pop(f"{prefix}k_ln.{suffix}", None)
    return missing


def accept_seed_state_dicts(module: nn.Module, keep_k_ln: bool = False) -> None:
    """Load the seed's state dicts into ``module`` as they are (a pre-hook
    converts the keys; a post-hook reports missing seed keys by their names)."""
    pending: list[str] = []

    def convert(mod, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        pending[:] = [(prefix, n) for n in seed_keys_to_ours(mod, state_dict, prefix, keep_k_ln, error_msgs)]

    def report(mod, incompatible):
        for prefix, seed_key in pending:
            ours = f"{prefix}qkv_proj.{seed_key.rsplit('.', 1)[1]}"
            if ours in incompatible.missing_keys:
                incompatible.missing_keys.remove(ours)
            incompatible.missing_keys.append(seed_key)
        pending.clear()

    module.register_load_state_dict_pre_hook(convert)
    module.register_load_state_dict_post_hook(report)
