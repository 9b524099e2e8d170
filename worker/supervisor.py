"""The worker supervisor: heartbeats, claims, leases, model process trees, checkpoints, results.

Why the lease is timed here and not trusted to coordd: a supervisor that was frozen (SIGSTOP,
a blocked loop, a suspend) must find out on its own that its lease is gone and kill its model
tree before anything else (CASES B07). Its deadline is the monotonic moment the claim/renew
was *sent* plus the granted `lease_s` (docs/reference/protocol.md); past it, or on
`lease_lost`/`lease_expired`, the tree is killed and no result is ever reported.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import uuid
from collections.abc import Callable

from coordd import errors
from coordd.client import CallTimeout, Client, Disconnected
from coordd.clock import Clock, SystemClock
from worker import (artifacts, checkpoints, governance, orphans, remote_files, renewal,
                    resources, stopping)
from worker.claiming import ClaimLoop
from worker.config import KindConfig, WorkerConfig, expand_argv, job_env
from worker.jobrun import CANCELLED, LEASE_LOST, SHUTDOWN, TIMEOUT, JobRun
from worker.kinds import KindHealth
from worker.link import Link
from worker.logs import LogShipper
from worker.control import ControlWatch
from worker.probes import Probes
from worker.process import ModelProcess, classify_exit
from worker.reports import LEASE_GONE, REPORT_TIMEOUT_S, SHUTDOWN_REPORT_TIMEOUT_S, Reporter
from worker.slots import Slots
from worker.waits import signame as _signame, wait_any as _wait_any

logger = logging.getLogger(__name__)

CHECKPOINT_POLL_S = 0.5
CALL_TIMEOUT_S = 10.0
STDERR_TAIL_BYTES = 2000
FORCE_MARGIN_S = 2.0
"""At stop, job tasks still running this long before `stop_timeout_s` are cancelled (SIGKILL)."""


class Supervisor(ClaimLoop):
    """Run jobs for one worker id until `request_stop`.

    Args:
        client_factory: returns the coordd Client (one connection, many calls in flight).
        worker_id: this worker's id.
        roles: the roles it claims for.
        config: the worker config.
        probes: host readings (default: the real `Probes`).
        clock: time source (default: SystemClock).
        override_path: `--readings-override` JSON file, re-read every heartbeat (given to
            the default Probes; an injected `probes` brings its own).
    """

    def __init__(self, client_factory: Callable[[], Client], worker_id: str, roles: list[str],
                 config: WorkerConfig, *, probes: Probes | None = None,
                 clock: Clock | None = None, override_path: str | None = None) -> None:
        if not worker_id or not roles:
            raise ValueError("worker_id and roles are required")
        self.worker_id = worker_id
        self.roles = list(roles)
        self.config = config
        self._client = client_factory()
        self._clock = clock or SystemClock()
        self._probes = probes or Probes(override_path=override_path, mono=self._clock.mono,
                                        wall=self._clock.wall)
        self._stop = asyncio.Event()
        self._reports = Reporter(self._client, worker_id, self._clock, self._stop, eager=self)
        self._wake = asyncio.Event()  # a slot freed, or stop
        self._never = asyncio.Event()
        self._runs: dict[str, JobRun] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = Slots(config.kinds)
        self._last_heartbeat: float | None = None
        self._artifact_dir: str | None = None
        self._link = Link(refused_cap_s=config.refused_backoff_cap_s)
        self.incarnation = uuid.uuid4().hex  # a new one per start: coordd ends the old leases
        self.kinds = KindHealth(config.kinds, self._clock.mono())
        self._groups = orphans.records_dir(config.work_dir, worker_id)
        self._forced = False
        self._tg: asyncio.TaskGroup | None = None
        self._watch = ControlWatch(client_factory(), worker_id, config, self._clock,
                                   lambda: self._runs,
                                   governance.watch_act(lambda: self._runs, self._clock.mono))

    # ------------------------------------------------------------ lifecycle

    def request_stop(self) -> None:
        """Stop claiming, hand running jobs back and return from `run` (idempotent)."""
        self._stop.set()
        self._wake.set()

    @property
    def running_jobs(self) -> list[str]:
        """Ids of the jobs this supervisor holds."""
        return list(self._runs)

    async def run(self) -> None:
        """Kill what a previous run of this worker id left (worker.orphans), then heartbeat,
        claim and run jobs until stopped, and say goodbye; every model tree is gone on
        return. Raises: orphans.WorkerRunning (this id runs here already)."""
        lock = await asyncio.to_thread(orphans.lock, self._groups)
        logger.info("worker %s started (roles %s, kinds %s)", self.worker_id, ",".join(self.roles),
                    ",".join(sorted(self.config.kinds)), extra={"action": "worker_start"})
        try:
            await asyncio.to_thread(orphans.kill_recorded, self._groups)
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                tg.create_task(self._heartbeat_loop(), name="heartbeat")
                tg.create_task(self._claim_loop(), name="claim")
                tg.create_task(self._watch.run(self._stop), name="control-watch")
                tg.create_task(self._stop_watch(), name="stop")
            await self._goodbye()
        finally:
            await asyncio.gather(self._client.close(), self._watch.close())
            orphans.unlock(lock)

    async def _stop_watch(self) -> None:
        await self._stop.wait()
        stopping.announce(self._runs.values())  # what goes out for each, as things stand
        await self._watch.close()  # its parked claim must not take back what we release
        for run in list(self._runs.values()):
            run.abort(SHUTDOWN)
        budget = self.config.stop_timeout_s - min(FORCE_MARGIN_S, self.config.stop_timeout_s / 4)
        force_at = self._clock.mono() + budget
        while self._tasks and self._clock.mono() < force_at:  # a claim in flight may add one
            await asyncio.wait(set(self._tasks), timeout=force_at - self._clock.mono())
        pending = set(self._tasks)
        if pending:
            logger.warning("stop timeout: killing %d job(s)", len(pending),
                           extra={"action": "worker_stop_forced"})
            self._forced = True
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

    # ------------------------------------------------------------ heartbeat

    async def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            await self.heartbeat_once()
            if await self._clock.wait(self._stop, self.config.heartbeat_interval_s):
                return

    async def heartbeat_once(self) -> bool:
        """Send one heartbeat; act on its cancel list. Returns False if coordd did not answer."""
        readings = resources.advertise(self.config, {**await asyncio.to_thread(self._probes.read),
                                                     **governance.capacity(self.config)})
        sent = self._clock.mono()
        self.kinds.recheck(sent)
        try:
            reply = await self._client.heartbeat(
                self.worker_id, self.roles, readings, incarnation=self.incarnation,
                kinds=self.kinds.usable(), broken_kinds=self.kinds.broken())
        except errors.CoordError as exc:
            self._link.failed(exc)
            return False
        self._link.answered()
        self._last_heartbeat = sent
        if reply.lost:
            logger.warning("coordd released %d job(s) of this worker's previous run: %s",
                           len(reply.lost), ", ".join(reply.lost), extra={"action": "worker_lost"})
        if reply.artifact_dir:
            self._artifact_dir = reply.artifact_dir
        for job_id in reply.cancel:
            run = self._runs.get(job_id)
            if run is not None:
                run.request_cancel()
        for a in reply.actions:  # suspend / resume / vacate, decided by coordd
            governance.act(self._runs.get(a.job_id), a.action, a.reason, self._clock.mono())
        return True

    async def _goodbye(self) -> None:
        try:
            await asyncio.wait_for(self._client.goodbye(self.worker_id, self.incarnation),
                                   SHUTDOWN_REPORT_TIMEOUT_S)
        except (errors.CoordError, TimeoutError) as exc:
            logger.info("goodbye not delivered: %s", exc, extra={"action": "goodbye_lost"})

    @property
    def artifact_dir(self) -> str:
        """coordd's store (a heartbeat named it), else this host's own (remote_files)."""
        return remote_files.store_dir(self._client, self._artifact_dir, self.config.work_dir)

    def _start_job(self, run: JobRun) -> None:
        assert self._tg is not None
        self._runs[run.job_id] = run
        self._watch.started(run.job_id)
        if self._stop.is_set():
            run.abort(SHUTDOWN)
        task = self._tg.create_task(self._job_task(run), name=f"job-{run.job_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------ one job

    async def _job_task(self, run: JobRun) -> None:
        renewer = asyncio.create_task(renewal.renew_loop(
            self._client, run, self.worker_id, self.config, self._clock, self._lose_lease))
        try:
            await self._run_job(run)
        except Exception as exc:  # a bug in one job must not stop the worker
            logger.exception("job %s: supervisor error", run.job_id,
                             extra={"action": "job_error", "job_id": run.job_id})
            await self._kill(run)
            await self._reports.fail(run, f"worker error: {type(exc).__name__}: {exc}", True)
        finally:
            try:
                await self._kill(run)  # also when this task is cancelled: never leave a tree
                orphans.forget(run.group_record)
            finally:
                run.finished.set()
                renewer.cancel()
                if self._runs.get(run.job_id) is run:  # not a next claim's new run of it
                    del self._runs[run.job_id]
                self._wake.set()
        if resources.holds_gpu(run.job) and not self._stop.is_set():
            await self.heartbeat_once()  # the freed VRAM, seen now: a parked claim wakes

    async def _kill(self, run: JobRun) -> None:
        if run.proc is not None:
            await run.proc.terminate_tree(0.0 if self._forced else self.config.grace_s)

    async def _run_job(self, run: JobRun) -> None:
        job, kind = run.job, run.kind
        if kind is None:
            await self._reports.fail(run, f"kind {job.kind} not configured on worker {self.worker_id}",
                                    False)
            return
        values = await asyncio.to_thread(artifacts.prepare_job_dir, run.dir, job.job_id, job.payload)
        run.files = remote_files.for_job(self._client, self._artifact_dir, self.artifact_dir,
                                         run, self.worker_id)
        run.checkpoints, values["resume_from"] = await checkpoints.start(
            values["checkpoint_dir"], self.artifact_dir, run.dir, job.job_id, job.checkpoint, run.files)
        if not await self._slots.acquire(run, kind.slots):
            await self._after_abort(run)
            return
        try:
            await self._execute(run, kind, values)
        finally:
            self._slots.release(run)

    async def _execute(self, run: JobRun, kind: KindConfig, values: dict[str, str]) -> None:
        argv = expand_argv(kind.argv, values)
        if self.kinds.is_broken(run.job.kind):  # claimed before its spawn failed here
            await self._reports.release(run, f"kind {run.job.kind} broken on {self.worker_id}: "
                                     f"{self.kinds.broken()[run.job.kind]}")
            return
        env = {**os.environ, **kind.env, **job_env(values), "COORD_WORKER_ID": self.worker_id,
               **resources.job_env(run.job)}
        out = {s: os.path.join(run.dir, f"{s}.log") for s in ("stdout", "stderr")}
        start = asyncio.ensure_future(ModelProcess.start(argv, env, run.dir, *out.values()))
        try:
            run.proc = await asyncio.shield(start)
            run.group_record = orphans.record(self._groups, run.proc.pid, run.job_id)
        except asyncio.CancelledError:  # spawned but not handed to us yet: still ours to kill
            try:
                run.proc = await start
            except Exception:
                pass
            raise
        except OSError as exc:  # the worker's fault, not the job's: no attempt spent
            self.kinds.cannot_exec(run.job.kind, f"cannot start {argv[0]}: {exc}")
            await self._reports.release(run, f"spawn_failed: cannot start {argv[0]}: {exc}")
            return
        timeout_s = kind.timeout_s if run.job.max_runtime_s is None \
            else min(kind.timeout_s, run.job.max_runtime_s)
        run.logs = LogShipper(self._client, self.worker_id, run.job_id, run.token, out)
        helpers = [asyncio.create_task(self._checkpoint_loop(run)),
                   asyncio.create_task(self._timeout_timer(run, timeout_s)),
                   asyncio.create_task(run.logs.run(self._clock, run.aborted))]
        try:
            exited = asyncio.ensure_future(run.proc.wait())
            await _wait_any(run.aborted, future=exited)
            await self._kill(run)  # on exit too: leftover group members go now
        finally:
            for task in helpers:
                task.cancel()
            await asyncio.gather(*helpers, return_exceptions=True)
        if run.holds_lease(self._clock.mono()):  # the rest of its output, before the report
            await run.logs.finish(SHUTDOWN_REPORT_TIMEOUT_S if self._stop.is_set()
                                  else REPORT_TIMEOUT_S)
        if run.proc.killed_by_us:
            await self._after_abort(run, values, timeout_s)
        else:
            await self._after_exit(run, kind, values)

    async def _after_abort(self, run: JobRun, values: dict[str, str] | None = None,
                           timeout_s: float = 0.0) -> None:
        reason = run.abort_reason
        if not run.holds_lease(self._clock.mono()):
            logger.warning("job %s: lease lost; tree killed, nothing reported", run.job_id,
                           extra={"action": "lease_lost_drop", "job_id": run.job_id})
            return
        if reason == CANCELLED:
            await self._reports.fail(run, "cancelled", False)
            return
        if values is not None:
            await self._checkpoint_once(run, checkpoints.end_mode(run.proc))
        if reason == TIMEOUT:
            await self._reports.fail(run, f"timeout after {timeout_s:g}s", True)
        else:  # not the job's doing: its attempt is given back
            await self._reports.release(run, reason if governance.is_vacate(reason)
                                        else "worker_shutdown", routine=True)

    async def _after_exit(self, run: JobRun, kind: KindConfig, values: dict[str, str]) -> None:
        assert run.proc is not None and run.proc.returncode is not None
        rc = run.proc.returncode
        await self._checkpoint_once(run, checkpoints.end_mode(run.proc))
        verdict = classify_exit(rc, killed_by_us=False)
        tail = run.proc.stderr_tail(STDERR_TAIL_BYTES).strip()
        what = f"exit {rc}" if rc >= 0 else f"killed by {_signame(-rc)}"
        logger.info("job %s: model %s (%s)", run.job_id, what, verdict,
                    extra={"action": "model_exit", "job_id": run.job_id, "rc": rc})
        stopping.confirm(run, stopping.COMPLETING if verdict == "success" else stopping.FAILING)
        if verdict != "success":
            await self._reports.fail(run, f"{what}: {tail}" if tail else what, verdict == "retryable")
            return
        try:
            outcome = await asyncio.to_thread(
                artifacts.read_result, values["result"], self.artifact_dir,
                max_bytes=kind.max_result_bytes, as_json=kind.result_json,
                inline_bytes=self.config.inline_result_bytes)
        except OSError as exc:
            await self._reports.fail(run, f"cannot store result: {exc}", True)
            return
        if isinstance(outcome, str):
            await self._reports.fail(run, outcome, False)
            return
        if (why := await remote_files.upload_result(run.files, outcome[1])) is not None:
            await self._reports.fail(run, why, True)  # (a remote worker: into coordd's store)
            return
        usage, why = await asyncio.to_thread(artifacts.read_usage, values["usage"])
        if why is not None:  # usage is for coordd's limit budgets; it never fails the job
            logger.warning("job %s: %s; not reported", run.job_id, why,
                           extra={"action": "usage_ignored", "job_id": run.job_id})
        await self._reports.complete(run, outcome, usage)
        await self._tidy(run)

    async def _tidy(self, run: JobRun) -> None:
        """Remove the job folder of `run`, whose report was sent, unless its lease was lost
        or the report's next claim handed the same job back (a refused result put it back
        to waiting with no backoff): the new run of it owns that folder now."""
        if not run.lease_gone and self._runs.get(run.job_id, run) is run:
            await asyncio.to_thread(shutil.rmtree, run.dir, True)

    # ------------------------------------------------------------ lease, timeout, checkpoints

    def _lose_lease(self, run: JobRun, why: str) -> None:
        if run.finished.is_set():
            return
        logger.warning("job %s: lease lost (%s); killing its tree", run.job_id, why,
                       extra={"action": "lease_lost", "job_id": run.job_id})
        run.lease_gone = True
        run.abort(LEASE_LOST)

    async def _timeout_timer(self, run: JobRun, seconds: float) -> None:
        left, counted = seconds, 0.0  # time the model spent suspended is not run time
        while not await self._clock.wait(run.aborted, left):
            left, counted = governance.stopped_since(run.proc, counted, self._clock.mono())
            if left <= 0:
                logger.warning("job %s: timeout after %gs", run.job_id, seconds,
                               extra={"action": "timeout", "job_id": run.job_id})
                return run.abort(TIMEOUT)

    async def _checkpoint_loop(self, run: JobRun) -> None:
        # until cancelled once the tree is gone: files renamed in during a grace period count
        while not await self._clock.wait(self._never, self._link.delay(CHECKPOINT_POLL_S)):
            await self._checkpoint_once(run)

    async def _checkpoint_once(self, run: JobRun, mode: str = checkpoints.RUNNING) -> None:
        """Record the newest whole new checkpoint file (worker.checkpoints) in coordd."""
        if run.checkpoints is None or run.proc is None or not run.holds_lease(self._clock.mono()):
            return
        exc = await run.checkpoints.record(self._client, self.worker_id, run.token, run.proc, mode,
                                           self._clock.mono(),
                                           lambda: run.holds_lease(self._clock.mono()))
        if isinstance(exc, LEASE_GONE):
            self._lose_lease(run, f"{exc.code}: {exc}")
        elif isinstance(exc, (Disconnected, CallTimeout, TimeoutError)):
            self._link.failed(exc)  # one line per outage; the loop backs off
