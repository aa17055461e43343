"""The reference library run side by side in the same rank processes: Gloo (cpu) or NCCL (cuda), via torch."""
from __future__ import annotations

import os
from typing import Any

from ..backend.cpu.affinity import unbound
from ..config import temp_dir
from ..errors import UsageError

_REDUCE = {"sum": "SUM", "prod": "PRODUCT", "min": "MIN", "max": "MAX", "avg": "AVG"}


class TorchReference:
    def __init__(self, kind: str, rank: int, world: int, job: str, device: Any = None):
        try:
            import torch
            import torch.distributed as dist
        except ImportError:
            raise UsageError(f"--compare {kind} needs torch installed (pip install torch)") from None
        import warnings
        warnings.filterwarnings("ignore", category=FutureWarning, module=r"torch\.")   # deprecation chatter
        self.torch, self.dist, self.kind, self.rank, self.world = torch, dist, kind, rank, world
        path = os.path.join(temp_dir(), f"slicetrace_{kind}_{job}")
        self.device = device
        if kind == "nccl":
            torch.cuda.set_device(device)
        with unbound():         # the reference's worker threads get the process's CPUs, not our rank's one
            dist.init_process_group(kind, init_method=f"file://{path}", rank=rank, world_size=world)
        self.group = dist.group.WORLD
        self._rs_native = True

    def tensor(self, arr: Any) -> Any:
        if self.kind == "nccl":
            return self.torch.from_dlpack(arr)
        if arr.dtype.name == "bfloat16":        # ml_dtypes' bfloat16: torch takes its bits
            return self.torch.from_numpy(arr.view("int16")).view(self.torch.bfloat16)
        return self.torch.from_numpy(arr)

    def run(self, op: str, x: Any, out: Any, redop: str, root: int) -> None:
        d, t = self.dist, self.tensor
        if redop == "avg" and self.kind == "gloo":
            redop = "sum"       # older torch's gloo has no AVG; SUM moves the same bytes (only the time is compared)
        rop = getattr(d.ReduceOp, _REDUCE[redop])
        # torch's all_reduce/broadcast/reduce work in place: run them on `out` as it is (no extra copy, which
        # would cost the reference bandwidth); the values drift, the traffic does not.
        if op == "all_reduce":
            d.all_reduce(t(out), op=rop)
        elif op == "broadcast":
            d.broadcast(t(out), src=root)
        elif op == "reduce":
            d.reduce(t(out), dst=root, op=rop)
        elif op == "all_gather":
            d.all_gather_into_tensor(t(out), t(x))
        elif op == "reduce_scatter":
            if self._rs_native:
                try:
                    d.reduce_scatter_tensor(t(out), t(x), op=rop)
                    return
                except (RuntimeError, NotImplementedError):     # a torch whose gloo lacks it: the same every rank
                    self._rs_native = False
            tx = t(x).clone()                                   # all_reduce + slice: twice the traffic
            d.all_reduce(tx, op=rop)
            k = tx.numel() // self.world
            t(out).copy_(tx[self.rank * k:(self.rank + 1) * k])
        elif op == "all_to_all":
            d.all_to_all_single(t(out), t(x))
        elif op == "send_recv":
            # one batched group, as NCCL wants (unbatched isend/irecv make torch build extra communicators)
            ops = [d.P2POp(d.isend, t(x), (self.rank + 1) % self.world),
                   d.P2POp(d.irecv, t(out), (self.rank - 1) % self.world)]
            for r in d.batch_isend_irecv(ops):
                r.wait()
        else:
            raise UsageError(f"op={op!r} has no {self.kind} reference")

    def sync(self) -> None:
        if self.kind == "nccl":
            self.torch.cuda.synchronize()

    def close(self) -> None:
        try:
            self.dist.destroy_process_group()
        except Exception:
            pass
