"""The machine as well as the model: CPU, RAM, process RSS, disk and network I/O, and per-GPU NVML counters, sampled
on a background thread every few seconds.

psutil (``pip install gradwatch[system]``) gives the host counters and NVML (``nvidia-ml-py``, same extra) the
GPU ones: utilisation, memory, power, temperature, SM clock, throttle reasons and uncorrected ECC errors.
Either missing, or no GPU, and its keys are simply absent; a counter that fails is dropped, never raised.
Nothing here touches the training thread or CUDA: NVML reads the driver.
"""

from __future__ import annotations

import os
import threading
import time

from gradwatch.contract import keys
from gradwatch.step_clock import clock_of

INTERVAL = 5.0  # seconds between samples


def _psutil():
    try:
        import psutil
    except ImportError:
        return None
    return psutil


def _nvml():
    """The initialised pynvml module and its device handles, or (None, [])."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    except Exception:  # not installed, no driver, no GPU
        return None, []
    return pynvml, handles


def gpu_sample(nvml, handles) -> dict:
    """Per-GPU counters as ``keys.gpu_key(i, name)`` (``system/gpu<i>/<name>``); each one that fails is left out."""
    out: dict = {}
    for i, h in enumerate(handles):
        reads = {
            "util": lambda h=h: nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            "memory_used": lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).used,
            "memory_total": lambda h=h: nvml.nvmlDeviceGetMemoryInfo(h).total,
            "power_w": lambda h=h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "temperature_c": lambda h=h: nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
            "sm_clock_mhz": lambda h=h: nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
            "throttle_reasons": lambda h=h: nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h),
            "ecc_uncorrected": lambda h=h: nvml.nvmlDeviceGetTotalEccErrors(
                h, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
            ),
        }
        for name, read in reads.items():
            try:
                out[keys.gpu_key(i, name)] = float(read())
            except Exception:  # not supported on this GPU (ECC on consumer cards, power on some)
                pass
    return out


class SystemMetrics:
    """A daemon thread that records host and GPU counters every ``interval`` seconds at the run's current step.

    Args:
        recorder: the run's ``Recorder``.
        interval: seconds between samples.
    """

    def __init__(self, recorder, interval: float = INTERVAL):
        self.recorder, self.interval = recorder, float(interval)
        self.clock = clock_of(recorder)  # samples go to the latest step logged or taken
        self.psutil = _psutil()
        self.nvml, self.handles = (None, []) if os.environ.get("GRADWATCH_NO_NVML") else _nvml()
        self.process = self.psutil.Process() if self.psutil else None
        self.last: tuple | None = None  # (time, disk counters, net counters) for rates
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._loop, name="gradwatch-system", daemon=True)
        if self.psutil or self.handles:
            if self.psutil:
                self.psutil.cpu_percent(None)  # the first call only starts the measurement
            self.thread.start()

    def sample(self) -> dict:
        """One sample of every counter available here."""
        out: dict = {}
        if self.psutil is not None:
            out.update(self._host())
        if self.handles:
            out.update(gpu_sample(self.nvml, self.handles))
        return out

    def _host(self) -> dict:
        ps = self.psutil
        out = {
            keys.CPU_PERCENT: float(ps.cpu_percent(None)),
            keys.RAM_PERCENT: float(ps.virtual_memory().percent),
        }
        try:
            out[keys.PROCESS_RSS] = float(self.process.memory_info().rss)
        except Exception:
            pass
        now = time.monotonic()
        disk, net = _io(ps.disk_io_counters), _io(ps.net_io_counters)
        if self.last is not None:
            then, d0, n0 = self.last
            dt = max(now - then, 1e-6)
            if disk and d0:
                out[keys.DISK_READ_BPS] = (disk.read_bytes - d0.read_bytes) / dt
                out[keys.DISK_WRITE_BPS] = (disk.write_bytes - d0.write_bytes) / dt
            if net and n0:
                out[keys.NET_SENT_BPS] = (net.bytes_sent - n0.bytes_sent) / dt
                out[keys.NET_RECV_BPS] = (net.bytes_recv - n0.bytes_recv) / dt
        self.last = (now, disk, net)
        return out

    def _loop(self) -> None:
        while not self.stop_event.wait(self.interval):
            values = self.sample()
            if values and not getattr(self.recorder, "finished", False):
                self.recorder.guarded(lambda v=values: self.recorder.put_record(self.clock.recent(), v, {}))

    def stop(self) -> None:
        """End the thread (it exits at its next wake-up at the latest)."""
        self.stop_event.set()
        if self.thread.is_alive():
            self.thread.join(timeout=1.0)


def _io(read):
    try:
        return read()
    except Exception:  # no disks or interfaces visible (containers)
        return None
