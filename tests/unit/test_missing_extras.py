"""coordd-web and coordd-mcp without their extras (./demo.sh installs the bare package): a
one-line hint naming the extra and exit 2, not a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("blocked, call, extra", [
    ("uvicorn", "from coordd_web.__main__ import main; sys.exit(main([]))", "web"),
    ("starlette", "from coordd_web.__main__ import main; sys.exit(main([]))", "web"),
    ("mcp", "from coordd_mcp import main; sys.exit(main([]))", "mcp"),
])
def test_a_missing_extra_is_a_one_line_hint(blocked, call, extra):
    code = f"import sys; sys.modules[{blocked!r}] = None; {call}"  # None: the import fails
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr
    assert f"needs the `{extra}` extra" in res.stderr and f"coordd[{extra}]" in res.stderr
