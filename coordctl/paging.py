"""`--all` for paged commands: fetch a page, print it, flush, then ask for the next one.

Output starts with the first page and memory holds one page, whatever the number of
jobs (issue 21: `list --all` at 1 M jobs printed nothing for 385 s and grew to 4.3 GB).
`--json` writes the same document as a single page would (`{"jobs": [...],
"next_after": null}`), job by job.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from coordd.wire.protocol import JobList, JobView

Fetch = Callable[[str | None], JobList]  # after -> the page after it


def pages(fetch: Fetch, after: str | None) -> Iterator[JobList]:
    """Yield pages from `after` on until `next_after` is None.

    A page that repeats the previous or the first one (a server that went back to the
    start) ends the walk, so a misbehaving server cannot loop us for ever; only those
    two pages' ids are kept.
    """
    page = fetch(after)
    first = {j.job_id for j in page.jobs}
    prev = first
    yield page
    while page.next_after is not None:
        page = fetch(page.next_after)
        ids = {j.job_id for j in page.jobs}
        if not ids or ids & prev or ids == first:
            return
        prev = ids
        yield page


def _out() -> Any:
    return sys.stdout.buffer


def stream_json(walk: Iterator[JobList]) -> None:
    """Write `{"jobs": [...], "next_after": null}` job by job, flushing after each page."""
    out = _out()
    out.write(b'{\n  "jobs": [')
    sep = b"\n"
    for page in walk:
        for job in page.jobs:
            doc = msgspec.json.format(msgspec.json.encode(job), indent=2)
            out.write(sep + b"\n".join(b"    " + line for line in doc.split(b"\n")))
            sep = b",\n"
        out.flush()
    out.write((b"\n  ]" if sep != b"\n" else b"]") + b',\n  "next_after": null\n}\n')
    out.flush()


def stream_table(walk: Iterator[JobList],
                 print_page: Callable[[list[JobView], bool], None],
                 print_tail: Callable[[int], None]) -> None:
    """Print each page as it comes (`print_page(jobs, first)`), then the total."""
    n = 0
    for i, page in enumerate(walk):
        print_page(page.jobs, i == 0)
        sys.stdout.flush()
        n += len(page.jobs)
    print_tail(n)
