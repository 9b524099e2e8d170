"""`python -m bench.instructions --rpc`: instructions per RPC of a real coordd daemon.

A real `Daemon` (coordd.daemon.server, or coordd.server before the packaged layout) serves
its Unix socket in a child process under valgrind's callgrind; this process is the client
(a bare socket client of its own, the same for every revision, so only the daemon's side
differs). After the set-up (a heartbeat, the jobs enqueued in batches of 500, WARMUP
cycles) the daemon's loop runs inside `functools.reduce` (callgrind's `--toggle-collect`)
while the client runs N claim -> complete cycles, one request at a time (or, with
`--rpc-clients K`, over K connections in rounds: K claims sent together, their replies
read, then K completes: the requests of a round arrive together, as under load); then
the loop leaves it. Everything the daemon does for those 2N requests is counted: the frames, the
decoding, the dispatch, the coordinator, the writer's SQL, the replies.

The daemon's clock is a FakeClock, pinned, and the checkpointer thread is off, so no timer
fires and no other thread runs while counting: the idle cost of the counted phase (the
control-pipe wake-ups; `--rpc-idle` counts it with 0 cycles) is about 130k instructions,
0.04% of a 300-job run. Compare figures at the same N: the count per job grows a little
with the jobs in the database. With `--cprofile DIR` the counted phase runs under cProfile instead (no
valgrind) and the top functions by own time are printed: where the instructions go.
"""

from __future__ import annotations

import functools
import itertools
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import msgspec

WARMUP = 20
HEADER = struct.Struct(">I")
START_TIMEOUT_S = 300.0  # python's imports under valgrind take a while


# ------------------------------------------------------------------ the daemon (child)

def daemon_child(sock_path: str, db: str, ctl_r: int, ack_w: int, prof: str | None) -> None:
    """Serve `sock_path` until the parent says stop: phase 1 (set-up) uncounted, phase 2
    (the cycles) inside functools.reduce, then shut down."""
    import asyncio

    import uvloop

    # as bench.instructions: the checkout's editable install must not lend a revision the
    # modules it lacks
    sys.meta_path[:] = [f for f in sys.meta_path if "Editable" not in getattr(
        f, "__name__", type(f).__name__)]
    from coordd import config as config_mod
    from coordd.clock import FakeClock
    try:
        from coordd.daemon.server import Daemon
    except ImportError:  # `--rev 9727d64`: the flat layout
        from coordd.server import Daemon  # type: ignore[no-redef]
    try:
        from coordd.process_start import setup_logging
        setup_logging(False)
    except ImportError:
        pass

    cfg = config_mod.load(None, db=db, socket=sock_path, wal_checkpoint_interval_s=0.0,
                          heartbeat_stale_s=86400.0)
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    daemon = Daemon(cfg, FakeClock(1_000.0))
    served = loop.create_task(daemon.run())

    def next_ctl() -> asyncio.Future[bytes]:
        fut = loop.create_future()

        def readable() -> None:
            loop.remove_reader(ctl_r)
            fut.set_result(os.read(ctl_r, 1))
        loop.add_reader(ctl_r, readable)
        return fut

    def measured(_a: object, _b: object) -> None:
        os.write(ack_w, b"g")
        loop.run_until_complete(next_ctl())

    loop.run_until_complete(next_ctl())  # the parent's set-up is done
    if prof:
        import cProfile
        profiler = cProfile.Profile(time.process_time)  # CPU, not the waits
        profiler.enable()
        measured(None, None)
        profiler.disable()
        profiler.dump_stats(prof)
    else:
        functools.reduce(measured, [None], None)  # what callgrind counts
    daemon.stop_event.set()
    loop.run_until_complete(served)
    loop.close()
    os.write(ack_w, b"d")


# ------------------------------------------------------------------ the client (parent)

class BareClient:
    """One connection, one request at a time: `{id, method, params}` out, the reply in."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.ids = itertools.count(1)
        self.enc = msgspec.msgpack.Encoder()
        self.buf = b""

    def call(self, method: str, params: dict) -> dict:
        self.send(method, params)
        return self.reply(method)

    def send(self, method: str, params: dict) -> None:
        body = self.enc.encode({"id": next(self.ids), "method": method, "params": params})
        self.sock.sendall(HEADER.pack(len(body)) + body)

    def reply(self, method: str) -> dict:
        while True:
            if len(self.buf) >= 4:
                (n,) = HEADER.unpack_from(self.buf)
                if len(self.buf) >= 4 + n:
                    reply = msgspec.msgpack.decode(self.buf[4:4 + n])
                    self.buf = self.buf[4 + n:]
                    if reply.get("error"):
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return reply["result"]
            chunk = self.sock.recv(1 << 16)
            if not chunk:
                raise RuntimeError("coordd closed the connection")
            self.buf += chunk

    def close(self) -> None:
        self.sock.close()


def cycle(clients: list[BareClient]) -> None:
    """One claim -> complete on every client: the claims sent together, then the replies
    read; the completes likewise (so k clients' requests arrive in the same rounds)."""
    for i, c in enumerate(clients):
        c.send("claim", {"worker_id": f"w{i}", "lease_s": 30.0})
    got = [c.reply("claim") for c in clients]
    for i, (c, g) in enumerate(zip(clients, got)):
        assert g.get("job"), g
        c.send("complete", {"job_id": g["job"]["job_id"], "worker_id": f"w{i}",
                            "token": g["lease"]["token"], "result": {"ok": 1}})
    for c in clients:
        c.reply("complete")


def eager_cycle(clients: list[BareClient], held: list[dict | None]) -> int:
    """One job on every client, eager dispatch: a complete that asks for the next job
    (`next`) brings it, so a job is one request; a claim is sent only where a client holds
    none (the first round, or a revision without `next`: its reply has none). `held`: each
    client's ClaimResult, updated in place. Returns the requests sent."""
    sent = 0
    for i, c in enumerate(clients):
        if held[i] is None:
            c.send("claim", {"worker_id": f"w{i}", "lease_s": 30.0})
            sent += 1
    for i, c in enumerate(clients):
        if held[i] is None:
            held[i] = c.reply("claim")
    for i, (c, g) in enumerate(zip(clients, held)):
        assert g and g.get("job"), g
        c.send("complete", {"job_id": g["job"]["job_id"], "worker_id": f"w{i}",
                            "token": g["lease"]["token"], "result": {"ok": 1},
                            "next": {"lease_s": 30.0}})
    for i, c in enumerate(clients):
        nxt = c.reply("complete").get("next")
        held[i] = nxt if nxt and nxt.get("job") else None
    return sent + len(clients)


def run(src: Path, n: int, work: Path, *, callgrind: bool, prof: str | None = None,
        toggle: str = "functools_reduce", k: int = 1, eager: bool = False,
        sent: list[int] | None = None) -> int | None:
    """Start the daemon child for `src`, set up, run `n` counted jobs over `k` connections
    (n // k rounds of k claims, then k completes; `eager`: of k completes that bring the
    next job, eager_cycle); Ir with callgrind. `sent`: the counted requests are added to it."""
    sock_path = str(work / f"d{len(list(work.iterdir()))}.sock")
    db = sock_path[:-5] + ".db"
    ctl_r, ctl_w = os.pipe()
    ack_r, ack_w = os.pipe()
    out = work / "callgrind.rpc.out"
    env = {**os.environ, "PYTHONPATH": str(src), "PYTHONHASHSEED": "0"}
    cmd = [sys.executable, str(Path(__file__).resolve()), sock_path, db, str(ctl_r),
           str(ack_w), prof or ""]
    if callgrind:
        cmd = ["valgrind", "--tool=callgrind", f"--toggle-collect={toggle}",
               f"--callgrind-out-file={out}", *cmd]
    log = open(work / "daemon.log", "wb")
    proc = subprocess.Popen(cmd, cwd=work, env=env, pass_fds=(ctl_r, ack_w), stdout=log,
                            stderr=subprocess.STDOUT)
    os.close(ctl_r)
    os.close(ack_w)
    client = None
    clients: list[BareClient] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while client is None:
            if proc.poll() is not None:
                raise SystemExit(f"the daemon exited {proc.returncode}:\n"
                                 f"{(work / 'daemon.log').read_text()[-3000:]}")
            try:
                client = BareClient(sock_path)
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit("the daemon did not come up") from None
                time.sleep(0.2)
        clients = [client, *(BareClient(sock_path) for _ in range(k - 1))]
        for i, c in enumerate(clients):
            c.call("heartbeat", {"worker_id": f"w{i}", "roles": ["cpu"], "readings": {
                "memory_used_pct": 40.0, "temperature_c": 50.0, "on_battery": False,
                "user_idle_s": 3600.0}})
        total = n + WARMUP * k
        for i in range(0, total, 500):
            client.call("enqueue_batch", {"jobs": [
                {"kind": "k", "required_role": "cpu", "priority": 2, "payload": {"i": j}}
                for j in range(i, min(total, i + 500))]})
        held: list[dict | None] = [None] * k
        for _ in range(WARMUP):
            if eager:
                eager_cycle(clients, held)
            else:
                cycle(clients)
        os.write(ctl_w, b"m")
        if not select.select([ack_r], [], [], START_TIMEOUT_S)[0] or os.read(ack_r, 1) != b"g":
            raise SystemExit("the daemon did not start the counted phase")
        requests = 0
        for _ in range(n // k):
            if eager:
                requests += eager_cycle(clients, held)
            else:
                cycle(clients)
                requests += 2 * k
        if sent is not None:
            sent.append(requests)
        os.write(ctl_w, b"e")
    finally:
        for c in clients or ([client] if client is not None else []):
            c.close()
        os.close(ctl_w)
        try:
            proc.wait(START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.returncode != 0:
            raise SystemExit(f"the daemon failed ({proc.returncode}):\n"
                             f"{(work / 'daemon.log').read_text()[-3000:]}")
        os.close(ack_r)
        log.close()
    return callgrind_total(out) if callgrind else None


def callgrind_total(out: Path) -> int:
    """The instructions (Ir) callgrind counted in its output file `out` (also
    bench.instructions'). Raises SystemExit when the file has no totals."""
    for line in out.read_text().splitlines():
        if line.startswith("summary:") or line.startswith("totals:"):
            return int(line.split()[1])
    raise SystemExit(f"no totals in {out}")


def profile_top(path: str, top: int = 25) -> list[str]:
    """The top functions of a cProfile dump by own time, as printable lines."""
    import pstats
    stats = pstats.Stats(path)
    rows = []
    for (file, line, name), (_cc, nc, tt, ct, _callers) in stats.stats.items():
        rows.append((tt, nc, ct, f"{Path(file).name}:{line}({name})"))
    rows.sort(reverse=True)
    total = sum(r[0] for r in rows) or 1.0
    return [f"    {100 * tt / total:5.1f}%  own {tt:7.3f}s  incl {ct:7.3f}s  calls {nc:7d}  {where}"
            for tt, nc, ct, where in rows[:top]]


def measure(src: Path, label: str, n: int, *, idle: bool = False,
            cprofile_dir: str | None = None, keep: str | None = None, k: int = 1,
            eager: bool = False) -> dict:
    """Ir per RPC and per job of the daemon serving `n` claim + complete cycles; `keep`: a
    folder to copy callgrind's output to (for callgrind_annotate)."""
    with tempfile.TemporaryDirectory(prefix="coordd-rpc-instr-") as w:
        work = Path(w)
        n -= n % k
        result: dict = {"label": label, "jobs": n, "clients": k}
        if cprofile_dir:
            Path(cprofile_dir).mkdir(parents=True, exist_ok=True)
            prof = str(Path(cprofile_dir) / f"{label.split()[0].replace('/', '_')}.pstats")
            run(src, n, work, callgrind=False, prof=prof, k=k, eager=eager)
            result["profile"] = prof
            return result
        sent: list[int] = []
        ir = run(src, n, work, callgrind=True, k=k, eager=eager, sent=sent)
        result.update(ir_total=ir, ir_per_job=ir / n, ir_per_rpc=ir / sent[0],
                      rpcs_per_job=sent[0] / n)
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            kept = Path(keep) / f"callgrind.{label.split()[0].replace('/', '_')}.out"
            shutil.copyfile(work / "callgrind.rpc.out", kept)
            result["callgrind_out"] = str(kept)
        if idle:
            result["ir_idle"] = run(src, 0, work, callgrind=True, k=k, eager=eager)
        return result


if __name__ == "__main__":
    here = Path(__file__).resolve().parent  # bench/: its profile.py would shadow the stdlib's
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    daemon_child(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]),
                 sys.argv[5] or None)
