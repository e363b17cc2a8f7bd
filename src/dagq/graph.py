"""Drawing a workflow's DAG as Mermaid, Graphviz dot, or plain text.

Given task states (a running or finished workflow), each node shows its state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dagq.definition import TaskDef, WorkflowDef

FORMATS = ("mermaid", "dot", "text")

_COLOURS = {
    "pending": "#eeeeee",
    "ready": "#b3e5fc",
    "running": "#90caf9",
    "waiting": "#e1bee7",
    "completed": "#c8e6c9",
    "failed": "#ef9a9a",
    "skipped": "#fff59d",
    "upstream_failed": "#ffccbc",
    "cancelled": "#bdbdbd",
    "compensating": "#ffe0b2",
    "compensated": "#ffe0b2",
    "compensation_failed": "#e57373",
}


@dataclass(frozen=True, slots=True)
class Node:
    """One task as drawn: its name, parents, policy, (optionally) state, and marks for
    what it does beyond running once (``foreach``, ``loop ≤3``, ``wait_for 'go'``,
    ``sleep 5s``, ``compensate``)."""

    name: str
    parents: Sequence[str]
    policy: str
    condition: str | None
    state: str | None = None
    marks: Sequence[str] = ()


def nodes_of(definition: WorkflowDef, states: Sequence[str] | None = None) -> list[Node]:
    """The nodes of a definition's DAG, with each task's state if ``states`` is given."""
    return [
        Node(
            name=task.name,
            parents=list(dict.fromkeys(task.depends_on)),  # a parent listed twice: one edge
            policy=str(task.dep_policy),
            condition=task.condition,
            state=states[i] if states else None,
            marks=_marks(task),
        )
        for i, task in enumerate(definition.tasks)
    ]


def _marks(task: TaskDef) -> list[str]:
    """What a task does beyond running once, for its node."""
    marks = []
    if task.foreach is not None:
        marks.append("foreach" + (f" ≤{task.max_parallel} at once" if task.max_parallel else ""))
    if task.loop is not None:
        marks.append(f"loop ≤{task.loop.max_iterations}")
    if task.wait_for is not None:
        marks.append(f"wait_for '{task.wait_for.signal}'")
    if task.sleep_s is not None:
        sleep = task.sleep_s
        marks.append(f"sleep {sleep:g}s" if isinstance(sleep, float | int) else f"sleep {sleep}")
    if task.compensate is not None:
        marks.append("compensate")
    return marks


def render(nodes: Sequence[Node], fmt: str, *, note: str | None = None) -> str:
    """The graph in the chosen format; ``note`` (one line, such as the rule set the
    workflow runs with) heads it, as a comment in mermaid and dot."""
    if fmt == "mermaid":
        drawn = _mermaid(nodes)
        return drawn if note is None else drawn.replace("\n", f"\n  %% {note}\n", 1)
    if fmt == "dot":
        return _dot(nodes) if note is None else f"// {note}\n{_dot(nodes)}"
    if fmt == "text":
        return _text(nodes) if note is None else f"{note}\n{_text(nodes)}"
    raise ValueError(f"unknown graph format {fmt!r} (known: {', '.join(FORMATS)})")


def _ids(nodes: Sequence[Node]) -> Mapping[str, str]:
    return {node.name: f"t{i}" for i, node in enumerate(nodes)}


def _mermaid(nodes: Sequence[Node]) -> str:
    ids = _ids(nodes)
    lines = ["flowchart TD"]
    for node in nodes:
        label = _mermaid_text(node.name) + (f"<br/><i>{node.state}</i>" if node.state else "")
        if node.marks:
            label += f"<br/><small>{_mermaid_text(' · '.join(node.marks))}</small>"
        lines.append(f'  {ids[node.name]}["{label}"]')
    for node in nodes:
        for parent in node.parents:
            arrow = "-.->" if node.condition else "-->"
            lines.append(f"  {ids[parent]} {arrow} {ids[node.name]}")
    states = sorted({n.state for n in nodes if n.state})
    for state in states:
        lines.append(f"  classDef {state} fill:{_COLOURS.get(state, '#ffffff')}")
        members = ",".join(ids[n.name] for n in nodes if n.state == state)
        lines.append(f"  class {members} {state}")
    return "\n".join(lines)


def _mermaid_text(text: str) -> str:
    """Text for a quoted mermaid label, which reads HTML and ends at a '"': those
    characters as mermaid's entity codes ('#' never appears in a task name)."""
    for char, code in (("&", "#amp;"), ('"', "#quot;"), ("<", "#lt;"), (">", "#gt;")):
        text = text.replace(char, code)
    return text


def _dot(nodes: Sequence[Node]) -> str:
    lines = ["digraph workflow {", "  rankdir=TB;", '  node [shape=box, style="rounded,filled"];']
    for node in nodes:
        label = _dot_string(
            node.name,
            *([node.state] if node.state else []),
            *([", ".join(node.marks)] if node.marks else []),
        )
        colour = _COLOURS.get(node.state or "", "#ffffff")
        lines.append(f'  {_dot_string(node.name)} [label={label}, fillcolor="{colour}"];')
    for node in nodes:
        for parent in node.parents:
            style = " [style=dashed]" if node.condition else ""
            lines.append(f"  {_dot_string(parent)} -> {_dot_string(node.name)}{style};")
    lines.append("}")
    return "\n".join(lines)


def _dot_string(*parts: str) -> str:
    """A quoted DOT string; parts go on separate lines (DOT's own ``\\n`` escape)."""
    quoted = (part.replace("\\", "\\\\").replace('"', '\\"') for part in parts)
    return '"' + "\\n".join(quoted) + '"'


def _text(nodes: Sequence[Node]) -> str:
    """Tasks in layers (a task's layer is one more than its deepest parent's)."""
    layer: dict[str, int] = {}
    for node in nodes:  # definitions are validated acyclic; parents may come later
        _depth(node.name, {n.name: n for n in nodes}, layer)
    width = max(len(n.name) for n in nodes)
    lines = []
    for depth in range(max(layer.values()) + 1):
        lines.append(f"layer {depth}")
        for node in nodes:
            if layer[node.name] != depth:
                continue
            state = f"[{node.state}] " if node.state else ""
            if node.marks:
                state += f"{{{', '.join(node.marks)}}} "
            after = ""
            if node.parents:
                policy = "" if node.policy == "all" else f" ({node.policy})"
                after = f"  <- {', '.join(node.parents)}{policy}"
            when = f"  if {node.condition}" if node.condition else ""
            lines.append(f"  {node.name:<{width}}  {state}{after}{when}".rstrip())
    return "\n".join(lines)


def _depth(name: str, by_name: Mapping[str, Node], memo: dict[str, int]) -> int:
    stack = [name]
    while stack:
        current = stack[-1]
        if current in memo:
            stack.pop()
            continue
        missing = [p for p in by_name[current].parents if p not in memo]
        if missing:
            stack.extend(missing)
            continue
        memo[current] = 1 + max((memo[p] for p in by_name[current].parents), default=-1)
        stack.pop()
    return memo[name]
