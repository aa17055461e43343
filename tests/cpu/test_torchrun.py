"""slicetrace.init() inside processes started by torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torchrun rendezvous not testable here")


def test_init_under_torchrun(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent("""
        import numpy as np, slicetrace
        comm = slicetrace.init()
        x = np.full(1000, comm.rank + 1.0, dtype=np.float32)
        comm.all_reduce(x, x)
        # one file per rank: three processes printing to one pipe can interleave their lines
        with open(f"{OUT}/rank{comm.rank}.txt", "w") as f:
            f.write(f"rank {comm.rank}/{comm.world_size} sum {x[0]:.1f}")
        comm.close()
    """).replace("{OUT}", str(tmp_path)))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # torchrun and its 3 workers in a process group of their own: on a timeout the whole group is killed (killing
    # torchrun alone, as subprocess.run does, would leave the workers running)
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "3",
                             "--master_port", str(port), str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"torchrun did not finish within 180 s (its process group was killed): {stderr[-2000:]}")
    assert proc.returncode == 0, stderr[-2000:]
    # torchrun's agent hosts the store (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 binding its port as well made
    # torch log "The server socket on ... has failed to bind ... ignoring the error"
    assert "failed to bind" not in stderr, stderr[-2000:]
    assert sorted((tmp_path / f"rank{r}.txt").read_text() for r in range(3)) == [
        "rank 0/3 sum 6.0", "rank 1/3 sum 6.0", "rank 2/3 sum 6.0"]
