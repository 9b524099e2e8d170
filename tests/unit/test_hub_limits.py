"""The hub's bounds on a pinned clock: config vs read limits, resends, listing agents,
the byte budget of a read reply."""

from __future__ import annotations

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.protocol import ReadMessages, SendMessage


async def test_a_resend_reports_the_stored_expiry_not_the_new_requests(bundle):
    first = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content="x", ttl_s=60,
                                                        message_id="req-1"))
    bundle.clock.advance(30)
    again = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                        content="x", ttl_s=60,
                                                        message_id="req-1"))
    assert (again.created, again.expires_at) == (False, first.expires_at)
    no_ttl = await bundle.coord.send_message(SendMessage(sender="a", recipient="b",
                                                         content="x", message_id="req-1"))
    assert (no_ttl.created, no_ttl.expires_at) == (False, first.expires_at)


@pytest.mark.parametrize("value", [43_201, 1e9, 0, -1, float("nan")])
def test_config_refuses_a_visibility_the_read_path_would_refuse(value):
    with pytest.raises(errors.ConfigError, match="message_visibility_s must be > 0 and <= 43200"):
        config_mod.load(None, message_visibility_s=value)


async def test_config_at_the_visibility_maximum_serves_default_reads(make_bundle):
    b = await make_bundle(message_visibility_s=43_200)
    await b.coord.send_message(SendMessage(sender="a", recipient="b", content="x"))
    got = await b.coord.read_messages(ReadMessages(reader="b"))
    assert got.visible_until == b.clock.wall() + 43_200
