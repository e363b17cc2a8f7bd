"""``explain``, specified one situation at a time on the pure state machine (no store)."""

from __future__ import annotations

from typing import Any

import pytest

from dagq.explanation import QUEUE_WAIT_S, Facts, QueueFacts, condition_record, explain
from dagq.history import HistoryEntry
from dagq.views import depths, layer_summary
from tests.helpers import Sim

pytestmark = pytest.mark.timeout(10)


def why(sim: Sim, task: str, **facts: Any) -> Any:
    return explain(sim.plan, sim.state, sim.history, sim.index(task), Facts(now=sim.now, **facts))


def kinds(found: Any) -> list[str]:
    return [w.kind for w in found.waiting_for]


def test_a_pending_child_waits_for_its_unfinished_parents_under_its_policy() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b"}, {"name": "c", "depends_on": ["a", "b"], "dep_policy": 2}]
    )
    sim.start()
    sim.finish("a")
    found = why(sim, "c")
    assert found.status == "pending"
    assert found.dependencies.policy == "2"
    assert found.dependencies.satisfied is None
    assert [(p.name, p.counts_as) for p in found.dependencies.parents] == [
        ("a", "done"),
        ("b", "open"),
    ]
    assert kinds(found) == ["parents"]
    assert "waiting for b" in found.summary


def test_a_satisfied_policy_names_the_parents_that_satisfied_it() -> None:
    sim = Sim([{"name": "a"}, {"name": "b"}, {"name": "c", "depends_on": ["a", "b"]}])
    sim.start()
    sim.finish("a")
    sim.finish("b")
    found = why(sim, "c")
    assert found.dependencies.satisfied is True
    assert "satisfied by a, b" in found.dependencies.summary


def test_under_jobq_semantics_a_skipped_parent_satisfies_any_policy() -> None:
    sim = Sim(
        [
            {"name": "a"},
            {"name": "b", "depends_on": ["a"], "condition": "inputs.a.ok"},
            {"name": "c"},
            {"name": "d", "depends_on": ["b", "c"], "dep_policy": "any"},
        ]
    )
    sim.start()
    sim.finish("a", output={"ok": False})
    sim.finish("c")
    assert "satisfied by c (" in why(sim, "d").dependencies.summary
    jobq = why(sim, "d", semantics="jobq")
    assert jobq.semantics == "jobq"
    assert "satisfied by b, c (" in jobq.dependencies.summary


def test_an_upstream_failed_task_says_its_policy_cannot_be_satisfied_and_by_whom() -> None:
    sim = Sim([{"name": "a"}, {"name": "b", "depends_on": ["a"]}])
    sim.start()
    sim.finish("a", ok=False, error="boom")
    found = why(sim, "b")
    assert found.status == "upstream_failed"
    assert found.dependencies.satisfied is False
    assert "cannot be satisfied" in found.dependencies.summary
    assert "did not succeed: a" in found.summary
    assert found.waiting_for == []


def test_a_false_condition_is_shown_with_its_expression_and_recorded_result() -> None:
    sim = Sim(
        [{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "inputs.a.score > 0.5"}]
    )
    sim.start()
    sim.finish("a", output={"score": 0.1})
    found = why(sim, "b")
    assert found.status == "skipped"
    assert found.condition is not None
    assert found.condition.expression == "inputs.a.score > 0.5"
    assert found.condition.result == "false"
    assert (
        found.condition.detail
        == "'inputs.a.score > 0.5' is false; it read inputs.a = {'score': 0.1}"
    )
    assert found.summary == "skipped: condition is false"


def test_a_condition_that_let_the_task_run_is_true() -> None:
    sim = Sim([{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "inputs.a.ok"}])
    sim.start()
    sim.finish("a", output={"ok": True})
    found = why(sim, "b")
    assert found.condition is not None and found.condition.result == "true"


def test_a_condition_that_cannot_be_evaluated_is_an_error_with_its_message() -> None:
    sim = Sim([{"name": "a"}, {"name": "b", "depends_on": ["a"], "condition": "inputs.a.n > 3"}])
    sim.start()
    sim.finish("a", output={"n": "fast"})
    found = why(sim, "b")
    assert found.condition is not None
    assert found.condition.result == "error"
    assert found.condition.detail is not None
    assert found.condition.detail.startswith("error: cannot compare string > int")
    assert "it read inputs.a = {'n': 'fast'}" in found.condition.detail


def test_the_condition_record_is_read_from_a_condition_entry_when_the_history_has_one() -> None:
    entries = [
        HistoryEntry(1.0, "dispatched", "a", 1),
        HistoryEntry(2.0, "condition", "b", 0, "inputs.a.x > 1 with inputs.a.x=0: false"),
    ]
    record = condition_record(entries)
    assert record is not None and record.kind == "condition"


def test_retries_show_the_budget_the_policy_and_each_attempts_reason() -> None:
    sim = Sim(
        [
            {
                "name": "a",
                "num_retries": 2,
                "retry": {"backoff_s": 5, "retry_on": ["IOError"]},
            }
        ]
    )
    sim.start()
    sim.finish("a", ok=False, error="disk full", error_type="IOError")
    found = why(sim, "a")
    assert found.retries.max_attempts == 3
    assert found.retries.attempts_used == 2
    assert found.retries.retry_on == ["IOError"]
    retried = [e for e in found.retries.attempts if e.kind == "retried"]
    assert retried and "disk full" in (retried[0].detail or "")
    assert kinds(found) == ["retry_delay"]
    assert "retry delay" in found.summary


def test_a_failure_not_retried_says_why() -> None:
    sim = Sim([{"name": "a", "num_retries": 3, "retry": {"no_retry_on": ["KeyError"]}}])
    sim.start()
    sim.finish("a", ok=False, error="KeyError: 'x'", error_type="KeyError")
    found = why(sim, "a")
    assert found.status == "failed"
    assert "KeyError is in no_retry_on" in found.summary


def test_a_sent_task_waits_for_a_worker_of_its_queue_with_the_queue_depth() -> None:
    sim = Sim([{"name": "a", "queue": "gpu"}])
    sim.start()
    sim.now += 3
    found = why(sim, "a", queue=QueueFacts("gpu", 4, 1, 3.0))
    assert kinds(found) == ["queue"]
    assert "queue 'gpu' (4 waiting, 1 in flight, oldest 3s)" in found.waiting_for[0].detail


def test_a_task_sent_long_ago_and_never_started_suspects_no_worker() -> None:
    sim = Sim([{"name": "a", "queue": "gpu"}])
    sim.start()
    sim.now += QUEUE_WAIT_S + 1
    found = why(sim, "a", queue=QueueFacts("gpu", 1, 0, QUEUE_WAIT_S + 1))
    assert kinds(found) == ["queue", "no_worker"]
    assert found.waiting_for[1].fix == "start one: dagq worker -q gpu"


def test_a_task_sent_to_a_queue_no_live_worker_serves_says_so_at_once() -> None:
    sim = Sim([{"name": "a", "queue": "gpu"}])
    sim.start()
    sim.now += 1
    found = why(sim, "a", queue=QueueFacts("gpu", 1, 0, 1.0, workers=0))
    assert kinds(found) == ["queue", "no_worker"]
    assert "no live worker serves queue 'gpu'" in found.waiting_for[1].detail


def test_a_task_sent_to_a_queue_a_live_worker_serves_waits_for_it() -> None:
    sim = Sim([{"name": "a", "queue": "gpu"}])
    sim.start()
    sim.now += 1
    found = why(sim, "a", queue=QueueFacts("gpu", 1, 0, 1.0, workers=2))
    assert kinds(found) == ["queue"]


def test_a_dead_lettered_message_is_named_with_the_command_that_replays_it() -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    found = why(sim, "a", dead_letter=("default/7", "delivered 5 times"))
    assert kinds(found) == ["queue", "dead_letter"]
    assert found.waiting_for[1].fix == "after fixing the cause: dagq dlq replay default/7"


def test_a_task_held_by_max_parallelism_says_so() -> None:
    sim = Sim([{"name": "a"}, {"name": "b"}], max_parallelism=1)
    sim.start()
    assert [name for name, *_ in sim.dispatched] == ["a"]
    found = why(sim, "b")
    assert kinds(found) == ["parallelism"]
    assert "1 of 1 slots in use" in found.waiting_for[0].detail


def test_a_foreach_task_shows_items_held_by_max_parallel() -> None:
    sim = Sim(
        [{"name": "fan", "foreach": "params.items", "max_parallel": 2, "cmd": "true"}],
        params={"items": [1, 2, 3, 4, 5]},
    )
    sim.start()
    found = why(sim, "fan")
    assert kinds(found) == ["items", "max_parallel"]
    assert "3 items held by max_parallel=2" in found.waiting_for[1].detail


def test_a_task_waiting_for_a_signal_says_which_and_how_to_send_it() -> None:
    sim = Sim([{"name": "approve", "wait_for": {"signal": "go", "timeout_s": 60}}])
    sim.start()
    found = why(sim, "approve")
    assert kinds(found) == ["signal"]
    assert found.waiting_for[0].fix == "dagq signal wf-1 go [--data JSON]"
    assert "after 60s it gives up (fail)" in found.waiting_for[0].detail


def test_a_timer_says_when_it_fires() -> None:
    sim = Sim([{"name": "pause", "sleep_s": 30}])
    sim.start()
    sim.now += 10
    found = why(sim, "pause")
    assert kinds(found) == ["timer"]
    assert "fires in 20s" in found.waiting_for[0].detail


def test_a_running_task_says_how_long_and_when_it_times_out() -> None:
    sim = Sim([{"name": "a", "timeout_s": 100}])
    sim.start()
    sim.started("a")
    sim.now += 30
    found = why(sim, "a")
    assert kinds(found) == ["worker"]
    assert "running on a worker for 30s; it times out in 70s" in found.waiting_for[0].detail


def test_a_running_task_names_the_worker_that_reports_it() -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    sim.started("a")
    sim.now += 30
    found = why(sim, "a", runner="w1 on host-1, pid 42")
    assert kinds(found) == ["worker"]
    assert "running on worker w1 on host-1, pid 42 for 30s" in found.waiting_for[0].detail


@pytest.mark.parametrize(("after_s", "kind"), [(5, "worker"), (30, "lost_worker")])
def test_a_running_task_no_live_worker_reports_is_suspected_lost_after_a_while(
    after_s: float, kind: str
) -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    sim.started("a")
    sim.now += after_s  # a worker's record lists a new attempt within a few seconds
    found = why(sim, "a", runner="")
    assert kinds(found) == [kind]
    if kind == "lost_worker":
        assert "no live worker reports running it" in found.waiting_for[0].detail


def test_no_coordinator_and_a_quarantine_come_first_for_an_unfinished_task() -> None:
    sim = Sim([{"name": "a"}])
    sim.start()
    found = why(sim, "a", coordinator=False, quarantine="a bug met while applying")
    assert kinds(found)[:2] == ["quarantine", "coordinator"]
    assert found.waiting_for[0].fix == "once the cause is fixed: dagq quarantine release wf-1"


def test_events_of_the_task_include_its_instances_but_not_a_namesake_prefix() -> None:
    sim = Sim([{"name": "a"}, {"name": "ab"}])
    sim.start()
    sim.history.append(HistoryEntry(sim.now, "retried", "a[3]", 1, "item 3 failed"))
    found = why(sim, "a")
    assert {e.task for e in found.events} == {"a", "a[3]"}


def test_layers_are_the_longest_path_from_a_root() -> None:
    sim = Sim(
        [
            {"name": "a"},
            {"name": "b", "depends_on": ["a"]},
            {"name": "c", "depends_on": ["a", "b"]},
            {"name": "d"},
        ]
    )
    assert depths(sim.plan) == [0, 1, 2, 0]
    sim.start()
    sim.finish("a")
    summary = layer_summary("test", sim.plan, sim.state)
    assert [(layer.layer, layer.total, layer.done) for layer in summary.layers] == [
        (0, 2, 1),
        (1, 1, 0),
        (2, 1, 0),
    ]
    assert summary.layers[0].counts == {"ready": 1, "completed": 1}
    assert summary.layers[0].tasks == ["a", "d"]


def test_a_recorded_evaluation_is_read_by_its_head_not_by_the_values_it_read() -> None:
    from dagq.explanation import _condition_result
    from dagq.history import HistoryEntry

    def record(detail: str) -> HistoryEntry:
        return HistoryEntry(at=1.0, kind="condition", task="b", attempt=0, detail=detail)

    expr = "inputs.a.ok"
    assert (
        _condition_result(record("'inputs.a.ok' is true; it read inputs.a = {\"ok\": false}"), expr)
        == "true"
    )
    assert (
        _condition_result(record("'inputs.a.ok' is false; it read inputs.a = {\"ok\": true}"), expr)
        == "false"
    )
    assert (
        _condition_result(record("error: no field 'ok'; it read inputs.a = null"), expr) == "error"
    )
