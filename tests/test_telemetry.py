"""The telemetry sampler against a fake NVML module (no GPU needed)."""

import types

import pytest

from dilcompile.profile import telemetry
from dilcompile.profile.telemetry import Sampler, TelemetryResult


class _NotSupported(Exception):
    pass


def fake_nvml(energy=True, reasons_name="nvmlDeviceGetCurrentClocksEventReasons", init_error=None):
    """A stand-in for ``pynvml``: each reading advances a fake clock by one step."""
    state = {"calls": 0, "energy_mj": 1_000_000, "init": 0, "shutdown": 0}

    def tick():
        state["calls"] += 1
        return state["calls"]

    def nvmlInit():
        if init_error:
            raise init_error
        state["init"] += 1

    def energy_fn(handle):
        assert handle == "h0"
        state["energy_mj"] += 5_000  # 5 J between two readings
        return state["energy_mj"]

    m = types.SimpleNamespace(
        NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2, NVML_TEMPERATURE_GPU=0, state=state,
        nvmlInit=nvmlInit,
        nvmlShutdown=lambda: state.__setitem__("shutdown", state["shutdown"] + 1),
        nvmlDeviceGetHandleByUUID=lambda uuid: "h0" if uuid == "GPU-abc" else (_ for _ in ()).throw(_NotSupported()),
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetPowerUsage=lambda h: 300_000 + 1000 * tick(),  # mW
        nvmlDeviceGetClockInfo=lambda h, which: 1980 if which == 1 else 2619,
        nvmlDeviceGetTemperature=lambda h, which: 60 + tick() % 3,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=97, memory=40),
    )
    setattr(m, reasons_name, lambda h: 4 if tick() % 2 else 1)  # alternate two reason bits
    if energy:
        m.nvmlDeviceGetTotalEnergyConsumption = energy_fn
    else:
        m.nvmlDeviceGetTotalEnergyConsumption = lambda h: (_ for _ in ()).throw(_NotSupported())
    return m


def test_sampler_records_gpu_samples_energy_and_summary():
    nvml = fake_nvml()
    s = Sampler(0, "GPU-abc", interval=1e-4, nvml=nvml, host=False)
    assert s.status == "ok"
    s.start()
    result = s.stop()
    s.close()
    assert nvml.state["init"] == 1 and nvml.state["shutdown"] == 1
    assert len(result.samples) >= 2  # one at the window's start, one at its end
    first = result.samples[0]
    assert first["sm_clock_mhz"] == 1980 and first["mem_clock_mhz"] == 2619 and first["gpu_util_pct"] == 97
    assert 300 < first["power_w"] < 400 and first["throttle_reasons"] in (1, 4)
    assert result.energy_j == pytest.approx(5.0)  # counter read at start and stop
    summary = result.summary(calls=10, tokens_per_call=1000)
    assert summary["energy_j"] == pytest.approx(0.5)
    assert summary["energy_per_token_j"] == pytest.approx(0.5 / 1000)
    assert summary["avg_power_w"] == pytest.approx(5.0 / result.window_s)
    assert summary["throttle_reasons"] == 5  # OR of the bits seen
    assert summary["max_temp_c"] == max(x["temp_c"] for x in result.samples)
    assert summary["telemetry_status"] == "ok"


def test_sampler_falls_back_to_power_integration_and_old_reason_name():
    nvml = fake_nvml(energy=False, reasons_name="nvmlDeviceGetCurrentClocksThrottleReasons")
    s = Sampler(3, None, interval=1e-4, nvml=nvml, host=False)  # no uuid: by index
    s.start()
    result = s.stop()
    assert result.status == "ok (energy from power samples)"
    pts = [(x["t_s"], x["power_w"]) for x in result.samples]
    expected = sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:]))
    assert result.energy_j == pytest.approx(expected)
    assert all(x["throttle_reasons"] in (1, 4) for x in result.samples)


def test_a_window_shorter_than_the_energy_counters_step_integrates_power():
    # On an H100 a 4096-token forward's window read 0 J from the counter (it advances in steps)
    nvml = fake_nvml()
    nvml.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1_000_000  # never moves within the window
    s = Sampler(0, "GPU-abc", interval=1e-4, nvml=nvml, host=False)
    s.start()
    result = s.stop()
    assert result.status == "ok (energy from power samples)"
    pts = [(x["t_s"], x["power_w"]) for x in result.samples]
    assert len(pts) >= 2 and result.energy_j > 0
    assert result.energy_j == pytest.approx(sum((t1 - t0) * (p0 + p1) / 2 for (t0, p0), (t1, p1) in zip(pts, pts[1:])))


def test_without_nvml_the_status_says_why_and_nothing_fails(monkeypatch):
    s = Sampler(0, None, nvml=fake_nvml(init_error=RuntimeError("NVML Shared Library Not Found")), host=False)
    assert s.status == "unavailable: NVML failed: NVML Shared Library Not Found"
    s.start()
    assert s.stop().summary(1, 1)["energy_j"] is None

    def no_module():
        raise ImportError("No module named 'pynvml'")
    monkeypatch.setattr(telemetry, "_load_nvml", no_module)
    assert Sampler(0, None).status.startswith("unavailable: nvidia-ml-py is not installed")
    assert Sampler(None).status.startswith("unavailable: no NVIDIA GPU")


def test_host_cpu_readings_where_readable():
    s = Sampler(None, interval=1e-3, host=True)
    s.start()
    sum(i * i for i in range(200_000))  # a little work in the window
    result = s.stop()
    for x in result.samples:
        assert x["cpu_util_pct"] is None or 0.0 <= x["cpu_util_pct"] <= 100.0
        assert x["cpu_freq_mhz"] is None or x["cpu_freq_mhz"] > 0
    assert isinstance(result, TelemetryResult)


def test_cuda_timer_flushes_l2_outside_the_timed_events(monkeypatch):
    import torch

    from dilcompile.profile.measure import Timer

    log = []

    class Event:
        def __init__(self, enable_timing):
            assert enable_timing

        def record(self):
            log.append("record")
            self.at = len(log)

        def elapsed_time(self, end):
            return float(end.at - self.at)

    class Buffer:
        def zero_(self):
            log.append("flush")

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: log.append("sync"))
    timer = Timer(torch.device("cpu"))
    timer.device, timer._flush = torch.device("cuda"), Buffer()
    timing = timer.time(lambda: log.append("call"), 3)
    assert log == ["sync"] + ["flush", "record", "call", "record"] * 3 + ["sync"]
    assert timing.times_ms == (2.0, 2.0, 2.0)  # each event pair brackets exactly one call
