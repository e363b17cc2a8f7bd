"""Reading request bodies: workflow definitions (YAML or JSON) and submissions.

A body that cannot be parsed at all is a 400 (malformed); one that parses but is not
an acceptable definition is a 422 naming the line, task and field
(:func:`dagq.loading.load_data` says which).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dagq.definition import WorkflowDef
from dagq.errors import ValidationError
from dagq.loading import load_data
from dagq.pyyaml import yaml
from dagq.server.problems import ProblemError

SOURCE = "request body"
JSON_TYPES = frozenset({"application/json"})
YAML_TYPES = frozenset(
    {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "text/plain"}
)
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SubmitEnvelope(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """The JSON form of a submission: a definition (a mapping, or YAML/JSON text) or
    the name of a workflow submitted before, with params, an optional id and labels."""

    definition: dict[str, Any] | str | None = None
    name: str | None = None
    params: dict[str, Any] = msgspec.field(default_factory=dict)
    id: str | None = None
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    #: The tenant to submit into (a caller without a tenant only; default: the caller's).
    tenant: str | None = None


@dataclass(frozen=True, slots=True)
class Submission:
    """What to submit: a definition, or the name of one already in the store."""

    definition: WorkflowDef | None
    name: str | None
    params: dict[str, Any] = field(default_factory=dict)
    workflow_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    tenant: str | None = None


def media_type(header: str | None) -> str | None:
    """The media type of a Content-Type header, without parameters, lower case."""
    if not header:
        return None
    return header.split(";", 1)[0].strip().lower() or None


def read_submission(body: bytes, content_type: str | None, workflow_id: str | None) -> Submission:
    """A submission from a YAML/JSON definition or a JSON envelope (see
    :class:`SubmitEnvelope`); ``workflow_id`` from the query, if any."""
    kind = _kind(content_type)
    if kind == "yaml":
        return Submission(definition=_yaml_definition(body), name=None, workflow_id=workflow_id)
    raw = _json(body)
    if isinstance(raw, dict) and "tasks" in raw:  # a definition itself
        return Submission(definition=_definition(raw, None), name=None, workflow_id=workflow_id)
    try:
        envelope = msgspec.convert(raw, SubmitEnvelope)
    except msgspec.ValidationError as exc:
        raise ValidationError(f"{SOURCE}: {exc}") from None
    if (envelope.definition is None) == (envelope.name is None):
        raise ValidationError(
            f"{SOURCE}: give either 'definition' (a workflow) or 'name' (of a workflow "
            "submitted before), not both or neither"
        )
    if envelope.id is not None and workflow_id is not None and envelope.id != workflow_id:
        raise ValidationError(f"{SOURCE}: 'id' differs from the id in the query")
    definition = None
    if isinstance(envelope.definition, str):
        definition = _yaml_definition(envelope.definition.encode())
    elif envelope.definition is not None:
        definition = _definition(envelope.definition, None)
    return Submission(
        definition=definition,
        name=envelope.name,
        params=envelope.params,
        workflow_id=envelope.id or workflow_id,
        labels=envelope.labels,
        tenant=envelope.tenant,
    )


def read_definition(body: bytes, content_type: str | None) -> WorkflowDef:
    """A workflow definition given as YAML or JSON (or wrapped as ``{"definition": …}``)."""
    kind = _kind(content_type)
    if kind == "yaml":
        return _yaml_definition(body)
    raw = _json(body)
    if isinstance(raw, dict) and set(raw) == {"definition"}:
        inner = raw["definition"]
        return _yaml_definition(inner.encode()) if isinstance(inner, str) else _definition(inner)
    return _definition(raw, None)


def _kind(content_type: str | None) -> str:
    found = media_type(content_type)
    if found is None or found in YAML_TYPES:
        return "yaml"  # JSON is YAML too: a body without a type is read as either
    if found in JSON_TYPES or found.endswith("+json"):
        return "json"
    raise ProblemError(
        "unsupported-media-type",
        f"Content-Type {found!r} is not accepted: send application/json or application/yaml",
    )


def _text(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProblemError("malformed-request", f"{SOURCE} is not UTF-8: {exc}") from None


def _json(body: bytes) -> Any:
    try:
        return json.loads(_text(body))
    except json.JSONDecodeError as exc:
        raise ProblemError(
            "malformed-request",
            f"{SOURCE}: line {exc.lineno}, column {exc.colno}: invalid JSON: {exc.msg}",
        ) from None
    except RecursionError:
        raise ValidationError(f"{SOURCE}: nested too deep") from None


def _yaml_definition(body: bytes) -> WorkflowDef:
    text = _text(body)
    try:
        raw = yaml.load(text, Loader=_Loader)  # a safe loader (CSafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ProblemError(
            "malformed-request", f"{SOURCE}: {where}invalid YAML: {exc.problem or exc}"
        ) from None
    except yaml.YAMLError as exc:
        raise ProblemError("malformed-request", f"{SOURCE}: invalid YAML: {exc}") from None
    except RecursionError:
        raise ValidationError(f"{SOURCE}: nested too deep") from None
    return _definition(raw, text)


def _definition(raw: Any, text: str | None = None) -> WorkflowDef:
    return load_data(raw, source=SOURCE, text=text)
