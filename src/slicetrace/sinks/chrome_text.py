"""Chrome-trace text for the example plugin (sinks/chrome.py): line templates and small formatters."""
from __future__ import annotations

import json
from typing import Any

# KernelCh b/e pair and KernelStep X record, filled by one % over a block of int columns.
CH_LINES = ('{"name":"KernelCh","cat":"GPU","id":%d,"pid":%d,"tid":1,"ph":"b","ts":%d.%03d,'
             '"args":{"Channel":%d,"StartGpuClk":%d,"StopGpuClk":%d,"ParentId":%d}},\n'
             '{"name":"KernelCh","cat":"GPU","id":%d,"pid":%d,"tid":1,"ph":"e","ts":%d.%03d},\n')
STEP_LINE = ('{"name":"KernelStep","cat":"GPU","ph":"X","pid":%d,"tid":%d,"ts":%d.%03d,"dur":%d.%03d,'
              '"args":{"Channel":%d,"IsSend":%d,"Peer":%d,"Step":%d,"Size":%d,"WaitGpuClk":%d,"StartGpuClk":%d,'
              '"StopGpuClk":%d,"SeqNum":%d,"ParentId":%d}},\n')


def us(ns: int) -> str:
    q, r = divmod(int(ns), 1000)
    return f"{q}.{r:03d}" if q >= 0 else f"{ns / 1000:.3f}"


def step_tid(channel: int, is_send: int, peer: int) -> int:
    return 1_000_000 + channel * 131072 + (1 if is_send else 0) * 65536 + (peer & 0xFFFF)


def pair(ev_id: int, rank: int, name: str, cat: str, ts0: int, ts1: int, args: dict) -> list[str]:
    """An async b/e record pair (same cat and id), as Perfetto pairs them."""
    nm = json.dumps(name)
    head = f'{{"name":{nm},"cat":"{cat}","id":{ev_id},"pid":{rank},"tid":1,'
    return [f'{head}"ph":"b","ts":{us(ts0)},"args":{json.dumps(args, default=str)}}},\n',
            f'{head}"ph":"e","ts":{us(ts1)}}},\n']


def metadata(r: int, tids: Any) -> str:
    """Process and track names: one track per (channel, direction, peer) in `tids`."""

    def meta(name: str, tid: int, value: Any) -> str:
        return json.dumps({"name": name, "ph": "M", "pid": r, "tid": tid, "args": {"name": value}},
                          separators=(",", ":")) + ",\n"
    out = [meta("process_name", 0, f"rank {r}"),
           json.dumps({"name": "process_sort_index", "ph": "M", "pid": r, "tid": 0, "args": {"sort_index": r}},
                      separators=(",", ":")) + ",\n",
           meta("thread_name", 1, "ops"), meta("thread_name", 2, "proxy")]
    for ch, snd, peer in sorted(tids):
        label = f"ch {ch} send->{peer}" if snd else f"ch {ch} recv<-{peer}"
        out.append(meta("thread_name", step_tid(ch, snd, peer), label))
    return "".join(out)
