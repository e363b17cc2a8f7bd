"""The expression language of conditions and templates, behaviour by behaviour."""

from __future__ import annotations

import shlex
from typing import Any

import msgspec
import pytest

from dagq.errors import DagqError, ValidationError
from dagq.expression import (
    MAX_DEPTH,
    MAX_LENGTH,
    Expr,
    ExpressionError,
    parse,
    references,
    render,
    template_expressions,
    truthy,
)

INPUTS: dict[str, Any] = {
    "train": {"mae": 0.05, "converged": True},
    "A": {"score": 0.3},
    "B": {"loss": 0.05},
    "prep/featurize": {"passed": True},
    "validate": {"has_errors": False},
    "train-1": {"loss": 0.001, "converged": False},
    "train-2": {"loss": 0.002, "converged": True},
    "scores": {"values": [3, 1, 2], "name": "run"},
}
PARAMS: dict[str, Any] = {"threshold": 0.5, "mode": "fast", "n": 3}


def ev(text: str, inputs: dict[str, Any] | None = None, **params: Any) -> Any:
    env = {"inputs": INPUTS if inputs is None else inputs, "params": {**PARAMS, **params}}
    return parse(text).evaluate(env)


def parse_error(text: str, **kwargs: Any) -> str:
    with pytest.raises(ValidationError) as info:
        parse(text, **kwargs)
    return str(info.value)


def eval_error(text: str, inputs: dict[str, Any] | None = None) -> str:
    with pytest.raises(ExpressionError) as info:
        ev(text, inputs)
    return str(info.value)


# --- the ai4s-jobq examples ----------------------------------------------------


def test_attribute_path_reads_a_parent_output() -> None:
    assert ev("inputs.train.mae < 0.1") is True


def test_conditions_combine_with_and() -> None:
    assert ev("inputs.A.score > 0.28 and inputs.B.loss < 0.1") is True


def test_brackets_read_a_task_whose_name_has_a_slash() -> None:
    assert ev('inputs["prep/featurize"].passed == True') is True


def test_not_negates_a_flag() -> None:
    assert ev("not inputs.validate.has_errors") is True


def test_all_over_star_glob() -> None:
    outputs = {"a": {"loss": 0.001}, "b": {"loss": 0.005}}
    assert ev('all(inputs["*"].loss < 0.01)', outputs) is True
    assert ev('all(inputs["*"].loss < 0.002)', outputs) is False


def test_dot_star_is_shorthand_for_star_glob() -> None:
    outputs = {"a": {"loss": 0.001}, "b": {"loss": 0.05}}
    assert ev("all(inputs.*.loss < 0.01)", outputs) == ev('all(inputs["*"].loss < 0.01)', outputs)
    assert parse("all(inputs.*.ok)").node == parse('all(inputs["*"].ok)').node


def test_any_over_prefix_glob_looks_only_at_matching_inputs() -> None:
    assert ev('any(inputs["train-*"].converged)') is True
    assert ev('all(inputs["train-*"].converged)') is False


def test_almost_all_allows_up_to_n_failures() -> None:
    outputs = {f"t{i}": {"loss": 0.1 if i < 5 else 0.001} for i in range(10)}
    assert ev('almost_all(inputs["*"].loss < 0.01, 5)', outputs) is True
    assert ev('almost_all(inputs["*"].loss < 0.01, 4)', outputs) is False


def test_count_counts_truthy_values() -> None:
    outputs = {f"t{i}": {"passed": i % 2 == 0} for i in range(9)}
    assert ev('count(inputs["*"].passed) > 3', outputs) is True
    assert ev('count(inputs["*"].passed)', outputs) == 5


def test_params_are_readable() -> None:
    assert ev("inputs.A.score < params.threshold") is True
    assert ev('params.mode == "fast"') is True


# --- globs ---------------------------------------------------------------------


def test_glob_with_no_match_follows_python_all_and_any() -> None:
    assert ev('all(inputs["zzz*"].ok)') is True
    assert ev('any(inputs["zzz*"].ok)') is False
    assert ev('count(inputs["zzz*"].ok)') == 0


def test_glob_visits_inputs_in_sorted_order() -> None:
    outputs = {"b": {"loss": "bad"}, "a": {"loss": None}}
    assert "for input 'a'" in eval_error("all(inputs.*.loss < 1)", outputs)


def test_glob_may_appear_several_times_with_one_pattern() -> None:
    outputs = {"a": {"x": 1, "y": 1}, "b": {"x": 2, "y": 3}}
    assert ev("count(inputs.*.x == inputs.*.y)", outputs) == 1


def test_glob_on_max_and_min_gives_the_extreme() -> None:
    assert ev('max(inputs["train-*"].loss)') == 0.002
    assert ev('min(inputs["train-*"].loss)') == 0.001


def test_nested_aggregates_bind_their_own_glob() -> None:
    outputs = {"a": {"n": 2}, "b": {"n": 2}}
    assert ev("all(inputs.*.n == count(inputs.*.n))", outputs) is True


def test_aggregates_accept_a_list_instead_of_a_glob() -> None:
    assert ev("any([inputs.A.missing, inputs.train.converged])") is True
    assert ev("all([1, 0])") is False
    assert ev("almost_all([1, 0, 0], 2)") is True


def test_glob_outside_an_aggregate_is_a_validation_error() -> None:
    assert "only allowed inside all()" in parse_error('inputs["*"].ok')


def test_glob_in_second_argument_is_refused() -> None:
    assert "first argument" in parse_error("almost_all(inputs.*.ok, inputs.*.n)")


def test_two_different_globs_in_one_aggregate_are_refused() -> None:
    assert "mixes the globs" in parse_error('all(inputs["a*"].x and inputs["b*"].y)')


def test_star_key_on_other_names_is_a_plain_key() -> None:
    assert ev('params["*"]') is None


# --- literals and access ---------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("42", 42),
        ("1.5", 1.5),
        ("2e3", 2000.0),
        ("'single'", "single"),
        ('"double"', "double"),
        (r'"tab\there \"q\" \u00e9 \x41 \\"', 'tab\there "q" é A \\'),
        ("true", True),
        ("True", True),
        ("false", False),
        ("False", False),
        ("null", None),
        ("None", None),
        ("[1, 'a', [true]]", [1, "a", [True]]),
        ("[1, 2,]", [1, 2]),
        ("[]", []),
    ],
)
def test_literals(text: str, value: Any) -> None:
    assert ev(text) == value


def test_missing_key_of_a_mapping_is_null() -> None:
    assert ev("inputs.A.nothing") is None
    assert ev("inputs.nobody") is None


def test_access_on_null_is_null() -> None:
    assert ev("inputs.nobody.score.deeper[0]") is None


def test_list_index_reads_items_and_out_of_range_is_null() -> None:
    assert ev("inputs.scores.values[0]") == 3
    assert ev("inputs.scores.values[-1]") == 2
    assert ev("inputs.scores.values[3]") is None


def test_string_key_in_brackets_reads_a_mapping() -> None:
    assert ev('inputs.scores["name"]') == "run"


def test_access_on_a_number_is_an_expression_error() -> None:
    assert "cannot read 'x' of float 0.3" in eval_error("inputs.A.score.x")


def test_access_on_a_number_literal_is_a_validation_error() -> None:
    assert "cannot read a key of int 5" in parse_error("(5).x")


def test_attribute_of_a_list_is_an_expression_error() -> None:
    assert "of a list" in eval_error("inputs.scores.values.first")


def test_a_list_index_must_be_an_int() -> None:
    assert "not float" in eval_error("inputs.scores.values[1.0]")


def test_dunder_names_are_plain_missing_keys() -> None:
    assert ev("inputs.__class__.__mro__") is None
    assert ev("inputs.A.__dict__") is None


def test_a_root_missing_from_the_environment_is_an_expression_error() -> None:
    with pytest.raises(ExpressionError, match="'params' is not available"):
        parse("params.x").evaluate({"inputs": {}})


# --- operators ---------------------------------------------------------------------


def test_chained_comparison_checks_each_pair() -> None:
    assert ev("0 < inputs.A.score < 1") is True
    assert ev("0 < inputs.A.score < 0.2") is False
    assert ev("1 < 2 < 3 > 2 == 2") is True


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("'a' in ['a', 'b']", True),
        ("3 in inputs.scores.values", True),
        ("'x' not in ['a']", True),
        ("'un' in 'run'", True),
        ("'mae' in inputs.train", True),
        ("'mse' not in inputs.train", True),
    ],
)
def test_membership(text: str, value: bool) -> None:
    assert ev(text) is value


def test_membership_in_null_is_an_expression_error() -> None:
    assert "'in' does not work on string and null" in eval_error("'a' in inputs.A.tags")


def test_and_or_short_circuit() -> None:
    assert ev("false and 1 / 0") is False
    assert ev("true or 1 / 0") is True


def test_and_or_give_booleans() -> None:
    assert ev("1 and 'x'") is True
    assert ev("0 or ''") is False
    assert ev("not []") is True


def test_precedence_of_not_and_or() -> None:
    assert ev("not false and false") is False
    assert ev("true or false and false") is True
    assert ev("not 1 == 2") is True


def test_arithmetic_precedence() -> None:
    assert ev("1 + 2 * 3 - 4 / 2") == 5.0
    assert ev("(1 + 2) * 3") == 9
    assert ev("7 // 2 + 7 % 2") == 4
    assert ev("-inputs.A.score * 2") == -0.6
    assert ev("- -3") == 3


def test_string_and_list_concatenation() -> None:
    assert ev("'a' + 'b' * 2") == "abb"
    assert ev("[1] + [2] * 2") == [1, 2, 2]


def test_is_compares_type_and_value() -> None:
    assert ev("inputs.A.nothing is None") is True
    assert ev("1 is True") is False
    assert ev("inputs.A.score is not None") is True


def test_division_by_zero_is_an_expression_error() -> None:
    assert "division by zero" in eval_error("1 / (inputs.A.score - 0.3)")


def test_comparing_null_with_a_number_names_both_types() -> None:
    message = eval_error("inputs.A.missing < 1")
    assert "cannot compare null < int" in message
    assert "inputs.A.missing < 1" in message


def test_comparing_a_string_with_a_number_is_an_expression_error() -> None:
    assert "cannot compare string > int" in eval_error("'a' > 1")


def test_arithmetic_on_mismatched_types_is_an_expression_error() -> None:
    assert "'+' does not work on string and int" in eval_error("'a' + 1")


def test_equality_across_types_is_simply_false() -> None:
    assert ev("inputs.A.missing == 1") is False
    assert ev("'1' != 1") is True


# --- functions -----------------------------------------------------------------------


def test_len_min_max_abs() -> None:
    assert ev("len(inputs.scores.values)") == 3
    assert ev("len('abc') + len(inputs.train)") == 5
    assert ev("max(1, 2.5, -1)") == 2.5
    assert ev("min(inputs.scores.values)") == 1
    assert ev("abs(-2)") == 2


def test_min_of_an_empty_list_is_an_expression_error() -> None:
    assert "empty" in eval_error("min([])")


def test_almost_all_needs_a_whole_number_of_failures() -> None:
    assert "whole number" in eval_error("almost_all([1], -1)")


def test_wrong_number_of_arguments_is_a_validation_error() -> None:
    assert "almost_all() takes 2 argument(s), not 1" in parse_error("almost_all(inputs.*.ok)")


def test_unknown_function_lists_the_allowed_ones() -> None:
    message = parse_error('__import__("os")')
    assert "unknown function '__import__'" in message
    assert "all, almost_all, any, count" in message


def test_unknown_name_lists_the_allowed_names() -> None:
    message = parse_error("output.x > 1")
    assert "unknown name 'output'" in message
    assert "names: inputs, params" in message


def test_a_name_is_not_callable() -> None:
    assert "'inputs' is not a function" in parse_error("inputs(1)")


def test_new_root_names_are_a_parameter() -> None:
    expr = parse("item.size > index", names=frozenset({"item", "index"}))
    assert expr.evaluate({"item": {"size": 3}, "index": 2}) is True
    assert "unknown name 'inputs'" in parse_error("inputs.A", names=frozenset({"item"}))


# --- parse errors ----------------------------------------------------------------------


def test_parse_error_names_the_place_and_column() -> None:
    message = parse_error("inputs.A.x > )", where="condition of task 'classify'")
    assert message.startswith("condition of task 'classify': unexpected ')' at column 14")


def test_parse_error_in_multi_line_text_gives_line_and_column() -> None:
    assert "at line 2, column 3" in parse_error("inputs.A\n  ) ")


def test_power_operator_is_refused() -> None:
    assert "'**'" in parse_error("9**9**9")


def test_single_equals_suggests_double() -> None:
    assert "use '=='" in parse_error("params.n = 1")


def test_unterminated_string_is_a_validation_error() -> None:
    assert "unterminated string at column 5" in parse_error("1 + 'abc")


def test_hyphenated_name_suggests_brackets() -> None:
    assert 'inputs["train-1"]' in parse_error("inputs.train-1.loss < 1")
    assert 'inputs["train-1"]' in parse_error("inputs.prep/x.ok")


def test_trailing_tokens_are_refused() -> None:
    assert "unexpected 'inputs' at column 3" in parse_error("1 inputs")


def test_empty_expression_is_refused() -> None:
    assert "unexpected end of expression" in parse_error("   ")


def test_non_string_condition_is_refused() -> None:
    assert "must be a string" in parse_error(True)  # type: ignore[arg-type]


# --- bounds --------------------------------------------------------------------------


def test_too_long_expression_is_refused() -> None:
    assert "too long" in parse_error("1+" * MAX_LENGTH + "1")


def test_deep_nesting_is_refused_without_recursion_error() -> None:
    assert "nested too deeply" in parse_error("(" * 2000 + "1" + ")" * 2000)
    assert "nested too deeply" in parse_error("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    assert "nested too deeply" in parse_error("-" * 1000 + "1")


def test_moderate_nesting_is_fine() -> None:
    assert ev("(" * 30 + "1" + ")" * 30) == 1


def test_too_many_parts_are_refused() -> None:
    assert "too complex" in parse_error("+".join(["1"] * 1500))


def test_long_flat_chains_do_not_nest() -> None:
    assert ev(" and ".join(["true"] * 400)) is True
    assert ev(" + ".join(["1"] * 500)) == 500


def test_huge_integer_literal_is_refused() -> None:
    assert "too large" in parse_error("99999999999999999999")
    assert "too large" in parse_error("1e999")


def test_integer_results_are_bounded() -> None:
    assert "out of range" in eval_error("9223372036854775807 * 9223372036854775807")


def test_float_overflow_is_an_expression_error() -> None:
    assert "out of range" in eval_error("1e308 * 10")


def test_string_repetition_is_bounded() -> None:
    assert "limit" in eval_error('"a" * 1000000000')


def test_list_repetition_is_bounded() -> None:
    assert "limit" in eval_error("[1, 2] * 600000")


# --- references -------------------------------------------------------------------------


def test_references_list_input_names_params_and_globs() -> None:
    refs = references(
        parse('inputs.A.x > params.threshold and inputs["prep/x"].ok and any(inputs["t-*"].y)')
    )
    assert refs.inputs == {"A", "prep/x"}
    assert refs.params == {"threshold"}
    assert refs.globs == {"t-*"}
    assert refs.uses_glob
    assert refs.roots == {"inputs", "params"}
    assert refs.dynamic == frozenset()


def test_references_mark_computed_keys_as_dynamic() -> None:
    refs = references(parse("inputs[params.which].ok and len(params) > 0"))
    assert refs.dynamic == {"inputs", "params"}
    assert refs.params == {"which"}
    assert refs.inputs == frozenset()


def test_references_without_glob() -> None:
    assert not references(parse("inputs.A.ok")).uses_glob


# --- truthiness and the Expr value -------------------------------------------------------


@pytest.mark.parametrize("value", [None, False, 0, 0.0, "", [], {}])
def test_falsy_values(value: Any) -> None:
    assert truthy(value) is False


@pytest.mark.parametrize("value", [True, 1, -0.5, "no", [0], {"a": None}])
def test_truthy_values(value: Any) -> None:
    assert truthy(value) is True


def test_expression_error_is_a_dagq_error() -> None:
    assert issubclass(ExpressionError, DagqError)


def test_parsed_expressions_are_equal_values() -> None:
    assert parse("inputs.A.x > 1") == parse("inputs.A.x > 1")
    assert parse("inputs.A.x > 1").text == "inputs.A.x > 1"


def test_an_expressions_compiled_form_is_not_part_of_its_value() -> None:
    expr = parse("inputs.A.x > 1")
    other = msgspec.structs.replace(expr, run=lambda scope: False)

    assert other == expr
    assert (other != expr) is False
    assert hash(other) == hash(expr)
    assert "run" not in repr(expr) and "inputs.A.x > 1" in repr(expr)
    assert expr != parse("inputs.A.x > 2")
    assert (expr == parse("inputs.A.x > 2")) is False
    assert expr != "inputs.A.x > 1"


def test_evaluation_error_names_the_expression() -> None:
    assert "in 'inputs.A.missing < 1'" in eval_error("inputs.A.missing < 1")


# --- templates -------------------------------------------------------------------------


PARAM_ROOTS = frozenset({"params"})
ENV = {"params": PARAMS, "inputs": INPUTS}


def test_whole_string_template_gives_the_raw_value() -> None:
    assert render("{{ params.n }}", ENV, roots=PARAM_ROOTS) == 3
    assert render("{{ [params.n, params.mode] }}", ENV, roots=PARAM_ROOTS) == [3, "fast"]


def test_embedded_template_is_replaced_by_text() -> None:
    assert render("run --n {{ params.n }} --mode={{params.mode}}", ENV, roots=PARAM_ROOTS) == (
        "run --n 3 --mode=fast"
    )


def test_embedded_non_strings_are_written_as_json() -> None:
    text = "{{ true }} {{ null }} {{ [1, 'a'] }} {{ inputs.scores }}"
    assert render(text, ENV, roots=frozenset({"inputs"})) == (
        'true null [1,"a"] {"values":[3,1,2],"name":"run"}'
    )


def test_embedded_values_pass_through_quote() -> None:
    env = {"params": {"path": "a b; rm -rf /"}}
    assert render("ls {{ params.path }}", env, roots=PARAM_ROOTS, quote=shlex.quote) == (
        "ls 'a b; rm -rf /'"
    )


def test_whole_string_template_is_not_quoted() -> None:
    env = {"params": {"path": "a b"}}
    assert render("{{ params.path }}", env, roots=PARAM_ROOTS, quote=shlex.quote) == "a b"


def test_templates_outside_roots_are_left_verbatim() -> None:
    text = "{{ params.n }} then {{ inputs.A.score }}"
    assert render(text, ENV, roots=PARAM_ROOTS) == "3 then {{ inputs.A.score }}"
    assert render("{{inputs.A}}", ENV, roots=PARAM_ROOTS) == "{{inputs.A}}"


def test_render_walks_dicts_and_lists_and_keeps_other_values() -> None:
    value = {"a": ["{{ params.n }}", 1.5, None], "b": {"c": "x{{ params.mode }}"}}
    assert render(value, ENV, roots=PARAM_ROOTS) == {
        "a": [3, 1.5, None],
        "b": {"c": "xfast"},
    }


def test_closing_braces_inside_a_string_literal_do_not_end_the_template() -> None:
    assert render("{{ '}}' + params.mode }}", ENV, roots=PARAM_ROOTS) == "}}fast"


def test_unclosed_template_is_a_validation_error() -> None:
    with pytest.raises(ValidationError, match="never closed"):
        render("echo {{ params.n", ENV, roots=PARAM_ROOTS)
    with pytest.raises(ValidationError, match="never closed"):
        template_expressions(["ok", "echo {{ params.n"])


def test_template_expressions_finds_every_template() -> None:
    found = template_expressions({"cmd": "a {{ params.n }} {{inputs.A.x}}", "x": ["{{ 1 }}"]})
    assert [text for text, _ in found] == ["params.n", "inputs.A.x", "1"]
    assert all(isinstance(expr, Expr) for _, expr in found)


def test_template_parse_error_names_the_template() -> None:
    with pytest.raises(ValidationError) as info:
        template_expressions("echo {{ params.n + }}", where="task 'x': cmd")
    assert str(info.value).startswith("task 'x': cmd: {{ params.n + }}: unexpected end")


def test_template_evaluation_error_propagates() -> None:
    with pytest.raises(ExpressionError, match="cannot compare"):
        render("{{ params.mode < 1 }}", ENV, roots=PARAM_ROOTS)
