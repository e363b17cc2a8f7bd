"""Durable-execution patterns in the state machine: timers, signals, loops, races,
deadlines and retry classification (no store, no clock)."""

from __future__ import annotations

import pytest

from dagq import machine
from dagq.dispatching import task_message
from dagq.errors import ValidationError
from dagq.messages import CancelRequested, RetryRequested, SignalSent, TaskFinished, decode_task
from tests.helpers import Sim, definition


def signal(sim: Sim, name: str, data: object = None) -> None:
    sim.apply(SignalSent(workflow_id="wf-1", name=name, data=data))


def wake(sim: Sim, name: str) -> machine.Effects:
    fx = machine.Effects()
    machine.wake(sim.plan, sim.state, sim.now, fx, task=sim.index(name))
    sim._collect(fx)
    return fx


# --- durable timers ------------------------------------------------------------------


def test_a_timer_waits_without_a_worker_and_completes_when_due() -> None:
    sim = Sim([{"name": "nap", "sleep_s": 60}, {"name": "after", "depends_on": ["nap"]}])
    fx = sim.start()
    assert sim.status("nap") == "waiting"
    assert fx.timers == [(sim.now + 60, 0)]
    assert sim.dispatched == []
    sim.now += 30
    wake(sim, "nap")
    assert sim.status("nap") == "waiting"
    sim.now += 30
    wake(sim, "nap")
    assert sim.status("nap") == "completed"
    assert sim.dispatched == [("after", 1, 0.0)]


def test_a_timer_can_take_its_delay_from_an_upstream_output() -> None:
    sim = Sim(
        [
            {"name": "plan"},
            {"name": "nap", "sleep_s": "inputs.plan.wait_s * 2", "depends_on": ["plan"]},
        ]
    )
    sim.start()
    sim.finish("plan", output={"wait_s": 5})
    assert sim.state.wake_at[sim.index("nap")] == sim.now + 10


def test_a_computed_delay_that_is_not_a_number_fails_the_task_clearly() -> None:
    sim = Sim(
        [{"name": "plan"}, {"name": "nap", "sleep_s": "inputs.plan.when", "depends_on": ["plan"]}]
    )
    sim.start()
    sim.finish("plan", output={"when": "tomorrow"})
    assert sim.status("nap") == "failed"
    assert "sleep_s must be a number of seconds" in sim.state.errors[sim.index("nap")]


# --- signals -------------------------------------------------------------------------


def approval() -> list[dict[str, object]]:
    return [
        {"name": "draft"},
        {
            "name": "review",
            "wait_for": {"signal": "approve", "timeout_s": 3600},
            "depends_on": ["draft"],
        },
        {"name": "publish", "depends_on": ["review"], "condition": "inputs.review.approved"},
    ]


def test_a_signal_completes_the_waiting_task_with_its_data_as_output() -> None:
    sim = Sim(approval())
    sim.start()
    sim.finish("draft")
    assert sim.status("review") == "waiting"
    signal(sim, "approve", {"approved": True, "by": "ana"})
    assert sim.status("review") == "completed"
    assert sim.state.outputs[sim.index("review")] == {"approved": True, "by": "ana"}
    assert sim.dispatched[-1][0] == "publish"


def test_a_rejection_takes_the_other_branch() -> None:
    sim = Sim(approval())
    sim.start()
    sim.finish("draft")
    signal(sim, "approve", {"approved": False})
    assert sim.status("publish") == "skipped"


def test_a_signal_sent_before_the_task_waits_is_kept_not_lost() -> None:
    sim = Sim(approval())
    sim.start()
    signal(sim, "approve", {"approved": True})
    assert sim.status("review") == "pending"
    sim.finish("draft")
    assert sim.status("review") == "completed"


def test_an_expired_wait_fails_closed_by_default() -> None:
    sim = Sim(approval())
    sim.start()
    sim.finish("draft")
    sim.now += 3600
    wake(sim, "review")
    assert sim.status("review") == "failed"
    assert "no signal 'approve' within 3600s" in sim.state.errors[sim.index("review")]
    assert sim.state.status == "failed"


def test_an_expired_wait_can_skip_instead() -> None:
    tasks = approval()
    tasks[1]["wait_for"] = {"signal": "approve", "timeout_s": 10, "on_timeout": "skip"}
    sim = Sim(tasks)
    sim.start()
    sim.finish("draft")
    sim.now += 10
    wake(sim, "review")
    assert sim.status("review") == "skipped"
    assert sim.state.status == "completed"


def test_cancel_cancels_a_waiting_task_at_once() -> None:
    sim = Sim(approval())
    sim.start()
    sim.finish("draft")
    sim.apply(CancelRequested(workflow_id="wf-1"))
    assert sim.status("review") == "cancelled"
    assert sim.state.status == "cancelled"


def test_a_signal_to_a_finished_workflow_is_ignored() -> None:
    sim = Sim(approval())
    sim.start()
    sim.apply(CancelRequested(workflow_id="wf-1"))
    signal(sim, "approve", {"approved": True})
    assert sim.history[-1].kind == "signal_ignored"


def test_a_timed_out_wait_retried_waits_again() -> None:
    sim = Sim(approval())
    sim.start()
    sim.finish("draft")
    sim.now += 3600
    wake(sim, "review")
    sim.apply(RetryRequested(workflow_id="wf-1"))
    assert sim.status("review") == "waiting"
    signal(sim, "approve", {"approved": True})
    assert sim.status("review") == "completed"


# --- loops ---------------------------------------------------------------------------


def refine(**loop: object) -> Sim:
    spec = {"until": "output.valid", "max_iterations": 3, **loop}
    return Sim([{"name": "refine", "loop": spec}, {"name": "publish", "depends_on": ["refine"]}])


def test_a_loop_reruns_until_its_condition_holds() -> None:
    sim = refine()
    sim.start()
    sim.finish("refine", output={"valid": False, "draft": 1})
    assert sim.status("refine") == "ready"
    assert sim.state.iteration[0] == 2
    assert sim.state.outputs[0] == {"valid": False, "draft": 1}  # the next one sees it
    sim.finish("refine", output={"valid": True, "draft": 2})
    assert sim.status("refine") == "completed"
    assert [d[:2] for d in sim.dispatched] == [("refine", 1), ("refine", 2), ("publish", 1)]


def test_a_loop_that_never_converges_fails_at_its_cap() -> None:
    sim = refine()
    sim.start()
    for _ in range(3):
        sim.finish("refine", output={"valid": False})
    assert sim.status("refine") == "failed"
    assert "within 3 iterations" in sim.state.errors[0]


def test_a_loop_can_complete_when_exhausted() -> None:
    sim = refine(on_exhausted="complete")
    sim.start()
    for _ in range(3):
        sim.finish("refine", output={"valid": False})
    assert sim.status("refine") == "completed"


def test_each_iteration_has_its_own_retries() -> None:
    sim = Sim(
        [
            {
                "name": "refine",
                "num_retries": 1,
                "retry": {"backoff_s": 0},
                "loop": {"until": "output.valid", "max_iterations": 3},
            }
        ]
    )
    sim.start()
    sim.finish("refine", ok=False, error="flaky")
    sim.finish("refine", output={"valid": False})
    sim.finish("refine", ok=False, error="flaky")
    assert sim.status("refine") == "ready"  # iteration 2's own retry


def test_a_loop_without_a_cap_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_iterations"):
        definition([{"name": "x", "loop": {"until": "output.ok"}}])


# --- races -----------------------------------------------------------------------------


def race() -> Sim:
    return Sim(
        [
            {"name": "fast"},
            {"name": "slow"},
            {
                "name": "first",
                "depends_on": ["fast", "slow"],
                "dep_policy": "any",
                "cancel_remaining": True,
            },
        ]
    )


def test_a_race_cancels_the_losers_once_one_wins() -> None:
    sim = race()
    sim.start()
    sim.started("slow")
    fx = sim.finish("fast", output=1)
    assert sim.status("first") == "ready"
    assert sim.status("slow") == "cancelled"
    assert fx.stop and sim.state.stop_requests == {sim.index("slow"): 1}
    sim.finish("first")
    assert sim.state.status == "completed"


def test_a_late_result_of_a_loser_changes_nothing() -> None:
    sim = race()
    sim.start()
    sim.finish("fast")
    sim.finish("slow", attempt=1)
    assert sim.status("slow") == "cancelled"


def test_a_race_needs_an_any_policy() -> None:
    with pytest.raises(ValidationError, match="a race needs dep_policy 'any'"):
        definition([{"name": "a"}, {"name": "b", "depends_on": ["a"], "cancel_remaining": True}])


# --- deadlines and retry classification -------------------------------------------------


def test_a_task_deadline_stops_retries_once_passed() -> None:
    sim = Sim([{"name": "a", "num_retries": 10, "task_deadline_s": 60, "retry": {"backoff_s": 0}}])
    sim.start()
    sim.now += 61
    sim.finish("a", ok=False, error="boom")
    assert sim.status("a") == "failed"
    assert "task deadline of 60s exceeded" in sim.history[-2].detail


def attempt_timeout(sim: Sim, fx: machine.Effects, name: str) -> float | None:
    """The time limit the message of ``name``'s attempt dispatched in ``fx`` carries."""
    [d] = [d for d in fx.dispatch if d.task == sim.index(name)]
    return decode_task(bytes(task_message(sim.plan, sim.state, d).message.body)).timeout_s


def held_behind_a_long_task() -> Sim:
    """'quick' (3 s deadline, one retry) waits behind 'long' at max_parallelism 1."""
    deadline = {"task_deadline_s": 3, "num_retries": 1, "retry": {"backoff_s": 0, "jitter": 0}}
    return Sim([{"name": "long"}, {"name": "quick", **deadline}], max_parallelism=1)


def test_time_held_back_by_max_parallelism_does_not_count_against_a_task_deadline() -> None:
    sim = held_behind_a_long_task()
    sim.start()
    assert sim.ready_names() == ["long", "quick"] and sim.dispatched == [("long", 1, 0.0)]
    sim.now += 4

    fx = sim.finish("long")

    assert sim.dispatched[-1] == ("quick", 1, 0.0)
    assert attempt_timeout(sim, fx, "quick") == 3  # its whole deadline, not 0.001 s
    sim.now += 1
    fx = sim.finish("quick", ok=False, error="flaky")
    assert sim.status("quick") == "ready", "its retry was refused"
    assert attempt_timeout(sim, fx, "quick") == 2  # what is left of the 3 s


def test_a_task_deadline_still_counts_from_the_first_send_across_retries() -> None:
    sim = held_behind_a_long_task()
    sim.start()
    sim.now += 4
    sim.finish("long")
    sim.now += 3

    sim.finish("quick", ok=False, error="slow")

    assert sim.status("quick") == "failed"
    assert "task deadline of 3s exceeded" in (sim.history[-2].detail or "")


def test_a_foreach_instance_sent_late_gets_only_what_is_left_of_the_deadline() -> None:
    sim = Sim(
        [{"name": "work", "foreach": "params.items", "max_parallel": 1, "task_deadline_s": 10}],
        params={"items": [1, 2]},
    )
    sim.start()
    sim.now += 4
    i = sim.index("work")
    fx = sim.apply(TaskFinished(workflow_id="wf-1", task=i, attempt=1, at=sim.now, ok=True, item=0))

    [d] = fx.dispatch
    assert d.item == 1
    assert decode_task(bytes(task_message(sim.plan, sim.state, d).message.body)).timeout_s == 6


def test_no_retry_on_names_exception_types_that_fail_at_once() -> None:
    sim = Sim([{"name": "a", "num_retries": 3, "retry": {"no_retry_on": ["ValueError"]}}])
    sim.start()
    sim.finish("a", ok=False, error="ValueError: bad", error_type="ValueError")
    assert sim.status("a") == "failed"


def test_retry_on_retries_only_the_named_exception_types() -> None:
    sim = Sim(
        [{"name": "a", "num_retries": 3, "retry": {"retry_on": ["TimeoutError"], "backoff_s": 0}}]
    )
    sim.start()
    sim.finish("a", ok=False, error="TimeoutError", error_type="TimeoutError")
    assert sim.status("a") == "ready"
    sim.finish("a", ok=False, error="KeyError: x", error_type="KeyError")
    assert sim.status("a") == "failed"


def test_a_cap_on_total_retry_delay_ends_the_retries() -> None:
    sim = Sim(
        [
            {
                "name": "a",
                "num_retries": 10,
                "retry": {"backoff_s": 10, "jitter": 0, "max_total_delay_s": 25},
            }
        ]
    )
    sim.start()
    sim.finish("a", ok=False, error="x")  # +10
    sim.finish("a", ok=False, error="x")  # +20 would be 30 > 25
    assert sim.status("a") == "failed"
    assert "max_total_delay_s=25" in sim.history[-2].detail


# --- compensation (sagas) -------------------------------------------------------------


def saga(**undo: object) -> Sim:
    compensate = {"cmd": "undo.sh", "num_retries": 1, "retry": {"backoff_s": 0}, **undo}
    return Sim(
        [
            {"name": "reserve", "compensate": compensate},
            {"name": "charge", "depends_on": ["reserve"], "compensate": compensate},
            {"name": "ship", "depends_on": ["charge"]},
        ]
    )


def finish_undo(sim: Sim, name: str, *, ok: bool = True) -> None:
    i = sim.index(name)
    sim.apply(
        TaskFinished(
            workflow_id="wf-1",
            task=i,
            attempt=sim.state.undo_attempt[i],
            at=sim.now,
            ok=ok,
            error=None if ok else "undo broke",
            undo=True,
        )
    )


def undo_dispatches(sim: Sim) -> list[str | None]:
    return [e.task for e in sim.history if e.kind == "dispatched" and e.detail == "compensation"]


def test_a_failure_undoes_completed_tasks_in_reverse_order_one_at_a_time() -> None:
    sim = saga()
    sim.start()
    sim.now += 1
    sim.finish("reserve")
    sim.now += 1
    sim.finish("charge")
    sim.finish("ship", ok=False, error="carrier down")
    assert sim.state.status == "compensating"
    assert undo_dispatches(sim) == ["charge"]
    finish_undo(sim, "charge")
    assert undo_dispatches(sim) == ["charge", "reserve"]
    finish_undo(sim, "reserve")
    assert sim.state.status == "failed"
    assert "task 'ship' failed" in (sim.state.error or "")
    kinds = [e.kind for e in sim.history]
    assert kinds.count("compensated") == 2 and kinds[-1] == "workflow_failed"


def test_a_cancelled_run_is_compensated_then_ends_cancelled() -> None:
    sim = saga()
    sim.start()
    sim.finish("reserve")
    sim.apply(CancelRequested(workflow_id="wf-1"))
    assert sim.state.status == "compensating"
    finish_undo(sim, "reserve")
    assert sim.state.status == "cancelled"


def test_an_undo_that_exhausts_its_retries_ends_in_compensation_failed() -> None:
    sim = saga()
    sim.start()
    sim.finish("reserve")
    sim.finish("charge")
    sim.finish("ship", ok=False, error="x")
    finish_undo(sim, "charge", ok=False)  # attempt 1; retried
    assert sim.state.undo_attempt[sim.index("charge")] == 2
    finish_undo(sim, "charge", ok=False)  # attempt 2 of 2: given up, the next undo runs
    assert undo_dispatches(sim)[-1] == "reserve"
    finish_undo(sim, "reserve")
    assert sim.state.status == "compensation_failed"
    assert "a compensation failed after the run failed" in (sim.state.error or "")


def test_a_completed_run_is_not_compensated() -> None:
    sim = saga()
    sim.start()
    for name in ("reserve", "charge", "ship"):
        sim.finish(name)
    assert sim.state.status == "completed"
    assert undo_dispatches(sim) == []


def test_cancel_does_not_interrupt_a_compensation() -> None:
    sim = saga()
    sim.start()
    sim.finish("reserve")
    sim.finish("charge", ok=False, error="x", retryable=False)
    assert sim.state.status == "compensating"
    sim.apply(CancelRequested(workflow_id="wf-1"))
    assert sim.state.status == "compensating"


def test_a_duplicate_undo_result_changes_nothing() -> None:
    sim = saga()
    sim.start()
    sim.finish("reserve")
    sim.finish("charge", ok=False, error="x", retryable=False)
    finish_undo(sim, "reserve")
    status = sim.state.status
    finish_undo(sim, "reserve")
    assert sim.state.status == status == "failed"


def test_a_compensation_on_a_wait_is_refused() -> None:
    with pytest.raises(ValidationError, match="has no side effects to undo"):
        definition([{"name": "w", "wait_for": {"signal": "x"}, "compensate": {"cmd": "true"}}])


# --- foreach (dynamic fan-out) -----------------------------------------------------------


def fan(**options: object) -> Sim:
    return Sim(
        [
            {"name": "split"},
            {"name": "work", "depends_on": ["split"], "foreach": "inputs.split.chunks", **options},
            {"name": "reduce", "depends_on": ["work"]},
        ]
    )


def finish_item(sim: Sim, k: int, *, ok: bool = True, output: object = None) -> None:
    i = sim.index("work")
    group = sim.state.groups[i]
    sim.apply(
        TaskFinished(
            workflow_id="wf-1",
            task=i,
            attempt=group.attempt[k],
            at=sim.now,
            ok=ok,
            output=output,
            error=None if ok else "bad chunk",
            item=k,
        )
    )


def sent_items(fx: machine.Effects) -> list[int]:
    return [d.item for d in fx.dispatch if d.item >= 0]


def test_foreach_expands_into_one_instance_per_item() -> None:
    sim = fan()
    sim.start()
    fx = sim.finish("split", output={"chunks": ["a", "b", "c"]})
    assert sent_items(fx) == [0, 1, 2]
    assert sim.status("work") == "running"
    assert sim.state.groups[sim.index("work")].items == ["a", "b", "c"]


def test_dependants_get_the_outputs_in_index_order_not_completion_order() -> None:
    sim = fan()
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b", "c"]})
    for k in (2, 0, 1):
        finish_item(sim, k, output=f"sum-{k}")
    assert sim.status("work") == "completed"
    assert sim.state.outputs[sim.index("work")] == ["sum-0", "sum-1", "sum-2"]
    assert sim.dispatched[-1][0] == "reduce"


def test_max_parallel_caps_the_instances_in_flight() -> None:
    sim = fan(max_parallel=2)
    sim.start()
    fx = sim.finish("split", output={"chunks": list(range(5))})
    assert sent_items(fx) == [0, 1]
    finish_item(sim, 1)
    assert sim.state.groups[sim.index("work")].attempt[2] == 1


def test_a_failed_item_is_retried_alone() -> None:
    sim = fan(num_retries=1, retry={"backoff_s": 0})
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b"]})
    finish_item(sim, 0, ok=False)
    group = sim.state.groups[sim.index("work")]
    assert (group.attempt[0], group.attempt[1]) == (2, 1)


def test_too_many_failed_items_fail_the_task_and_name_them() -> None:
    sim = fan(allow_failures=1)
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b", "c"]})
    finish_item(sim, 0, ok=False)
    finish_item(sim, 1)
    finish_item(sim, 2, ok=False)
    assert sim.status("work") == "failed"
    assert "2 of 3 items failed (allowed: 1): items 0, 2" in sim.state.errors[sim.index("work")]
    assert sim.status("reduce") == "upstream_failed"


def test_failures_within_allow_failures_complete_the_task_with_gaps() -> None:
    sim = fan(allow_failures=0.5)
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b"]})
    finish_item(sim, 0, ok=False)
    finish_item(sim, 1, output=1)
    assert sim.status("work") == "completed"
    assert sim.state.outputs[sim.index("work")] == [None, 1]


def test_an_empty_list_completes_at_once_with_an_empty_output() -> None:
    sim = fan()
    sim.start()
    sim.finish("split", output={"chunks": []})
    assert sim.status("work") == "completed"
    assert sim.state.outputs[sim.index("work")] == []


def test_a_foreach_that_is_not_a_list_fails_clearly() -> None:
    sim = fan()
    sim.start()
    sim.finish("split", output={"chunks": "abc"})
    assert sim.status("work") == "failed"
    assert "foreach must give a list, got str" in sim.state.errors[sim.index("work")]


def test_retry_of_a_failed_foreach_reruns_only_its_failed_items() -> None:
    sim = fan()
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b"]})
    finish_item(sim, 0, output="ok")
    finish_item(sim, 1, ok=False)
    assert sim.state.status == "failed"
    sim.apply(RetryRequested(workflow_id="wf-1"))
    group = sim.state.groups[sim.index("work")]
    assert (group.attempt[0], group.attempt[1]) == (1, 2)
    finish_item(sim, 1, output="fixed")
    assert sim.state.outputs[sim.index("work")] == ["ok", "fixed"]


def test_cancel_cancels_unsent_items_and_waits_for_running_ones() -> None:
    sim = fan(max_parallel=1)
    sim.start()
    sim.finish("split", output={"chunks": ["a", "b", "c"]})
    sim.apply(CancelRequested(workflow_id="wf-1"))
    assert sim.status("work") == "running"
    finish_item(sim, 0, ok=False)
    assert sim.status("work") == "cancelled"
    assert sim.state.status == "cancelled"


def test_a_large_list_is_kept_as_a_document() -> None:
    sim = fan()
    sim.start()
    fx = sim.finish("split", output={"chunks": ["x" * 100] * 1000})
    group = sim.state.groups[sim.index("work")]
    assert group.items is None and group.items_ref
    assert [key for key, _ in fx.documents] == [group.items_ref]


def test_foreach_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="max_parallel only applies to a foreach task"):
        definition([{"name": "a", "max_parallel": 2}])
    with pytest.raises(ValidationError, match="cannot also have loop"):
        definition(
            [{"name": "a", "foreach": "params.xs", "loop": {"until": "true", "max_iterations": 2}}],
            params={"xs": [1]},
        )
