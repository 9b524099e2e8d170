"""coordd's metrics, in Prometheus text format (prometheus-client), on a private registry.

Series:
- `coordd_jobs{status}`, `coordd_waiting_jobs{priority}`: queue depth (set at each scrape);
- `coordd_queue_latency_seconds`: `status`'s oldest_waiting_age_s (coordd.store.latency), 0
  when no due job waits;
- `coordd_workers{state="known"|"live"}`, `coordd_active_leases`;
- `coordd_claims_total`, `coordd_claim_refusals_total{reason}`, `coordd_lease_expiries_total`;
- `coordd_writer_batch_size`, `coordd_writer_commit_seconds`,
  `coordd_writer_queue_wait_seconds` (histograms: p50/p99 with histogram_quantile),
  `coordd_writer_queue_depth`;
- `coordd_storage_bytes{file="db"|"wal"|"artifacts"}`;
- `coordd_governance_actions_total{action, reason}`: suspends, resumes, vacates of running
  jobs (coordd.rules.governance), by the first reason code (`preempted_by` for preemptions);
- `coordd_preemptions_total`: victims chosen by coordd.rules.preemption (reservations made);
- `coordd_limit_units{limit, state="used"|"max"}`, `coordd_limit_rate_units{limit,
  state="used"|"max"}` (units claimed in the current rate window), `coordd_limit_usable{limit,
  priority}` (units a job of that priority may still take), `coordd_limit_waiting_jobs{limit}`,
  `coordd_limit_budget_used{limit, metric}`: fleet-wide limits (coordd.rules.limits); claims a
  limit refused count in `coordd_claim_refusals_total{reason="limit"}`.
Served by the `metrics` RPC (`coordctl metrics`) and, when `metrics_port` is set, over HTTP
on 127.0.0.1.
"""

from __future__ import annotations

import bisect
import logging
import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client import metrics as _library
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString

from coordd.clock import SystemClock
from coordd.wire.protocol import StatusReply
from coordd.wire.limits import LimitView

logger = logging.getLogger(__name__)

BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
SECONDS_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)


class Metrics:
    """Every series coordd exports; one instance per Coordinator (its own registry)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.claims = LoopCounter("coordd_claims", "Jobs handed out by claim", r)
        self.refusals = Counter("coordd_claim_refusals", "Claims that got no job, by reason",
                                ["reason"], registry=r)
        self.lease_expiries = Counter("coordd_lease_expiries",
                                      "Expired leases reaped (job requeued, failed or cancelled)",
                                      registry=r)
        self.batch_size = LoopHistogram("coordd_writer_batch_size",
                                        "Requests per group commit", BATCH_BUCKETS, r)
        self.commit_seconds = LoopHistogram("coordd_writer_commit_seconds",
                                            "Seconds per group commit (BEGIN to COMMIT)",
                                            SECONDS_BUCKETS, r)
        self.queue_wait = LoopHistogram("coordd_writer_queue_wait_seconds",
                                        "Seconds a request waits for the writer",
                                        SECONDS_BUCKETS, r)
        self.queue_depth = Gauge("coordd_writer_queue_depth",
                                 "Requests accepted and not yet committed", registry=r)
        self.jobs = Gauge("coordd_jobs", "Jobs by status", ["status"], registry=r)
        self.waiting = Gauge("coordd_waiting_jobs", "Waiting jobs by priority", ["priority"],
                             registry=r)
        self.latency = Gauge("coordd_queue_latency_seconds", "Seconds the oldest runnable "
                             "waiting job has waited since it became runnable (0: none)",
                             registry=r)
        self.workers = Gauge("coordd_workers", "Workers known, and live (fresh heartbeat)",
                             ["state"], registry=r)
        self.active_leases = Gauge("coordd_active_leases", "Live leases", registry=r)
        self.storage = Gauge("coordd_storage_bytes", "Bytes on disk", ["file"], registry=r)
        self.governance = Counter("coordd_governance_actions",
                                  "Running jobs suspended, resumed or vacated, by reason",
                                  ["action", "reason"], registry=r)
        self.preemptions = Counter("coordd_preemptions",
                                   "Running jobs chosen to vacate for a waiting job of a "
                                   "higher priority (a reservation made)", registry=r)

        self.limit_units = Gauge("coordd_limit_units", "Units of a fleet-wide limit held by "
                                 "running jobs (used) and its concurrency (max)",
                                 ["limit", "state"], registry=r)
        self.limit_rate = Gauge("coordd_limit_rate_units", "Units claimed in a limit's rate "
                                "window (used) and its rate (max)", ["limit", "state"],
                                registry=r)
        self.limit_usable = Gauge("coordd_limit_usable", "Units a job of this priority may "
                                  "still take (reserves held back)", ["limit", "priority"],
                                  registry=r)
        self.limit_waiting = Gauge("coordd_limit_waiting_jobs", "Waiting jobs naming a limit",
                                   ["limit"], registry=r)
        self.limit_budget = Gauge("coordd_limit_budget_used", "Reported usage in a limit's "
                                  "budget window", ["limit", "metric"], registry=r)

    def set_limits(self, views: list[LimitView]) -> None:
        """Set the limit gauges from a `limits` reply (a limit gone loses its series)."""
        for g in (self.limit_units, self.limit_rate, self.limit_usable, self.limit_waiting,
                  self.limit_budget):
            g.clear()
        for v in views:
            self.limit_units.labels(v.name, "used").set(v.used)
            if v.concurrency is not None:
                self.limit_units.labels(v.name, "max").set(v.concurrency)
            if v.rate is not None:
                self.limit_rate.labels(v.name, "used").set(v.rate_used)
                self.limit_rate.labels(v.name, "max").set(float(v.rate.split("/")[0]))
            for prio, n in v.usable.items():
                if n is not None:
                    self.limit_usable.labels(v.name, prio.removeprefix("p")).set(n)
            self.limit_waiting.labels(v.name).set(v.waiting)
            for metric, amount in v.budget_used.items():
                self.limit_budget.labels(v.name, metric).set(amount)

    def observe_batch(self, size: int, commit_s: float, waits_s: list[float]) -> None:
        """Record one group commit: its size, its duration and each request's wait (seconds)."""
        self.batch_size.observe(size)
        self.commit_seconds.observe(commit_s)
        for w in waits_s:
            self.queue_wait.observe(w)

    def count_governance(self, worker_id: str, changes: list[tuple[str, str]],
                         preempted: list[tuple[str, str, str]] | None = None) -> None:
        """Count governance transitions [(action, reason code)] and preemptions
        [(waiting job, victim, worker)], and log each one."""
        for job_id, victim, holder in preempted or ():
            self.preemptions.inc()
            self.governance.labels("vacate", "preempted_by").inc()
            logger.info("job %s preempts %s on %s (reserved)", job_id, victim, holder,
                        extra={"action": "preempt", "job_id": job_id, "victim": victim,
                               "worker_id": holder})
        for action, reason in changes:
            self.governance.labels(action, reason).inc()
            logger.info("governance: %s a job of %s (%s)", action, worker_id, reason,
                        extra={"action": f"governance_{action}", "worker_id": worker_id,
                               "reason": reason})

    def set_status(self, st: StatusReply, queue_depth: int, artifact_bytes: int) -> None:
        """Set the gauges from a `status` reply and the writer's queue depth."""
        for status, n in st.jobs.items():
            self.jobs.labels(status).set(n)
        for prio, n in st.waiting_by_priority.items():
            self.waiting.labels(prio.removeprefix("p")).set(n)
        self.workers.labels("known").set(st.workers)
        self.workers.labels("live").set(st.workers_live)
        self.active_leases.set(st.active_leases)
        self.latency.set(st.oldest_waiting_age_s or 0.0)
        self.queue_depth.set(queue_depth)
        self.storage.labels("db").set(st.db_bytes)
        self.storage.labels("wal").set(st.wal_bytes)
        self.storage.labels("artifacts").set(artifact_bytes)

    def render(self) -> str:
        """The Prometheus text exposition of every series."""
        return generate_latest(self.registry).decode()


class LoopHistogram:
    """A Prometheus histogram observed from the event loop's thread only (the writer's
    batches), exported by a collector: the same series as prometheus_client's Histogram
    (`_bucket{le}`, `_count`, `_sum`, `_created`) without its lock and Python calls per
    observation (docs/decisions.md, "jobcost"). A scrape from the HTTP thread reads counts
    a batch may be adding to, as it would with the library's Histogram (its buckets and
    sum are separate values too)."""

    def __init__(self, name: str, documentation: str, bounds: tuple[float, ...],
                 registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = tuple(float(b) for b in bounds)
        # what docgen reads of a prometheus_client metric (docs/reference/metrics.md)
        self._type, self._labelnames = "histogram", ()
        self._upper_bounds = [*self._bounds, float("inf")]
        self._les = [floatToGoString(b) for b in self._bounds] + ["+Inf"]
        self.counts = [0] * (len(self._bounds) + 1)  # per bucket, not cumulative; +Inf last
        self.sum = 0.0
        self._created = SystemClock().wall()  # the series' `_created`, as the library's
        registry.register(self)

    def observe(self, value: float) -> None:
        """Count one observation (a value equal to a bound falls in that bound's bucket)."""
        self.counts[bisect.bisect_left(self._bounds, value)] += 1
        self.sum += value

    def describe(self) -> list[HistogramMetricFamily]:
        """The family without samples (the registry's name check)."""
        return [HistogramMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterator[HistogramMetricFamily]:
        """The histogram's samples now, cumulative by bucket as Prometheus reads them."""
        counts, total, running = list(self.counts), self.sum, 0
        buckets = []
        for le, n in zip(self._les, counts):
            running += n
            buckets.append((le, float(running)))
        family = HistogramMetricFamily(self._name, self._documentation, buckets=buckets,
                                       sum_value=total)
        if getattr(_library, "_use_created", True):  # as the library's own metrics
            family.add_sample(self._name + "_created", {}, self._created)
        yield family


class LoopCounter:
    """A Prometheus counter without labels, counted from the event loop's thread only (the
    claims), exported by a collector: the same series as prometheus_client's Counter
    (`_total`, `_created`) without its lock and Python calls per count (as LoopHistogram)."""

    def __init__(self, name: str, documentation: str, registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._type, self._labelnames = "counter", ()  # what docgen reads, as LoopHistogram
        self.value = 0.0
        self._created = SystemClock().wall()  # the series' `_created`, as the library's
        registry.register(self)

    def inc(self, amount: float = 1) -> None:
        """Add `amount` (>= 0: a counter only goes up; callers count jobs)."""
        self.value += amount

    def describe(self) -> list[CounterMetricFamily]:
        """The family without samples (the registry's name check)."""
        return [CounterMetricFamily(self._name, self._documentation)]

    def collect(self) -> Iterator[CounterMetricFamily]:
        """The counter's samples now."""
        yield CounterMetricFamily(
            self._name, self._documentation, value=self.value,
            created=self._created if getattr(_library, "_use_created", True) else None)


def tree_bytes(root: str) -> int:
    """Total size in bytes of the regular files under `root` (0 if it does not exist)."""
    total = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                pass
    return total
