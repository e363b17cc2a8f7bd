"""Property tests of ai4s-jobq semantics: random DAGs in ai4s-jobq's form, driven by
random, hostile event orders (shuffled, duplicated, stale, crashes), as in
test_machine_properties. Every run terminates, and the final parent statuses justify
what happened to each task under ai4s-jobq's rule: a skipped parent is a done one, for
every dep_policy, so a task is skipped only by its own condition.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq import state
from dagq.messages import CancelRequested, SubmitRequested, TaskFinished, TaskStarted
from dagq.state import BAD, TERMINAL, TaskStatus
from tests.helpers import Sim
from tests.unit.test_machine_properties import World

#: Conditions that may be true, false, or impossible to evaluate (a null or a bool
#: compared with a number): all three must settle the task.
CONDITIONS = [
    "inputs.{p}.ok == true",
    "inputs.{p}.n > 1",
    "inputs.{p} == null",
    "all(inputs.*.ok)",
]


@st.composite
def jobq_workflows(draw: st.DrawFn) -> list[dict[str, Any]]:
    n = draw(st.integers(1, 10))
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        parents = sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
        kwargs = draw(st.sampled_from([{"cmd": "true"}, {"sleep_s": 0.1}, {}]))
        task: dict[str, Any] = {
            "name": f"t{i}",
            "num_retries": draw(st.integers(0, 2)),
            "kwargs": kwargs,
        }
        if parents:
            task["depends_on"] = [f"t{p}" for p in parents]
            choice = draw(st.sampled_from(["all", "any", "all_settled", "n"]))
            task["dep_policy"] = draw(st.integers(1, len(parents))) if choice == "n" else choice
            if draw(st.booleans()):
                pattern = draw(st.sampled_from(CONDITIONS))
                task["condition"] = pattern.format(p=f"t{draw(st.sampled_from(parents))}")
        tasks.append(task)
    return tasks


class JobqWorld(World):
    """A failed attempt may leave an output, as ai4s-jobq's shell worker reports it."""

    def absorb(self, fx: Any) -> None:
        super().absorb(fx)
        self.sim.history += fx.history

    def run_one(self) -> None:
        index = self.draw(st.integers(0, len(self.queue) - 1))
        d = self.queue.pop(index)
        if self.draw(st.booleans()):
            self.apply(
                TaskStarted(workflow_id="wf-1", task=d.task, attempt=d.attempt, at=self.sim.now)
            )
        ok = self.draw(st.booleans())
        output = self.draw(
            st.sampled_from([None, {"ok": True, "n": 2}, {"ok": False, "n": 0}, "text"])
        )
        self.apply(
            TaskFinished(
                workflow_id="wf-1",
                task=d.task,
                attempt=d.attempt,
                at=self.sim.now,
                ok=ok,
                output=output,
                error=None if ok else "boom",
                warning=None if output is not None or not ok else "not JSON",
            )
        )


def jobq_oracle(policy: Any, parents: list[TaskStatus]) -> str:
    """ai4s-jobq's state.py, spelled out: skipped and completed parents are both done."""
    if not parents:
        return "run"
    done = sum(1 for p in parents if p in (TaskStatus.COMPLETED, TaskStatus.SKIPPED))
    bad = sum(1 for p in parents if p in BAD)
    if policy == "all":
        return "upstream" if bad else "run"
    if policy in ("any", "all_settled"):
        return "run" if done else "upstream"
    return "run" if done >= policy else "upstream"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tasks=jobq_workflows(), data=st.data())
def test_jobq_runs_terminate_and_skipped_parents_count_as_done(
    tasks: list[dict[str, Any]], data: st.DataObject
) -> None:
    sim = Sim(tasks)
    assert sim.plan.jobq
    world = JobqWorld(sim, data.draw, tasks)
    world.apply(SubmitRequested(workflow_id="wf-1"))
    for _ in range(400):
        if sim.state.status in state.WORKFLOW_TERMINAL and not world.queue:
            break
        world.step()
    while world.queue:  # drain: delivering everything ends it
        world.run_one()
    st_ = sim.state
    assert st_.status in state.WORKFLOW_TERMINAL
    assert all(code in TERMINAL for code in st_.task_status)
    cancelled = any(isinstance(e, CancelRequested) for e in world.sent)
    ran = {task for task, _ in world.dispatch_ids}
    for t, spec in zip(sim.plan.tasks, tasks, strict=True):
        parents = [TaskStatus(st_.task_status[p]) for p in t.parents]
        expected = jobq_oracle(spec.get("dep_policy", "all"), parents)
        status = TaskStatus(st_.task_status[t.index])
        if t.index in ran:
            assert expected == "run", (t.name, parents)
        if status is TaskStatus.UPSTREAM_FAILED:
            assert expected == "upstream", (t.name, parents)
        if status is TaskStatus.SKIPPED:
            assert "condition" in spec, (t.name, "skipped by its parents")
        if status is TaskStatus.SKIPPED and not cancelled:
            assert any(e.kind == "condition" and e.task == t.name for e in sim.history)
    if not cancelled:
        sinks = [i for i in range(st_.n_tasks) if sim.plan.is_sink[i]]
        failed = any(st_.task_status[i] in BAD for i in sinks)
        assert st_.status == ("failed" if failed else "completed")
