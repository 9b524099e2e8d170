"""The Coordinator's fleet-wide limits (`limits`, `limits_set`, `limits_reset`, loading
the runtime overrides) and workflows (`workflow_submit`, `workflow_list`,
`workflow_cancel`; `workflow_get` is a read, coordd.service.reads) over the store's
admission and workflow operations (coordd.store.api_admission, api_workflows).

The checks are coordd.service.limits's and coordd.service.workflows' (`Workflows.plan` validates a
graph); a runtime limit override is stored first and only then installed in the
LimitBook the claims read.
"""

from __future__ import annotations

import logging
from typing import Any

from coordd.service import limits as limit_service
from coordd.service import workflows as flows
from coordd.rules.names import check_id
from coordd.service.limits import check_override, names_asked
from coordd.wire.limits import LimitReset, LimitSet, LimitsQuery, LimitsResult, LimitView
from coordd.wire.workflows import (
    ListWorkflows, WorkflowId, WorkflowList, WorkflowSubmit, WorkflowSubmitResult,
    WorkflowView,
)

logger = logging.getLogger(__name__)


class Areas:
    """Mixed into Coordinator (its store, limit book, push, flows)."""

    store: Any
    limit_book: Any
    push: Any
    flows: Any

    # ------------------------------------------------------------ limits

    check_usage = staticmethod(limit_service.check_usage)

    async def load_limits(self) -> None:
        """Install the runtime overrides stored in the store (at start)."""
        rows = await self.store.limit_overrides()
        for name, why in self.limit_book.load_overrides(rows):
            logger.warning("runtime override of limit %s ignored: %s", name, why,
                           extra={"action": "limit_override_ignored", "limit": name})
        await self.store.limits_loaded(self.limit_book)

    async def limits(self, p: LimitsQuery | None = None) -> LimitsResult:
        """Every limit (or `p.name`) with its use now. Raises: NotFound (no such limit)."""
        p = p or LimitsQuery()
        views, now = await self.store.limit_views(self.limit_book,
                                                  names_asked(self.limit_book, p), p.holders)
        return LimitsResult(limits=views, now=now)

    async def limits_set(self, p: LimitSet) -> LimitView:
        """Change (or create) limit `p.name` at runtime; kept in the store, so a restart
        keeps it; it takes precedence over the config's keys it names.

        Raises: errors.BadRequest (a bad key or value: nothing changes).
        """
        override, limit = self.limit_book.preview(p.name, p.settings)
        old = self.limit_book.defs.get(p.name)
        dropped = bool(old is not None and old.rate_n and not limit.rate_n)
        await self.store.set_limit_override(p.name, override, dropped)
        self.limit_book.set_override(p.name, override)
        logger.info("limit %s set at runtime: %s", p.name, p.settings,
                    extra={"action": "limit_set", "limit": p.name})
        self.push.limits_changed()  # the parked claims a limit refused look again
        return (await self.limits(LimitsQuery(name=p.name))).limits[0]

    async def limits_reset(self, p: LimitReset) -> LimitsResult:
        """Drop the runtime override of `p.name` (back to the config; a limit only set at
        runtime goes away, and jobs naming it are no longer held back).

        Raises: errors.NotFound (no override of that name).
        """
        check_override(self.limit_book, p.name)
        await self.store.set_limit_override(p.name, None, True)
        self.limit_book.set_override(p.name, None)
        logger.info("limit %s reset to the config", p.name,
                    extra={"action": "limit_reset", "limit": p.name})
        self.push.limits_changed()
        if p.name in self.limit_book.defs:
            return await self.limits(LimitsQuery(name=p.name))
        return LimitsResult(now=(await self.store.limit_views(self.limit_book, [], False))[1])

    # ------------------------------------------------------------ workflows

    async def workflow_submit(self, p: WorkflowSubmit) -> WorkflowSubmitResult:
        """Validate and queue a whole graph in one transaction. Raises: BadRequest,
        PayloadTooLarge, InvalidState (a repeated key with another graph)."""
        wf = self.flows.plan(p)
        return flows.submitted(wf, await self.store.workflow_submit(wf))

    async def workflow_list(self, p: ListWorkflows) -> WorkflowList:
        """Workflows, newest first, with node counts by status. Raises: BadRequest."""
        flows.check_list(p)
        return await self.store.workflow_list(p.status, p.limit)  # type: ignore[no-any-return]

    async def workflow_cancel(self, p: WorkflowId) -> WorkflowView:
        """Cancel every node that has not ended (running ones stop at their holder's next
        renew or heartbeat); return the workflow. Raises: NotFound, BadRequest."""
        check_id("workflow_id", p.workflow_id)
        wid = await self.store.resolve_id("workflow", p.workflow_id) if p.prefix \
            else p.workflow_id
        return await self.store.workflow_cancel(wid)  # type: ignore[no-any-return]
