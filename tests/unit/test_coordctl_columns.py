"""COLUMNS=0 (or not a number) must not make coordctl's tables vanish: rich took 0 as
the width and printed nothing at all, with status 0 (`coordctl top` not even its
"terminal too small" line)."""

from __future__ import annotations

import io
import sys

import pytest

from coordctl import render


@pytest.mark.parametrize("columns", ["0", "-3", "wide"])
def test_a_columns_that_is_no_width_is_ignored(monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(sys, "stdout", io.StringIO())  # a pipe, also under `pytest -s`
    assert render.make_console().width == render.PIPE_WIDTH_DEFAULT


def test_a_columns_that_is_a_width_is_used(monkeypatch):
    monkeypatch.setenv("COLUMNS", "57")
    monkeypatch.setattr(sys, "stdout", io.StringIO())
    assert render.make_console().width == 57
