"""worker.launch.fast_argv: which models start under setpriv, and the errors of a bad program."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from worker import launch

pytestmark = pytest.mark.skipif(launch.SETPRIV is None, reason="util-linux setpriv not installed")


def _write(path, text: str, mode: int = 0o755) -> str:
    path.write_text(text)
    path.chmod(mode)
    return str(path)


def test_elf_and_script_programs_take_setpriv(tmp_path):
    env = {"PATH": os.environ["PATH"]}
    argv = launch.fast_argv(["sleep", "5"], env)
    assert argv is not None
    assert argv[:4] == [launch.SETPRIV, "--pdeathsig", "KILL", "--"]
    assert os.path.isabs(argv[4]) and argv[4].endswith("/sleep") and argv[5:] == ["5"]
    script = _write(tmp_path / "model.sh", "#!/bin/sh\nexit 0\n")
    assert launch.fast_argv([script, "x"], env)[4:] == [script, "x"]


@pytest.mark.parametrize("body", [
    b"echo not a script\n",                      # no magic at all
    b"\x7fELF garbage",                          # ELF magic, no valid header
    b"#!/nonexistent/interpreter\n",             # the kernel would answer ENOENT
    b"#!\n",                                     # no interpreter named
])
def test_files_the_kernel_may_refuse_take_the_shim(tmp_path, body):
    # execve would fail on these, and setpriv's execvp would hand ENOEXEC files to /bin/sh:
    # the shim reports the exec's error exactly
    plain = tmp_path / "model"
    plain.write_bytes(body)
    plain.chmod(0o755)
    assert launch.fast_argv([str(plain)], {"PATH": "/usr/bin"}) is None


@pytest.mark.parametrize("case", ["missing_on_path", "missing_path", "not_executable", "dir"])
def test_bad_programs_raise_as_a_direct_spawn_would(tmp_path, case):
    if case == "missing_on_path":
        argv, code = ["no-such-model-xyz"], errno.ENOENT
    elif case == "missing_path":
        argv, code = [str(tmp_path / "gone")], errno.ENOENT
    elif case == "not_executable":
        argv, code = [_write(tmp_path / "m.sh", "#!/bin/sh\n", mode=stat.S_IRUSR)], errno.EACCES
    else:
        argv, code = [str(tmp_path)], errno.EACCES
    with pytest.raises(OSError) as info:
        launch.fast_argv(argv, {"PATH": str(tmp_path)})
    assert info.value.errno == code
