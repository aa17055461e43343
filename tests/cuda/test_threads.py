"""Ops issued from a thread that never chose a device (its current device is 0, as for any new thread) run on
the communicator's device, as NCCL's do, and leave the thread's current device as it was."""
from __future__ import annotations

import threading

import pytest


def _from_a_fresh_thread(comm):
    import cupy
    dev = comm._session.backend.device
    with cupy.cuda.Device(dev):
        x = cupy.full(1000, comm.rank + 1, dtype=cupy.float32)
        a2a = cupy.arange(2 * comm.world_size, dtype=cupy.float32) + 100 * comm.rank
    out = {}

    def work():
        try:
            before = cupy.cuda.runtime.getDevice()
            y = comm.all_reduce(x)                       # out=None: allocated by the library
            z = comm.all_to_all(a2a)
            after = cupy.cuda.runtime.getDevice()
            with cupy.cuda.Device(dev):                  # CuPy's own calls need the array's device current
                cupy.cuda.Device(dev).synchronize()
                out.update(before=before, after=after, y_dev=y.device.id, z_dev=z.device.id,
                           y=float(y.sum().get()), z=z.get().tolist())
            comm.close()                                 # from this thread too
            out["after_close"] = cupy.cuda.runtime.getDevice()
        except Exception as e:                           # reported, not lost in the thread
            out["error"] = f"{type(e).__name__}: {e}"
    t = threading.Thread(target=work)
    t.start()
    t.join(120)
    out["alive"] = t.is_alive()
    out["device"] = dev
    return out


@pytest.mark.cuda
def test_ops_from_a_thread_on_another_device_run_on_the_communicators(gpu, kcache):
    import slicetrace
    res = slicetrace.launch(_from_a_fresh_thread, 2, backend="cuda", cache_dir=kcache, timeout_s=60.0,
                            join_timeout_s=240)
    n = 2
    for r, out in enumerate(res):
        assert "error" not in out and not out["alive"], out
        assert out["before"] == out["after"] == out["after_close"] == 0     # the thread's own device, as it was
        assert out["y_dev"] == out["z_dev"] == out["device"]
        assert out["y"] == pytest.approx(1000 * n * (n + 1) / 2)
        assert out["z"] == [100.0 * j + 2 * r + i for j in range(n) for i in range(2)]


def _capture_beside_the_comm(comm, rounds: int):
    """The user captures a CUDA graph of his own work in global mode (torch.cuda.graph's default) while the
    communicator's watchdog and drain threads poll their events: each capture must end valid and replay right."""
    import time
    import cupy
    dev = comm._session.backend.device
    errs = []
    with cupy.cuda.Device(dev):
        x = cupy.ones(1 << 20, dtype=cupy.float32)
        y = cupy.empty_like(x)
        comm.all_reduce(x)                               # an op: the threads have events to query
        cupy.multiply(x, 2, out=y)                       # compiled before the capture
        s = cupy.cuda.Stream(non_blocking=True)
        for _ in range(rounds):
            y.fill(0)
            cupy.cuda.Device(dev).synchronize()
            s.begin_capture(getattr(cupy.cuda.runtime, "streamCaptureModeGlobal", 0))
            with s:
                cupy.multiply(x, 2, out=y)
            time.sleep(0.6)                              # two watchdog periods and many drain polls
            try:
                g = s.end_capture()
                g.launch(s)
                s.synchronize()
                errs.append(None if float(y.sum().get()) == 2.0 * x.size else "wrong replay")   # x: ones
            except Exception as e:                       # noqa: BLE001 - an invalidated capture: reported
                errs.append(f"{type(e).__name__}: {e}")
        z = comm.all_reduce(cupy.ones(1000, dtype=cupy.float32))
        total = float(z.sum().get())
    comm.close()
    return {"errs": errs, "z": total}


@pytest.mark.cuda
def test_a_users_global_mode_graph_capture_is_not_invalidated_by_our_threads(gpu, kcache, tmp_path):
    import slicetrace
    res = slicetrace.launch(_capture_beside_the_comm, 2, 3, backend="cuda", cache_dir=kcache, timeout_s=60.0,
                            profiler_plugin="example", profile_dump_file=str(tmp_path / "t"), join_timeout_s=240)
    for r, out in enumerate(res):
        print(f"\nrank {r}: {out}")
        assert out["errs"] == [None] * 3, out
        assert out["z"] == 2000.0
