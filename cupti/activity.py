"""arena_cupti.activity: kernel timing through NVIDIA's CUPTI Activity API (the ``cupti-python`` package).

The profiler's ``cupti`` timer: while a :class:`KernelActivityRecorder` is recording, CUPTI reports one
activity record per kernel launched on the GPU (``CONCURRENT_KERNEL``: start and end timestamps in ns,
device, stream, name); a stage's time is the sum of its kernels' durations, excluding host-side launch
gaps, as in the paper (§3.4, "captures the latencies of launched kernels").

``cupti-python`` is an optional dependency (``pip install arena[gpu]``); importing this package never
fails: :func:`available` says whether CUPTI can be used here (an NVIDIA GPU and the package present).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

#: Activity buffer CUPTI asks for (bytes); 0 max records lets CUPTI fill it.
BUFFER_BYTES = 8 * 1024 * 1024


def _load() -> Any:
    try:
        from cupti import cupti  # type: ignore[import-not-found]
    except Exception:  # noqa: BLE001 - absent package or no CUDA driver: CUPTI is unavailable
        return None
    return cupti


def available() -> bool:
    """True when the cupti-python bindings import (they need the CUDA driver and an NVIDIA GPU)."""
    return _load() is not None


@dataclass(frozen=True)
class KernelRecord:
    name: str
    device_id: int
    stream_id: int
    start_ns: int
    end_ns: int

    @property
    def duration_s(self) -> float:
        return max(0, self.end_ns - self.start_ns) * 1e-9


class CuptiUnavailable(RuntimeError):
    pass


class KernelActivityRecorder:
    """Collects CUPTI kernel activity records between :meth:`start` and :meth:`stop`.

    Usage::

        recorder = KernelActivityRecorder()
        recorder.start()
        run_and_synchronize()
        kernels = recorder.stop()          # list[KernelRecord]
        seconds = sum(k.duration_s for k in kernels)

    CUPTI delivers records asynchronously through the buffer-completed callback; :meth:`stop` flushes
    all buffers (``activity_flush_all``) so every kernel of the recorded region is returned.
    """

    _registered = False
    _lock = threading.Lock()
    _sink: list[KernelRecord] | None = None

    def __init__(self, device_id: int | None = None):
        self._cupti = _load()
        if self._cupti is None:
            raise CuptiUnavailable("cupti-python is not installed or no NVIDIA GPU/driver is present")
        self.device_id = device_id

    # CUPTI calls these two from its own threads.
    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return BUFFER_BYTES, 0

    @classmethod
    def _buffer_completed(cls, activities: list[Any]) -> None:
        cupti = _load()
        kernel_kind = int(cupti.ActivityKind.CONCURRENT_KERNEL)
        with cls._lock:
            sink = cls._sink
            if sink is None:
                return
            for activity in activities:
                if int(activity.kind) != kernel_kind:
                    continue
                sink.append(
                    KernelRecord(
                        name=str(getattr(activity, "name", "")),
                        device_id=int(getattr(activity, "device_id", 0)),
                        stream_id=int(getattr(activity, "stream_id", 0)),
                        start_ns=int(activity.start),
                        end_ns=int(activity.end),
                    )
                )

    def start(self) -> None:
        cupti = self._cupti
        cls = type(self)
        with cls._lock:
            cls._sink = []
        if not cls._registered:
            cupti.activity_register_callbacks(cls._buffer_requested, cls._buffer_completed)
            cls._registered = True
        cupti.activity_enable(cupti.ActivityKind.CONCURRENT_KERNEL)

    def stop(self) -> list[KernelRecord]:
        cupti = self._cupti
        cls = type(self)
        # Forced flush: deliver incomplete buffers too (CUPTI_ACTIVITY_FLAG_FLUSH_FORCED = 1).
        cupti.activity_flush_all(1)
        cupti.activity_disable(cupti.ActivityKind.CONCURRENT_KERNEL)
        with cls._lock:
            records = cls._sink or []
            cls._sink = None
        if self.device_id is not None:
            records = [r for r in records if r.device_id == self.device_id]
        return records


def kernel_seconds(records: list[KernelRecord]) -> float:
    """Sum of kernel durations (kernels of one stage run one after another on one stream)."""
    return float(sum(r.duration_s for r in records))


__all__ = ["BUFFER_BYTES", "CuptiUnavailable", "KernelActivityRecorder", "KernelRecord", "available", "kernel_seconds"]
