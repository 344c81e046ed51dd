"""What ``LongNetDecoder.generate`` does around the model calls: its
argument checks, batches of prompts of different lengths (left padding and
its mask), the cropped context of the recompute path, and the choice of the
next token."""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

from ..checks import check_int


def check_sampling(temperature, top_k, generator) -> tuple[float, int | None]:
    """temperature: a finite real ≥ 0 (0 = greedy); top_k: None or an int ≥ 1
    (≥ the vocabulary keeps every token); generator: None or a torch.Generator."""
    if isinstance(temperature, bool) or not isinstance(temperature, Real):
        raise TypeError(f"temperature must be a float ≥ 0 (0 = greedy), got {temperature!r}")
    if not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite float ≥ 0 (0 = greedy), got {temperature!r}")
    if top_k is not None:
        top_k = check_int("top_k", top_k, minimum=1, maximum=None)
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}")
    return float(temperature), top_k


TOKEN_DTYPES = (torch.int64, torch.int32)  # what nn.Embedding indexes with


def check_token_ids(idx, shape: str, also: str = "") -> None:
    """Raise TypeError unless ``idx`` is a tensor of int64 or int32 token ids."""
    if not isinstance(idx, Tensor) or idx.dtype not in TOKEN_DTYPES:
        got = type(idx).__name__ if not isinstance(idx, Tensor) else f"a tensor of {idx.dtype}"
        fix = "; convert with idx.long()" if isinstance(idx, Tensor) and not (
            idx.is_floating_point() or idx.is_complex() or idx.dtype == torch.bool) else ""
        raise TypeError(f"idx must be an int64 or int32 tensor of token ids {shape}{also}, got {got}{fix}")


def check_prompt(idx, key_padding_mask, vocab_size: int) -> Tensor:
    """idx (B, N0) token ids, B, N0 ≥ 1, in [0, vocab_size) at the real
    tokens; key_padding_mask None or (B, N0) bool with a real token in every
    row. Returns the mask's real-token count of the longest row (N0 without a mask)."""
    check_token_ids(idx, "(B, N0)", " or a list of 1-D prompts")
    if idx.dim() != 2 or idx.shape[0] == 0 or idx.shape[1] == 0:
        raise ValueError(f"idx must be (B, N0) token ids with B ≥ 1 and a prompt of N0 ≥ 1 tokens, got shape "
                         f"{tuple(idx.shape)}; start an unconditional sample from a BOS token")
    real = None
    if key_padding_mask is not None:
        if not isinstance(key_padding_mask, Tensor) or key_padding_mask.dtype != torch.bool:
            raise TypeError("key_padding_mask must be a bool tensor (B, N0), True = padding")
        if key_padding_mask.shape != idx.shape or key_padding_mask.device != idx.device:
            raise ValueError(f"key_padding_mask must be (B, N0) = {tuple(idx.shape)} on {idx.device} like idx, got "
                             f"{tuple(key_padding_mask.shape)} on {key_padding_mask.device}")
        real = ~key_padding_mask
        empty = (~real.any(1)).nonzero().flatten().tolist()
        if empty:
            raise ValueError(f"key_padding_mask marks every token of row {empty[0]} as padding; every row needs "
                             "a prompt of ≥ 1 real token")
    ids = idx if real is None else idx[real]
    low, high = ids.min().item(), ids.max().item()
    if low < 0 or high >= vocab_size:
        raise ValueError(f"idx holds token ids in [{low}, {high}] but the vocabulary is [0, {vocab_size})")
    return idx.shape[1] if real is None else int(real.sum(1).max())


def left_pad(prompts) -> tuple[Tensor, Tensor | None]:
    """A list of 1-D prompts (token ids of different lengths) → idx (B, N0)
    with each prompt at the end of its row and key_padding_mask (B, N0), True
    = pad (None where every prompt has N0 tokens)."""
    if not prompts:
        raise ValueError("idx is an empty list: pass at least one prompt")
    for i, p in enumerate(prompts):
        if not isinstance(p, Tensor) or p.dim() != 1:
            got = type(p).__name__ if not isinstance(p, Tensor) else f"shape {tuple(p.shape)}"
            raise TypeError(f"idx as a list holds 1-D tensors of token ids, got {got} at index {i}")
        if p.shape[0] == 0:
            raise ValueError(f"idx[{i}] is an empty prompt; every prompt needs ≥ 1 token (e.g. a BOS token)")
        if p.dtype != prompts[0].dtype or p.device != prompts[0].device:
            raise ValueError(f"idx[{i}] is {p.dtype} on {p.device} but idx[0] is {prompts[0].dtype} on "
                             f"{prompts[0].device}; pass prompts of one dtype and device")
    width = max(p.shape[0] for p in prompts)
    idx = torch.stack([torch.cat([p.new_zeros(width - p.shape[0]), p]) for p in prompts])  # (B, N0)
    if all(p.shape[0] == width for p in prompts):
        return idx, None
    mask = torch.stack([torch.arange(width, device=idx.device) < width - p.shape[0] for p in prompts])
    return idx, mask


def crop_rows(idx: Tensor, mask: Tensor | None, max_len: int) -> tuple[Tensor, Tensor | None]:
    """The context of the recompute path: each row's last ``max_len`` real
    tokens. Without a mask the last max_len columns; with one, older real
    tokens become pads and the leading columns without a real token go."""
    if mask is None:
        return idx[:, -max_len:], None
    later = (~mask).flip(1).cumsum(1).flip(1)  # (B, N): real tokens at or after each position
    mask = mask | (later > max_len)
    first = int((~mask).any(0).int().argmax())  # every row keeps ≥ 1 real token
    return idx[:, first:], mask[:, first:]


def last_real(mask: Tensor) -> Tensor:
    """(B,) column of each row's last real token (mask (B, N), True = pad;
    every row has one): where a right-padded prompt's next token is predicted."""
    return mask.shape[1] - 1 - (~mask).flip(1).int().argmax(1)


def pick(logits: Tensor, temperature: float, top_k: int | None, generator) -> Tensor:
    """Next token (B, 1) from the last position's logits (B, vocab)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    # softmax and sampling in float32 at least, whatever autocast gave
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32)) / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = logits.topk(top_k).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return torch.multinomial(logits.softmax(-1), 1, generator=generator)
