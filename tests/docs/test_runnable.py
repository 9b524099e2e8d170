"""The docs' runnable command blocks run against a real coordd and coord-worker
(tests/docs/runnable.py says how a block is marked and what it runs with)."""

from __future__ import annotations

import pytest

from tests.docs import runnable

BLOCKS = runnable.all_blocks()


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    yield from runnable.start_site(tmp_path_factory.mktemp("docs-site"))


def test_the_docs_have_runnable_blocks():
    """The runner has something to run: the coordctl reference's example at least."""
    assert any(b.path == "docs/reference/coordctl.md" for b in BLOCKS), BLOCKS


@pytest.mark.parametrize("block", BLOCKS, ids=[b.where for b in BLOCKS])
def test_runnable_block(site, block):
    result = site.run(block)
    assert result.returncode == 0, (
        f"{block.where}: the runnable block failed (exit {result.returncode})\n"
        f"--- block ---\n{block.code}--- output ---\n{result.stdout}\n{site.logs()}")


def test_a_failing_block_is_reported_with_its_place(site):
    """A command that fails stops its block (set -e), and the block's place is known."""
    text = "intro\n\n<!-- runnable -->\n```bash\ncoordctl status >/dev/null\nfalse\necho after\n```\n"
    [block] = runnable.blocks_in(text, "docs/x.md")
    assert block.where == "docs/x.md:4"
    result = site.run(block)
    assert result.returncode != 0 and "after" not in result.stdout


def test_a_block_sees_the_running_coordd(site):
    """`coordctl` resolves to this checkout's and talks to the fixture's coordd."""
    [block] = runnable.blocks_in("<!-- runnable -->\n```bash\ncoordctl --json workers\n```\n",
                                 "x.md")
    result = site.run(block)
    assert result.returncode == 0, result.stdout
    assert runnable.WORKER_ID in result.stdout


def test_a_marker_must_precede_a_bash_block():
    with pytest.raises(runnable.MarkerError, match="x.md:1"):
        runnable.blocks_in("<!-- runnable -->\n```python\nprint(1)\n```\n", "x.md")
    with pytest.raises(runnable.MarkerError, match="never closed"):
        runnable.blocks_in("<!-- runnable -->\n```bash\ntrue\n", "x.md")
    assert runnable.blocks_in("```bash\nnot marked\n```\n", "x.md") == []
