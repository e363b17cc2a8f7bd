"""Property tests: random DAGs driven by random, hostile event orders.

Events arrive shuffled, duplicated, from stale attempts, and the coordinator's working
copy is thrown away and rebuilt from its encoded document at random points (a
crash). Whatever happens, every run terminates and the invariants of
docs/architecture.md §2 hold.
"""

from __future__ import annotations

from collections import Counter
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dagq import group as groups
from dagq import machine, snapshots, state
from dagq.group import encode_group
from dagq.messages import (
    CancelRequested,
    Event,
    RetryRequested,
    SignalSent,
    SubmitRequested,
    TaskFinished,
    TaskStarted,
)
from dagq.state import BAD, TERMINAL, UNDO_DONE, UNDO_FAILED, TaskStatus
from tests.helpers import Sim

POLICIES = ["all", "any", "all_settled"]


@st.composite
def workflows(draw: st.DrawFn) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    n = draw(st.integers(1, 10))
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        parents = sorted(draw(st.sets(st.integers(0, i - 1), max_size=3))) if i else []
        task: dict[str, Any] = {
            "name": f"t{i}",
            "num_retries": draw(st.integers(0, 2)),
            "retry": {"backoff_s": 0, "jitter": 0},
        }
        if parents:
            task["depends_on"] = [f"t{p}" for p in parents]
            choice = draw(st.sampled_from([*POLICIES, "n"]))
            task["dep_policy"] = draw(st.integers(1, len(parents))) if choice == "n" else choice
            if draw(st.booleans()):
                task["condition"] = f"inputs.t{draw(st.sampled_from(parents))}.ok != false"
            if choice not in {"all", "all_settled"} and draw(st.integers(0, 3)) == 0:
                task["cancel_remaining"] = True
        tasks.append(_with_kind(draw, task))
    workflow: dict[str, Any] = {
        "params": {f"items{n}": list(range(draw(st.integers(0, 4)))) for n in range(3)}
    }
    if draw(st.booleans()):
        workflow["max_parallelism"] = draw(st.integers(1, 3))
    if draw(st.booleans()):
        workflow["result_policy"] = "all_tasks_succeed"
    return tasks, workflow


def _with_kind(draw: st.DrawFn, task: dict[str, Any]) -> dict[str, Any]:
    """Make a task a timer, a wait, a loop, a foreach or a plain run (maybe with an undo)."""
    kind = draw(st.sampled_from(["run"] * 6 + ["sleep", "wait", "loop", "foreach"]))
    if kind == "sleep":
        task = {k: v for k, v in task.items() if k not in ("num_retries", "retry")}
        task["sleep_s"] = draw(st.sampled_from([0, 5, 50]))
    elif kind == "wait":
        task = {k: v for k, v in task.items() if k not in ("num_retries", "retry")}
        task["wait_for"] = {
            "signal": f"s{draw(st.integers(0, 2))}",
            "timeout_s": draw(st.sampled_from([10, 100])),
            "on_timeout": draw(st.sampled_from(["fail", "skip"])),
        }
    elif kind == "loop":
        task["loop"] = {"until": "output.ok", "max_iterations": draw(st.integers(1, 3))}
    elif kind == "foreach":
        task.pop("cancel_remaining", None)
        task["foreach"] = f"params.items{draw(st.integers(0, 2))}"
        if draw(st.booleans()):
            task["max_parallel"] = draw(st.integers(1, 2))
        if draw(st.booleans()):
            task["allow_failures"] = draw(st.sampled_from([1, 0.5]))
    if kind in ("run", "loop") and draw(st.integers(0, 3)) == 0:
        task["compensate"] = {
            "cmd": "undo",
            "num_retries": draw(st.integers(0, 1)),
            "retry": {"backoff_s": 0, "jitter": 0},
        }
    return task


class World:
    """Workers and queues as chaos: any message may run, fail, repeat or arrive late."""

    def __init__(self, sim: Sim, draw: st.DrawFn, tasks: list[dict[str, Any]]) -> None:
        self.sim = sim
        self.tasks = tasks
        self.draw = draw
        self.queue: list[machine.Dispatch] = []
        self.undos: Counter[tuple[int, int]] = Counter()
        self.sent: list[Event] = []
        self.dispatch_ids: Counter[tuple[int, int]] = Counter()
        self.instances: Counter[tuple[int, int, int]] = Counter()
        self.max_in_flight = 0
        self.base = snapshots.encode_tasks(sim.state)
        self.deltas: list[bytes] = []

    def absorb(self, fx: machine.Effects) -> None:
        for d in fx.dispatch:
            self.queue.append(d)
            if d.undo:
                self.undos[(d.task, d.attempt)] += 1
            elif d.item >= 0:
                self.instances[(d.task, d.item, d.attempt)] += 1
            else:
                self.dispatch_ids[(d.task, d.attempt)] += 1

    def apply(self, event: Event) -> None:
        self.sent.append(event)
        fx = machine.Effects()
        machine.apply(self.sim.plan, self.sim.state, event, self.sim.now, fx)
        self.absorb(fx)
        self.max_in_flight = max(self.max_in_flight, self.sim.state.in_flight)
        self.flush()

    def flush(self) -> None:
        """What the coordinator stores: a delta of the changed tasks, now and then a base."""
        st = self.sim.state
        _check_kept_chunks(st)
        if len(self.deltas) >= 4:
            self.base, self.deltas = snapshots.encode_tasks(st), []
        else:
            self.deltas.append(
                snapshots.encode_delta(st, st.changed, st.changed_groups, st.changed_items)
            )
        st.changed.clear()
        st.changed_groups.clear()
        st.changed_items.clear()

    def crash(self) -> None:
        """Throw the working copy away; rebuild it from the base and deltas stored so far."""
        old = self.sim.state
        new = snapshots.empty_state(snapshots.header(old))
        snapshots.load_tasks(new, self.base)
        for delta in self.deltas:
            snapshots.apply_delta(new, delta)
        new.rebuild(self.sim.plan)
        for column in (
            "task_status",
            "attempt",
            "dispatched_at",
            "started_at",
            "task_finished_at",
            "outputs",
            "output_refs",
            "errors",
            "retry_base",
            "wake_at",
            "iteration",
            "round_started",
            "delay_spent",
            "stop_requests",
            "undo_status",
            "undo_attempt",
            "n_done",
            "n_skip",
            "n_bad",
            "counts",
            "in_flight",
        ):
            assert getattr(new, column) == getattr(old, column), column
        assert {i: encode_group(g) for i, g in new.groups.items()} == {
            i: encode_group(g) for i, g in old.groups.items()
        }
        for i, group in old.groups.items():
            assert (new.groups[i].sent, sorted(new.groups[i].unsent)) == (
                group.sent,
                sorted(k for k in group.unsent if group.status[k] == TaskStatus.PENDING),
            ), "group counters"
        # Held tasks come back in task order rather than readiness order: same set.
        assert sorted(new.held) == sorted(old.held)
        self.sim.state = new

    def step(self) -> None:
        action = self.draw(
            st.sampled_from(
                ["run", "run", "run", "dup", "stale", "crash", "cancel", "signal", "time"]
            )
        )
        if action == "dup" and self.sent:
            self.apply(self.draw(st.sampled_from(self.sent)))
        elif action == "stale" and self.sent:
            old = self.draw(st.sampled_from(self.sent))
            if isinstance(old, TaskFinished):
                self.apply(
                    TaskFinished(
                        workflow_id="wf-1",
                        task=old.task,
                        attempt=max(old.attempt - 1, 0),
                        at=old.at,
                        ok=not old.ok,
                    )
                )
        elif action == "crash":
            self.crash()
        elif action == "cancel" and self.draw(st.integers(0, 9)) == 0:
            self.apply(CancelRequested(workflow_id="wf-1"))
        elif action == "signal":
            name = f"s{self.draw(st.integers(0, 2))}"
            self.apply(SignalSent(workflow_id="wf-1", name=name, data={"ok": True}))
        elif action == "time":
            self.pass_time(self.draw(st.sampled_from([1, 10, 100])))
        elif self.queue:
            self.run_one()

    def pass_time(self, seconds: float) -> None:
        """The clock moves on: due timers fire and expired waits time out."""
        self.sim.now += seconds
        for i, when in sorted(self.sim.state.wake_at.items()):
            if when <= self.sim.now:
                fx = machine.Effects()
                machine.wake(self.sim.plan, self.sim.state, self.sim.now, fx, task=i)
                self.absorb(fx)
                self.flush()

    def run_one(self) -> None:
        index = self.draw(st.integers(0, len(self.queue) - 1))
        d = self.queue.pop(index)
        task, attempt, undo, item = d.task, d.attempt, d.undo, d.item
        if self.draw(st.booleans()):
            self.apply(
                TaskStarted(
                    workflow_id="wf-1",
                    task=task,
                    attempt=attempt,
                    at=self.sim.now,
                    undo=undo,
                    item=item,
                )
            )
        ok = self.draw(st.booleans())
        self.apply(
            TaskFinished(
                workflow_id="wf-1",
                task=task,
                attempt=attempt,
                at=self.sim.now,
                ok=ok,
                output={"ok": self.draw(st.booleans())} if ok else None,
                error=None if ok else "boom",
                retryable=self.draw(st.booleans()),
                undo=undo,
                item=item,
            )
        )


def _check_kept_chunks(st_: state.RunState) -> None:
    """A chunk of a foreach group kept encoded is what encoding it again gives."""
    for group in st_.groups.values():
        kept = dict(group.encoded)
        group.encoded.clear()
        again = encode_group(group)
        fresh = group.encoded
        group.encoded = kept
        if groups.is_chunked(group):
            assert all(fresh[c] == data for c, data in kept.items())
            assert encode_group(group) == again


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workflows(), data=st.data())
def test_every_run_terminates_and_keeps_the_invariants(
    spec: tuple[list[dict[str, Any]], dict[str, Any]], data: st.DataObject
) -> None:
    # Groups of 3 and 4 items are stored in chunks of 2 (a million's are of CHUNK).
    with mock.patch.object(groups, "CHUNK", 2):
        _run_and_check(spec, data)


def _run_and_check(spec: tuple[list[dict[str, Any]], dict[str, Any]], data: st.DataObject) -> None:
    tasks, workflow = spec
    sim = Sim(tasks, **workflow)
    world = World(sim, data.draw, tasks)
    world.apply(SubmitRequested(workflow_id="wf-1"))
    for _ in range(400):
        if sim.state.status in state.WORKFLOW_TERMINAL and not world.queue:
            break
        world.step()
    while world.queue or sim.state.wake_at:  # drain: delivering everything ends it
        if world.queue:
            world.run_one()
        else:
            world.pass_time(1000)
    st_ = sim.state
    assert st_.status in state.WORKFLOW_TERMINAL
    assert all(code in TERMINAL for code in st_.task_status)
    assert sum(st_.counts) == st_.n_tasks == st_.n_terminal
    # Invariant 7: every attempt got exactly one message with its own id.
    assert all(n == 1 for n in world.dispatch_ids.values())
    assert all(n == 1 for n in world.instances.values())
    _check_groups(sim)
    for (task, attempt), _ in world.dispatch_ids.items():
        spec = sim.plan.tasks[task]
        if spec.loop is None:  # a loop's iterations each have their own retries
            assert attempt <= spec.max_attempts
    if sim.plan.max_parallelism:
        assert world.max_in_flight <= sim.plan.max_parallelism
    _check_dependencies(sim, world)
    _check_result(sim, world)


def oracle(policy: Any, parents: list[TaskStatus]) -> str:
    """docs/architecture.md §5 spelled out plainly, independent of the machine's tallies."""
    done = parents.count(TaskStatus.COMPLETED)
    skipped = parents.count(TaskStatus.SKIPPED)
    bad = sum(1 for p in parents if p in BAD)
    if not parents:
        return "run"
    if skipped == len(parents):
        return "skip"
    if policy == "all":
        return "upstream" if bad else "run"
    if policy in ("any", "all_settled"):
        return "run" if done else "upstream"
    if done >= policy or (done and done + skipped >= policy):
        return "run"
    return "upstream"


def _check_dependencies(sim: Sim, world: World) -> None:
    """Final parent statuses justify what happened to each task."""
    ran = {task for task, _ in world.dispatch_ids}
    cancelled = any(isinstance(e, CancelRequested) for e in world.sent)
    for t, spec in zip(sim.plan.tasks, world.tasks, strict=True):
        parents = [TaskStatus(sim.state.task_status[p]) for p in t.parents]
        expected = oracle(spec.get("dep_policy", "all"), parents)
        status = TaskStatus(sim.state.task_status[t.index])
        if t.index in ran:
            assert expected == "run", (t.name, parents)
        if status is TaskStatus.UPSTREAM_FAILED:
            assert expected == "upstream", (t.name, parents)
        if status is TaskStatus.SKIPPED and not {"condition", "wait_for"} & set(spec):
            assert expected == "skip", (t.name, parents)
        if not cancelled and status is TaskStatus.PENDING:
            raise AssertionError(f"{t.name} never decided")


def _check_result(sim: Sim, world: World) -> None:
    cancelled = any(isinstance(e, CancelRequested) for e in world.sent)
    st_ = sim.state
    if cancelled and st_.status != "completed" and st_.cancel_reason:
        expected = "cancelled"
    else:
        culprits = [
            t
            for t in sim.plan.tasks
            if st_.task_status[t.index] in BAD
            and (sim.plan.all_tasks_must_succeed or sim.plan.is_sink[t.index])
        ]
        expected = "failed" if culprits else "completed"
    _check_compensation(sim, world, expected)


def _check_groups(sim: Sim) -> None:
    """A finished foreach task reflects its instances: all done, failures within bounds."""
    st_ = sim.state
    for i, group in st_.groups.items():
        spec = sim.plan.tasks[i]
        status = TaskStatus(st_.task_status[i])
        if status == TaskStatus.COMPLETED:
            assert all(s in TERMINAL for s in group.status)
            failed = group.failed()
            allow = spec.allow_failures or 0
            assert len(failed) <= (int(allow * group.n) if allow < 1 else int(allow))
            assert st_.outputs[i] == [group.outputs.get(k) for k in range(group.n)]
        if status == TaskStatus.RUNNING:
            raise AssertionError(f"{spec.name} left running")


def _check_compensation(sim: Sim, world: World, expected: str) -> None:
    """Undos ran for exactly the completed tasks that have one, newest first, within
    their attempts; an undo given up on ends the run in compensation_failed."""
    st_ = sim.state
    undoable = [
        t.index
        for t in sim.plan.tasks
        if t.undo is not None and st_.task_status[t.index] == TaskStatus.COMPLETED
    ]
    if expected == "completed" or not undoable:
        assert st_.status == expected and not world.undos
        return
    assert sorted(st_.undo_order) == sorted(undoable)
    finished = [st_.task_finished_at[i] for i in st_.undo_order]
    assert finished == sorted(finished, reverse=True)
    for (task, attempt), n in world.undos.items():
        assert n == 1 and attempt <= sim.plan.tasks[task].undo.max_attempts  # type: ignore[union-attr]
    failed = any(st_.undo_status[i] == UNDO_FAILED for i in st_.undo_order)
    assert all(st_.undo_status[i] in (UNDO_DONE, UNDO_FAILED) for i in st_.undo_order)
    assert st_.status == ("compensation_failed" if failed else expected)


# --- requests with ids, delivered again at any time -------------------------------------


class RequestWorld(World):
    """Chaos in which clients' requests (cancel, signal, retry) carry ids, and the queue
    delivers any earlier request again at any later point."""

    #: Fewer requests than a state remembers: every copy must be recognised.
    MAX_REQUESTS = state.MAX_REQUEST_IDS // 2

    def __init__(self, sim: Sim, draw: st.DrawFn, tasks: list[dict[str, Any]]) -> None:
        super().__init__(sim, draw, tasks)
        self.requests: list[Event] = []

    def request(self, event: Event) -> None:
        self.requests.append(event)
        self.apply(event)

    def redeliver(self) -> None:
        """A copy of an earlier request: it must change nothing and do nothing."""
        event = self.draw(st.sampled_from(self.requests))
        before = snapshots.encode(self.sim.state)
        fx = machine.Effects()
        machine.apply(self.sim.plan, self.sim.state, event, self.sim.now, fx)
        assert (fx.dispatch, fx.history, fx.timers, fx.stop, fx.finished) == (
            [],
            [],
            [],
            False,
            False,
        )
        assert snapshots.encode(self.sim.state) == before, f"{event} acted twice"

    def step(self) -> None:
        action = self.draw(
            st.sampled_from(["run", "run", "run", "request", "again", "crash", "time"])
        )
        n = len(self.requests)
        if action == "request" and n < self.MAX_REQUESTS:
            kind = self.draw(st.sampled_from(["signal", "signal", "cancel", "retry"]))
            if kind == "signal":
                name = f"s{self.draw(st.integers(0, 2))}"
                self.request(SignalSent(workflow_id="wf-1", name=name, data=n, request_id=f"r{n}"))
            elif kind == "cancel":
                self.request(CancelRequested(workflow_id="wf-1", request_id=f"r{n}"))
            else:
                self.request(RetryRequested(workflow_id="wf-1", request_id=f"r{n}"))
        elif action == "again" and self.requests:
            self.redeliver()
        elif action == "crash":
            self.crash()
        elif action == "time":
            self.pass_time(self.draw(st.sampled_from([1, 10, 100])))
        elif self.queue:
            self.run_one()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(spec=workflows(), data=st.data())
def test_every_request_delivered_again_in_any_order_acts_once(
    spec: tuple[list[dict[str, Any]], dict[str, Any]], data: st.DataObject
) -> None:
    tasks, workflow = spec
    sim = Sim(tasks, **workflow)
    world = RequestWorld(sim, data.draw, tasks)
    world.apply(SubmitRequested(workflow_id="wf-1"))
    for _ in range(300):
        if sim.state.status in state.WORKFLOW_TERMINAL and not world.queue:
            if len(world.requests) >= world.MAX_REQUESTS or not data.draw(st.booleans()):
                break
            n = len(world.requests)  # the run ended: ask for a retry (often ignored)
            world.request(RetryRequested(workflow_id="wf-1", request_id=f"r{n}"))
            continue
        world.step()
    while world.queue or sim.state.wake_at:
        if world.queue:
            world.run_one()
        else:
            world.pass_time(1000)
    for _ in world.requests:  # every request delivered once more, in a random order
        world.redeliver()
    st_ = sim.state
    assert st_.status in state.WORKFLOW_TERMINAL
    assert all(code in TERMINAL for code in st_.task_status)
    assert sum(st_.counts) == st_.n_tasks == st_.n_terminal
    assert all(n == 1 for n in world.dispatch_ids.values())
    assert all(n == 1 for n in world.undos.values())
    ids = [e.request_id for e in world.requests]  # type: ignore[union-attr]
    assert st_.requests == ids
