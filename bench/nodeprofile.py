"""Where the local node's CPU goes during a run, by kind of work: a JFR recording of the node
(``jcmd``, from the JDK the launcher runs on), its CPU samples sorted by the frames they ran
in. ``make bench ARGS="--only compaction --node-profile"``; or, for a recording made by hand,
``python -m bench.nodeprofile FILE.jfr``."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path

from .ops import Meter

KINDS: tuple[tuple[str, tuple[str, ...]], ...] = (
    # (kind, frames that mark it), first match wins; dedicated threads by name come before
    # (not the request stages': their pooled threads keep the name they were first seen with)
    ("paxos: conditional batches, leases", (".service.paxos.", "StorageProxy.cas")),
    ("reads: GROUP BY and functions", ("cql3.selection.", "GroupMaker", "AggregationQueryPager")),
    ("writes: batches", ("BatchStatement.",)),
    ("writes: single statements", ("ModificationStatement.",)),
    ("results: native protocol encoding", ("ResultMessage", "ResultSet$Codec", "Message.encode")),
    (
        "reads: iterating and serializing rows",
        ("ReadCommand", "ReadResponse", "ReadExecutor", "SelectStatement.", "StorageProxy.read"),
    ),
    ("writes: applying mutations", ("Mutation.apply", "Keyspace.apply", "CommitLog.add")),
)
THREADS: tuple[tuple[str, str], ...] = (
    ("CompactionExecutor", "background: compaction"),
    ("MemtableFlushWriter", "background: memtable flush"),
    ("PerDiskMemtableFlushWriter", "background: memtable flush"),
    ("MemtablePostFlush", "background: memtable flush"),
    ("epollEventLoopGroup", "native protocol I/O"),
    ("GC Thread", "JVM: GC"),
    ("G1 ", "JVM: GC"),
    ("C1 CompilerThread", "JVM: JIT"),
    ("C2 CompilerThread", "JVM: JIT"),
)


def kind_of(thread: str, frames: Iterable[str]) -> str:
    for prefix, kind in THREADS:
        if thread.startswith(prefix):
            return kind
    stack = " ".join(frames)
    for kind, marks in KINDS:
        if any(m in stack for m in marks):
            return kind
    return "other"


def samples(text: Iterable[str]) -> Iterator[tuple[str, list[str]]]:
    """(thread, frames) of each ``jdk.ExecutionSample`` in ``jfr print`` output."""
    thread, frames, inside = "", [], False
    for line in text:
        s = line.strip()
        if s.startswith("jdk.ExecutionSample"):
            if inside:
                yield thread, frames
            thread, frames, inside = "", [], True
        elif s.startswith("sampledThread ="):
            thread = s.split('"')[1] if '"' in s else s
        elif inside and "line:" in s:
            frames.append(re.sub(r"\(.*", "", s))
    if inside:
        yield thread, frames


UNSAMPLED = ("C1 ", "C2 ", "GC ", "G1 ")
"""Thread groups (``Meter.server_threads``) JFR does not sample: JIT compilers and GC."""


def sampled_cpu_s(meter: Meter) -> float | None:
    """The node's CPU over a block outside the threads JFR does not sample."""
    if meter.server_cpu_s is None:
        return None
    threads = meter.server_threads or {}
    return meter.server_cpu_s - sum(v for k, v in threads.items() if k.startswith(UNSAMPLED))


def summarize(recording: Path, cpu_s: float | None = None) -> dict[str, object]:
    """The share of CPU samples per kind of work, and the CPU seconds it stands for when the
    node's CPU over the recording is given (outside JIT and GC threads: ``sampled_cpu_s``)."""
    jfr = shutil.which("jfr")
    if jfr is None:
        raise RuntimeError("no `jfr` on PATH (it comes with the JDK)")
    out = subprocess.run(
        [jfr, "print", "--events", "jdk.ExecutionSample", "--stack-depth", "300", str(recording)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counts = Counter(kind_of(t, f) for t, f in samples(out.splitlines()))
    total = sum(counts.values()) or 1  # an idle node may give no sample: no kinds
    kinds = {
        kind: {
            "share": round(n / total, 3),
            "cpu_s": None if cpu_s is None else round(cpu_s * n / total, 2),
        }
        for kind, n in counts.most_common()
    }
    return {"samples": sum(counts.values()), "recording": str(recording), "kinds": kinds}


class Recording:
    """A JFR recording of the node with pid ``pid`` over a block (``jcmd JFR.start/stop``)."""

    def __init__(self, pid: int, path: Path, name: str) -> None:
        # absolute: the node writes the file, and a relative name is taken from its own cwd
        self.pid, self.path, self.name = pid, path.resolve(), name
        self.jcmd = shutil.which("jcmd")
        if self.jcmd is None:
            raise RuntimeError("no `jcmd` on PATH (it comes with the JDK)")

    def _jcmd(self, *args: str) -> None:
        subprocess.run([self.jcmd, str(self.pid), *args], capture_output=True, check=True)

    def __enter__(self) -> Recording:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.unlink(missing_ok=True)
        self._jcmd("JFR.start", f"name={self.name}", "settings=profile")
        return self

    def __exit__(self, *exc: object) -> None:
        self._jcmd("JFR.stop", f"name={self.name}", f"filename={self.path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("recording", type=Path)
    parser.add_argument("--cpu-s", type=float, help="the node's CPU seconds over the recording")
    args = parser.parse_args()
    print(json.dumps(summarize(args.recording, args.cpu_s), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
