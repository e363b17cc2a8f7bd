"""The state machine, specified one behaviour at a time (no store, no clock)."""

from __future__ import annotations

import pytest

from dagq import machine
from dagq.messages import CancelRequested, RetryRequested, TaskStarted
from dagq.plan import POLICY_ALL, POLICY_ALL_SETTLED, POLICY_ANY
from tests.helpers import Sim


def chain() -> Sim:
    return Sim(
        [{"name": "a"}, {"name": "b", "depends_on": ["a"]}, {"name": "c", "depends_on": ["b"]}]
    )


def test_activation_dispatches_only_the_roots() -> None:
    sim = chain()
    sim.start()
    assert sim.dispatched == [("a", 1, 0.0)]
    assert sim.state.status == "running"


def test_activation_twice_changes_nothing() -> None:
    sim = chain()
    sim.start()
    sim.start()
    assert sim.dispatched == [("a", 1, 0.0)]


def test_completion_dispatches_the_child_and_keeps_the_output() -> None:
    sim = chain()
    sim.start()
    sim.finish("a", output={"x": 1})
    assert sim.dispatched[-1] == ("b", 1, 0.0)
    assert sim.state.outputs[sim.index("a")] == {"x": 1}


def test_workflow_completes_when_every_task_completed() -> None:
    sim = chain()
    sim.start()
    for name in "abc":
        sim.finish(name)
    assert sim.state.status == "completed"
    assert sim.finished


def test_started_event_marks_running() -> None:
    sim = chain()
    sim.start()
    sim.started("a")
    assert sim.status("a") == "running"


def test_duplicate_completion_is_a_no_op() -> None:
    sim = chain()
    sim.start()
    sim.finish("a")
    before = (sim.statuses(), list(sim.dispatched))
    sim.finish("a", attempt=1)
    assert (sim.statuses(), sim.dispatched) == before


def test_completion_of_an_older_attempt_is_ignored() -> None:
    sim = Sim([{"name": "a", "num_retries": 2}])
    sim.start()
    sim.finish("a", ok=False, error="boom")
    assert sim.state.attempt[0] == 2
    sim.finish("a", ok=True, attempt=1)
    assert sim.status("a") == "ready"


def test_failure_with_budget_is_retried_with_backoff() -> None:
    sim = Sim([{"name": "a", "num_retries": 2, "retry": {"backoff_s": 10, "jitter": 0}}])
    sim.start()
    sim.finish("a", ok=False, error="boom")
    assert sim.dispatched[-1] == ("a", 2, 10.0)
    sim.finish("a", ok=False, error="boom")
    assert sim.dispatched[-1] == ("a", 3, 20.0)


def test_retry_after_overrides_the_backoff() -> None:
    sim = Sim([{"name": "a", "num_retries": 1}])
    sim.start()
    sim.finish("a", ok=False, error="busy", retry_after_s=3.5)
    assert sim.dispatched[-1] == ("a", 2, 3.5)


def test_backoff_is_capped_and_jitter_stays_within_its_fraction() -> None:
    policy = {"backoff_s": 10, "backoff_multiplier": 10, "backoff_max_s": 50, "jitter": 0.2}
    sim = Sim([{"name": "a", "num_retries": 5, "retry": policy}])
    sim.start()
    for _ in range(5):
        sim.finish("a", ok=False, error="boom")
    delays = [d for _, attempt, d in sim.dispatched if attempt > 1]
    assert 8 <= delays[0] <= 12
    assert all(40 <= d <= 60 for d in delays[2:])


def test_num_retries_gives_num_retries_plus_one_attempts() -> None:
    sim = Sim([{"name": "a", "num_retries": 2}, {"name": "b", "depends_on": ["a"]}])
    sim.start()
    for _ in range(3):
        sim.finish("a", ok=False, error="exit code 1")
    assert [a for n, a, _ in sim.dispatched if n == "a"] == [1, 2, 3]
    assert sim.status("a") == "failed"
    assert sim.status("b") == "upstream_failed"
    assert sim.state.status == "failed"
    assert "task 'a' failed: exit code 1" in (sim.state.error or "")


def test_non_retryable_failure_fails_at_once() -> None:
    sim = Sim([{"name": "a", "num_retries": 5}])
    sim.start()
    sim.finish("a", ok=False, error="bad input", retryable=False)
    assert sim.status("a") == "failed"
    assert len(sim.dispatched) == 1


def test_defaults_give_retries_to_every_task() -> None:
    sim = Sim([{"name": "a"}], defaults={"num_retries": 1})
    sim.start()
    sim.finish("a", ok=False, error="x")
    assert sim.status("a") == "ready"


def test_failure_cascades_upstream_failed_down_the_chain() -> None:
    sim = chain()
    sim.start()
    sim.finish("a", ok=False, error="boom")
    assert sim.statuses() == {"a": "failed", "b": "upstream_failed", "c": "upstream_failed"}


def test_all_policy_fails_a_join_as_soon_as_one_parent_fails() -> None:
    sim = Sim([{"name": "a"}, {"name": "b"}, {"name": "j", "depends_on": ["a", "b"]}])
    sim.start()
    sim.finish("a", ok=False, error="x")
    assert sim.status("j") == "upstream_failed"
    assert sim.state.status == "running"  # b still runs


def test_any_policy_runs_at_the_first_completed_parent() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b"}, {"name": "j", "depends_on": ["a", "b"], "dep_policy": "any"}]
    )
    sim.start()
    sim.finish("b")
    assert sim.status("j") == "ready"


def test_any_policy_fails_when_no_parent_can_complete() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b"}, {"name": "j", "depends_on": ["a", "b"], "dep_policy": "any"}]
    )
    sim.start()
    sim.finish("a", ok=False, error="x")
    assert sim.status("j") == "pending"
    sim.finish("b", ok=False, error="x")
    assert sim.status("j") == "upstream_failed"


def test_all_settled_waits_for_every_parent_then_runs_if_one_completed() -> None:
    tasks = [
        {"name": "a"},
        {"name": "b"},
        {"name": "j", "depends_on": ["a", "b"], "dep_policy": "all_settled"},
    ]
    sim = Sim(tasks)
    sim.start()
    sim.finish("a")
    assert sim.status("j") == "pending"
    sim.finish("b", ok=False, error="x")
    assert sim.status("j") == "ready"


def test_n_of_m_runs_once_n_parents_completed() -> None:
    tasks = [{"name": p} for p in "abc"] + [
        {"name": "j", "depends_on": list("abc"), "dep_policy": 2}
    ]
    sim = Sim(tasks)
    sim.start()
    sim.finish("a")
    assert sim.status("j") == "pending"
    sim.finish("c")
    assert sim.status("j") == "ready"


def test_n_of_m_fails_once_n_is_out_of_reach() -> None:
    tasks = [{"name": p} for p in "abc"] + [
        {"name": "j", "depends_on": list("abc"), "dep_policy": 2}
    ]
    sim = Sim(tasks)
    sim.start()
    sim.finish("a", ok=False, error="x")
    assert sim.status("j") == "pending"
    sim.finish("b", ok=False, error="x")
    assert sim.status("j") == "upstream_failed"


@pytest.mark.parametrize(
    ("policy", "tallies", "expected"),
    [
        (POLICY_ALL, (2, 0, 0), machine.RUN),
        (POLICY_ALL, (1, 1, 0), machine.RUN),
        (POLICY_ALL, (0, 2, 0), machine.SKIP),
        (POLICY_ALL, (1, 0, 0), machine.WAIT),
        (POLICY_ALL, (0, 0, 1), machine.UPSTREAM),
        (POLICY_ANY, (0, 2, 0), machine.SKIP),
        (POLICY_ANY, (0, 1, 1), machine.UPSTREAM),
        (POLICY_ALL_SETTLED, (1, 0, 0), machine.WAIT),
        (POLICY_ALL_SETTLED, (0, 2, 0), machine.SKIP),
        (2, (1, 1, 0), machine.RUN),
        (2, (0, 2, 0), machine.SKIP),
        (2, (0, 1, 0), machine.WAIT),
    ],
)
def test_verdicts_for_two_parents(
    policy: int, tallies: tuple[int, int, int], expected: int
) -> None:
    assert machine.verdict(policy, 2, *tallies) == expected


def test_false_condition_skips_and_the_skip_propagates_to_a_lone_child() -> None:
    sim = Sim(
        [
            {"name": "a"},
            {"name": "b", "depends_on": ["a"], "condition": "inputs.a.score > 0.5"},
            {"name": "c", "depends_on": ["b"]},
        ]
    )
    sim.start()
    sim.finish("a", output={"score": 0.1})
    assert sim.statuses() == {"a": "completed", "b": "skipped", "c": "skipped"}
    assert sim.state.status == "completed"


def test_join_with_one_completed_parent_runs_despite_a_skipped_branch() -> None:
    sim = Sim(
        [
            {"name": "a"},
            {"name": "yes", "depends_on": ["a"], "condition": "inputs.a.ok"},
            {"name": "no", "depends_on": ["a"], "condition": "not inputs.a.ok"},
            {"name": "join", "depends_on": ["yes", "no"]},
        ]
    )
    sim.start()
    sim.finish("a", output={"ok": True})
    sim.finish("yes")
    assert sim.status("no") == "skipped"
    assert sim.status("join") == "ready"


def test_condition_can_read_params() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "params.go"}],
        params={"go": True},
        overrides={"go": False},
    )
    sim.start()
    sim.finish("a")
    assert sim.status("b") == "skipped"


def test_condition_evaluation_error_fails_the_task_with_that_error() -> None:
    sim = Sim([{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "inputs.a.n > 1"}])
    sim.start()
    sim.finish("a", output={"n": "text"})
    assert sim.status("b") == "failed"
    assert "condition could not be evaluated" in sim.state.errors[sim.index("b")]


def test_condition_over_a_stored_reference_uses_the_resolved_value() -> None:
    sim = Sim([{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "inputs.a.big"}])
    sim.start()
    sim.state.resolved["outputs/x"] = {"big": True}
    sim.finish("a", output_ref="outputs/x")
    assert sim.status("b") == "ready"


def test_result_policy_all_sinks_ignores_an_absorbed_failure() -> None:
    tasks = [
        {"name": "a"},
        {"name": "b"},
        {"name": "j", "depends_on": ["a", "b"], "dep_policy": "any"},
    ]
    sim = Sim(tasks)
    sim.start()
    sim.finish("a", ok=False, error="x")
    sim.finish("b")
    sim.finish("j")
    assert sim.state.status == "completed"


def test_result_policy_all_tasks_counts_every_failure() -> None:
    tasks = [
        {"name": "a"},
        {"name": "b"},
        {"name": "j", "depends_on": ["a", "b"], "dep_policy": "any"},
    ]
    sim = Sim(tasks, result_policy="all_tasks_succeed")
    sim.start()
    sim.finish("a", ok=False, error="x")
    sim.finish("b")
    sim.finish("j")
    assert sim.state.status == "failed"


def test_max_parallelism_holds_tasks_and_refills_a_freed_slot_at_once() -> None:
    sim = Sim([{"name": f"t{i}"} for i in range(5)], max_parallelism=2)
    sim.start()
    assert [n for n, _, _ in sim.dispatched] == ["t0", "t1"]
    sim.finish("t0")
    assert [n for n, _, _ in sim.dispatched] == ["t0", "t1", "t2"]
    assert sim.state.in_flight == 2


def test_cancel_cancels_waiting_tasks_and_waits_for_running_ones() -> None:
    sim = chain()
    sim.start()
    sim.started("a")
    fx = sim.apply(CancelRequested(workflow_id="wf-1"))
    assert fx.stop
    assert sim.state.status == "cancelling"
    assert sim.statuses() == {"a": "running", "b": "cancelled", "c": "cancelled"}
    sim.finish("a", ok=False, error="stopped")
    assert sim.statuses()["a"] == "cancelled"
    assert sim.state.status == "cancelled"


def test_cancel_of_a_finished_workflow_is_a_no_op() -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    sim.finish("a")
    sim.apply(CancelRequested(workflow_id="wf-1"))
    assert sim.state.status == "completed"


def test_retry_reruns_only_failed_tasks_and_keeps_completed_outputs() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b", "depends_on": ["a"]}, {"name": "c", "depends_on": ["b"]}]
    )
    sim.start()
    sim.finish("a", output=1)
    sim.finish("b", ok=False, error="x")
    assert sim.state.status == "failed"
    sim.apply(RetryRequested(workflow_id="wf-1"))
    assert sim.state.status == "running"
    assert sim.statuses() == {"a": "completed", "b": "ready", "c": "pending"}
    assert sim.dispatched[-1] == ("b", 2, 0.0)  # a new attempt, so a new message id
    assert sim.state.outputs[0] == 1
    sim.finish("b")
    sim.finish("c")
    assert sim.state.status == "completed"


def test_retry_of_named_tasks_brings_back_their_casualties_only() -> None:
    sim = Sim([{"name": "a"}, {"name": "b"}, {"name": "a2", "depends_on": ["a"]}])
    sim.start()
    sim.finish("a", ok=False, error="x")
    sim.finish("b", ok=False, error="y")
    sim.apply(RetryRequested(workflow_id="wf-1", tasks=["a"]))
    assert sim.statuses() == {"a": "ready", "b": "failed", "a2": "pending"}


def test_retry_gives_a_fresh_retry_budget() -> None:
    sim = Sim([{"name": "a", "num_retries": 1}])
    sim.start()
    sim.finish("a", ok=False, error="x")
    sim.finish("a", ok=False, error="x")
    sim.apply(RetryRequested(workflow_id="wf-1"))
    sim.finish("a", ok=False, error="x")
    assert sim.status("a") == "ready"  # attempt 2 of the new round


def test_retry_of_a_running_workflow_is_ignored() -> None:
    sim = chain()
    sim.start()
    sim.apply(RetryRequested(workflow_id="wf-1"))
    assert sim.history[-1].kind == "retry_ignored"


def test_expired_attempt_is_failed_and_retried() -> None:
    sim = Sim([{"name": "a", "num_retries": 1, "timeout_s": 5}])
    sim.start()
    sim.started("a")
    fx = machine.Effects()
    machine.expire_attempt(sim.plan, sim.state, sim.now + 100, fx, task=0, attempt=1)
    assert sim.state.attempt[0] == 2
    assert "timeout" in sim.state.errors[0]


def test_deadline_cancel_ends_failed() -> None:
    sim = chain()
    sim.start()
    fx = machine.Effects()
    machine.cancel(sim.plan, sim.state, sim.now, fx, "deadline of 5s exceeded", final="failed")
    assert sim.state.status == "failed"
    assert sim.state.error == "deadline of 5s exceeded"


def test_history_records_the_story() -> None:
    sim = Sim([{"name": "a", "num_retries": 1, "retry": {"backoff_s": 0}}])
    sim.start()
    sim.finish("a", ok=False, error="x")
    sim.finish("a")
    kinds = [(e.kind, e.task, e.attempt) for e in sim.history]
    assert kinds == [
        ("submitted", None, 0),
        ("dispatched", "a", 1),
        ("started", "a", 1),  # from the 'finished': its 'started' was never sent
        ("retried", "a", 1),
        ("dispatched", "a", 2),
        ("started", "a", 2),
        ("completed", "a", 2),
        ("workflow_completed", None, 0),
    ]


def test_long_skip_chain_does_not_recurse() -> None:
    tasks = [{"name": "t0"}, {"name": "t1", "depends_on": ["t0"], "condition": "inputs.t0"}]
    tasks += [{"name": f"t{i}", "depends_on": [f"t{i - 1}"]} for i in range(2, 5000)]
    sim = Sim(tasks)
    sim.start()
    sim.finish("t0", output=False)
    assert sim.state.status == "completed"
    assert sim.state.counts[6] == 4999  # skipped


def test_an_attempt_delivered_again_is_noted_once_in_the_history() -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    sim.started("a")  # the first delivery's worker dies without reporting
    sim.now += 70

    def again() -> TaskStarted:
        return TaskStarted(
            workflow_id="wf-1", task=0, attempt=1, at=sim.now, worker="w2", delivery=2
        )

    sim.apply(again())
    sim.apply(again())  # the same event posted twice (at-least-once)

    [note] = [e for e in sim.history if e.kind == "redelivered"]
    assert (note.task, note.attempt) == ("a", 1)
    assert note.detail.startswith("delivered again to worker w2 (delivery 2)")
    assert sim.status("a") == "running"
    assert sim.state.attempt[0] == 1  # a delivery is not an attempt
