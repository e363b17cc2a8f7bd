"""``/v1/workflows`` and ``/v1/graph``: submit runs and look at them."""

from __future__ import annotations

from typing import Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, Depends, Header, Path, Query, Request
from sse_starlette import EventSourceResponse
from starlette.responses import Response

from dagq import keys
from dagq.client import TaskInfo, WorkflowSummary, instance_infos, task_info
from dagq.definition import WorkflowDef
from dagq.errors import UsageError, ValidationError, WorkflowNotFound
from dagq.history import read_chunks
from dagq.plan import Plan, compile_plan, resolve_params
from dagq.server import bodies, idempotency, problems, resources
from dagq.server.access import Caller, caller, while_allowed
from dagq.server.concern import about
from dagq.server.context import Api, actor, allow, answer, api_of, guard, json_schema
from dagq.server.filters import RunFilter, run_filter
from dagq.server.problems import ProblemError
from dagq.server.resources import Accepted, status_url
from dagq.server.stream import history_events
from dagq.state import UNSET, RunState, TaskStatus
from dagq.submitted import load_submitted, require_submitted
from dagq.tokens import check_tenant
from dagq.views import load_run

router = APIRouter(prefix="/v1")
Who = Annotated[Caller, Depends(caller)]
Server = Annotated[Api, Depends(api_of)]
WorkflowId = Annotated[str, Path(description="The workflow's id.")]
TaskName = Annotated[str, Path(description="The task's name (may contain '/').")]


def _ok(struct: type[Any], *statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI responses: 200 with ``struct``, and the problems of ``statuses``."""
    return {200: {"content": json_schema(struct)}, **problems.openapi_responses(*statuses)}


#: Task states in which a task waits for something (``reason`` says what).
WAITING = frozenset({"pending", "ready", "waiting"})
#: How long a stream gets to say goodbye when the server stops.
STREAM_GRACE_S = 5.0
#: Index rows a listing looks through for one page, at most (a created range that
#: matches nothing must not scan a store of millions).
SCAN_ROWS = 10_000


@router.post(
    "/workflows",
    status_code=202,
    summary="Submit a workflow",
    openapi_extra={
        "requestBody": {
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            }
        }
    },
    responses={
        202: {"description": "Accepted: watch Location", "content": json_schema(Accepted)},
        **problems.openapi_responses(400, 404, 409, 413, 415, 422),
    },
)
async def submit_workflow(
    request: Request,
    who: Who,
    api: Server,
    workflow_id: Annotated[str | None, Query(alias="id", description="Name the run.")] = None,
) -> Response:
    """Submit a definition (YAML or JSON body), or ``{"definition" | "name", "params",
    "id", "tenant", "labels"}`` as JSON, where ``name`` re-submits the newest workflow
    of that name and ``labels`` (``{"key": "value"}``) are what the run can be found by.
    The run belongs to the caller's tenant (a token without one may name any).
    Answers 202 with ``Location`` (the run's status); an ``Idempotency-Key`` makes it
    safe to send again. Needs the operator role."""
    allow(who, "operator", "submit workflows")

    async def run(_: str | None) -> Response:
        found = await anyio.to_thread.run_sync(  # a large YAML body parses for seconds
            bodies.read_submission,
            await request.body(),
            request.headers.get("content-type"),
            workflow_id,
        )
        tenant = _tenant_of(who, found.tenant)
        definition = found.definition or await _submitted_before(api, tenant, found.name or "")
        result = await api.client.submit(
            definition,
            params=found.params,
            workflow_id=found.workflow_id,
            tenant=tenant,
            labels=found.labels,
            actor=actor(who),
        )
        about(request, result.id)
        url = status_url(result.id)
        headers = {"Location": url, "Retry-After": str(api.settings.retry_after_s)}
        return answer(Accepted(id=result.id, created=result.created, status_url=url), 202, headers)

    return await idempotency.once(api.keys, request, who.tenant, run, problems.render)


def _tenant_of(who: Caller, asked: str | None) -> str:
    """The tenant a submission goes to: the caller's; one a caller of a tenant may not
    name another (403: it knows its own tenant, so the refusal reveals nothing)."""
    if asked is None or asked == who.tenant:
        return who.tenant
    if who.tenant:
        raise ProblemError(
            "forbidden", f"a token of tenant {who.tenant!r} may not submit into another tenant"
        )
    try:
        return check_tenant(asked)
    except UsageError as exc:
        raise ValidationError(f"{bodies.SOURCE}: {exc}") from None


async def _submitted_before(api: Api, tenant: str, name: str) -> WorkflowDef:
    """The definition of the newest workflow called ``name`` (of ``tenant``)."""
    page = await api.client.store.index.query(name=name, tenant=tenant or None, limit=1)
    submitted = await load_submitted(api.client.store, page.rows[0].id) if page.rows else None
    if submitted is None:
        raise WorkflowNotFound(
            f"no workflow named '{name}' was submitted before; send its definition"
        )
    return submitted.definition


# The filters the run list and its counts share.
LabelQuery = Annotated[
    list[str] | None, Query(description="key=value: runs with that label; repeatable.")
]
CreatedAfterQuery = Annotated[
    str | None, Query(description="Epoch seconds or ISO 8601 (inclusive).")
]
CreatedBeforeQuery = Annotated[
    str | None, Query(description="Epoch seconds or ISO 8601 (exclusive).")
]


@router.get(
    "/workflows",
    summary="List workflows",
    responses={
        200: {"content": json_schema(resources.WorkflowPage)},
        **problems.openapi_responses(409, 422),
    },
)
async def list_workflows(
    *,
    who: Who,
    api: Server,
    status: str | None = None,
    name: str | None = None,
    tenant: str | None = None,
    label: LabelQuery = None,
    created_after: CreatedAfterQuery = None,
    created_before: CreatedBeforeQuery = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: str | None = None,
) -> Response:
    """Runs newest first, filtered by status, name, tenant, labels and creation time;
    pass ``next_cursor`` as ``cursor`` for the next page."""
    allow(who, "viewer", "read workflows")
    wanted = run_filter(
        who,
        status=status,
        name=name,
        tenant=tenant,
        labels=label,
        created_after=created_after,
        created_before=created_before,
    )
    items, cursor = await matching_page(api, wanted, limit=limit, cursor=cursor)
    return answer(resources.WorkflowPage(items=items, next_cursor=cursor))


@router.get(
    "/workflows/counts",
    summary="Count workflows by status",
    responses={
        200: {"content": json_schema(resources.StatusCounts)},
        **problems.openapi_responses(422),
    },
)
async def count_workflows(
    *,
    who: Who,
    api: Server,
    name: str | None = None,
    tenant: str | None = None,
    label: LabelQuery = None,
    created_after: CreatedAfterQuery = None,
    created_before: CreatedBeforeQuery = None,
) -> Response:
    """How many runs of each status the whole store holds under the listing's filters
    (name, tenant, labels, creation time), counted by the store's index."""
    allow(who, "viewer", "read workflows")
    wanted = run_filter(
        who,
        name=name,
        tenant=tenant,
        labels=label,
        created_after=created_after,
        created_before=created_before,
    )
    counts = (
        {}
        if wanted.empty
        else await api.client.store.index.count(
            name=wanted.name,
            tenant=wanted.tenant,
            labels=dict(wanted.labels) or None,
            created_after=wanted.created_after,
            created_before=wanted.created_before,
        )
    )
    return answer(resources.StatusCounts(counts=counts, total=sum(counts.values())))


async def matching_page(
    api: Api, wanted: RunFilter, *, limit: int, cursor: str | None
) -> tuple[list[WorkflowSummary], str | None]:
    """Up to ``limit`` runs that pass ``wanted``, newest first, and the cursor of the
    rest (None: no more); at most SCAN_ROWS index rows are looked through."""
    if wanted.empty:
        return [], None
    items: list[WorkflowSummary] = []
    scanned = 0
    after = wanted.created_after
    while len(items) < limit and scanned < SCAN_ROWS:
        rows, cursor = await api.client.list_page(
            status=wanted.status,
            name=wanted.name,
            tenant=wanted.tenant,
            limit=min(limit - len(items), 500),
            cursor=cursor,
        )
        scanned += len(rows)
        items += [r for r in rows if wanted.matches(r)]
        if cursor is None or (after is not None and rows and rows[-1].created_at < after):
            cursor = None  # newest first: nothing older can be in range
            break
    return items, cursor


@router.get(
    "/workflows/{workflow_id}",
    summary="A workflow's status",
    responses={
        200: {"content": json_schema(resources.WorkflowDetail)},
        **problems.openapi_responses(404),
    },
)
async def get_workflow(workflow_id: WorkflowId, who: Who, api: Server) -> Response:
    """Status, counts per task state, progress and failed tasks."""
    await guard(api, who, workflow_id)
    return answer(resources.detail(await api.client.status(workflow_id)))


@router.get(
    "/workflows/{workflow_id}/tasks",
    summary="A workflow's tasks",
    responses=_ok(TaskInfo, 404, 409),
)
async def list_tasks(
    workflow_id: WorkflowId, who: Who, api: Server, state: str | None = None
) -> Response:
    """Every task (or those in ``state``): state, attempt, queue, timing, error."""
    await guard(api, who, workflow_id)
    return answer(await api.client.tasks(workflow_id, state=state))


@router.get(
    "/workflows/{workflow_id}/tasks/{name:path}/output",
    summary="A task's output",
    responses={200: {"content": {"application/json": {}}}, **problems.openapi_responses(404, 409)},
)
async def task_output(workflow_id: WorkflowId, name: TaskName, who: Who, api: Server) -> Response:
    """The output of a completed task, as JSON (409 while it has none)."""
    await guard(api, who, workflow_id)
    return answer(await api.client.output(workflow_id, name))


@router.get(
    "/workflows/{workflow_id}/tasks/{name:path}",
    summary="One task",
    responses={
        200: {"content": json_schema(resources.TaskDetail)},
        **problems.openapi_responses(404),
    },
)
async def get_task(workflow_id: WorkflowId, name: TaskName, who: Who, api: Server) -> Response:
    """A task with its attempts (queued, started, ended, outcome), its whole error, its
    events and, while it waits, the reason it is not running."""
    allow(who, "viewer", "read workflows")
    await guard(api, who, workflow_id)
    _, plan, st = await load_run(api.client.store, workflow_id, plans=api.client.plans)
    if name not in plan.by_name:
        await api.client.error(workflow_id, name)  # raises TaskNotFound naming it
    info = task_info(plan, st, plan.by_name[name])
    history = resources.events(await read_chunks(api.client.store, workflow_id), None)
    own = [e for e in history if e.task is not None and keys.of_task(e.task, name)]
    full_error = None
    if info.attempt > 0 and info.error is not None:
        full_error = await api.client.error(workflow_id, name)
    reason = None
    if info.status in WAITING:
        reason = (await api.client.explain(workflow_id, name)).summary
    fields: dict[str, Any] = {f: getattr(info, f) for f in info.__struct_fields__}
    current = (info.attempt, info.started_at, info.status)
    return answer(
        resources.TaskDetail(
            **fields,
            attempts=resources.attempts(name, own, current),
            full_error=full_error,
            events=own,
            reason=reason,
            instances=instance_infos(plan, st, plan.by_name[name])[: resources.MAX_INSTANCES],
        )
    )


@router.get(
    "/workflows/{workflow_id}/timeline",
    summary="Every attempt of a workflow, for a Gantt chart",
    responses=_ok(resources.Timeline, 404),
)
async def workflow_timeline(workflow_id: WorkflowId, who: Who, api: Server) -> Response:
    """Each attempt of each task (and foreach instance): when it was queued, started
    and finished, and how it ended (or the task's state while it runs)."""
    allow(who, "viewer", "read workflows")
    await guard(api, who, workflow_id)
    _, plan, st = await load_run(api.client.store, workflow_id, plans=api.client.plans)
    current: dict[str, resources.Current] = {}
    for i in range(st.n_tasks):
        if st.attempt[i] or i in st.groups:
            info = task_info(plan, st, i)
            current[info.name] = (info.attempt, info.started_at, info.status)
            for each in instance_infos(plan, st, i):
                current[each.name] = (each.attempt, each.started_at, each.status)
    history = resources.events(await read_chunks(api.client.store, workflow_id), None)
    loops = frozenset(t.name for t in plan.tasks if t.loop is not None)
    return answer(resources.timeline(history, current, instance_bars(plan, st), loops))


def instance_bars(plan: Plan, st: RunState) -> list[resources.TimelineItem]:
    """The latest attempt of each foreach instance (the first MAX_INSTANCES of each
    task) as the state has it: sent, started, finished."""
    bars = []
    for i, group in st.groups.items():
        for k in range(min(group.n, resources.MAX_INSTANCES)):
            if group.dispatched_at[k] == UNSET and group.started_at[k] == UNSET:
                continue  # not sent yet
            bars.append(
                resources.TimelineItem(
                    task=keys.attempt_name(plan.tasks[i].name, item=k),
                    attempt=group.attempt[k],
                    enqueued_at=_moment(group.dispatched_at[k]),
                    started_at=_moment(group.started_at[k]),
                    finished_at=_moment(group.finished_at[k]),
                    status=TaskStatus(group.status[k]).label,
                )
            )
    return bars


def _moment(value: float) -> float | None:
    return None if value == UNSET else value


@router.get(
    "/workflows/{workflow_id}/events",
    summary="A workflow's history",
    responses={
        200: {"content": json_schema(resources.Event)},
        **problems.openapi_responses(400, 404),
    },
)
async def list_events(
    workflow_id: WorkflowId,
    who: Who,
    api: Server,
    after: Annotated[str | None, Query(description="Only the events after this id.")] = None,
) -> Response:
    """Every history entry, oldest first, each with the id a stream would give it."""
    await guard(api, who, workflow_id)
    await require_submitted(api.client.store, workflow_id)
    position = resources.parse_event_id(after) if after else None
    start = None if position is None or position[0] == 0 else position[0] - 1
    chunks = await read_chunks(api.client.store, workflow_id, after=start)
    return answer(resources.events(chunks, position))


@router.get(
    "/workflows/{workflow_id}/stream",
    summary="Stream a workflow's events (SSE)",
    responses={
        200: {"description": "text/event-stream of events", "content": {"text/event-stream": {}}},
        **problems.openapi_responses(400, 404),
    },
)
async def stream_events(
    *,
    workflow_id: WorkflowId,
    request: Request,
    who: Who,
    api: Server,
    last_event_id: Annotated[str | None, Header()] = None,
    after: Annotated[str | None, Query(description="Like Last-Event-ID.")] = None,
) -> EventSourceResponse:
    """Server-sent events: every history entry (``id:`` resumes it with
    ``Last-Event-ID``), then ``end`` with the final status once the run has ended;
    ``unauthorized`` ends it if the token is revoked or expires meanwhile."""
    await guard(api, who, workflow_id)
    await require_submitted(api.client.store, workflow_id)
    resume = last_event_id or after
    position = resources.parse_event_id(resume) if resume else None
    stopping = anyio.Event()
    found = history_events(
        api.client, workflow_id, position, settings=api.settings, stopping=stopping
    )
    return EventSourceResponse(
        while_allowed(request, found),
        ping=api.settings.stream_ping_s,
        shutdown_event=stopping,
        shutdown_grace_period=STREAM_GRACE_S,
    )


@router.get(
    "/workflows/{workflow_id}/graph",
    summary="A workflow's DAG with task states",
    responses=_ok(resources.Graph, 404),
)
async def workflow_graph(workflow_id: WorkflowId, who: Who, api: Server) -> Response:
    """Nodes (with state and queue), edges and counts per state."""
    await guard(api, who, workflow_id)
    submitted, plan, st = await load_run(api.client.store, workflow_id, plans=api.client.plans)
    states = [TaskStatus(code).label for code in st.task_status]
    return answer(
        resources.graph_of(
            submitted.definition,
            [t.queue for t in plan.tasks],
            states=states,
            workflow_id=workflow_id,
            status=st.status,
        )
    )


@router.post(
    "/graph",
    summary="The DAG of a definition not yet submitted",
    openapi_extra={
        "requestBody": {
            "content": {
                "application/yaml": {"schema": {"type": "string"}},
                "application/json": {"schema": {"type": "object"}},
            }
        }
    },
    responses={
        200: {"content": json_schema(resources.Graph)},
        **problems.openapi_responses(400, 413, 415, 422),
    },
)
async def preview_graph(request: Request, who: Who) -> Response:
    """Validate a definition (YAML or JSON body) and draw it: nodes and edges."""
    definition = await anyio.to_thread.run_sync(
        bodies.read_definition, await request.body(), request.headers.get("content-type")
    )
    try:
        plan = compile_plan(definition, resolve_params(definition, {}))
    except (UsageError, ValidationError) as exc:
        raise ValidationError(f"{bodies.SOURCE}: {exc}") from None
    return answer(resources.graph_of(definition, [t.queue for t in plan.tasks]))
