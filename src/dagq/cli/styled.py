"""Styled text without rich: what a command prints, before it knows where it goes.

A command builds its lines from :class:`Styled` spans (``Styled("failed", "bold red")``);
piped, only their ``plain`` text is written and rich is never imported (``dagq status``
and ``dagq list`` start a third faster). On a terminal rich draws them: a ``Styled`` is
rich-renderable (``__rich__``), so it goes into rich tables, groups and ``print`` as it
is. Styles are rich's style strings.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from rich.text import Text

#: A span: its text and its style ('' for none).
Span: TypeAlias = tuple[str, str]


class Styled:
    """Text made of spans, each of one style (rich's ``Text``, as far as dagq uses it)."""

    __slots__ = ("spans",)

    def __init__(self, text: str = "", style: str = "") -> None:
        self.spans: list[Span] = [(text, style)] if text else []

    @classmethod
    def assemble(cls, *parts: str | Span) -> Styled:
        """Spans in order: a string is unstyled, a pair is (text, style)."""
        styled = cls()
        for part in parts:
            styled.append(*((part, "") if isinstance(part, str) else part))
        return styled

    def append(self, text: str, style: str = "") -> None:
        if text:
            self.spans.append((text, style))

    @property
    def plain(self) -> str:
        """The text without its styles (what a pipe gets)."""
        return "".join(text for text, _ in self.spans)

    @property
    def style(self) -> str:
        """The style of text of one style ('' if none, or if it has several)."""
        styles = {style for _, style in self.spans}
        return styles.pop() if len(styles) == 1 else ""

    def __add__(self, other: Styled | str) -> Styled:
        joined = Styled()
        more = Styled(other) if isinstance(other, str) else other
        joined.spans = [*self.spans, *more.spans]
        return joined

    def __bool__(self) -> bool:
        return bool(self.spans)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Styled) and self.spans == other.spans

    __hash__ = None  # type: ignore[assignment]  # mutable, as rich's Text

    def __repr__(self) -> str:
        return f"Styled({self.plain!r})"

    def __rich__(self) -> Text:
        """Called by rich only, so rich is loaded already when this imports it."""
        from rich.text import Text

        return Text.assemble(*self.spans)


class Bar:
    """A progress bar with its count and timing beside it: drawn on a terminal only;
    piped, the count and timing are a plain line."""

    __slots__ = ("count", "done", "timing", "total")

    def __init__(self, *, done: int, total: int, count: str, timing: str) -> None:
        self.done, self.total, self.count, self.timing = done, total, count, timing

    @property
    def plain(self) -> str:
        return f"{self.count}  {self.timing}"
