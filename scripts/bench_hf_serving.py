"""Hugging Face static-cache serving: decode tokens/s and memory of ``generate``
with a compiled decode step, our attentions against sdpa and FlexAttention.

A Llama built from a config (random weights: speed does not depend on
them); per case (context × batch) a prompt batch — batch 1 one unpadded row,
more rows left-padded (row b has context − b·context/(2·batch) real
tokens) — and greedy ``generate(cache_implementation="static")`` with
transformers' own ``compile_config`` (fullgraph; CUDA graphs on CUDA,
``mode="reduce-overhead"`` as transformers' default; on CPU transformers
compiles only when asked with ``_compile_all_devices``, which this script
sets). Each attention runs in a process of its own (its own Dynamo cache:
in one process the models would share their forward's code object, and a
model compiled later would pay the guards of the graphs before it at every
step). Per case and attention: a warm-up generation compiles the decode
step; then rounds interleave the attentions (A, B, C, A, B, C, …, one
process working at a time), each
round one generation whose steps a stopping criterion timestamps (it runs
after every step's forward): prefill = start to the first stamp, decode
tokens/s = batch × (new − 1) ÷ (last stamp − first stamp) — the decode steps
alone, not a difference of two noisy generations that a long prefill swamps.
Graphs compiled during the timed rounds are counted (``recompiles``; 0
expected). Up to ``--check-max`` tokens the greedy tokens of sdpa and ours
are compared with their own eager ``DynamicCache`` generation
(FlexAttention's eager path materialises every score: skipped).

Memory, in generations of their own after the timed rounds (the profiler
slows what it watches; dilcompile/profile/memory.py): ``prefill_peak_mb``,
the peak allocated in a one-token generation (the prefill, static cache
included), and ``decode_alloc_mb_per_step``, what one compiled decode step
allocates — a sparse step: in proportion to the keys it attends, not the cache.

Rows go to the run store (``pass = 'decode'``, variant ``hf-static-decode``,
impl = the attention name; the case, prefill ms and memory in ``config``); a
table and one JSON line are printed.

    python scripts/bench_hf_serving.py [--quick] [--model small|large] [--contexts 1024 4096]
        [--batches 1 4] [--threads 1] [--device auto] [--tag T] [--db runs/dilcompile.duckdb]
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from dilcompile.cli._bench import COUNT, SIZE, close_store, open_store, parser  # noqa: E402
from dilcompile.cli._util import render  # noqa: E402
from dilcompile.profile.memory import peak_bytes, trace  # noqa: E402
from dilcompile.profile.record import timing_columns  # noqa: E402
from dilcompile.profile.runner import run_script  # noqa: E402
from dilcompile.store import DEFAULT_DB, StoreError  # noqa: E402

PROG = "bench_hf_serving"

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


class _Server:
    """One attention's model in its own process, answering the parent's calls (``_serve``)."""

    def __init__(self, name: str, cfg: dict, max_len: int, device: str, dtype, threads: int, new: int,
                 check_max: int):
        from transformers import CompileConfig

        from dilcompile.integrations.transformers import register

        register()
        torch.set_num_threads(threads)
        self.name, self.device, self.new, self.check_max = name, torch.device(device), new, check_max
        self.model = _model(name, cfg, max_len, self.device, dtype)
        # On CUDA, transformers' own default: the decode step captured as a CUDA graph.
        mode = "reduce-overhead" if self.device.type == "cuda" else "default"
        compile_config = CompileConfig(fullgraph=True, mode=mode)
        compile_config._compile_all_devices = True  # transformers compiles on CUDA by itself; on CPU when asked
        self.static = dict(cache_implementation="static", compile_config=compile_config)

    def _generate(self, new: int, **kw):
        """→ (tokens, prefill ms, decode ms of the new − 1 steps after the first token)."""
        from transformers import StoppingCriteriaList

        clock = _Clock()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        start = time.perf_counter()
        with torch.no_grad():  # the criterion reads the new token: each stamp follows its step's compute
            out = self.model.generate(self.ids, attention_mask=self.mask, do_sample=False, pad_token_id=0,
                                      max_new_tokens=new, min_new_tokens=new, **kw,
                                      stopping_criteria=StoppingCriteriaList([clock]))
        return out, (clock.stamps[0] - start) * 1e3, (clock.stamps[-1] - clock.stamps[0]) * 1e3

    def case(self, context: int, batch: int) -> tuple[float, int, bool | None]:
        """Warm-up of a case: → (compile s, graphs compiled, tokens equal to eager's, or None if not compared)."""
        from torch._dynamo.utils import counters

        self.ids, self.mask = _prompts(context, batch, self.device)
        torch._dynamo.reset()  # each case's graphs
        graphs = counters["stats"]["unique_graphs"]
        out, pre, dec = self._generate(self.new, **self.static)
        same = None  # FlexAttention's eager path materialises every score: not compared
        if self.name != "flex_attention" and context <= self.check_max:
            same = bool(torch.equal(out, self._generate(self.new)[0]))
        return (pre + dec) / 1e3, counters["stats"]["unique_graphs"] - graphs, same

    def round(self) -> tuple[float, float, int]:
        """One timed generation: → (prefill ms, decode ms, graphs compiled meanwhile)."""
        from torch._dynamo.utils import counters

        graphs = counters["stats"]["unique_graphs"]
        _, pre, dec = self._generate(self.new, **self.static)
        return pre, dec, counters["stats"]["unique_graphs"] - graphs

    def memory(self) -> dict:
        """Untimed (the profiler slows what it watches): the prefill peak, and what the last decode step
        of a 3-token generation allocates inside its compiled graph."""
        step = trace(lambda: self._generate(3, **self.static), self.device).regions("Torch-Compiled Region")[-1]
        return {"prefill_peak_mb": peak_bytes(lambda: self._generate(1, **self.static), self.device) / 2**20,
                "decode_alloc_mb_per_step": step.allocated_bytes / 2**20}


def _serve(conn, *args) -> None:
    """A worker process: builds a ``_Server`` (the workers import and build at once) and answers
    (method, args) with ("ok", value) or ("error", text)."""

    def error(exc):
        return "error", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"

    try:
        server, failed = _Server(*args), None
    except Exception as exc:  # noqa: BLE001 — every call answers it
        server, failed = None, error(exc)
    while True:
        call, call_args = conn.recv()
        if call == "stop":
            return
        try:
            conn.send(failed or ("ok", getattr(server, call)(*call_args)))
        except Exception as exc:  # noqa: BLE001 — e.g. FlexAttention's CPU lowering refusing a decode shape
            conn.send(error(exc))


class _Worker:
    """The parent's handle on a ``_serve`` process: ``call`` runs a ``_Server`` method there and waits."""

    def __init__(self, context, *args):
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, *args), daemon=True)
        self.process.start()

    def call(self, method: str, *args):
        self.conn.send((method, args))
        status, value = self.conn.recv()
        if status == "error":
            raise RuntimeError(value)
        return value

    def stop(self) -> None:
        try:
            self.conn.send(("stop", ()))
        except OSError:  # the process died (its error was raised by ``call``)
            pass
        self.process.join(timeout=60)


def main(argv=None) -> int:
    ap = parser(PROG, __doc__, quick=False, rounds=5, device="auto", tag=None, db=DEFAULT_DB)
    ap.add_argument("--model", choices=sorted(MODELS), default="small")
    ap.add_argument("--contexts", type=SIZE, nargs="+", default=[1024, 4096, 16384], help="prompt lengths")
    ap.add_argument("--batches", type=SIZE, nargs="+", default=[1, 4])
    ap.add_argument("--attentions", nargs="+", choices=ATTENTIONS, default=list(ATTENTIONS))
    ap.add_argument("--new", type=SIZE, default=32, help="new tokens per generation, at least 2")
    ap.add_argument("--threads", type=SIZE, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--check-max", type=COUNT, default=4096,
                    help="compare tokens with eager generation up to this context")
    args = ap.parse_args(argv)
    if args.new < 2:  # a decode rate needs a step after the first token
        ap.error(f"argument --new: '{args.new}' is not a whole number ≥ 2")
    try:
        import transformers  # noqa: F401
    except ImportError:
        print(f"{PROG}: error: needs transformers: pip install 'dilcompile[hf]'", file=sys.stderr)
        return 1
    if args.quick:
        cfg, cases, attentions = QUICK, [(24, 2)], ["sdpa", *OURS]
        args.new, args.rounds = 6, 2
    else:
        cfg, attentions = MODELS[args.model] | SPARSITY, args.attentions
        cases = [(c, b) for c in args.contexts for b in args.batches]
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    threads = args.threads or torch.get_num_threads()
    spec = cfg | {"model": "quick" if args.quick else args.model, "new": args.new, "rounds": args.rounds,
                  "threads": threads, "cases": cases}
    recorder = open_store(PROG, args.db, spec, device, tag=args.tag)  # checked before anything is measured
    if recorder is None:
        return 1

    spawn = multiprocessing.get_context("spawn")  # CUDA and torch's thread pools do not survive a fork
    max_len = max(c for c, _ in cases) + args.new
    workers = {name: _Worker(spawn, name, cfg, max_len, str(device), dtype, threads, args.new, args.check_max)
               for name in attentions}
    names = ["context", "batch", "attention", "prefill ms", "decode tokens/s", "÷ sdpa", "tokens = eager",
             "prefill peak MB", "decode MB/step"]
    table, all_equal, recompiled = [], True, 0
    try:
        for context, batch in cases:
            compile_s, same, failed, running = {}, {}, {}, []
            for name in attentions:  # warm-up, one process at a time: compiles the decode step once
                try:
                    compile_s[name], graphs, same[name] = workers[name].call("case", context, batch)
                except RuntimeError as exc:
                    failed[name] = str(exc)
                    print(f"  {context} × {batch} {name}: failed, left out of this case: {exc}", file=sys.stderr)
                    continue
                running.append(name)
                said = {True: "equal", False: "DIFFER from"}.get(same[name], "not compared with")
                print(f"  {context} × {batch} {name}: compiled {graphs} graph(s) in {compile_s[name]:.1f} s; "
                      f"tokens {said} eager", file=sys.stderr)
            decode, prefill = ({name: [] for name in running} for _ in range(2))
            recompiles = 0
            for _ in range(args.rounds):  # interleaved: every attention once per round
                for name in running:
                    pre, dec, graphs = workers[name].call("round")
                    prefill[name].append(pre)
                    decode[name].append(dec)
                    recompiles += graphs
            recompiled += recompiles
            memory = {name: workers[name].call("memory") for name in running}
            base = {"variant": "hf-static-decode", "pass": "decode", "mode": "longnet",
                    "dtype": str(dtype).removeprefix("torch."), "batch": batch, "seq_len": context + args.new,
                    "heads": cfg["heads"], "head_dim": cfg["hidden"] // cfg["heads"], "causal": True,
                    "compiled": True, "recompiles": recompiles}
            rate = {}
            try:
                for name, error in failed.items():
                    recorder.write(base | {"impl": name, "status": "error", "error": error,
                                           "config": json.dumps(spec | {"context": context})})
                for name in running:
                    case = {"context": context, "prefill_ms": statistics.median(prefill[name]),
                            "same_tokens_as_eager": same[name], **memory[name]}
                    rate[name] = recorder.write(base | {"impl": name, "status": "ok", "compile_s": compile_s[name],
                                                        **timing_columns(decode[name], batch * (args.new - 1)),
                                                        "config": json.dumps(spec | case)})["tokens_per_s"]
            except StoreError as exc:  # the writer saved the rows the store refused; the error says where
                print(f"{PROG}: error: {exc}", file=sys.stderr)
                return 1
            table += [[context, batch, name, statistics.median(prefill[name]), rate[name],
                       rate[name] / rate["sdpa"] if "sdpa" in rate else None, same[name], *memory[name].values()]
                      for name in running]
            all_equal &= all(v is not False for v in same.values())
    finally:
        for worker in workers.values():
            worker.stop()
    if close_store(PROG, recorder):
        return 1
    print(render(names, table))
    print(f"medians of {args.rounds} interleaved rounds on {recorder.device_name}, "
          f"{str(dtype).removeprefix('torch.')}, {threads} thread(s), one process per attention; "
          f"{recompiled} graph(s) compiled while timing")
    print(json.dumps({"bench": "hf_serving", "rows": [dict(zip(names, t)) for t in table],
                      "recompiles": recompiled, "sweep_id": recorder.sweep_id}))
    return 0 if all_equal else 1


if __name__ == "__main__":
    sys.exit(run_script(main, PROG))
