"""Compile the fused dilated Triton kernels ahead of time for NVIDIA targets.

No GPU is needed: ``triton.compile`` with an explicit ``GPUTarget`` lowers to
PTX and cubin with the ptxas bundled in the triton wheel, and ptxas's ``-v``
report gives registers, spills and the stack frame; triton's metadata gives
shared memory. ``matrix()`` lists every configuration the launcher
(``dilated/impl/triton.py``) can produce, each typed as an eager launch types
its arguments and as torch.compile does (``scale`` fp64, integers i64).

    python -m dilcompile.testing.gpu_compile [--arch 80 90 100] [--jobs 2] [--largest] [--all-flags]

prints the compile table of docs/gpu.md, "Compiled for the GPU". Runs with
TRITON_INTERPRET unset (the interpreter replaces compilation).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace

KERNELS = ("_fwd_kernel", "_dq_kernel", "_dkdv_kernel")
DTYPES = ("fp16", "bf16", "fp32")
HEAD_DIMS = (16, 32, 64, 128, 256)  # every BLOCK_D the launcher makes (the next power of two ≥ D, ≥ 16)
SHARED_LIMIT = {80: 166912, 86: 101376, 89: 101376, 90: 232448, 100: 232448}  # bytes per block, opt-in maximum
_FLOATS = {"fp16": "*fp16", "bf16": "*bf16", "fp32": "*fp32"}
_FP32_POINTERS = {"O", "LSE", "DELTA", "DQ", "DK", "DV"}  # the fp32 accumulators, lse and Δ
_TORCH_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "fp32": "float32"}


@dataclass(frozen=True)
class Config:
    kernel: str
    dtype: str
    head_dim: int
    tile: int
    arch: int
    causal: bool = True
    has_keep: bool = True
    typing: str = "eager"  # or "inductor": scale fp64, integers i64
    varlen: bool = False  # packed sequences: each program's segment read from the SEGS table
    candidate: bool = False  # the untimed candidate: fwd and dq walk full blocks unmasked, dk/dv adds dq by atomics
    half_out: bool = False  # fwd: the output in the inputs' dtype (work.KernelConfig.half_out), not fp32
    tma: bool = False  # fwd, dq: keys and values through tensor descriptors (work.KernelConfig.tma)


@dataclass(frozen=True)
class Report:
    config: Config
    registers: int
    spill_bytes: int  # spill stores
    stack_bytes: int  # the stack frame
    shared_bytes: int
    fp64_instructions: int  # ".f64" in the PTX: only the entry cast of an fp64 scale may have one

    @property
    def shared_ok(self) -> bool:
        return self.shared_bytes <= SHARED_LIMIT.get(self.config.arch, min(SHARED_LIMIT.values()))


def tiles_for(head_dim: int, dtype: str, arch: int = 90, kernel: str = "_fwd_kernel") -> tuple[int, ...]:
    """The tiles ``work.branch_tile`` can choose for this head dim, dtype, arch and kernel."""
    from dilcompile.dilated.work import TILES, kernel_config

    cap = kernel_config(_name(kernel), _TORCH_DTYPES[dtype], head_dim, arch).tile
    return tuple(t for t in TILES if t <= cap)


def _name(kernel: str) -> str:
    """"fwd", "dq", "dkdv" of "_fwd_kernel", …: ``work``'s kernel names."""
    return kernel.strip("_").removesuffix("_kernel")


def matrix(archs=(80, 90), flags: bool = True) -> list[Config]:
    """Every (kernel, dtype, head dim, tile, arch) the launcher produces, with
    all four (causal, key mask) flag pairs under both typings when ``flags``,
    else with the heaviest (causal, key mask) under both typings."""
    pairs = [(c, k) for c in (False, True) for k in (False, True)] if flags else [(True, True)]
    return [Config(kernel, dtype, d, tile, arch, causal, keep, typing)
            for arch in archs for kernel in KERNELS for dtype in DTYPES for d in HEAD_DIMS
            for tile in tiles_for(d, dtype, arch, kernel) for causal, keep in pairs for typing in ("eager", "inductor")]


def launch_flags(config: Config) -> dict:
    """The constexprs and launch options the launcher gives ``config``'s
    kernel (``work.launch_flags``) as a later branch's launch: it reads and adds
    (OVERWRITE off), the heavier variant; the candidate switched on if asked."""
    from dilcompile.dilated import work

    name = _name(config.kernel)
    chosen = work.kernel_config(name, _TORCH_DTYPES[config.dtype], config.head_dim, config.arch, config.tile)
    if config.candidate:
        chosen = replace(chosen, **{"atomic_dq" if name == "dkdv" else "full_blocks": True})
    chosen = replace(chosen, tma=config.tma)
    return work.launch_flags(name, chosen, config.head_dim, _TORCH_DTYPES[config.dtype], branch=1, covers=False,
                             causal=config.causal, has_keep=config.has_keep, varlen=config.varlen, interpreting=False,
                             arch=config.arch)


def _build(config: Config):
    """(kernel, signature, constexprs, specialisation, options) of ``config``: what triton.compile takes."""
    from dilcompile.kernels import triton_dilated as kernels

    fn = getattr(kernels, config.kernel)
    integer = "i64" if config.typing == "inductor" else "i32"
    signature = {}
    for arg in fn.arg_names:
        if arg == "KEEP":
            signature[arg] = "*i8"
        elif arg in ("OFFSETS", "SEGS"):
            signature[arg] = "*i32"
        elif arg == "O" and config.half_out:
            signature[arg] = _FLOATS[config.dtype]
        elif arg in _FP32_POINTERS:
            signature[arg] = "*fp32"
        elif arg in ("Q", "K", "V", "DO"):
            signature[arg] = _FLOATS[config.dtype]
        elif arg in ("BRANCH", "H", "N", "D", "w", "r"):
            signature[arg] = integer
        elif arg == "scale":
            signature[arg] = "fp64" if config.typing == "inductor" else "fp32"
        else:
            signature[arg] = "constexpr"
    constexprs = launch_flags(config)
    options = dict(num_warps=constexprs.pop("num_warps"), num_stages=constexprs.pop("num_stages"))
    # What a launch specializes on (triton's JIT and Inductor alike): 16-byte
    # aligned pointers, and N, D and w divisible by 16 (head dims here are).
    attrs = {(i,): [["tt.divisibility", 16]] for i, arg in enumerate(fn.arg_names)
             if signature[arg].startswith("*") or arg in ("N", "D", "w")}
    return fn, signature, constexprs, attrs, options


def build_key(config: Config) -> str:
    """One kernel build: the kernels' source file (each kernel and what it
    calls), triton's version (its ptxas), signature, constexprs,
    specialisation, options and target. Configurations of one key compile to
    one cubin, so one compile serves them all, in this run and the next."""
    import triton

    from dilcompile.kernels import triton_dilated as kernels

    fn, signature, constexprs, attrs, options = _build(config)
    with open(kernels.__file__, "rb") as f:
        source = hashlib.sha256(f.read()).hexdigest()
    build = [triton.__version__, source, config.kernel, signature, sorted(constexprs.items()), sorted(map(str, attrs.items())),
             sorted(options.items()), config.arch]
    return hashlib.sha256(json.dumps(build).encode()).hexdigest()


def compile_kernel(config: Config):
    """Compile one configuration; returns (triton's compiled kernel, ptxas's -v log)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("TRITON_INTERPRET=1: unset it to compile for a GPU")
    import triton
    from triton import knobs
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constexprs, attrs, options = _build(config)
    log = io.StringIO()
    knobs.nvidia.dump_ptxas_log = True
    knobs.compilation.always_compile = True  # a cached kernel brings no ptxas report
    try:
        with contextlib.redirect_stdout(log):
            compiled = triton.compile(ASTSource(fn, signature, constexprs=constexprs, attrs=attrs),
                                      target=GPUTarget("cuda", config.arch, 32), options=options)
    finally:
        knobs.nvidia.dump_ptxas_log = False
        knobs.compilation.always_compile = False
    return compiled, log.getvalue()


def report(config: Config) -> Report:
    """Compile ``config`` and read ptxas's report and triton's shared memory."""
    compiled, log = compile_kernel(config)

    def number(pattern):
        found = re.search(pattern, log)
        return int(found.group(1)) if found else 0

    if "Used" not in log:
        raise RuntimeError(f"no ptxas report for {config}: {log!r}")
    return Report(config, registers=number(r"Used (\d+) registers"),
                  spill_bytes=number(r"(\d+) bytes spill stores"), stack_bytes=number(r"(\d+) bytes stack frame"),
                  shared_bytes=int(compiled.metadata.shared), fp64_instructions=compiled.asm["ptx"].count(".f64"))


def cache_dir() -> str:
    """Where reports are kept by build key: $DILCOMPILE_GPU_COMPILE_CACHE, else ~/.cache/dilcompile/gpu_compile."""
    return os.environ.get("DILCOMPILE_GPU_COMPILE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "dilcompile", "gpu_compile")


def reports(configs: list[Config], jobs: int = 2) -> list[Report]:
    """``report`` of every configuration, ``jobs`` processes at a time: one
    compile per distinct build (``build_key``), none for a build whose report
    an earlier run kept (``cache_dir``)."""
    keys = [build_key(c) for c in configs]
    found: dict[str, dict] = {}
    for key in set(keys):
        path = os.path.join(cache_dir(), key + ".json")
        if os.path.exists(path):
            with open(path) as f:
                found[key] = json.load(f)
    todo = {key: config for key, config in zip(keys, configs) if key not in found}
    os.makedirs(cache_dir(), exist_ok=True)
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(ProcessPoolExecutor(jobs)) if jobs > 1 and len(todo) > 1 else None
        made = pool.map(report, todo.values(), chunksize=1) if pool else map(report, todo.values())
        for key, r in zip(todo, made):  # kept as each arrives: a run cut short leaves what it compiled
            found[key] = {k: v for k, v in asdict(r).items() if k != "config"}
            temporary = os.path.join(cache_dir(), f"{key}.{os.getpid()}.tmp")
            with open(temporary, "w") as f:
                json.dump(found[key], f)
            os.replace(temporary, os.path.join(cache_dir(), key + ".json"))  # whole or absent
    return [Report(config, **found[key]) for key, config in zip(keys, configs)]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, nargs="+", default=[80, 90, 100])
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    p.add_argument("--all-flags", action="store_true", help="every flag pair (default: the heaviest, causal + mask)")
    p.add_argument("--largest", action="store_true", help="only the largest tile of each kernel, dtype and D")
    args = p.parse_args(argv)
    configs = matrix(tuple(args.arch), flags=args.all_flags)
    if args.largest:
        configs = [c for c in configs if c.tile == tiles_for(c.head_dim, c.dtype, c.arch, c.kernel)[0]]
    rows = reports(configs, args.jobs)
    print("| kernel | dtype | D | tile | sm | typing | causal, mask | registers | spill B | stack B | shared B |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        c = r.config
        print(f"| {c.kernel} | {c.dtype} | {c.head_dim} | {c.tile} | {c.arch} | {c.typing} | {int(c.causal)}, "
              f"{int(c.has_keep)} | {r.registers} | {r.spill_bytes} | {r.stack_bytes} | {r.shared_bytes} |")
    for r in rows:  # one JSON line per configuration, for scripts
        print(json.dumps(dict(asdict(r.config), **{k: v for k, v in asdict(r).items() if k != "config"})),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
