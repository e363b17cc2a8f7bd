"""``dagq run``'s progress, drawn once the run is under way: what it shows counts from
the run's start, not from the moment it is drawn."""

from __future__ import annotations

from typing import Any

from dagq.cli.local_run import Screen, _Progress
from dagq.state import RunState


class _Live:
    """Stands in for the rich live view (:class:`dagq.cli.display.LiveProgress`)."""

    def __init__(self) -> None:
        self.started = 0.0
        self.first_done: int | None = None
        self.updates: list[int] = []

    def __enter__(self) -> _Live:
        return self

    def update(self, plan: Any, st: RunState) -> None:
        self.updates.append(st.n_terminal)


class _Screen(Screen):
    def __init__(self) -> None:
        super().__init__()
        self.live = _Live()

    @property
    def screen(self) -> Any:
        return self

    def progress(self, workflow_id: str, name: str) -> _Live:
        return self.live


def test_a_view_drawn_late_counts_its_rate_from_the_first_look() -> None:
    screen = _Screen()
    progress = _Progress(screen, "w", "name")
    progress.update(None, RunState("w", 3, 0.0))  # too early to draw: nothing drawn

    assert progress.live is None
    progress.show()
    assert screen.live.first_done == 0  # what was done at the first look, not at drawing
    assert screen.live.started == progress.created
