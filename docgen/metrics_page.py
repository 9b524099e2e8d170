"""docs/reference/metrics.md: every metric family coordd exports (coordd.ops.metrics.Metrics),
with its type, labels and help, read from a fresh registry."""

from __future__ import annotations

import inspect

from prometheus_client.metrics import MetricWrapperBase

from coordd.ops import metrics
from docgen import md

SUFFIXES = {"counter": "_total", "histogram": "_bucket, _sum, _count"}


def families() -> list[MetricWrapperBase | metrics.LoopHistogram | metrics.LoopCounter]:
    """The metric objects of a fresh Metrics, in the order they are declared (the writer's
    histograms are LoopHistograms and the claims a LoopCounter, which carry the same
    attributes read here)."""
    m = metrics.Metrics()
    return [v for v in vars(m).values()
            if isinstance(v, (MetricWrapperBase, metrics.LoopHistogram, metrics.LoopCounter))]


def render() -> str:
    """The whole page."""
    rows = []
    for fam in families():
        kind = fam._type
        name = fam._name
        series = (name + "_total" if kind == "counter" else
                  f"{name}_bucket, {name}_sum, {name}_count" if kind == "histogram" else name)
        labels = ", ".join(md.code(label) for label in fam._labelnames)
        extra = ""
        if kind == "histogram":
            bounds = [b for b in fam._upper_bounds if b != float("inf")]
            extra = ". Buckets (`le`): " + ", ".join(f"{b:g}" for b in bounds) + ", +Inf."
        rows.append([md.code(name), kind, md.code(series), labels, fam._documentation + extra])
    return (
        md.header("Metrics", "coordd/ops/metrics.py",
                  "Every series coordd exports, in the Prometheus text format. Read them "
                  "with `coordctl metrics` (the `metrics` RPC) or, with `metrics_port` set, "
                  "over HTTP at `http://127.0.0.1:PORT/metrics`. Gauges are refreshed every "
                  "reaper round and at each scrape.")
        + "## Families\n\n"
        + md.table(["family", "type", "series", "labels", "help"], rows)
        + "\n## Label values\n\n"
        + "From the module's own description (coordd/ops/metrics.py):\n\n"
        + inspect.cleandoc(metrics.__doc__ or "").split("Series:", 1)[-1].strip()
        .replace("\nServed by", "\n\nServed by") + "\n")
