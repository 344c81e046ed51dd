"""torch.compile for an H100 on a machine without one: Inductor down to sm_90 cubin.

A CPU-only torch can trace and compile for device "cuda" if it is told what
the device is and never asked to touch it. ``fake_h100()`` installs the
stand-ins (each says why it is needed) and removes them on exit:

- ``torch.cuda`` and Dynamo's ``CudaInterface`` report one sm_90 device with
  an H100's properties; device guards, streams and RNG state are no-ops;
- a triton driver whose target is ``GPUTarget("cuda", 90, 32)``: kernels
  compile to cubin with triton's bundled ptxas, and nothing loads or runs;
- the few CPU-build entry points that refuse "cuda" before dispatch reaches
  the fake tensor (``Tensor.contiguous``, ``Tensor.copy_``, the raw stream
  getter of Inductor's generated module) are routed around;
- Inductor's joint-graph pattern init (it traces real CUDA tensors) and
  constant folding are off, and the static CUDA launcher is not used.

``compile_for_sm90(fn, *inputs)`` compiles ``fn`` with ``fullgraph=True`` on
fake CUDA inputs and returns every Triton kernel Inductor compiled, including
user kernels of ``torch.library.triton_op``. Inside ``fake_h100()`` and a
``FakeTensorMode``; ``to_fake_cuda`` moves modules and BlockMasks there.

A backward needs more. Autograd asks c10 for the CUDA device guard when it
records a fake CUDA leaf, and ATen's CUDA hooks for an accelerator when it
runs; a CPU-only build registers neither, and the process aborts in C++.
``build_fake_cuda_runtime(directory)`` compiles a tiny shared library that
registers both as no-ops (one device, its default stream, nothing else); a
fresh process loads it with ``ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)``
before importing torch, which queries the hooks once, on import. Then
``compile_for_sm90(fn, ..., backward=True)`` compiles a loss's forward and
backward graphs, as a training step does on a GPU.

Private pieces of torch and triton are looked up defensively:
``FakeGpuUnavailable`` names the one that is missing (the tests skip).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess

import torch


class FakeGpuUnavailable(RuntimeError):
    """This torch or triton lacks a private piece the harness relies on."""


class H100Properties:
    """What ``torch.cuda.get_device_properties`` reports for an H100 SXM."""
    name = "NVIDIA H100 80GB HBM3"
    major, minor = 9, 0
    multi_processor_count = 132
    total_memory = 80 * 2**30
    max_threads_per_multi_processor = 2048
    max_threads_per_block = 1024
    regs_per_multiprocessor = 65536
    warp_size = 32
    shared_memory_per_block = 49152
    shared_memory_per_block_optin = 232448
    shared_memory_per_multiprocessor = 233472
    L2_cache_size = 50 * 2**20
    gcnArchName = "NVIDIA H100"
    uuid = "00000000-0000-0000-0000-000000000000"
    is_integrated = 0
    is_multi_gpu_board = 0
    clock_rate = 1980000
    memory_clock_rate = 2619000
    memory_bus_width = 5120


def _returns(value):
    # A fresh function per stand-in: Dynamo keys its handlers of torch functions by identity.
    return lambda *args, **kwargs: value


def _contiguous(self, memory_format=torch.contiguous_format):
    # Tensor.contiguous initializes CUDA in its C++ binding before dispatch; clone reaches the fake rule.
    return self if self.is_contiguous(memory_format=memory_format) else self.clone(memory_format=memory_format)


def _copy_(self, src, non_blocking=False):
    return torch.ops.aten.copy_.default(self, src, non_blocking)  # the same, for copy_


def _stand_ins() -> list[tuple[object, str, object]]:
    try:
        import torch._inductor.fx_passes.joint_graph as joint_graph
        from torch._dynamo.device_interface import CudaInterface
    except ImportError as exc:
        raise FakeGpuUnavailable(f"torch lacks {exc.name}") from exc
    for obj, name in ((CudaInterface, "Worker"), (joint_graph, "lazy_init")):
        if not hasattr(obj, name):
            raise FakeGpuUnavailable(f"torch lacks {getattr(obj, '__name__', obj)}.{name}")
    cuda, iface = torch.cuda, CudaInterface
    return [
        (cuda, "is_available", _returns(True)),
        (cuda, "device_count", _returns(1)),
        (cuda, "current_device", _returns(0)),
        (cuda, "get_device_properties", _returns(H100Properties())),
        (cuda, "get_device_capability", _returns((9, 0))),
        (cuda, "get_device_name", _returns(H100Properties.name)),
        (cuda, "is_bf16_supported", _returns(True)),
        (cuda, "get_rng_state", _returns(torch.zeros(16, dtype=torch.uint8))),  # Dynamo saves it per frame
        (cuda, "set_rng_state", _returns(None)),
        (cuda, "_exchange_device", _returns(0)),  # torch.cuda.device(...) guards
        (cuda, "_maybe_exchange_device", _returns(0)),
        (cuda, "set_device", _returns(None)),
        (cuda, "synchronize", _returns(None)),
        (cuda, "_lazy_init", _returns(None)),  # device queries from C++ (fake runtime loaded) call it first
        (iface, "is_available", staticmethod(_returns(True))),
        (iface, "device_count", staticmethod(_returns(1))),
        (iface, "current_device", staticmethod(_returns(0))),
        (iface, "set_device", staticmethod(_returns(None))),
        (iface, "synchronize", staticmethod(_returns(None))),
        (iface, "get_device_properties", staticmethod(_returns(H100Properties()))),
        (iface, "get_compute_capability", staticmethod(_returns(90))),
        (iface, "get_raw_stream", staticmethod(_returns(0))),
        (iface, "exchange_device", staticmethod(_returns(0))),
        (iface, "maybe_exchange_device", staticmethod(_returns(0))),
        (iface, "memory_allocated", staticmethod(_returns(0))),
        (iface, "is_bf16_supported", staticmethod(_returns(True))),
        (iface.Worker, "get_device_properties", staticmethod(_returns(H100Properties()))),
        (iface.Worker, "current_device", staticmethod(_returns(0))),
        (torch.Tensor, "contiguous", _contiguous),
        (torch.Tensor, "copy_", _copy_),
        (torch._C, "_cuda_getCurrentRawStream", _returns(0)),  # imported by Inductor's generated module
        (joint_graph, "lazy_init", _returns(None)),  # its SDPA / pad-mm patterns trace real CUDA tensors
    ]


def _fake_driver():
    """A triton CUDA driver for sm_90 that compiles but never loads or launches."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.backends.driver import GPUDriver
        from triton.backends.nvidia.driver import CudaDriver, ty_to_cpp
    except ImportError as exc:
        raise FakeGpuUnavailable(f"triton lacks {exc.name}") from exc

    class Utils:
        def load_binary(self, name, cubin, shared, device):  # (module, function, registers, spills, threads)
            return 0, 0, 0, 0, 1024

        def get_device_properties(self, device):
            p = H100Properties
            return {"max_shared_mem": p.shared_memory_per_block_optin, "multiprocessor_count": p.multi_processor_count,
                    "max_num_regs": p.regs_per_multiprocessor, "warpSize": p.warp_size,
                    "sm_clock_rate": p.clock_rate, "mem_clock_rate": p.memory_clock_rate,
                    "mem_bus_width": p.memory_bus_width}

    class Launcher:
        def __init__(self, src, metadata):
            pass

        def __call__(self, *args, **kwargs):  # nothing runs: there is no GPU
            return None

    class FakeCudaDriver(CudaDriver):  # a CudaDriver to Inductor's isinstance check, without libcuda
        def __init__(self):
            GPUDriver.__init__(self)
            self.utils = Utils()
            self.launcher_cls = Launcher
            self.get_current_stream = _returns(0)

        def get_current_target(self):
            return GPUTarget("cuda", 90, 32)

        def get_active_torch_device(self):
            return torch.device("cuda", 0)

        def map_python_to_cpp_type(self, ty):
            return ty_to_cpp(ty)

        def get_benchmarker(self):
            return _returns(0.0)

        def get_empty_cache_for_benchmark(self):
            return torch.empty(0)

        def clear_cache(self, cache):
            pass

    return FakeCudaDriver()


@contextlib.contextmanager
def fake_h100():
    """Within the block, torch and triton see one H100 that is never touched."""
    import torch._inductor.config as inductor_config
    from triton.runtime import driver

    patches = _stand_ins()
    missing = object()
    saved = [(obj, name, obj.__dict__.get(name, getattr(obj, name, missing))) for obj, name, _ in patches]
    previous = getattr(driver, "_active", None)
    try:
        for obj, name, value in patches:
            setattr(obj, name, value)
        driver.set_active(_fake_driver())
        with inductor_config.patch(use_static_cuda_launcher=False, fallback_random=True,
                                   joint_graph_constant_folding=False):
            yield
    finally:
        driver._active = previous
        for obj, name, value in saved:
            if value is missing:
                delattr(obj, name)
            else:
                setattr(obj, name, value)


def compile_for_sm90(fn, *inputs, backward: bool = False, dynamic: bool | None = None) -> list[tuple[str, int, int]]:
    """``torch.compile(fn, fullgraph=True)`` on fake CUDA ``inputs``, through
    Inductor to sm_90 cubin; returns (kernel name, cubin bytes, shared memory
    bytes) of every Triton kernel compiled. The compiled callable is dropped:
    Dynamo's graph then runs on the fake inputs, which computes nothing.
    ``backward``: ``fn`` returns a loss of parameters that require grad, and
    its backward graph is compiled now rather than at the first backward
    (which would run on fake tensors); needs the fake CUDA runtime (above).
    ``dynamic``: as ``torch.compile``'s (True: the graph a second length gets)."""
    import triton
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.compile_fx import compile_fx

    if backward and not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        raise FakeGpuUnavailable("torch lacks torch._functorch.config.force_non_lazy_backward_lowering")
    compiled = []
    real_compile = triton.compile

    def recording_compile(*args, **kwargs):
        kernel = real_compile(*args, **kwargs)
        compiled.append((kernel.name, len(kernel.asm["cubin"]), int(kernel.metadata.shared)))
        return kernel

    def backend(gm, example_inputs):
        compile_fx(gm, example_inputs)
        return gm.forward

    torch._dynamo.reset()
    triton.compile = recording_compile
    try:
        eager_backward = functorch_config.patch(force_non_lazy_backward_lowering=True) if backward else \
            contextlib.nullcontext()
        with inductor_config.patch(compile_threads=1), eager_backward:  # in this process, triton.compile wrapped
            torch.compile(fn, backend=backend, fullgraph=True, dynamic=dynamic)(*inputs)
    finally:
        triton.compile = real_compile
        torch._dynamo.reset()
    return compiled


_RUNTIME_SOURCE = r"""
// No-op CUDA device guard and ATen CUDA hooks for a CPU-only torch
// (dilcompile/testing/fake_gpu.py): one device, its default stream.
#include <ATen/detail/CUDAHooksInterface.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

namespace at::fake_cuda {
using c10::Device;
using c10::DeviceIndex;
using c10::DeviceType;
using c10::Stream;

struct Guard final : c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override { return DeviceType::CUDA; }
  Device exchangeDevice(Device) const override { return Device(DeviceType::CUDA, 0); }
  Device getDevice() const override { return Device(DeviceType::CUDA, 0); }
  void setDevice(Device) const override {}
  void uncheckedSetDevice(Device) const noexcept override {}
  Stream getStream(Device d) const override { return Stream(Stream::DEFAULT, d); }
  Stream exchangeStream(Stream s) const override { return s; }
  DeviceIndex deviceCount() const noexcept override { return 1; }
};
C10_REGISTER_GUARD_IMPL(CUDA, Guard);

struct CUDAHooks final : CUDAHooksInterface {  // the registry's key is the class name
  explicit CUDAHooks(CUDAHooksArgs) {}
  void init() const override {}
  bool isBuilt() const override { return true; }
  bool isAvailable() const override { return true; }
  bool hasCUDA() const override { return true; }
  bool hasPrimaryContext(DeviceIndex) const override { return true; }
  DeviceIndex deviceCount() const override { return 1; }
  DeviceIndex getCurrentDevice() const override { return 0; }
  DeviceIndex current_device() const override { return 0; }
  int getNumGPUs() const override { return 1; }
};
REGISTER_CUDA_HOOKS(CUDAHooks);
}  // namespace at::fake_cuda
"""


def build_fake_cuda_runtime(directory: str) -> str:
    """Compile the fake CUDA runtime for this torch into ``directory`` (once
    per torch and source) and return the library's path. Load it in a fresh
    process before torch is imported (module doc)."""
    if torch.version.cuda is not None:
        raise FakeGpuUnavailable(f"torch {torch.__version__} is a CUDA build: it has the real runtime")
    compiler = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++")
    if compiler is None:
        raise FakeGpuUnavailable("no C++ compiler (c++ or g++) to build the fake CUDA runtime")
    key = hashlib.sha256(f"{torch.__version__}\n{_RUNTIME_SOURCE}".encode()).hexdigest()[:16]
    library = os.path.join(directory, f"fake_cuda_runtime_{key}.so")
    if os.path.exists(library):
        return library
    os.makedirs(directory, exist_ok=True)
    source = os.path.join(directory, f"fake_cuda_runtime_{key}.{os.getpid()}.cpp")
    with open(source, "w") as f:
        f.write(_RUNTIME_SOURCE)
    root = os.path.dirname(torch.__file__)
    lib = os.path.join(root, "lib")
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    command = [compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
               "-I", os.path.join(root, "include"), source, f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10",
               "-ltorch_cpu", "-o", source + ".so"]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise FakeGpuUnavailable(f"the fake CUDA runtime did not compile: {run.stderr.strip()[-1500:]}")
    os.replace(source + ".so", library)  # whole or absent, should two processes build it
    os.remove(source)
    return library


def to_fake_cuda(obj):
    """A module (its parameters and buffers), a FlexAttention BlockMask or a
    tree of tensors with every tensor a fake CUDA tensor of the same shape,
    strides and dtype. Call inside the ``FakeTensorMode``; a module is
    converted in place. Convert parameters that do not require grad (a fake
    CUDA leaf that does aborts without the fake runtime: module doc), and
    ``requires_grad_()`` the result for a backward."""
    import torch.utils._pytree as pytree

    def convert(t):
        return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")

    if isinstance(obj, torch.nn.Module):
        return obj._apply(convert)
    if hasattr(obj, "_TENSOR_ATTRS"):  # a BlockMask: its own .to, with each tensor converted
        real_to = torch.Tensor.to
        torch.Tensor.to = lambda t, *args, **kwargs: convert(t)
        try:
            return obj.to("cuda")
        finally:
            torch.Tensor.to = real_to
    return pytree.tree_map_only(torch.Tensor, convert, obj)
