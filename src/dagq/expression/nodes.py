"""The tree an expression parses to, and what a tree reads (its ``Refs``).

The nodes are frozen msgspec structs rather than dataclasses: a dataclass is compiled
from generated source when its module is imported (a millisecond each here), and these
are imported by every command that reads a workflow.
"""

from __future__ import annotations

from typing import Final, TypeAlias, assert_never

import msgspec

DEFAULT_NAMES: Final = frozenset({"inputs", "params"})
GLOB_ROOT: Final = "inputs"


class Literal(msgspec.Struct, frozen=True):
    """A number, string, boolean or null written in the text."""

    value: int | float | str | bool | None


class ListOf(msgspec.Struct, frozen=True):
    """A list literal, ``[a, b]``."""

    items: tuple[Node, ...]


class Name(msgspec.Struct, frozen=True):
    """A root name such as ``inputs`` or ``params``, looked up in the environment."""

    name: str


class Glob(msgspec.Struct, frozen=True):
    """``inputs["train-*"]``: stands for each matching input in turn, inside an aggregate."""

    root: str
    pattern: str


class Attr(msgspec.Struct, frozen=True):
    """A ``.name`` step: reads the key ``name`` of a mapping."""

    name: str


class Index(msgspec.Struct, frozen=True):
    """A ``[key]`` step: a mapping key or a list index."""

    key: Node


Step: TypeAlias = Attr | Index


class Path(msgspec.Struct, frozen=True):
    """A value followed by access steps, ``inputs.A.scores[0]``."""

    base: Node
    steps: tuple[Step, ...]


class Unary(msgspec.Struct, frozen=True):
    """``-x`` or ``not x``."""

    op: str
    operand: Node


class BoolOp(msgspec.Struct, frozen=True):
    """``a and b and c`` or ``a or b``: short-circuit, gives a bool."""

    op: str
    operands: tuple[Node, ...]


class Compare(msgspec.Struct, frozen=True):
    """A comparison chain, ``first ops[0] operands[0] ops[1] operands[1] ...``."""

    first: Node
    ops: tuple[str, ...]
    operands: tuple[Node, ...]


class Arith(msgspec.Struct, frozen=True):
    """A left-to-right chain of operators of one precedence, ``a + b - c``."""

    first: Node
    ops: tuple[str, ...]
    operands: tuple[Node, ...]


class Call(msgspec.Struct, frozen=True):
    """A call of a built-in function; ``glob`` is the pattern its first argument ranges over."""

    func: str
    args: tuple[Node, ...]
    glob: str | None = None


Node: TypeAlias = Literal | ListOf | Name | Glob | Path | Unary | BoolOp | Compare | Arith | Call


class Refs(msgspec.Struct, frozen=True):
    """What an expression reads, for validation.

    ``inputs`` and ``params`` are the keys read explicitly (``inputs.A``, ``params["n"]``);
    ``dynamic`` holds the roots read whole or through a computed key, whose keys cannot be
    known before evaluation.
    """

    roots: frozenset[str]
    inputs: frozenset[str]
    params: frozenset[str]
    globs: frozenset[str]
    dynamic: frozenset[str]

    @property
    def uses_glob(self) -> bool:
        """Whether an aggregate ranges over inputs matched by a glob."""
        return bool(self.globs)


def _children(node: Node) -> tuple[Node, ...]:
    match node:
        case Literal() | Name() | Glob():
            return ()
        case ListOf(items=items):
            return items
        case Path(base=base, steps=steps):
            return (base, *(step.key for step in steps if isinstance(step, Index)))
        case Unary(operand=operand):
            return (operand,)
        case BoolOp(operands=operands):
            return operands
        case Compare(first=first, operands=operands) | Arith(first=first, operands=operands):
            return (first, *operands)
        case Call(args=args):
            return args
        case _:
            assert_never(node)


def _static_key(step: Step) -> str | None:
    if isinstance(step, Attr):
        return step.name
    key = step.key
    return key.value if isinstance(key, Literal) and isinstance(key.value, str) else None


def collect_refs(root: Node) -> Refs:
    """The names, keys and globs read by the tree under ``root``."""
    roots: set[str] = set()
    dynamic: set[str] = set()
    globs: set[str] = set()
    keys: dict[str, set[str]] = {"inputs": set(), "params": set()}
    stack = [root]
    while stack:
        node = stack.pop()
        if isinstance(node, Path) and isinstance(node.base, Name):
            name = node.base.name
            roots.add(name)
            key = _static_key(node.steps[0])
            if key is None:
                dynamic.add(name)
            else:
                keys.setdefault(name, set()).add(key)
            stack.extend(_children(node)[1:])
            continue
        if isinstance(node, Name):
            roots.add(node.name)
            dynamic.add(node.name)
        elif isinstance(node, Glob):
            roots.add(node.root)
            globs.add(node.pattern)
        stack.extend(_children(node))
    return Refs(
        roots=frozenset(roots),
        inputs=frozenset(keys["inputs"]),
        params=frozenset(keys["params"]),
        globs=frozenset(globs),
        dynamic=frozenset(dynamic),
    )
