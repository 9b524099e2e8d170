"""Benchmarks for coordd (not part of the test suite): `python -m bench.run --help`."""
