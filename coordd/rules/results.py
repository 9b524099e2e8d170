"""Result schemas: results are untrusted input, decoded strictly at `complete`.

A job may name a schema (`result_schema` on enqueue or on a workflow node, or by kind
through the config's `result_schemas`). At `complete` its result is decoded with msgspec
into the schema's Struct: unknown fields and wrong types are refused; the Structs'
`__post_init__` applies the safe normalizations (case and surrounding space of enum-like
labels) and the semantic rules. The normalized value is what is stored. A refused result
is recorded as a failed attempt with the validation error (coordd.store.sqlite.leases.complete): it
counts against `max_attempts`, so a node whose worker keeps returning bad results ends in
the dead letter state instead of bouncing between workers forever.

The example shipped here, `claims`: every claim labelled a fact must cite evidence ids,
and every cited id must be one of the result's evidence items.
"""

from __future__ import annotations

import msgspec

CLAIM_LABELS = ("fact", "opinion", "speculation")


class ResultInvalid(Exception):
    """A result does not satisfy its schema; the message is the validation error."""


class Evidence(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A piece of evidence a claim can cite by `id`."""

    id: str
    text: str
    source: str | None = None


class Claim(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A statement with its label; a `fact` must cite evidence ids."""

    text: str
    label: str
    evidence: list[str] = []

    def __post_init__(self) -> None:
        self.label = self.label.strip().lower()  # safe normalization: "Fact " -> "fact"
        if self.label not in CLAIM_LABELS:
            raise ValueError(f"label {self.label!r} is not one of {', '.join(CLAIM_LABELS)}")
        if self.label == "fact" and not self.evidence:
            raise ValueError(f"claim labelled fact cites no evidence: {self.text[:80]!r}")


class Claims(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The `claims` schema: claims, the evidence they cite, and an optional title."""

    claims: list[Claim]
    evidence: list[Evidence] = []
    title: str | None = None

    def __post_init__(self) -> None:
        known = {e.id for e in self.evidence}
        for c in self.claims:
            unknown = [i for i in c.evidence if i not in known]
            if unknown:
                raise ValueError(f"claim cites unknown evidence id(s) {unknown}: "
                                 f"{c.text[:80]!r}")


SCHEMAS: dict[str, type[msgspec.Struct]] = {"claims": Claims}
"""Schema name -> Struct. A name not listed here is refused at enqueue/submit."""


def check(name: str, result_json: str) -> str:
    """Decode `result_json` strictly as schema `name`; return the normalized JSON to store.

    Raises:
        ResultInvalid: the result does not decode as the schema, or breaks one of its rules.
    """
    try:
        value = msgspec.json.decode(result_json, type=SCHEMAS[name])
    except (msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ResultInvalid(f"result_invalid ({name}): {exc}") from exc
    return msgspec.json.encode(value).decode()
