"""Telemetry sampled in a thread during a timed window.

GPU (NVML, package ``nvidia-ml-py``): power, SM/memory clock, temperature,
utilisation, clock-event (throttle) reasons; energy from the total-energy
counter across the window (power samples integrated where the counter is
missing). Host: CPU utilisation (all cores, /proc/stat) and frequency.
Everything degrades: without NVML the status says why and nothing fails.
"""

from __future__ import annotations

import glob
import threading
import time
from dataclasses import dataclass, field


def _load_nvml():
    import pynvml  # nvidia-ml-py
    return pynvml


# ---- host CPU -------------------------------------------------------------

def _cpu_times() -> tuple[int, int] | None:
    """(idle, total) jiffies of all CPUs."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return idle, sum(fields[:8])


def cpu_freq_mhz() -> float | None:
    """Mean current frequency of the CPUs, where the OS exposes it."""
    values = []
    for path in glob.glob("/sys/devices/system/cpu/cpu[0-9]*/cpufreq/scaling_cur_freq"):
        try:
            with open(path) as f:
                values.append(int(f.read()) / 1000.0)
        except (OSError, ValueError):
            pass
    if not values:
        try:
            with open("/proc/cpuinfo") as f:
                values = [float(line.split(":")[1]) for line in f if line.startswith("cpu MHz")]
        except (OSError, ValueError, IndexError):
            return None
    return sum(values) / len(values) if values else None


class _CpuUtil:
    def __init__(self):
        self.last = _cpu_times()

    def sample(self) -> float | None:
        now = _cpu_times()
        if now is None or self.last is None or now[1] == self.last[1]:
            return None
        d_idle, d_total = now[0] - self.last[0], now[1] - self.last[1]
        self.last = now
        return 100.0 * (1.0 - d_idle / d_total)


# ---- NVML -----------------------------------------------------------------

def _try(fn, *args):
    try:
        return fn(*args)
    except Exception:  # NVMLError_NotSupported and friends: this metric is just missing
        return None


def nvml_handle(nvml, index: int, uuid: str | None):
    if uuid:
        handle = _try(nvml.nvmlDeviceGetHandleByUUID, uuid)
        if handle is not None:
            return handle
    return nvml.nvmlDeviceGetHandleByIndex(index)


def _throttle_fn(nvml):
    # Renamed "clocks event reasons" in newer drivers/bindings.
    return getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
        getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)


def nvml_sample(nvml, handle) -> dict:
    power = _try(nvml.nvmlDeviceGetPowerUsage, handle)  # mW
    util = _try(nvml.nvmlDeviceGetUtilizationRates, handle)
    reasons_fn = _throttle_fn(nvml)
    return {
        "power_w": None if power is None else power / 1000.0,
        "sm_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_SM),
        "mem_clock_mhz": _try(nvml.nvmlDeviceGetClockInfo, handle, nvml.NVML_CLOCK_MEM),
        "temp_c": _try(nvml.nvmlDeviceGetTemperature, handle, nvml.NVML_TEMPERATURE_GPU),
        "gpu_util_pct": None if util is None else util.gpu,
        "mem_util_pct": None if util is None else util.memory,
        "throttle_reasons": None if reasons_fn is None else _try(reasons_fn, handle),
    }


@dataclass
class TelemetryResult:
    status: str  # "ok", "ok (energy from power samples)" or "unavailable: <reason>"
    samples: list[dict] = field(default_factory=list)  # telemetry table rows (without run_id)
    window_s: float = 0.0
    energy_j: float | None = None  # whole window

    def summary(self, calls: int, tokens_per_call: int) -> dict:
        """Run-level columns: energy per call and per token, averages over the window."""
        def values(key):
            return [s[key] for s in self.samples if s.get(key) is not None]

        def mean(key):
            v = values(key)
            return sum(v) / len(v) if v else None

        energy = None if self.energy_j is None else self.energy_j / calls
        power = self.energy_j / self.window_s if self.energy_j is not None and self.window_s > 0 else mean("power_w")
        reasons = values("throttle_reasons")
        temps = values("temp_c")
        throttle = 0
        for r in reasons:
            throttle |= int(r)
        return {
            "energy_j": energy,
            "energy_per_token_j": None if energy is None else energy / tokens_per_call,
            "avg_power_w": power,
            "max_temp_c": max(temps) if temps else None,
            "avg_sm_clock_mhz": mean("sm_clock_mhz"),
            "throttle_reasons": throttle if reasons else None,
            "cpu_util_pct": mean("cpu_util_pct"),
            "cpu_freq_mhz": mean("cpu_freq_mhz"),
            "telemetry_status": self.status,
        }


class Sampler:
    """Samples GPU (if ``gpu_index`` is given and NVML works) and host metrics
    every ``interval`` seconds between :meth:`start` and :meth:`stop`.

    ``nvml``: the NVML module to use (tests pass a fake); default ``pynvml``.
    """

    def __init__(self, gpu_index: int | None = None, gpu_uuid: str | None = None, interval: float = 0.02,
                 nvml=None, host: bool = True):
        self.interval, self.host = interval, host
        self.samples: list[dict] = []
        self._stop = threading.Event()
        self._thread = None
        self._nvml = self._handle = None
        self._energy0 = None
        if gpu_index is None:
            self.status = "unavailable: no NVIDIA GPU in this run (cpu)"
            return
        try:
            nvml = nvml if nvml is not None else _load_nvml()
        except ImportError:
            self.status = "unavailable: nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return
        try:
            nvml.nvmlInit()
            self._handle = nvml_handle(nvml, gpu_index, gpu_uuid)
            self._nvml = nvml
            self.status = "ok"
        except Exception as exc:  # driver missing, permissions, ...
            self.status = f"unavailable: NVML failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"

    def _energy_mj(self):
        if self._nvml is None:
            return None
        return _try(self._nvml.nvmlDeviceGetTotalEnergyConsumption, self._handle)

    def _sample(self, cpu: _CpuUtil | None) -> None:
        row = {"t_s": time.perf_counter() - self._t0}
        if self._nvml is not None:
            row.update(nvml_sample(self._nvml, self._handle))
        if cpu is not None:
            row["cpu_util_pct"] = cpu.sample()
            row["cpu_freq_mhz"] = cpu_freq_mhz()
        self.samples.append(row)

    def _loop(self, cpu) -> None:
        while not self._stop.wait(self.interval):
            self._sample(cpu)

    def start(self) -> "Sampler":
        self.samples = []
        self._stop.clear()
        self._t0 = time.perf_counter()
        self._energy0 = self._energy_mj()
        cpu = _CpuUtil() if self.host else None
        if self._nvml is not None:
            self._sample(None)  # a first GPU reading at t=0 (CPU utilisation needs an interval)
        self._thread = threading.Thread(target=self._loop, args=(cpu,), daemon=True, name="dilcompile-telemetry")
        self._thread.start()
        return self

    def stop(self) -> TelemetryResult:
        window = time.perf_counter() - self._t0
        energy1 = self._energy_mj()
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._nvml is not None:
            self._sample(None)  # a last GPU reading at the window's end
        status, energy = self.status, None
        # The counter advances in steps (tens of ms on an H100): a window that short reads 0 J from it,
        # so it counts only once it moved; else the power samples (one at each end at least) are integrated.
        if self._energy0 is not None and energy1 is not None and energy1 > self._energy0:
            energy = (energy1 - self._energy0) / 1000.0
        elif self._nvml is not None:
            pts = [(s["t_s"], s["power_w"]) for s in self.samples if s.get("power_w") is not None]
            if len(pts) >= 2:
                energy = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
                status = "ok (energy from power samples)"
        return TelemetryResult(status, list(self.samples), window, energy)

    def close(self) -> None:
        if self._nvml is not None:
            _try(self._nvml.nvmlShutdown)
            self._nvml = None
