"""The writer's histograms (coordd.ops.metrics.LoopHistogram) export what
prometheus_client's Histogram exports for the same observations: the same buckets (a value
on a bound counts in that bound's bucket), count and sum, and a `_created` series."""

from __future__ import annotations

import random

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from coordd.ops.metrics import SECONDS_BUCKETS, LoopHistogram, Metrics


def test_the_same_exposition_as_prometheus_clients_histogram():
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = LoopHistogram("h_seconds", "doc", SECONDS_BUCKETS, ours_reg)
    ref = Histogram("h_seconds", "doc", buckets=SECONDS_BUCKETS, registry=ref_reg)
    rng = random.Random(3)
    values = [0.0, *SECONDS_BUCKETS, 2.0, 1e9] + [rng.random() / 50 for _ in range(500)]
    for v in values:
        ours.observe(v)
        ref.observe(v)
    lines = [generate_latest(r).decode().splitlines() for r in (ours_reg, ref_reg)]
    plain = [[s for s in got if "_created" not in s] for got in lines]
    assert plain[0] == plain[1]
    low = float(sum(v <= 0.0002 for v in values))  # the bound itself counts in its bucket
    assert f'h_seconds_bucket{{le="0.0002"}} {low}' in plain[0]
    assert f"h_seconds_count {float(len(values))}" in plain[0]
    created = [[s.split(" ")[0] for s in got if "_created" in s] for got in lines]
    assert created[0] == created[1] and created[0]


def test_a_batch_is_counted_in_the_three_writer_histograms():
    m = Metrics()
    m.observe_batch(3, 0.0004, [0.0001, 0.003, 0.3])
    text = m.render()
    assert "coordd_writer_batch_size_bucket{le=\"4.0\"} 1.0" in text
    assert "coordd_writer_batch_size_sum 3.0" in text
    assert "coordd_writer_commit_seconds_bucket{le=\"0.0005\"} 1.0" in text
    assert "coordd_writer_queue_wait_seconds_count 3.0" in text
    assert "coordd_writer_queue_wait_seconds_bucket{le=\"0.005\"} 2.0" in text


def test_no_created_series_where_the_library_exports_none():
    """PROMETHEUS_DISABLE_CREATED_SERIES (or disable_created_metrics()) drops every
    `_created` series of the library's metrics: the writer's histograms follow it."""
    import prometheus_client.metrics as library
    library.disable_created_metrics()
    try:
        reg = CollectorRegistry()
        LoopHistogram("h_seconds", "doc", SECONDS_BUCKETS, reg).observe(0.1)
        Histogram("g_seconds", "doc", buckets=SECONDS_BUCKETS, registry=reg).observe(0.1)
        assert "_created" not in generate_latest(reg).decode()
    finally:
        library.enable_created_metrics()
