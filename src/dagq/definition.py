"""The workflow definition: typed, frozen structs, one source of truth for the format.

The YAML/JSON format is a superset of the ai4s-jobq workflow format. The JSON Schema
that ``dagq schema`` prints is generated from these structs, so docs cannot drift.
Loading and validation live in :mod:`dagq.loading` and :mod:`dagq.validation`.
"""

from typing import Annotated, Any, Literal

import msgspec

DepPolicyName = Literal["all", "any", "all_settled"]
ResultPolicy = Literal["all_sinks_succeed", "all_tasks_succeed"]

#: Task fields reserved for later versions; a definition using them is refused
#: with a message that says so, rather than an "unknown field".
RESERVED_TASK_FIELDS = ("priority",)

Seconds = Annotated[float, msgspec.Meta(gt=0, description="A duration in seconds (> 0).")]
#: A task's time limit; 0 means none (as ai4s-jobq files write it).
Timeout = Annotated[
    float, msgspec.Meta(ge=0, description="A time limit in seconds; 0 means no limit.")
]
Semantics = Literal["jobq", "dagq"]
Command = str | list[str]


class _Strict(
    msgspec.Struct, frozen=True, forbid_unknown_fields=True, omit_defaults=True, gc=False
):
    """Base of definition structs: immutable, unknown fields rejected.

    Not tracked by the garbage collector (``gc=False``): a definition is plain data
    that never refers back to itself, and a large one (100,000 tasks) held by a
    client or by ``dagq run`` would otherwise add its tasks to every full collection.
    """


class RetryPolicy(_Strict, frozen=True, kw_only=True):
    """How long to wait between attempts, and which failures are final."""

    backoff_s: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    backoff_multiplier: Annotated[float, msgspec.Meta(ge=1)] = 2.0
    backoff_max_s: Annotated[float, msgspec.Meta(ge=0)] = 300.0
    jitter: Annotated[
        float,
        msgspec.Meta(ge=0, le=1, description="Fraction of the delay randomised (0 to 1)."),
    ] = 0.1
    non_retryable_exit_codes: list[int] = msgspec.field(default_factory=list)
    retry_on: Annotated[
        list[str],
        msgspec.Meta(description="Only these exception types (class names) are retried."),
    ] = msgspec.field(default_factory=list)
    no_retry_on: Annotated[
        list[str], msgspec.Meta(description="These exception types (class names) fail at once.")
    ] = msgspec.field(default_factory=list)
    max_total_delay_s: (
        Annotated[
            float,
            msgspec.Meta(
                ge=0, description="Fail instead of retrying once the delays would pass this."
            ),
        ]
        | None
    ) = None


SignalName = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,99}$")]


class WaitFor(_Strict, frozen=True, kw_only=True):
    """Wait, holding no worker, for a signal (``dagq signal``) or a person's approval."""

    signal: SignalName
    timeout_s: Seconds | None = None
    on_timeout: Literal["fail", "skip"] = "fail"


class Loop(_Strict, frozen=True, kw_only=True):
    """Re-run the task until ``until`` (over ``output`` and ``iteration``) holds, at most
    ``max_iterations`` times."""

    until: str
    max_iterations: Annotated[int, msgspec.Meta(ge=1, le=10_000)]
    on_exhausted: Literal["fail", "complete"] = "fail"


class ShellKwargs(_Strict, frozen=True, kw_only=True):
    """The ai4s-jobq ``kwargs`` block of a shell task."""

    cmd: Command
    env: dict[str, str] = msgspec.field(default_factory=dict)
    cwd: str | None = None


Call = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="A Python function to run, as 'package.module:function'.",
    ),
]


class Compensate(_Strict, frozen=True, kw_only=True):
    """The undo of a task's side effects, run if the workflow fails or is cancelled after
    the task completed. It sees the task's output under the task's name in its inputs."""

    cmd: Command | None = None
    kwargs: ShellKwargs | None = None
    call: Call | None = None
    args: Any = None
    queue: str | None = None
    timeout_s: Seconds | None = None
    num_retries: Annotated[int, msgspec.Meta(ge=0, le=1000)] = 3
    retry: RetryPolicy | None = None


class TaskDef(_Strict, frozen=True, kw_only=True):
    """One task of a workflow."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    #: A tuple, not a list: a tuple of names leaves the collector's sight once seen.
    depends_on: tuple[str, ...] = ()
    queue: str | None = None
    dep_policy: DepPolicyName | Annotated[int, msgspec.Meta(ge=1)] = "all"
    timeout_s: Timeout | None = None
    num_retries: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    condition: str | None = None
    kwargs: (
        Annotated[
            dict[str, Any],
            msgspec.Meta(
                description=(
                    "ai4s-jobq's free mapping: with 'cmd', a shell task ('cmd', 'env', "
                    "'cwd', 'bg_dirsync_to'); without, the arguments of the worker's "
                    "processor (dagq worker --processor)."
                )
            ),
        ]
        | None
    ) = None
    cmd: Command | None = None
    call: (
        Annotated[
            str,
            msgspec.Meta(
                pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
                description="A Python function to run, as 'package.module:function'.",
            ),
        ]
        | None
    ) = None
    args: Any = None
    retry: RetryPolicy | None = None
    sleep_s: (
        Annotated[float, msgspec.Meta(ge=0)]
        | Annotated[str, msgspec.Meta(description="An expression over inputs and params.")]
        | None
    ) = None
    wait_for: WaitFor | None = None
    loop: Loop | None = None
    cancel_remaining: bool = False
    task_deadline_s: Seconds | None = None
    compensate: Compensate | None = None
    foreach: (
        Annotated[str, msgspec.Meta(description="An expression yielding the list to fan out over.")]
        | None
    ) = None
    max_parallel: Annotated[int, msgspec.Meta(ge=1)] | None = None
    allow_failures: (
        Annotated[
            float,
            msgspec.Meta(
                ge=0, description="Items that may fail: a count (>= 1) or a fraction (< 1)."
            ),
        ]
        | None
    ) = None


class Defaults(_Strict, frozen=True, kw_only=True):
    """Settings applied to every task that does not set them itself."""

    queue: str | None = None
    timeout_s: Timeout | None = None
    num_retries: Annotated[int, msgspec.Meta(ge=0, le=1000)] | None = None
    retry: RetryPolicy | None = None


class WorkflowDef(_Strict, frozen=True, kw_only=True):
    """A workflow: a DAG of tasks and the settings that shape its run."""

    name: Annotated[str, msgspec.Meta(min_length=1, max_length=200)]
    tasks: list[TaskDef]
    version: str | int | None = None
    default_queue: str = "default"
    default_task_timeout_s: Timeout | None = None
    max_parallelism: Annotated[int, msgspec.Meta(ge=1)] | None = None
    result_policy: ResultPolicy = "all_sinks_succeed"
    params: Annotated[
        dict[str, Any],
        msgspec.Meta(
            description=(
                "Param name -> its default (the type is inferred from it), or a "
                "declaration {type: int|float|bool|string|list|object, default, choices, "
                "min, max, description}; without 'default' the param is required."
            )
        ),
    ] = msgspec.field(default_factory=dict)
    deadline_s: Seconds | None = None
    defaults: Defaults | None = None
    semantics: (
        Annotated[
            Semantics,
            msgspec.Meta(
                description="The rule set: ai4s-jobq's or dagq's (default: chosen by the form)."
            ),
        ]
        | None
    ) = None
    #: The JSON Schema an editor checks the file against: accepted, never used.
    schema_url: str | None = msgspec.field(default=None, name="$schema")


#: The fields of ai4s-jobq's workflow format; a definition that uses any other field
#: (``$schema`` and ``semantics`` aside) is dagq-native.
JOBQ_WORKFLOW_FIELDS = (
    "name",
    "tasks",
    "default_queue",
    "default_task_timeout_s",
    "max_parallelism",
    "result_policy",
)
JOBQ_TASK_FIELDS = (
    "name",
    "kwargs",
    "depends_on",
    "queue",
    "dep_policy",
    "timeout_s",
    "num_retries",
    "condition",
)
_NOT_JOBQ = {
    "workflow": tuple(
        f
        for f in WorkflowDef.__struct_fields__
        if f not in JOBQ_WORKFLOW_FIELDS and f not in ("semantics", "schema_url")
    ),
    "task": tuple(f for f in TaskDef.__struct_fields__ if f not in JOBQ_TASK_FIELDS),
}


class RuleSet(msgspec.Struct, frozen=True):
    """Which semantics a definition runs with (docs/architecture.md §5), and why."""

    jobq: bool
    reason: str

    def describe(self) -> str:
        """One line for people: the rule set and the reason."""
        return f"{'ai4s-jobq' if self.jobq else 'dagq'} semantics: {self.reason}"


def rule_set(definition: WorkflowDef) -> RuleSet:
    """ai4s-jobq semantics for a definition in ai4s-jobq's form (every task says what to
    run through ``kwargs``, or not at all, and no dagq-only field is used), dagq's for
    every other; ``semantics: jobq | dagq`` decides instead when given."""
    if definition.semantics is not None:
        return RuleSet(
            definition.semantics == "jobq", f"the workflow sets 'semantics: {definition.semantics}'"
        )
    for field in _NOT_JOBQ["workflow"]:
        if _used(getattr(definition, field)):
            return RuleSet(False, f"the workflow uses '{field}', which ai4s-jobq does not have")
    fields = _NOT_JOBQ["task"]
    for task in definition.tasks:
        for field in fields:
            if _used(getattr(task, field)):
                return RuleSet(False, f"task '{task.name}' uses '{field}' (a dagq-only field)")
    return RuleSet(True, "every task runs through kwargs and no dagq-only field is used")


def _used(value: Any) -> bool:
    """Is a field set to something other than "nothing" (its default)?"""
    return value is not None and value is not False and value != {}


def to_builtins(definition: WorkflowDef) -> dict[str, Any]:
    """The definition as plain JSON-able data, without fields left at their default."""
    data = msgspec.to_builtins(definition)
    assert isinstance(data, dict)
    return data


def json_schema() -> dict[str, Any]:
    """A JSON Schema of the definition format, generated from the structs."""
    schema = msgspec.json.schema(WorkflowDef)
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "dagq workflow definition"
    return schema
