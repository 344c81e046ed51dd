"""The environment a sweep runs in: device, driver, versions, git state, host."""

from __future__ import annotations

import importlib.metadata
import platform
import socket
import subprocess
from pathlib import Path

import torch


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _git(*args: str) -> str | None:
    root = Path(__file__).resolve().parents[2]
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def resolve_device(device: str | None) -> torch.device:
    if device in (None, "auto"):
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):  # torch's parse error is a RuntimeError
        dev = None
    if dev is None or dev.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda, cuda:<index> or auto, got {device!r}")
    if dev.type == "cpu" and dev.index not in (None, 0):  # torch accepts cpu:5 and runs on the one CPU device
        raise ValueError(f"device {device!r}: torch has one CPU device; use --device cpu")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} asked for but torch sees no CUDA device; use --device cpu")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"device {device!r} asked for but torch sees {torch.cuda.device_count()} CUDA device(s) "
                         f"(cuda:0..cuda:{torch.cuda.device_count() - 1})")
    return dev


def gpu_identity(device: torch.device) -> tuple[int, str | None]:
    """(index, NVML uuid "GPU-...") of a CUDA device; the uuid survives CUDA_VISIBLE_DEVICES remapping."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is None:
        return index, None
    text = str(uuid)
    return index, text if text.startswith("GPU-") else f"GPU-{text}"


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()


def driver_version() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        try:
            v = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
        return v.decode() if isinstance(v, bytes) else str(v)
    except Exception:
        return None


def capture(device: torch.device) -> dict:
    """The ``sweeps`` table's environment columns for ``device``."""
    from .._version import __version__

    env = {
        "device_uuid": None,
        "sm_count": None,
        "driver_version": None,
        "cuda_version": torch.version.cuda,
        "torch_version": torch.__version__,
        "triton_version": _version("triton"),
        "python_version": platform.python_version(),
        "dilcompile_version": __version__,
        "git_sha": _git("rev-parse", "HEAD"),
        "git_dirty": None,
        "hostname": socket.gethostname(),
        "cpu_model": cpu_model(),
        "torch_threads": torch.get_num_threads(),
    }
    status = _git("status", "--porcelain", "--untracked-files=no")
    env["git_dirty"] = None if status is None else bool(status)
    if device.type == "cuda":
        index, uuid = gpu_identity(device)
        env["device_uuid"] = uuid
        env["sm_count"] = torch.cuda.get_device_properties(index).multi_processor_count
        env["driver_version"] = driver_version()
    else:
        import os
        env["sm_count"] = os.cpu_count()
    return env
