"""Tokens to a tree: recursive descent for atoms, precedence climbing for operators.

Grammar, loosest binding first (a superset of the ai4s-jobq condition syntax)::

    expr     := and ("or" and)*
    and      := not ("and" not)*
    not      := "not" not | compare
    compare  := sum (("==" | "!=" | "<" | "<=" | ">" | ">=" | "in" | "not" "in"
                      | "is" | "is" "not") sum)*             # chained: 0 < x < 1
    sum      := product (("+" | "-") product)*
    product  := unary (("*" | "/" | "//" | "%") unary)*
    unary    := "-" unary | postfix
    postfix  := primary ("." NAME | "[" expr "]")*
    primary  := NUMBER | STRING | true | false | null | True | False | None
              | NAME | FUNCTION "(" [expr ("," expr)* [","]] ")"
              | "(" expr ")" | "[" [expr ("," expr)* [","]] "]"
"""

from __future__ import annotations

from typing import Any

import msgspec

from dagq.expression.failures import ParseFailure
from dagq.expression.functions import FUNCTIONS, Function
from dagq.expression.lexer import Token, tokenize
from dagq.expression.limits import MAX_DEPTH, MAX_NODES
from dagq.expression.nodes import (
    GLOB_ROOT,
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
    Step,
    Unary,
)
from dagq.expression.values import NUMBERS, kind_of, show


class _GlobScope(msgspec.Struct):
    """The aggregate call whose first argument is being parsed, and the glob it uses."""

    func: str
    allowed: bool
    pattern: str | None = None


_CONSTANTS: dict[str, Any] = {
    "true": True,
    "True": True,
    "false": False,
    "False": False,
    "null": None,
    "None": None,
}
_KEYWORDS = frozenset({"and", "or", "not", "in", "is"})
_NOT_LEVEL, _COMPARE_LEVEL, _UNARY_LEVEL = 3, 4, 7
_LEVELS = {"==": 4, "!=": 4, "<": 4, "<=": 4, ">": 4, ">=": 4, "+": 5, "-": 5}
_LEVELS |= {"*": 6, "/": 6, "//": 6, "%": 6}
_GLOB_CHARS = frozenset("*?[")
# (word, next word or None) -> (level, operator, words used)
_WORD_OPERATORS: dict[tuple[str, str | None], tuple[int, str, int]] = {
    ("or", None): (1, "or", 1),
    ("and", None): (2, "and", 1),
    ("in", None): (4, "in", 1),
    ("is", None): (4, "is", 1),
    ("is", "not"): (4, "is not", 2),
    ("not", "in"): (4, "not in", 2),
}


class Parser:
    """Recursive descent for atoms and access steps, precedence climbing for operators.

    Every recursion passes through ``_enter``, so nesting is bounded by MAX_DEPTH levels
    (a few Python frames each), long before Python's own recursion limit.
    """

    def __init__(self, text: str, names: frozenset[str] | None) -> None:
        self.tokens = tokenize(text)
        self.index = 0
        self.names = names
        self.depth = 0
        self.nodes = 0
        self.globs: list[_GlobScope] = []

    def parse(self) -> Node:
        """The tree of the whole text; raises ParseFailure."""
        node = self._binary(0)
        if self._peek().kind != "end":
            raise self._unexpected(self._peek())
        return node

    # tokens
    def _peek(self, ahead: int = 0) -> Token:
        return self.tokens[min(self.index + ahead, len(self.tokens) - 1)]

    def _at(self, op: str, ahead: int = 0) -> bool:
        token = self._peek(ahead)
        return token.kind == "op" and token.value == op

    def _expect(self, op: str) -> None:
        token = self._peek()
        if not self._at(op):
            raise self._unexpected(token, f" (expected '{op}')")
        self.index += 1

    def _unexpected(self, token: Token, suffix: str = "") -> ParseFailure:
        if token.kind == "end":
            return ParseFailure(f"unexpected end of expression{suffix}", token.pos)
        shown = token.text if len(token.text) <= 20 else token.text[:17] + "..."
        return ParseFailure(f"unexpected {shown!r}{suffix}", token.pos)

    def _count(self, node: Node) -> Node:
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise ParseFailure(f"expression is too complex (more than {MAX_NODES} parts)", None)
        return node

    def _enter(self) -> None:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            message = f"expression is nested too deeply (more than {MAX_DEPTH} levels)"
            raise ParseFailure(message, self._peek().pos)

    # operators, by precedence climbing; a run of one level's operators makes one node
    def _binary(self, min_level: int) -> Node:
        self._enter()
        node = self._unary(min_level)
        while (infix := self._infix()) is not None and infix[0] >= min_level:
            node = self._chain(node, infix[0])
        self.depth -= 1
        return node

    def _infix(self) -> tuple[int, str, int] | None:
        """The level, operator and token count of the operator ahead, if any."""
        token = self._peek()
        if token.kind == "op":
            level = _LEVELS.get(token.value)
            return None if level is None else (level, token.value, 1)
        if token.kind != "name":
            return None
        following = self._peek(1)
        pair = (token.value, following.value if following.kind == "name" else None)
        return _WORD_OPERATORS.get(pair) or _WORD_OPERATORS.get((token.value, None))

    def _chain(self, first: Node, level: int) -> Node:
        ops: list[str] = []
        operands: list[Node] = []
        while (infix := self._infix()) is not None and infix[0] == level:
            ops.append(infix[1])
            self.index += infix[2]
            operands.append(self._binary(level + 1))
        if level <= 2:
            return self._count(BoolOp(ops[0], (first, *operands)))
        if level == _COMPARE_LEVEL:
            return self._count(Compare(first, tuple(ops), tuple(operands)))
        return self._count(Arith(first, tuple(ops), tuple(operands)))

    def _unary(self, min_level: int) -> Node:
        token = self._peek()
        if token.kind == "name" and token.value == "not":
            if min_level > _NOT_LEVEL:
                raise self._unexpected(token, " (put the 'not' expression in parentheses)")
            self.index += 1
            return self._count(Unary("not", self._binary(_NOT_LEVEL)))
        if token.kind == "op" and token.value == "-":
            self.index += 1
            self._enter()
            operand = self._unary(_UNARY_LEVEL)
            self.depth -= 1
            value = operand.value if isinstance(operand, Literal) else None
            if isinstance(value, NUMBERS) and not isinstance(value, bool):
                return Literal(-value)  # so that x[-1] and -9223372036854775808 are literals
            return self._count(Unary("-", operand))
        return self._postfix()

    # access steps and atoms
    def _postfix(self) -> Node:
        node = self._primary()
        steps: list[Step] = []
        while self._at(".") or self._at("["):
            if not steps and isinstance(node, Literal) and not isinstance(node.value, str):
                hint = self._bracket_hint(self.index - 2)
                shown = "" if node.value is None else f" {show(node.value)}"
                message = f"cannot read a key of {kind_of(node.value)}{shown}"
                raise ParseFailure(message, self._peek().pos, hint)
            glob_ok = not steps and node == Name(GLOB_ROOT)
            token = self._peek(1)
            if self._at("."):
                if token.kind == "op" and token.value == "*" and glob_ok:
                    node = self._glob("*", token.pos)
                elif token.kind == "name":
                    steps.append(Attr(token.value))
                elif token.text == "*":
                    raise ParseFailure(f"a glob ('.*') can only follow '{GLOB_ROOT}'", token.pos)
                else:
                    raise self._unexpected(token, " after '.'")
                self.index += 2
            elif (
                glob_ok
                and token.kind == "str"
                and self._at("]", 2)
                and (_GLOB_CHARS & set(token.value))
            ):
                self.index += 3
                node = self._glob(token.value, token.pos)
            else:
                self.index += 1
                steps.append(Index(self._binary(0)))
                self._expect("]")
            self._count(node)
        return Path(node, tuple(steps)) if steps else node

    def _glob(self, pattern: str, pos: int) -> Node:
        if not self.globs:
            message = (
                "a glob over inputs is only allowed inside "
                "all(), any(), count(), almost_all(), min() or max()"
            )
            raise ParseFailure(message, pos)
        scope = self.globs[-1]
        if not scope.allowed:
            raise ParseFailure(
                f"a glob is only allowed in the first argument of {scope.func}()", pos
            )
        if scope.pattern is not None and scope.pattern != pattern:
            message = f"{scope.func}() mixes the globs {scope.pattern!r} and {pattern!r}"
            raise ParseFailure(message, pos)
        scope.pattern = pattern
        return Glob(GLOB_ROOT, pattern)

    def _primary(self) -> Node:
        token = self._peek()
        self.index += 1
        if token.kind in ("num", "str"):
            return self._count(Literal(token.value))
        if token.kind == "name":
            if token.value in _CONSTANTS:
                return self._count(Literal(_CONSTANTS[token.value]))
            if token.value in _KEYWORDS:
                raise self._unexpected(token)
            if self._at("("):
                return self._call(token)
            if self.names is not None and token.value not in self.names:
                raise self._unknown(token, "name")
            return self._count(Name(token.value))
        if token.kind == "op" and token.value == "(":
            node = self._binary(0)
            self._expect(")")
            return node
        if token.kind == "op" and token.value == "[":
            return self._count(ListOf(self._items("]")))
        raise self._unexpected(token)

    def _items(self, close: str) -> tuple[Node, ...]:
        items: list[Node] = []
        while not self._at(close):
            items.append(self._binary(0))
            if not self._at(","):
                break
            self.index += 1
        self._expect(close)
        return tuple(items)

    def _call(self, token: Token) -> Node:
        spec = FUNCTIONS.get(token.value)
        if spec is None:
            if self.names is not None and token.value in self.names:
                raise ParseFailure(f"{token.value!r} is not a function", token.pos)
            raise self._unknown(token, "function")
        self.index += 1
        scope = _GlobScope(token.value, allowed=True)
        args = self._call_args(token.value, spec, scope)
        if not spec.min_args <= len(args) <= spec.max_args:
            wanted = (
                str(spec.min_args) if spec.min_args == spec.max_args else f"{spec.min_args} or more"
            )
            message = f"{token.value}() takes {wanted} argument(s), not {len(args)}"
            raise ParseFailure(message, token.pos)
        if scope.pattern is not None and len(args) > spec.min_args:
            message = f"{token.value}() over a glob takes the glob expression only"
            raise ParseFailure(message, token.pos)
        return self._count(Call(token.value, args, scope.pattern))

    def _call_args(self, func: str, spec: Function, scope: _GlobScope) -> tuple[Node, ...]:
        """Parse the arguments; only the first of an aggregate may hold a glob."""
        args: list[Node] = []
        while not self._at(")"):
            if spec.glob:
                self.globs.append(scope if not args else _GlobScope(func, allowed=False))
            args.append(self._binary(0))
            if spec.glob:
                self.globs.pop()
            if not self._at(","):
                break
            self.index += 1
        self._expect(")")
        return tuple(args)

    def _unknown(self, token: Token, kind: str) -> ParseFailure:
        hint = f"functions: {', '.join(sorted(FUNCTIONS))}"
        if self.names is not None:
            hint = f"names: {', '.join(sorted(self.names))}; {hint}"
        if kind == "name":
            hint = "; ".join(filter(None, (hint, self._bracket_hint(self.index - 2))))
        return ParseFailure(f"unknown {kind} {token.value!r}", token.pos, hint)

    def _bracket_hint(self, index: int) -> str:
        """A hint for ``inputs.train-1``, which reads as a subtraction."""
        if index >= 0 and self.tokens[index].text in ("-", "/"):
            return 'a task name with "-" or "/" needs brackets: inputs["train-1"]'
        return ""
