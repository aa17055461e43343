"""Several slicetrace.init() calls in one torchrun job: each communicator's ranks agree on its job id, with the
store torchrun's agent hosts and with torch.distributed's default store; rank 0 is a client of the agent's store."""
import os
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed: torchrun rendezvous not testable here")

# rank 0 starts each later init() 2 s after rank 1: rank 1 then asks the store for the job id first
JOB = """
    import os, time, numpy as np, slicetrace
    PREFIX
    for i in range(3):
        if i and os.environ["RANK"] == "0":
            time.sleep(2)
        comm = slicetrace.init(timeout_s=10)
        x = np.full(100, comm.rank + 1.0, dtype=np.float32)
        comm.all_reduce(x, x)
        with open(f"{OUT}/rank{comm.rank}_{i}.txt", "w") as f:
            f.write(f"{comm._session.job} {x[0]:.1f}")
        comm.close()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(tmp_path, prefix: str, nproc: int = 2) -> str:
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB).replace("PREFIX", prefix).replace("{OUT}", str(tmp_path)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # a process group of its own: on a timeout the workers are killed with torchrun
    proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
                             "--master_port", str(_free_port()), str(script)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    try:
        _, stderr = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, stderr = proc.communicate(timeout=30)
        pytest.fail(f"torchrun did not finish within 150 s (its process group was killed): {stderr[-3000:]}")
    assert proc.returncode == 0, stderr[-3000:]
    return stderr


def _results(tmp_path, nproc: int = 2) -> None:
    for i in range(3):
        got = [(tmp_path / f"rank{r}_{i}.txt").read_text().split() for r in range(nproc)]
        assert len({job for job, _ in got}) == 1, (i, got)          # one job per communicator
        assert all(s == "3.0" for _, s in got), (i, got)
    assert len({(tmp_path / f"rank0_{i}.txt").read_text().split()[0] for i in range(3)}) == 3


@pytest.mark.timeout(200)
def test_a_later_init_does_not_read_the_previous_communicators_job_id(tmp_path):
    """The agent's store outlives each communicator: a fixed key gave rank 1 the last job id, and the ranks hung on
    different jobs until timeout_s."""
    stderr = _torchrun(tmp_path, "")
    _results(tmp_path)
    # the agent hosts the store: rank 0 binding the port too logged torch's "failed to bind ... ignoring" error
    assert "failed to bind" not in stderr, stderr[-3000:]


@pytest.mark.timeout(200)
def test_each_init_has_its_job_id_with_torchs_default_store_too(tmp_path):
    _torchrun(tmp_path, 'import torch.distributed as dist; dist.init_process_group("gloo")')
    _results(tmp_path)


@pytest.mark.timeout(200)
def test_each_init_has_its_job_id_when_rank_0_hosts_the_store(tmp_path):
    """Outside torchrun (MASTER_ADDR/MASTER_PORT set by hand) rank 0 hosts the store: a later init() shares its
    server (torch's multi_tenant) instead of failing to bind the port the last communicator's store holds."""
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(JOB).replace("PREFIX", "").replace("{OUT}", str(tmp_path)))
    port = _free_port()
    procs = []
    for r in range(2):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RANK": str(r), "WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        env.pop("TORCHELASTIC_USE_AGENT_STORE", None)
        procs.append(subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True, env=env))
    try:
        errs = [p.communicate(timeout=120)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert [p.returncode for p in procs] == [0, 0], [e[-2000:] for e in errs]
    _results(tmp_path)


SPAWNED = """
    import numpy as np, slicetrace, torch.distributed as dist, torch.multiprocessing as mp

    def main(rank, out):
        dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank, world_size=3)
        comm = slicetrace.init(timeout_s=30)
        x = comm.all_reduce(np.full(4, rank + 1.0))
        try:
            slicetrace.init(rank=0, world_size=2, timeout_s=30)
            sub = "made"
        except slicetrace.UsageError as e:
            sub = str(e).split(":")[0]
        with open(f"{out}/rank{rank}.txt", "w") as f:
            f.write(f"{comm.rank} {comm.world_size} {x[0]:.1f} {sub}")
        comm.close()
        dist.destroy_process_group()

    if __name__ == "__main__":
        mp.spawn(main, args=("{OUT}",), nprocs=3)
"""


@pytest.mark.timeout(200)
def test_init_takes_rank_and_world_from_a_process_group_made_without_torchruns_variables(tmp_path):
    """torch.multiprocessing.spawn with init_process_group(rank=, world_size=) sets no RANK/WORLD_SIZE: each
    process's init() made a world of one, and its all_reduce returned its own data, with no error."""
    script = tmp_path / "spawned.py"
    script.write_text(textwrap.dedent(SPAWNED).replace("{OUT}", str(tmp_path)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                             "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE")}
    env["PYTHONPATH"] = os.pathsep.join(sys.path)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = [(tmp_path / f"rank{r}.txt").read_text() for r in range(3)]
    # a sub-communicator without job= is refused as under torchrun (init(world_size=2) in a job of 3 ranks)
    assert got == [f"{r} 3 6.0 init(world_size=2) in a job of 3 ranks makes a sub-communicator" for r in range(3)]
