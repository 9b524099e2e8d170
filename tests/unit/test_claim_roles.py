"""The claim's read of a worker row's roles (coordd.store.sqlite.claims._roles): sorted,
strings only, none from text that is not a JSON list; the same answer when read again."""

from __future__ import annotations

import pytest

from coordd.store.sqlite.claims import _roles


@pytest.mark.parametrize("text, roles", [
    ('["gpu", "cpu", "gpu"]', ("cpu", "gpu")),
    ('["cpu", 3, null, ["x"], {"a": 1}]', ("cpu",)),
    ("[]", ()),
    ('{"cpu": true}', ()),
    ('"cpu"', ()),
    ("not json", ()),
    (None, ()),
])
def test_roles_of_a_worker_row(text, roles):
    assert _roles(text) == roles
    assert _roles(text) == roles  # again: the kept answer
