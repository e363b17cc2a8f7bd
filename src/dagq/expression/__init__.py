"""The safe expression language of conditions and ``{{ }}`` templates.

Text is tokenized and parsed by hand into a small tree of frozen dataclasses, which is
compiled once into nested closures, so evaluation in the coordinator's hot path costs a few
function calls. Nothing here uses ``eval`` or Python's ``ast``: an expression can only do
what the operators below do, and ``a.b`` only ever reads the key ``"b"`` of a mapping.

The grammar is in ``dagq.expression.parser`` (a superset of the ai4s-jobq condition syntax).
A glob, ``inputs["train-*"]`` or ``inputs.*``, may appear in the first argument of
``all``, ``any``, ``count``, ``almost_all``, ``min`` and ``max``: that argument is evaluated
once per input whose name matches (sorted), giving the list the function works on.

The package's modules, text to value: ``lexer`` (tokens), ``parser`` (the tree of ``nodes``),
``evaluation`` (the tree compiled to closures, using ``operators`` and ``functions``),
``expr`` (``parse`` and ``Expr``, which tie those together) and ``templates``.
"""

from __future__ import annotations

from dagq.expression.expr import Expr, parse, references
from dagq.expression.failures import ExpressionError
from dagq.expression.limits import MAX_DEPTH as MAX_DEPTH
from dagq.expression.limits import MAX_INT as MAX_INT
from dagq.expression.limits import MAX_LENGTH as MAX_LENGTH
from dagq.expression.limits import MAX_NODES as MAX_NODES
from dagq.expression.limits import MAX_SIZE as MAX_SIZE
from dagq.expression.nodes import (
    DEFAULT_NAMES,
    Arith,
    Attr,
    BoolOp,
    Call,
    Compare,
    Glob,
    Index,
    ListOf,
    Literal,
    Name,
    Node,
    Path,
    Refs,
    Unary,
)
from dagq.expression.nodes import GLOB_ROOT as GLOB_ROOT
from dagq.expression.nodes import Step as Step
from dagq.expression.reads import brief, describe_reads
from dagq.expression.templates import render, template_expressions
from dagq.expression.values import truthy

__all__ = [
    "DEFAULT_NAMES",
    "Arith",
    "Attr",
    "BoolOp",
    "Call",
    "Compare",
    "Expr",
    "ExpressionError",
    "Glob",
    "Index",
    "ListOf",
    "Literal",
    "Name",
    "Node",
    "Path",
    "Refs",
    "Unary",
    "brief",
    "describe_reads",
    "parse",
    "references",
    "render",
    "template_expressions",
    "truthy",
]
