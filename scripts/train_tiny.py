"""Train a tiny LongNet decoder, compiled, on the project's own source and docs
(characters), then sample from the checkpoint.

    python scripts/train_tiny.py                       # train (a couple of minutes on 2 CPU cores)
    python scripts/train_tiny.py --sample --prompt "def dilated"

Prints a progress bar, a table of (step, train loss, val loss, elapsed) and,
last, one JSON line with the curve. The checkpoint holds the model config, the
weights, the vocabulary and the curve.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from dilcompile.models import LongNetConfig, LongNetDecoder  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402

CORPUS_GLOBS = ("README.md", "Makefile", "pyproject.toml", "dilcompile/**/*.py", "scripts/*.py", "tests/*.py")


def build_corpus(root: Path = ROOT) -> str:
    """The project's own text, offline: every source and doc file, sorted, one after another."""
    files = sorted({p for pattern in CORPUS_GLOBS for p in root.glob(pattern) if p.is_file()})
    if not files:
        raise SystemExit(f"no corpus files under {root}")
    return "\n\n".join(f"# ==== {p.relative_to(root)}\n{p.read_text(encoding='utf-8')}" for p in files)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--embed-dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--segments", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--rates", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--no-compile", action="store_true", help="train eagerly")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads (1 helps on a busy machine)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=ROOT / "runs" / "tiny_longnet.pt")
    p.add_argument("--sample", action="store_true", help="sample from --out instead of training")
    p.add_argument("--prompt", default="def ")
    p.add_argument("--tokens", type=int, default=400)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=20)
    return p.parse_args(argv)


def batches(data: torch.Tensor, batch: int, seq_len: int, gen: torch.Generator):
    start = torch.randint(0, len(data) - seq_len - 1, (batch,), generator=gen)
    rows = start[:, None] + torch.arange(seq_len + 1)  # (B, N+1)
    chunk = data[rows]
    return chunk[:, :-1], chunk[:, 1:]  # inputs, next-character targets


@torch.no_grad()
def evaluate(model, data, args, gen, batches_n: int = 4) -> float:
    model.eval()
    losses = [model(*batches(data, args.batch, args.seq_len, gen))[1].item() for _ in range(batches_n)]
    model.train()
    return sum(losses) / len(losses)


def train(args) -> dict:
    torch.manual_seed(args.seed)
    text = build_corpus()
    vocab = sorted(set(text))
    stoi = {c: i for i, c in enumerate(vocab)}
    data = torch.tensor([stoi[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(data))
    train_data, val_data = data[:split], data[split:]
    config = LongNetConfig(vocab_size=len(vocab), max_seq_len=args.seq_len, embed_dim=args.embed_dim,
                           num_heads=args.heads, num_layers=args.layers, segment_lengths=tuple(args.segments),
                           dilation_rates=tuple(args.rates))
    model = LongNetDecoder(config)
    # Compilation happens here, at the call site; eval runs the eager module (no second graph).
    step_model = model if args.no_compile else torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.01)
    warmup = max(1, args.steps // 15)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / warmup) * (
        0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / args.steps)))))
    gen = torch.Generator().manual_seed(args.seed)
    print(f"corpus: {len(text):,} characters, vocab {len(vocab)}, model {sum(p.numel() for p in model.parameters()):,} "
          f"parameters, {'compiled' if not args.no_compile else 'eager'}, threads {torch.get_num_threads()}")
    curve, running, t0 = [], [], time.perf_counter()
    first_step_s = None
    bar = tqdm(range(1, args.steps + 1), desc="train", unit="step", dynamic_ncols=True)
    for step in bar:
        x, y = batches(train_data, args.batch, args.seq_len, gen)
        _, loss = step_model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running.append(loss.item())
        if first_step_s is None:
            first_step_s = time.perf_counter() - t0  # includes compilation
        bar.set_postfix(loss=f"{running[-1]:.3f}")
        if step % args.eval_every == 0 or step == args.steps or step == 1:
            point = {"step": step, "train_loss": round(sum(running) / len(running), 4),
                     "val_loss": round(evaluate(model, val_data, args, gen), 4),
                     "elapsed_s": round(time.perf_counter() - t0, 1)}
            curve.append(point)
            running = []
            bar.write(f"step {point['step']:5d}  train {point['train_loss']:.3f}  val {point['val_loss']:.3f}  "
                      f"{point['elapsed_s']:7.1f} s")
    total_s = time.perf_counter() - t0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"config": config.to_json(), "state_dict": model.state_dict(), "vocab": vocab, "curve": curve},
               args.out)
    summary = {"steps": args.steps, "batch": args.batch, "seq_len": args.seq_len, "compiled": not args.no_compile,
               "first_step_s": round(first_step_s, 1), "total_s": round(total_s, 1),
               "tokens_per_s": round(args.steps * args.batch * args.seq_len / total_s), "curve": curve,
               "checkpoint": str(args.out)}
    print(f"saved {args.out}")
    print(json.dumps(summary))
    return summary


def sample(args) -> str:
    ckpt = torch.load(args.out, map_location="cpu", weights_only=True)
    model = LongNetDecoder(LongNetConfig.from_json(ckpt["config"]))
    model.load_state_dict(ckpt["state_dict"])
    vocab = ckpt["vocab"]
    stoi = {c: i for i, c in enumerate(vocab)}
    missing = sorted(set(args.prompt) - set(stoi))
    if missing:
        raise SystemExit(f"--prompt has characters outside the vocabulary: {missing}")
    idx = torch.tensor([[stoi[c] for c in args.prompt]], dtype=torch.long)
    gen = torch.Generator().manual_seed(args.seed)
    out = model.eval().generate(idx, args.tokens, temperature=args.temperature, top_k=args.top_k, generator=gen)
    text = "".join(vocab[i] for i in out[0].tolist())
    print(text)
    return text


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sample(args) if args.sample else train(args)
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main, "train_tiny"))
