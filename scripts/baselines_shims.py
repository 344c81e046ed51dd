"""What scripts/bench_baselines.py needs to run other projects' dilated attention
from the user's own checkouts (no third-party code lives in this repository).

- :func:`flash_attn_func`: flash-attn's ``flash_attn_func`` (the subset
  torchscale calls) served by ATen's fused attention kernels — CUDA:
  ``aten._scaled_dot_product_flash_attention`` (fp16/bf16) or
  ``aten._scaled_dot_product_efficient_attention`` (fp32); CPU:
  ``aten._scaled_dot_product_flash_attention_for_cpu`` (fp32, fp64, bf16,
  fp16). These return the output and the log-sum-exp; the output is
  differentiable, the lse is not (as in flash-attn).
- :func:`load_torchscale`: imports ``torchscale.component.dilated_attention``
  from a checkout with the shim standing in for the ``flash_attn`` package,
  then restores ``sys.modules``.
- :func:`load_seed`: imports the seed library's ``dilated_attention`` module
  from a checkout without running its package ``__init__`` (which imports
  LongNet from torchscale and the DeepSpeed/FairScale modules).
"""

from __future__ import annotations

import contextlib
import importlib
import math
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import Tensor, nn

TORCHSCALE_FILE = Path("torchscale") / "component" / "dilated_attention.py"
SEED_FILE = Path("dilated_attention_pytorch") / "dilated_attention.py"
_SHIMMED = ("flash_attn", "flash_attn.flash_attn_interface")


def _attend(q: Tensor, k: Tensor, v: Tensor, dropout_p: float, scale: float, causal: bool) -> tuple[Tensor, Tensor]:
    """ATen's fused kernel on (B, H, N, D) views → out (B, H, N, D), lse (B, H, N) natural log."""
    if q.device.type == "cpu":
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, dropout_p, causal, scale=scale)
    elif q.dtype in (torch.float16, torch.bfloat16):
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, causal, scale=scale)[:2]
    elif q.dtype == torch.float32:
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, None, True, dropout_p, causal, scale=scale)[:2]
    else:
        raise TypeError(f"flash_attn_func shim: q.dtype {q.dtype} on {q.device.type}: ATen's fused kernels there "
                        "take float16, bfloat16 or float32; pass one of those")
    return out, lse[..., :q.shape[2]]  # the efficient kernel pads lse's length to a multiple of 32


def flash_attn_func(q: Tensor, k: Tensor, v: Tensor, dropout_p: float = 0.0, softmax_scale: float | None = None,
                    causal: bool = False, window_size=(-1, -1), softcap: float = 0.0, alibi_slopes=None,
                    deterministic: bool = False, return_attn_probs: bool = False):
    """flash-attn's ``flash_attn_func``: q (b, lq, h, d), k and v (b, lk, h, d) →
    out (b, lq, h, d); with ``return_attn_probs=True`` ``(out, lse, None)``, lse
    (b, h, lq) in natural log (flash-attn's third value, the dropout mask, is
    not computed). Scale ``softmax_scale`` (default 1/sqrt(d)); ``causal``
    needs lq == lk (flash-attn aligns the mask bottom-right, ATen top-left:
    equal lengths are where both agree). Sliding windows, softcap, ALiBi and
    grouped k/v heads are not served."""
    if q.dim() != 4 or k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"flash_attn_func shim: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: "
                         "expected (b, l, h, d) with the same b, h and d (k and v of equal shape)")
    if causal and q.shape[1] != k.shape[1]:
        raise ValueError(f"flash_attn_func shim: causal with lq = {q.shape[1]} != lk = {k.shape[1]}; "
                         "the shim serves causal attention of equal lengths only")
    if tuple(window_size) != (-1, -1) or softcap or alibi_slopes is not None:
        raise ValueError("flash_attn_func shim: window_size, softcap and alibi_slopes are not served; leave them unset")
    scale = 1.0 / math.sqrt(q.shape[-1]) if softmax_scale is None else float(softmax_scale)
    out, lse = _attend(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), dropout_p, scale, causal)
    out = out.transpose(1, 2)  # (b, l, h, d): ATen's kernels store it that way, so this view is contiguous
    return (out, lse, None) if return_attn_probs else out


@contextlib.contextmanager
def flash_attn_shimmed():
    """``import flash_attn.flash_attn_interface`` gets this module's
    :func:`flash_attn_func` inside the block; ``sys.modules`` is restored after."""
    saved = {name: sys.modules.get(name) for name in _SHIMMED}
    package = types.ModuleType("flash_attn")
    interface = types.ModuleType("flash_attn.flash_attn_interface")
    package.__path__ = []  # a package, so the submodule import resolves
    package.__version__ = "0+aten-shim"
    package.flash_attn_func = interface.flash_attn_func = flash_attn_func
    package.flash_attn_interface = interface
    sys.modules.update({"flash_attn": package, "flash_attn.flash_attn_interface": interface})
    try:
        yield
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module


def _torchscale_wrapper(q, k, v, dropout=0.0, bias=None, softmax_scale=None, is_causal=False):
    """What torchscale's flash_attention.py defines on CUDA (sm ≥ 8) around flash-attn,
    for devices where it defines nothing (CPU): (out, lse)."""
    if bias is not None:
        raise ValueError("torchscale's flash path takes no attention bias")
    out, lse, _ = flash_attn_func(q, k, v, dropout_p=dropout, softmax_scale=softmax_scale, causal=is_causal,
                                  return_attn_probs=True)
    return out, lse


def checkout_error(flag: str, path: str, marker: Path, fix: str) -> str | None:
    """None if ``path`` is a checkout holding ``marker``; else the one-line reason."""
    root = Path(path).expanduser()
    if not root.is_dir():
        return f"{flag} {path!r} is not a folder; {fix}"
    if not (root / marker).is_file():
        return f"{flag} {path!r} has no {marker}; {fix}"
    return None


@contextlib.contextmanager
def _on_path(root: Path):
    sys.path.insert(0, str(root))
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(root))


def load_torchscale(path: str):
    """``torchscale.component.dilated_attention`` from the checkout at ``path``,
    its flash path served by :func:`flash_attn_func`. Needs einops (ImportError)."""
    root = Path(path).expanduser().resolve()
    loaded = sys.modules.get("torchscale")
    if loaded is not None and not str(getattr(loaded, "__file__", "")).startswith(str(root)):
        raise ImportError(f"another torchscale is imported already ({getattr(loaded, '__file__', loaded)})")
    with flash_attn_shimmed(), _on_path(root):
        module = importlib.import_module("torchscale.component.dilated_attention")
        mha = importlib.import_module("torchscale.component.multihead_attention")
    if mha.flash_attn_func is None:  # CPU (or a GPU below sm 8, where it wants xformers): no flash path defined
        mha.flash_attn_func = _torchscale_wrapper
    return module


def torchscale_attention(module, heads: int, head_dim: int, segments, rates, seq_parallel: bool = False) -> nn.Module:
    """torchscale's ``DilatedAttention`` (LongNet) as attention alone: its q, k,
    v and out projections are identities, so ``m(x_q, x_k, x_v, is_causal=...)``
    with x (B, N, H·D) returns (attention (B, N, H·D), None)."""
    args = SimpleNamespace(flash_attention=True, segment_length=list(segments), dilated_ratio=list(rates),
                           seq_parallel=seq_parallel, multiway=False, xpos_rel_pos=False, xpos_scale_base=512,
                           layernorm_eps=1e-5)
    m = module.DilatedAttention(args, heads * head_dim, heads, dropout=0.0, self_attention=True)
    m.q_proj = m.k_proj = m.v_proj = m.out_proj = nn.Identity()
    return m.eval()


def load_seed(path: str):
    """The seed library's ``dilated_attention`` module from the checkout at
    ``path``, imported without its package ``__init__``."""
    root = Path(path).expanduser().resolve()
    name = "dilated_attention_pytorch"
    loaded = sys.modules.get(name)
    if loaded is not None and list(getattr(loaded, "__path__", [])) != [str(root / name)]:
        raise ImportError(f"another {name} is imported already ({getattr(loaded, '__path__', loaded)})")
    if loaded is None:
        package = types.ModuleType(name)
        package.__path__ = [str(root / name)]
        sys.modules[name] = package
    import warnings

    with warnings.catch_warnings():  # "Enhanced memory pool not available" and the like
        warnings.simplefilter("ignore")
        return importlib.import_module(f"{name}.dilated_attention")
