"""The MCP tools' schemas take every field of the wire request they stand for, so an agent
can ask for what coordctl and the client library can (a new Enqueue field is not left out)."""

from __future__ import annotations

import pytest

pytest.importorskip("mcp")

from coordd.wire.protocol import Enqueue  # noqa: E402
from coordd.wire.workflows import WorkflowNode  # noqa: E402
from coordd_mcp.tools import BY_NAME  # noqa: E402


def test_enqueue_job_and_workflow_nodes_take_every_field_of_their_request():
    job = BY_NAME["enqueue_job"].schema["properties"]
    assert sorted(set(Enqueue.__struct_fields__) - set(job)) == []
    node = BY_NAME["submit_workflow"].schema["properties"]["nodes"]["items"]["properties"]
    assert sorted(set(WorkflowNode.__struct_fields__) - set(node)) == []
