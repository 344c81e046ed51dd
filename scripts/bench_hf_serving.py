"""Hugging Face static-cache serving: decode tokens/s of ``generate`` with a
compiled decode step, our attentions against sdpa and FlexAttention.

A Llama built from a config (random weights: speed does not depend on
them); per case (context × batch) a prompt batch — batch 1 one unpadded row,
more rows left-padded (row b has context − b·context/(2·batch) real
tokens) — and greedy ``generate(cache_implementation="static")`` with
transformers' own ``compile_config`` (fullgraph; on CPU transformers
compiles only when asked with ``_compile_all_devices``, which this script
sets). Per case and attention: a warm-up generation compiles the decode
step; then rounds interleave the attentions (A, B, C, A, B, C, …), each
round one generation whose steps a stopping criterion timestamps (it runs
after every step's forward): prefill = start to the first stamp, decode
tokens/s = batch × (new − 1) ÷ (last stamp − first stamp) — the decode steps
alone, not a difference of two noisy generations that a long prefill swamps. Graphs compiled during the timed rounds are counted
(``recompiles``; 0 expected). Up to ``--check-max`` tokens the greedy tokens
of sdpa and ours are compared with their own eager ``DynamicCache``
generation (FlexAttention's eager path materialises every score: skipped).

Rows go to the run store (``pass = 'decode'``, variant ``hf-static-decode``,
impl = the attention name, the case and prefill ms in ``config``); a table
and one JSON line are printed.

    python scripts/bench_hf_serving.py [--quick] [--model small|large] [--contexts 1024 4096]
        [--batches 1 4] [--threads 1] [--db runs/dilcompile.duckdb]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dilcompile.cli._util import render, store_path  # noqa: E402
from dilcompile.profile import env as _env  # noqa: E402
from dilcompile.profile.measure import percentile  # noqa: E402
from dilcompile.profile.runner import run_script, utc_now  # noqa: E402
from dilcompile.store import DEFAULT_DB, RunWriter, StoreError  # noqa: E402

ATTENTIONS = ("sdpa", "flex_attention", "dilcompile_dilated", "dilcompile_block_sparse")
OURS = ("dilcompile_dilated", "dilcompile_block_sparse")
# The models: attention a large share of a decode step (small) and a smaller one (large).
MODELS = {
    "small": dict(layers=2, hidden=256, heads=4, kv_heads=4),
    "large": dict(layers=8, hidden=1024, heads=8, kv_heads=8),
}
SPARSITY = dict(segments=[1024, 2048, 4096], rates=[1, 2, 4], pattern="global_local(window=1024, global_tokens=128)",
                block_size=128)
QUICK = dict(layers=1, hidden=64, heads=4, kv_heads=2, segments=[8, 16], rates=[1, 2],
             pattern="local_window(window=8)", block_size=8)


def _model(name: str, cfg: dict, max_len: int, device, dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dilcompile.integrations.transformers import configure

    config = LlamaConfig(vocab_size=1000, hidden_size=cfg["hidden"], intermediate_size=2 * cfg["hidden"],
                         num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                         num_key_value_heads=cfg["kv_heads"], max_position_embeddings=max_len)
    configure(config, segment_lengths=cfg["segments"], dilation_rates=cfg["rates"], pattern=cfg["pattern"],
              block_size=cfg["block_size"])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=dtype).to(device).eval()


def _prompts(context: int, batch: int, device):
    """(batch, context) ids and mask: row b has context − b·context/(2·batch) real tokens, left-padded."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (batch, context), generator=gen)
    starts = torch.arange(batch) * context // (2 * batch)
    mask = (torch.arange(context) >= starts[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


class _Clock:
    """A ``StoppingCriteria`` that never stops and stamps every step."""

    def __init__(self):
        self.stamps = []

    def __call__(self, input_ids, scores, **kwargs):
        self.stamps.append(time.perf_counter())
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model, one short case, few rounds (a smoke run)")
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--contexts", type=int, nargs="+", default=[1024, 4096, 16384], help="prompt lengths")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--attentions", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS))
    ap.add_argument("--new", type=int, default=32, help="new tokens per generation")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--check-max", type=int, default=4096,
                    help="compare tokens with eager generation up to this context")
    ap.add_argument("--db", default=DEFAULT_DB, type=store_path)
    args = ap.parse_args(argv)
    for name in ("contexts", "batches"):
        if min(getattr(args, name)) < 1:
            ap.error(f"--{name} take ints ≥ 1, got {getattr(args, name)}")
    if args.new < 2 or args.rounds < 1:
        ap.error(f"--new must be ≥ 2 and --rounds ≥ 1, got {args.new} and {args.rounds}")
    try:
        from torch._dynamo.utils import counters
        from transformers import CompileConfig
    except ImportError:
        print("bench_hf_serving: error: needs transformers: pip install 'dilcompile[hf]'", file=sys.stderr)
        return 1
    from dilcompile.integrations.transformers import register

    register()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        cfg, cases, attentions = QUICK, [(24, 2)], ["sdpa", *OURS]
        args.new, args.rounds = 6, 2
    else:
        cfg, attentions = MODELS[args.model] | SPARSITY, args.attentions
        cases = [(c, b) for c in args.contexts for b in args.batches]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    spec = cfg | {"model": "quick" if args.quick else args.model, "new": args.new, "rounds": args.rounds,
                  "threads": torch.get_num_threads(), "cases": cases}
    sweep_id, now = uuid.uuid4().hex, utc_now()
    try:  # the store is checked (and a bad one refused) before anything is measured
        writer = RunWriter(args.db, {"sweep_id": sweep_id, "sweep_started_at": now, "sweep_kind": "bench",
                                     "sweep_name": "bench_hf_serving", "tag": None, "spec": json.dumps(spec),
                                     **_env.capture(device)})
    except StoreError as exc:
        print(f"bench_hf_serving: error: {exc}", file=sys.stderr)
        return 1

    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on CUDA by itself; on CPU when asked
    models = {name: _model(name, cfg, max(c for c, _ in cases) + args.new, device, dtype) for name in attentions}
    names = ["context", "batch", "attention", "prefill ms", "decode tokens/s", "÷ sdpa", "tokens = eager"]
    table, all_equal, recompiled = [], True, 0
    for context, batch in cases:
        ids, mask = _prompts(context, batch, device)
        greedy = dict(attention_mask=mask, do_sample=False, pad_token_id=0)

        def generate(name, new, **kw):
            """→ (tokens, prefill ms, decode ms of the new − 1 steps after the first token)."""
            from transformers import StoppingCriteriaList

            clock = _Clock()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            with torch.no_grad():  # the criterion reads the new token: each stamp follows its step's compute
                out = models[name].generate(ids, max_new_tokens=new, min_new_tokens=new, **greedy, **kw,
                                            stopping_criteria=StoppingCriteriaList([clock]))
            return out, (clock.stamps[0] - start) * 1e3, (clock.stamps[-1] - clock.stamps[0]) * 1e3

        static = dict(cache_implementation="static", compile_config=compile_config)
        torch._dynamo.reset()  # each case's graphs: the models share their forward's code object and its graph limit
        compile_s, same, failed, running = {}, {}, {}, []
        for name in attentions:  # warm-up: compiles the decode step once
            graphs = counters["stats"]["unique_graphs"]
            try:
                out, pre, dec = generate(name, args.new, **static)
                ms = pre + dec
            except Exception as exc:  # noqa: BLE001 — e.g. FlexAttention's CPU lowering refusing a decode shape
                failed[name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
                print(f"  {context} × {batch} {name}: failed, left out of this case: {failed[name]}", file=sys.stderr)
                continue
            running.append(name)
            compile_s[name] = ms / 1e3
            if name != "flex_attention" and context <= args.check_max:
                same[name] = bool(torch.equal(out, generate(name, args.new)[0]))
            said = {True: "equal", False: "DIFFER from"}.get(same.get(name), "not compared with")
            print(f"  {context} × {batch} {name}: compiled {counters['stats']['unique_graphs'] - graphs} graph(s) "
                  f"in {ms / 1e3:.1f} s; tokens {said} eager", file=sys.stderr)
        graphs_before = counters["stats"]["unique_graphs"]
        decode, prefill = ({name: [] for name in running} for _ in range(2))
        for _ in range(args.rounds):  # interleaved: every attention once per round
            for name in running:
                _, pre, dec = generate(name, args.new, **static)
                prefill[name].append(pre)
                decode[name].append(dec)
        recompiles = counters["stats"]["unique_graphs"] - graphs_before
        recompiled += recompiles
        base = {"sweep_id": sweep_id, "started_at": now, "variant": "hf-static-decode", "pass": "decode",
                "mode": "longnet", "device": _env.device_name(device), "device_kind": device.type,
                "dtype": str(dtype).removeprefix("torch."), "batch": batch, "seq_len": context + args.new,
                "heads": cfg["heads"], "head_dim": cfg["hidden"] // cfg["heads"], "causal": True, "compiled": True,
                "recompiles": recompiles, "status": "ok"}
        rate = {}
        try:
            for name, error in failed.items():
                writer.write(base | {"run_id": uuid.uuid4().hex, "impl": name, "status": "error", "error": error,
                                     "config": json.dumps(spec | {"context": context})})
            for name in running:
                decode_ms = decode[name]
                med = statistics.median(decode_ms)
                rate[name] = batch * (args.new - 1) / med * 1e3
                case = {"context": context, "prefill_ms": statistics.median(prefill[name]),
                        "same_tokens_as_eager": same.get(name)}
                writer.write(base | {"run_id": uuid.uuid4().hex, "impl": name, "repeats": len(decode_ms),
                                     "latency_ms": med, "latency_p20_ms": percentile(decode_ms, 20),
                                     "latency_p80_ms": percentile(decode_ms, 80), "latency_min_ms": min(decode_ms),
                                     "tokens_per_s": rate[name], "compile_s": compile_s[name],
                                     "config": json.dumps(spec | case)})
        except StoreError as exc:  # the writer saved the rows the store refused; the error says where
            print(f"bench_hf_serving: error: {exc}", file=sys.stderr)
            return 1
        for name in running:
            ratio = rate[name] / rate["sdpa"] if "sdpa" in rate else None
            table.append([context, batch, name, statistics.median(prefill[name]), rate[name], ratio, same.get(name)])
        all_equal &= all(same.values())
    writer.close()
    print(render(names, table))
    print(f"medians of {args.rounds} interleaved rounds on {_env.device_name(device)}, "
          f"{str(dtype).removeprefix('torch.')}, {torch.get_num_threads()} thread(s); "
          f"{recompiled} graph(s) compiled while timing")
    print(json.dumps({"bench": "hf_serving", "rows": [dict(zip(names, t)) for t in table],
                      "recompiles": recompiled, "sweep_id": sweep_id}))
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_hf_serving"))
