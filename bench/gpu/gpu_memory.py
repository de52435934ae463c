"""The GPU's used memory, sampled while one benchmark process runs.

Both sides are measured by the same instrument: the driver's count of used
device memory (NVML, or `nvidia-smi` where the Python binding is missing),
polled every few milliseconds from outside the process, less what was used
before it started. It includes what each framework's own accounting leaves
out (the CUDA context, cuBLAS workspaces, PyTorch's cached blocks, NVRTC
modules), which is what zeroplan's plan counts in its `memory.peak_bytes`.

zeroplan allocates its arenas once at load, and PyTorch's caching allocator
keeps what it reserved, so the peak holds for the run's whole length and a
poll of some milliseconds does not miss it.
"""

import subprocess
import threading
import time


class NoGpu(RuntimeError):
    pass


def _nvml_reader(index):
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    return lambda: pynvml.nvmlDeviceGetMemoryInfo(handle).used


def _smi_reader(index):
    def read():
        out = subprocess.run(
            ["nvidia-smi", f"--id={index}", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, check=True,
        ).stdout
        return int(out.strip().splitlines()[0]) * (1 << 20)

    return read


def reader(index=0):
    """A function returning the used bytes of GPU `index`, and its source."""
    try:
        return _nvml_reader(index), "nvml"
    except Exception:  # noqa: BLE001 (the binding is optional; nvidia-smi is the fallback)
        pass
    try:
        read = _smi_reader(index)
        read()
        return read, "nvidia-smi"
    except (OSError, subprocess.CalledProcessError) as e:
        raise NoGpu(f"neither NVML nor nvidia-smi answers: {e}") from e


class PeakSampler:
    """`with PeakSampler(read) as s: ...` then `s.peak_bytes`: the most used
    bytes seen during the block above those used when it began."""

    def __init__(self, read, interval_s=0.005):
        self.read, self.interval_s = read, interval_s
        self.baseline = self.peak = 0
        self._stop = threading.Event()
        self._thread = None

    def _poll(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.read())
            time.sleep(self.interval_s)

    def __enter__(self):
        self.baseline = self.peak = self.read()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False

    @property
    def peak_bytes(self):
        return self.peak - self.baseline
