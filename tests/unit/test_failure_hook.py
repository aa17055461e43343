"""An op's failure reaches the plugins that implement comm_failed (slicetrace's extension, not NCCL's ABI), and the
example plugin's trace carries it: an instant on the rank's process and the process renamed "failed: <Error>"."""
from __future__ import annotations

import json
import time

from slicetrace.analyze.trace import check_trace, failures, load_trace
from slicetrace.config import Settings
from slicetrace.events import abi
from slicetrace.events.host import EventHost
from slicetrace.events.plugin import Failure, LoadedPlugin
from slicetrace.sinks.chrome import ChromePlugin
from tests.helpers.plugins import NoopPlugin

COMM = abi.CommInfo(77, "t", 1, 2, 0)


class Hears(NoopPlugin):
    name = "hears"

    def __init__(self):
        self.told: list[Failure] = []

    def comm_failed(self, ctx, failure):
        self.told.append(failure)


class Raises(NoopPlugin):
    name = "raises"

    def comm_failed(self, ctx, failure):
        raise RuntimeError("its own bug")


def test_plugins_with_comm_failed_hear_each_failure_and_others_are_left_alone():
    hears, plain = Hears(), NoopPlugin()
    host = EventHost([LoadedPlugin(hears), LoadedPlugin(plain)], COMM)
    before = time.monotonic_ns()
    host.failed("PeerError", "rank 1 exited\nmore", "AllReduce", 3)
    host.failed("MismatchError", "collective #2 differs")
    assert [f[1:] for f in hears.told] == [("PeerError", "rank 1 exited\nmore", "AllReduce", 3),
                                           ("MismatchError", "collective #2 differs", None, None)]
    assert before <= hears.told[0].ts_ns <= hears.told[1].ts_ns <= time.monotonic_ns()    # the trace's clock
    assert host.counters()["plugin_error"] == 0
    host.close()
    host.failed("PeerError", "after close")          # finalized plugins are not called
    assert len(hears.told) == 2


def test_a_comm_failed_that_raises_counts_as_the_plugins_error_and_the_others_still_hear():
    hears = Hears()
    host = EventHost([LoadedPlugin(Raises()), LoadedPlugin(hears)], COMM)
    host.failed("CommTimeoutError", "waited 6s")
    assert [f.error for f in hears.told] == ["CommTimeoutError"]
    assert host.counters()["plugin_error"] == 1
    host.close()


def _records(path):
    return [json.loads(line.rstrip(",\n")) for line in open(path) if line.startswith("{")]


def test_the_example_plugin_writes_the_failure_as_an_instant_and_renames_the_process(tmp_path):
    plugin = ChromePlugin(Settings(profile_dump_file=str(tmp_path / "t")))
    host = EventHost([LoadedPlugin(plugin)], COMM)
    host.failed("PeerError", "rank 1 (pid 9) exited; detected by rank 0 in AllReduce #3\nsecond line", "AllReduce",
                3)
    host.failed("PeerError", "a second one")
    path = tmp_path / "t_77_0.json"
    host.close()
    assert check_trace(str(path)) == []
    recs = _records(path)
    inst = [r for r in recs if r.get("ph") == "i"]
    assert [(r["name"], r["s"], r["cat"], r["tid"]) for r in inst] == [
        ("PeerError: rank 1 (pid 9) exited; detected by rank 0 in AllReduce #3", "p", "ERROR", 1),
        ("PeerError: a second one", "p", "ERROR", 1)]
    assert inst[0]["args"] == {"Error": "PeerError", "Op": "AllReduce", "SeqNum": 3,
                               "Message": "rank 1 (pid 9) exited; detected by rank 0 in AllReduce #3\nsecond line"}
    assert "Op" not in inst[1]["args"] and "SeqNum" not in inst[1]["args"]
    names = [r["args"]["name"] for r in recs if r["name"] == "process_name"]
    assert names == ["rank 0 (comm 77)", "rank 0 (comm 77) failed: PeerError"]       # a viewer keeps the last
    # the analyzer reads them back (report, convert)
    got = failures(load_trace(str(path)))
    assert [(f["rank"], f["error"], f["op"], f["seq"]) for f in got] == [(0, "PeerError", "AllReduce", 3),
                                                                         (0, "PeerError", None, None)]


def test_a_failed_rank_that_lost_records_says_both_in_its_name():
    assert abi.process_label(2, 5, {"overrun": 12}, "CommTimeoutError") == \
        "rank 2 (comm 5) failed: CommTimeoutError; lost: overrun 12"
    assert abi.process_label(2, 5, {"overrun": 12}) == "rank 2 (comm 5) lost: overrun 12"


def test_a_failure_instant_whose_message_is_not_a_string_is_refused_naming_the_field():
    from slicetrace.analyze.records import record_problem
    r = {"name": "PeerError: x", "cat": "ERROR", "ph": "i", "s": "p", "pid": 0, "ts": 1.0,
         "args": {"Error": "PeerError", "Message": 3}}
    assert record_problem(r) == ("'args.Message' must be a string (an op's failure: its error class, message and "
                                 "op), not 3")
    r["args"]["Message"] = "x"
    assert record_problem(r) is None


def test_a_failure_instant_without_a_name_is_quoted_by_its_error_class():
    """A trace from another writer may leave the instant unnamed (Chrome's format allows it): report still prints it."""
    import numpy as np
    from rich.console import Console
    from slicetrace.analyze.report import build, render
    from slicetrace.analyze.trace import KERNEL_STEP_TABLE
    recs = [{"cat": "ERROR", "ph": "i", "s": "p", "pid": 1, "ts": 5.0,
             "args": {"Error": "PeerError", "Message": "rank 0 exited", "Op": "SendRecv", "SeqNum": 2}}]
    got = failures(recs)
    assert [(f["name"], f["error"], f["op"], f["seq"]) for f in got] == [("PeerError", "PeerError", "SendRecv", 2)]
    ks = np.array([(0, 0, 1, 1, 0, 4096, 0, 10, 20, 0, 0), (1, 0, 0, 0, 0, 4096, 5, 20, 30, 0, 0)], KERNEL_STEP_TABLE)
    con = Console(record=True, width=200)
    render(build(ks, failures=got), console=con)
    assert "failed: rank 1 in SendRecv #2 raised PeerError" in " ".join(con.export_text().split())
