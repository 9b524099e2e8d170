"""coordctl's one-line errors print what coordd or the user sent with its control
characters escaped, as its tables do (render.safe): a socket path or a reason holding
ESC must not drive the terminal."""

from __future__ import annotations

import pytest

from coordctl.__main__ import fail


def test_the_error_line_escapes_control_characters(capsys):
    with pytest.raises(SystemExit) as exit_:
        fail("timeout", "job J still waiting after 1s: no live worker runs kind "
                        "k\x1b[31mRED\u202e\n  x")
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err, repr(err)
    assert err == ("coordctl: timeout: job J still waiting after 1s: no live worker runs "
                   "kind k\\x1b[31mRED\\u202e x\n")
