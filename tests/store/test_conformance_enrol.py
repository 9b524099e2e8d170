"""Enrolment tokens over both stores (coordd.store.api_enrol): one use per token, expiry
on the store's clock, a burn that two racing enrolments cannot both pass; the whole
enrolment (coordd.service.enrol) over each store."""

from __future__ import annotations

import asyncio
import time

import pytest

from coordd import config as config_mod
from coordd import errors
from coordd.net import pki
from coordd.service.enrol import Enrolment, digest
from coordd.wire.enrol import Enroll, TokenCreate
from tests.store.conftest import T0


async def test_a_token_is_used_once_and_expires_on_the_stores_clock(bundle):
    st = bundle.store
    assert await st.add_token("d1", "gpu3", 60.0, now=T0) == T0 + 60
    assert await st.token_state("d1", now=T0 + 1) == (("gpu3", T0 + 60, None), T0 + 1)
    assert await st.token_state("nope", now=T0 + 1) == (None, T0 + 1)
    await st.burn_token("d1", "serial-1", now=T0 + 2)
    state, _ = await st.token_state("d1", now=T0 + 3)
    assert state == ("gpu3", T0 + 60, T0 + 2)
    with pytest.raises(errors.PermissionDenied, match="already used"):
        await st.burn_token("d1", "serial-2", now=T0 + 3)
    with pytest.raises(errors.PermissionDenied, match="unknown token"):
        await st.burn_token("nope", "serial-3", now=T0 + 3)
    await st.add_token("d2", "gpu4", 60.0, now=T0)
    with pytest.raises(errors.PermissionDenied, match="expired"):
        await st.burn_token("d2", "serial-4", now=T0 + 60)  # now == expires_at: expired
    await st.burn_token("d2", "serial-4", now=T0 + 59.9)  # the refusal burnt nothing


async def test_tokens_expired_a_day_ago_are_dropped_when_one_is_made(bundle):
    st = bundle.store
    await st.add_token("old", "w", 10.0, now=T0)
    await st.add_token("recent", "w", 10.0, now=T0 + 86400)
    await st.add_token("new", "w", 10.0, now=T0 + 10 + 86400 + 1)
    assert (await st.token_state("old", now=T0))[0] is None
    assert (await st.token_state("recent", now=T0))[0] is not None


async def test_racing_enrolments_with_one_token_pass_once(bundle):
    """Eight burns at once (eight connections on PostgreSQL): one passes, seven are
    refused `permission_denied`."""
    await bundle.store.add_token("d", "gpu3", 60.0, now=T0)
    got = await asyncio.gather(*(bundle.store.burn_token("d", f"s{i}", now=T0 + 1)
                                 for i in range(8)), return_exceptions=True)
    assert sum(r is None for r in got) == 1
    assert all(isinstance(r, errors.PermissionDenied) for r in got if r is not None)


async def test_enrolment_signs_one_certificate_per_token(bundle, tmp_path):
    ca = tmp_path / "ca"
    pki.init_ca(ca, now=time.time())
    enrol = Enrolment(bundle.store, config_mod.load(
        None, tls_ca_key=str(ca / "ca.key"), tls_client_ca=str(ca / "ca.pem")))
    made = await enrol.token_create(TokenCreate(worker_id="gpu3", ttl_s=3600))
    assert made.worker_id == "gpu3" and made.token.startswith("cdt_")
    assert made.ca_sha256 == pki.fingerprint((ca / "ca.pem").read_bytes())
    state, now = await bundle.store.token_state(digest(made.token))
    assert state == ("gpu3", made.expires_at, None) and now < made.expires_at <= now + 3600
    csr = pki.make_csr(pki.new_key(), "ignored").decode()
    with pytest.raises(errors.BadRequest):
        await enrol.enroll(Enroll(token=made.token, csr_pem="not a csr"))
    done = await enrol.enroll(Enroll(token=made.token, csr_pem=csr))
    assert pki.cert_identity(done.cert_pem.encode()) == ("gpu3", None)
    with pytest.raises(errors.PermissionDenied, match="already used"):
        await enrol.enroll(Enroll(token=made.token, csr_pem=csr))
    with pytest.raises(errors.PermissionDenied, match="unknown token"):
        await enrol.enroll(Enroll(token="cdt_nope", csr_pem=csr))
    with pytest.raises(errors.BadRequest, match="ttl_s must be"):
        await enrol.token_create(TokenCreate(worker_id="gpu3", ttl_s=0))
    off = Enrolment(bundle.store, config_mod.load(None))
    with pytest.raises(errors.InvalidState, match="enrolment is off"):
        await off.token_create(TokenCreate(worker_id="gpu3", ttl_s=60))
