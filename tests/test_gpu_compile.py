"""The fused dilated kernels compile for NVIDIA GPUs with no GPU here, within
register, spill and shared-memory budgets (docs/gpu.md, "Compiled for the
GPU"), in a subprocess with TRITON_INTERPRET unset.

Compiled: on sm_90 every (kernel, dtype, head dim, tile) the launcher can
produce, with the heaviest flags (causal, key mask) and eager typing; with
torch.compile's typing (scale fp64, integers i64) and on sm_80 and sm_100
(when this triton targets it) the largest tile of each; the lighter flag
pairs on sm_90 at head dims 64 and 128, and there the untimed candidates in
bf16. Budgets: half precision spills nothing on sm_90 (but the configurations
timed fastest on an H100 with spills, at most 512 B) and at most 16 B
elsewhere, fp32 at most 1 KB, shared memory within the device's limit, and
only the entry cast of an fp64 scale is fp64."""

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

pytest.importorskip("triton")

from dilcompile.dilated.work import kernel_config  # noqa: E402
from dilcompile.testing.gpu_compile import DTYPES, HEAD_DIMS, KERNELS, SHARED_LIMIT, Config, tiles_for  # noqa: E402

_SCRIPT = """
import json, sys
from dataclasses import asdict
from dilcompile.testing.gpu_compile import Config, reports
configs = [Config(**c) for c in json.loads(sys.stdin.read())]
for r in reports(configs, jobs=2):
    print(json.dumps(dict(asdict(r.config), registers=r.registers, spill=r.spill_bytes, shared=r.shared_bytes,
                          fp64=r.fp64_instructions)))
"""


def _knows(arch: int) -> bool:
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return os.path.exists(get_ptxas(arch).path)
    except Exception:  # an older triton: no Blackwell ptxas
        return False


def _configs() -> list[Config]:
    out = []
    for kernel in KERNELS:
        for dtype in DTYPES:
            for d in HEAD_DIMS:
                tiles = tiles_for(d, dtype, 90, kernel)
                out += [Config(kernel, dtype, d, t, 90) for t in tiles]
                out.append(Config(kernel, dtype, d, tiles[0], 90, typing="inductor"))
                out.append(Config(kernel, dtype, d, tiles_for(d, dtype, 80, kernel)[0], 80))
                if _knows(100):
                    out.append(Config(kernel, dtype, d, tiles[0], 100))
                if d in (64, 128):
                    out += [Config(kernel, dtype, d, tiles[0], 90, causal, keep)
                            for causal, keep in ((False, False), (False, True), (True, False))]
                if d == 128 and dtype == "bf16":  # packed sequences: the segment from the table
                    out.append(Config(kernel, dtype, d, tiles[0], 90, varlen=True))
                if d in (64, 128) and dtype == "bf16":  # the candidates: whole blocks unmasked, dq by atomics
                    tile = 64 if kernel == "_dkdv_kernel" else tiles[0]  # 128 spilled 692 B with the atomics
                    out.append(Config(kernel, dtype, d, tile, 90, False, False, candidate=True))
                    if kernel == "_fwd_kernel":  # and the output in bf16, with the heaviest flags
                        out.append(Config(kernel, dtype, d, tile, 90, half_out=True))
                    out.append(Config(kernel, dtype, d, tile, 90, tma=True))  # rows through descriptors (TMA)
    return out


@pytest.mark.timeout(3600)  # ~330 builds, 2 at a time: about 8 min on a quiet 2-core machine, cold
def test_kernels_compile_for_the_gpu_within_budgets():
    configs = _configs()
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run([sys.executable, "-c", _SCRIPT], input=json.dumps([asdict(c) for c in configs]), env=env,
                         capture_output=True, text=True, timeout=3000)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == len(configs)
    problems = []
    for r in rows:
        half = r["dtype"] != "fp32"
        spill_budget = (0 if r["arch"] == 90 else 16) if half else 1024  # 16 B: a few words, in L1
        chosen = kernel_config(r["kernel"].strip("_").removesuffix("_kernel"), {"fp16": "float16", "bf16": "bfloat16",
                               "fp32": "float32"}[r["dtype"]], r["head_dim"], r["arch"], r["tile"])
        if chosen.timed:
            spill_budget = 512  # timed fastest on an H100 with these spills (work.CONFIGS, docs/gpu.md)
        found = [f"spills {r['spill']} B" for _ in [0] if r["spill"] > spill_budget] + \
            [f"shared {r['shared']} B" for _ in [0] if r["shared"] > SHARED_LIMIT[r["arch"]]] + \
            [f"{r['fp64']} fp64 instructions" for _ in [0] if r["fp64"] > (2 if r["typing"] == "inductor" else 0)]
        problems += [f"{r['kernel']} {r['dtype']} D={r['head_dim']} tile={r['tile']} sm_{r['arch']} {r['typing']} "
                     f"causal={r['causal']} mask={r['has_keep']}: {p}" for p in found]
    assert not problems, "\n".join(problems)


def test_one_compile_per_distinct_build_and_none_for_a_kept_report(tmp_path, monkeypatch):
    # configurations that compile to one cubin share one compile; a later run reads the kept report
    from dilcompile.testing import gpu_compile

    monkeypatch.setenv("DILCOMPILE_GPU_COMPILE_CACHE", str(tmp_path))
    compiled = []
    monkeypatch.setattr(gpu_compile, "report", lambda c: compiled.append(c) or gpu_compile.Report(c, 1, 2, 3, 4, 0))
    same = Config("_fwd_kernel", "bf16", 64, 64, 90)
    configs = [same, Config("_fwd_kernel", "bf16", 64, 64, 90), Config("_fwd_kernel", "bf16", 64, 32, 90),
               Config("_fwd_kernel", "bf16", 64, 64, 90, typing="inductor")]
    assert gpu_compile.build_key(configs[0]) == gpu_compile.build_key(configs[1])
    first = gpu_compile.reports(configs, jobs=1)
    assert len(compiled) == 3 and [r.config for r in first] == configs
    assert gpu_compile.reports(configs, jobs=1) == first and len(compiled) == 3
