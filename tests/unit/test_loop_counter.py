"""The claims counter (coordd.ops.metrics.LoopCounter) exports what prometheus_client's
Counter exports for the same counts: `_total` and a `_created` series, HELP and TYPE."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

from coordd.ops.metrics import LoopCounter, Metrics


def _exposition(reg: CollectorRegistry) -> list[str]:
    """The registry's lines, the `_created` value (when each was made) left out."""
    return [s.split(" ")[0] if s.startswith("c_jobs_created ") else s
            for s in generate_latest(reg).decode().splitlines()]


def test_the_same_exposition_as_prometheus_clients_counter():
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = LoopCounter("c_jobs", "doc", ours_reg)
    ref = Counter("c_jobs", "doc", registry=ref_reg)
    assert _exposition(ours_reg) == _exposition(ref_reg)
    for n in (1, 3, 1, 64):
        ours.inc(n)
        ref.inc(n)
    ours.inc()
    ref.inc()
    assert _exposition(ours_reg) == _exposition(ref_reg)
    assert "c_jobs_total 70.0" in _exposition(ours_reg)
    assert "c_jobs_created" in _exposition(ours_reg)


def test_claims_are_counted_as_coordd_claims_total():
    m = Metrics()
    m.claims.inc(1 + 2)
    m.claims.inc(1)
    assert "coordd_claims_total 4.0" in m.render().splitlines()


def test_no_created_series_where_the_library_exports_none():
    import prometheus_client.metrics as library
    library.disable_created_metrics()
    try:
        reg = CollectorRegistry()
        LoopCounter("c_jobs", "doc", reg).inc()
        Counter("d_jobs", "doc", registry=reg).inc()
        text = generate_latest(reg).decode()
        assert "_created" not in text and "c_jobs_total 1.0" in text
    finally:
        library.enable_created_metrics()
