"""Hugging Face static-cache serving: tokens/s of ``generate`` with a compiled
decode step, our attentions against sdpa.

A Llama built from a config (random weights: speed does not depend on them),
a left-padded batch of prompts, greedy ``generate(cache_implementation=
"static")`` with transformers' own ``compile_config`` (fullgraph; on CPU
transformers compiles only when asked with ``_compile_all_devices``). Per
attention: a warm-up generation compiles the decode step; then rounds
interleave the attentions (A, B, C, A, B, C, …), each round timing a whole
generation and a prefill-only one (``max_new_tokens=1``), so decode tokens/s
= batch × (new − 1) ÷ (generation − prefill). Graphs compiled during the timed
rounds are counted (``recompiles``; 0 expected). The greedy tokens of every
attention are also compared with its own eager ``DynamicCache`` generation.

Rows go to the run store (``pass = 'decode'``, variant ``hf-static-decode``,
impl = the attention name); a table and one JSON line are printed.

    python scripts/bench_hf_serving.py [--quick] [--db runs/dilcompile.duckdb]
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

ATTENTIONS = ("sdpa", "dilcompile_dilated", "dilcompile_block_sparse")
FULL = dict(layers=4, hidden=512, heads=8, kv_heads=8, prompt=1024, batch=4, new=64, rounds=5,
            segments=[256, 512, 1024], rates=[1, 2, 4], pattern="local_window(window=256)", block_size=64)
QUICK = dict(layers=1, hidden=64, heads=4, kv_heads=2, prompt=24, batch=2, new=6, rounds=2,
             segments=[8, 16], rates=[1, 2], pattern="local_window(window=8)", block_size=8)


def _model(name: str, cfg: dict, device, dtype):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from dilcompile.integrations.transformers import configure

    config = LlamaConfig(vocab_size=1000, hidden_size=cfg["hidden"], intermediate_size=2 * cfg["hidden"],
                         num_hidden_layers=cfg["layers"], num_attention_heads=cfg["heads"],
                         num_key_value_heads=cfg["kv_heads"], max_position_embeddings=cfg["prompt"] + cfg["new"])
    configure(config, segment_lengths=cfg["segments"], dilation_rates=cfg["rates"], pattern=cfg["pattern"],
              block_size=cfg["block_size"])
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, attn_implementation=name, dtype=dtype).to(device).eval()


def _prompts(cfg: dict, device):
    """A left-padded batch: row b has prompt − b·prompt/(2·batch) real tokens."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 1000, (cfg["batch"], cfg["prompt"]), generator=gen)
    starts = torch.arange(cfg["batch"]) * cfg["prompt"] // (2 * cfg["batch"])
    mask = (torch.arange(cfg["prompt"]) >= starts[:, None]).long()
    return (ids * mask).to(device), mask.to(device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a tiny model, few rounds (a smoke run)")
    ap.add_argument("--db", default=DEFAULT_DB, type=store_path)
    args = ap.parse_args(argv)
    try:
        from transformers import CompileConfig
        from torch._dynamo.utils import counters
    except ImportError:
        print("bench_hf_serving: error: needs transformers: pip install 'dilcompile[hf]'", file=sys.stderr)
        return 1
    from dilcompile.integrations.transformers import register

    register()
    cfg = QUICK if args.quick else FULL
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    sweep_id, now = uuid.uuid4().hex, utc_now()
    try:  # the store is checked (and a bad one refused) before anything is measured
        writer = RunWriter(args.db, {"sweep_id": sweep_id, "sweep_started_at": now, "sweep_kind": "bench",
                                     "sweep_name": "bench_hf_serving", "tag": None, "spec": json.dumps(cfg),
                                     **_env.capture(device)})
    except StoreError as exc:
        print(f"bench_hf_serving: error: {exc}", file=sys.stderr)
        return 1

    ids, mask = _prompts(cfg, device)
    compile_config = CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on CUDA by itself; on CPU when asked
    greedy = dict(attention_mask=mask, do_sample=False, pad_token_id=0, cache_implementation="static",
                  compile_config=compile_config)
    models = {name: _model(name, cfg, device, dtype) for name in ATTENTIONS}

    def generate(name, new):
        start = time.perf_counter()
        with torch.no_grad():
            out = models[name].generate(ids, max_new_tokens=new, min_new_tokens=new, **greedy)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return out, (time.perf_counter() - start) * 1e3

    torch._dynamo.reset()
    compile_s, same_tokens = {}, {}
    for name in ATTENTIONS:  # warm-up: compiles each decode step once
        graphs = counters["stats"]["unique_graphs"]
        out, ms = generate(name, cfg["new"])
        compile_s[name] = ms / 1e3
        with torch.no_grad():
            eager = models[name].generate(ids, attention_mask=mask, max_new_tokens=cfg["new"],
                                          min_new_tokens=cfg["new"], do_sample=False, pad_token_id=0)
        same_tokens[name] = bool(torch.equal(out, eager))
        print(f"  {name}: compiled {counters['stats']['unique_graphs'] - graphs} graph(s) in {ms / 1e3:.1f} s; "
              f"tokens {'equal' if same_tokens[name] else 'DIFFER from'} eager", file=sys.stderr)
    graphs_before = counters["stats"]["unique_graphs"]
    full, prefill = ({name: [] for name in ATTENTIONS} for _ in range(2))
    for _ in range(cfg["rounds"]):  # interleaved: every attention once per round
        for name in ATTENTIONS:
            full[name].append(generate(name, cfg["new"])[1])
            prefill[name].append(generate(name, 1)[1])
    recompiles = counters["stats"]["unique_graphs"] - graphs_before

    decode_tokens = cfg["batch"] * (cfg["new"] - 1)
    names = ["attention", "generate ms", "prefill ms", "decode tokens/s", "÷ sdpa", "tokens = eager"]
    table, rows = [], {}
    base = {"sweep_id": sweep_id, "started_at": now, "variant": "hf-static-decode", "pass": "decode",
            "mode": "longnet", "device": _env.device_name(device), "device_kind": device.type,
            "dtype": str(dtype).removeprefix("torch."), "batch": cfg["batch"], "seq_len": cfg["prompt"] + cfg["new"],
            "heads": cfg["heads"], "head_dim": cfg["hidden"] // cfg["heads"], "causal": True, "compiled": True,
            "recompiles": recompiles, "status": "ok"}
    try:
        for name in ATTENTIONS:
            decode_ms = [f - p for f, p in zip(full[name], prefill[name])]
            med = statistics.median(decode_ms)
            rows[name] = base | {"run_id": uuid.uuid4().hex, "impl": name, "repeats": len(decode_ms),
                                 "latency_ms": med, "latency_p20_ms": percentile(decode_ms, 20),
                                 "latency_p80_ms": percentile(decode_ms, 80), "latency_min_ms": min(decode_ms),
                                 "tokens_per_s": decode_tokens / med * 1e3, "compile_s": compile_s[name],
                                 "config": json.dumps(cfg | {"same_tokens_as_eager": same_tokens[name]})}
            writer.write(rows[name])
        writer.close()
    except StoreError as exc:  # the writer saved the rows the store refused; the error says where
        print(f"bench_hf_serving: error: {exc}", file=sys.stderr)
        return 1
    for name in ATTENTIONS:
        r = rows[name]
        table.append([name, statistics.median(full[name]), statistics.median(prefill[name]), r["tokens_per_s"],
                      r["tokens_per_s"] / rows["sdpa"]["tokens_per_s"], same_tokens[name]])
    print(render(names, table))
    print(f"medians of {cfg['rounds']} interleaved rounds on {_env.device_name(device)}, {base['dtype']}; "
          f"{recompiles} graph(s) compiled while timing")
    print(json.dumps({"bench": "hf_serving", "rows": [dict(zip(names, t)) for t in table],
                      "recompiles": recompiles, "sweep_id": sweep_id}))
    return 0 if all(same_tokens.values()) else 1


if __name__ == "__main__":
    sys.exit(run_script(main, "bench_hf_serving"))
