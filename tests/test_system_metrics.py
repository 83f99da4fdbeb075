"""System metrics (gradwatch.capture.system_metrics): host counters from psutil, GPU counters from NVML, absent cleanly."""

from __future__ import annotations

import time
from types import SimpleNamespace

import torch
from torch import nn
from training import Recorder
from waiting import wait_until

import gradwatch
from gradwatch.capture.system_metrics import SystemMetrics, gpu_sample


def test_host_counters_and_io_rates_are_sampled_on_a_thread():
    rec = Recorder()
    sm = SystemMetrics(rec, interval=0.05)
    try:
        wait_until(lambda: len([i for i in rec.items if i[0] == "rec"]) >= 3, timeout=10, interval=0.05)
    finally:
        sm.stop()
    records = [i[2] for i in rec.items if i[0] == "rec"]
    assert len(records) >= 3
    first, last = records[0], records[-1]
    assert 0 <= first["system/cpu_percent"] <= 100 * 64 and 0 < first["system/ram_percent"] <= 100
    assert first["system/process_rss"] > 10e6  # this process, with torch loaded
    assert "system/net_recv_bps" in last or "system/disk_read_bps" in last  # rates from the second sample on
    assert not any(k.startswith("system/gpu") for k in first)  # no NVML here: absent, not zero
    assert not sm.thread.is_alive()
    n = len(rec.items)
    time.sleep(0.2)
    assert len(rec.items) == n  # stopped means stopped


class FakeNvml:
    """Enough of pynvml for one GPU whose ECC counter is not supported (a consumer card)."""

    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC = 0, 1, 2, 3

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=87)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=3 << 30, total=16 << 30)

    def nvmlDeviceGetPowerUsage(self, h):
        return 215500  # milliwatts

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 71

    def nvmlDeviceGetClockInfo(self, h, clock):
        return 1410

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0

    def nvmlDeviceGetTotalEccErrors(self, h, kind, counter):
        raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")


def test_gpu_counters_per_device_and_an_unsupported_one_left_out():
    got = gpu_sample(FakeNvml(), ["h0", "h1"])
    assert got["system/gpu0/util"] == 87 and got["system/gpu1/power_w"] == 215.5
    assert got["system/gpu0/memory_used"] == 3 << 30 and got["system/gpu0/temperature_c"] == 71
    assert got["system/gpu1/sm_clock_mhz"] == 1410 and "system/gpu0/ecc_uncorrected" not in got


def test_watch_records_system_metrics_through_the_server(server, api):
    run = gradwatch.init(project="system", name="sys", server=server.url)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    run.watch(model, opt, system_every=0.1)
    for _ in range(20):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        run.log({"loss": loss})
        time.sleep(0.02)
    run.finish()
    keys = api.get(f"/api/runs/{run.id}/keys")
    assert {"system/cpu_percent", "system/ram_percent", "system/process_rss", "perf/step_time"} <= set(keys)
