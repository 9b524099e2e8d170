"""Enrolment on a PostgreSQL store (StoreCoordinator's mixin): coordd.enrol's methods
(`token_create`, admin; `ca_bundle` and `enroll`, the enrolment listener's) over the
store's token operations (coordd.store.api_enrol)."""

from __future__ import annotations

import functools
from typing import Any

from coordd.config import Config
from coordd.enrol import ENROL_METHODS as _METHODS
from coordd.enrol import Enrolment
from coordd.protocol_enrol import CaBundle, Enroll, Enrolled, TokenCreate, TokenCreated

ENROL_METHODS = frozenset(_METHODS)
"""The enrolment RPC methods, all served on the store."""


class EnrolService:
    """The enrolment methods over `self.store` (see the module docstring)."""

    store: Any
    config: Config

    @functools.cached_property
    def enrolment(self) -> Enrolment:
        """Enrolment over this coordinator's store (the CA is read at the first use)."""
        return Enrolment(self.store, self.config)

    async def token_create(self, p: TokenCreate) -> TokenCreated:
        """Make a one-time token for a worker id. Raises: BadRequest, InvalidState
        (enrolment is off: no CA key)."""
        return await self.enrolment.token_create(p)

    async def ca_bundle(self, p: Any = None) -> CaBundle:
        """The fleet CA certificate. Raises: InvalidState (enrolment is off)."""
        return await self.enrolment.ca_bundle(p)

    async def enroll(self, p: Enroll) -> Enrolled:
        """Burn the token, sign the CSR. Raises: PermissionDenied, BadRequest, InvalidState."""
        return await self.enrolment.enroll(p)
