"""The one place that says how every bundled DAG run must end: run state and every task's state.

Used by ``devtools.demo`` and by ``tests/integration/test_executor_parity.py``. The states were observed
under LocalExecutor (the reference) on Airflow 3.3.2 and follow from each DAG's code, not from timing.
Task keys are ``task_id``, or ``task_id[map_index]`` for mapped task instances.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

EXAMPLE_FILES: tuple[str, ...] = (
    # Airflow's own bundled examples, copied unchanged at run time from the installed packages. All need no
    # outside service and end deterministically. Not used: example_branch_operator (random branch, installs
    # packages), example_dag_decorator (HTTP call), example_retry_policy (HTTP call, minute-long retries),
    # example_failed_dag (@once schedule; leoflow_fails covers a failing run), example_complex (35 bash tasks
    # that add time, not coverage).
    "example_bash_operator",  # bash, a skip through exit code 99, multiple_outputs
    "tutorial",
    "tutorial_taskflow_api",
    "example_xcom",
    "example_dynamic_task_mapping",  # three DAGs: mapping, second-order mapping, mapped task group
    "example_skip_dag",
    "example_short_circuit_operator",
    "example_setup_teardown",
    "example_setup_teardown_taskflow",
    "example_task_group",
    "example_task_group_decorator",
    "example_xcomargs",  # two DAGs: example_xcom_args, example_xcom_args_with_operators
    "example_nested_branch_dag",  # branches are fixed by arguments, not random
)
"""File names (without ``.py``) of the bundled example DAGs the stack loads as a second bundle."""


@dataclass(frozen=True)
class Expected:
    """How one DAG run must end: ``run_state`` (``success``/``failed``) and ``{task key: state}``."""

    run_state: str
    tasks: Mapping[str, str] = field(default_factory=dict)

    def counts(self) -> tuple[int, int]:
        """(tasks expected ``success``, tasks expected ``failed``)."""
        states = list(self.tasks.values())
        return states.count("success"), states.count("failed")


def _all(state: str, *keys: str) -> dict[str, str]:
    return {key: state for key in keys}


EXPECTED: dict[str, Expected] = {
    # ---- ours (dags/)
    "leoflow_fanout": Expected(
        "success", {**_all("success", *(f"branch_{i:02d}" for i in range(20))), "join": "success"}
    ),
    "leoflow_chain": Expected("success", _all("success", *(f"link_{i:02d}" for i in range(10)))),
    "leoflow_xcom": Expected("success", _all("success", "produce", "transform", "check")),
    "leoflow_retry": Expected("success", _all("success", "flaky", "after_retry")),
    "leoflow_sensor": Expected("success", _all("success", "wait_a_bit", "after_sensor")),
    "leoflow_mapped": Expected(
        "success", {**_all("success", *(f"square[{i}]" for i in range(5))), "total": "success"}
    ),
    "leoflow_callbacks": Expected(
        "failed", {"cb_succeeds": "success", "cb_retries": "success", "cb_fails": "failed"}
    ),
    "leoflow_fails": Expected("failed", {"fine": "success", "boom": "failed", "never_runs": "upstream_failed"}),
    # ---- Airflow's bundled examples
    "example_bash_operator": Expected(
        "success",
        {
            **_all(
                "success",
                "runme_0",
                "runme_1",
                "runme_2",
                "run_after_loop",
                "also_run_this",
                "describe_dag_folder",
                "show_dag_folder_stats",
            ),
            "this_will_skip": "skipped",  # exit 99 is BashOperator's skip code
            "run_this_last": "skipped",  # all_success downstream of the skipped task
        },
    ),
    "tutorial": Expected("success", _all("success", "print_date", "sleep", "templated")),
    "tutorial_taskflow_api": Expected("success", _all("success", "extract", "transform", "load")),
    "example_xcom": Expected(
        "success",
        _all("success", "bash_push", "bash_pull", "pull_value_from_bash_push", "push", "push_by_returning", "puller"),
    ),
    "example_dynamic_task_mapping": Expected(
        "success", {**_all("success", *(f"add_one[{i}]" for i in range(3))), "sum_it": "success"}
    ),
    "example_task_mapping_second_order": Expected(
        "success",
        {
            "get_nums": "success",
            **_all("success", *(f"times_2[{i}]" for i in range(3))),
            **_all("success", *(f"add_10[{i}]" for i in range(3))),
        },
    ),
    "example_task_group_mapping": Expected(
        "success",
        {
            **_all("success", *(f"op.add_1[{i}]" for i in range(3))),
            **_all("success", *(f"op.mul_2[{i}]" for i in range(3))),
        },
    ),
    "example_skip_dag": Expected(
        "success",
        {
            "skip_operator_1": "skipped",
            "always_true_1": "success",
            "all_success": "skipped",
            "final_1": "skipped",
            "skip_operator_2": "skipped",
            "always_true_2": "success",
            "one_success": "success",
            "final_2": "success",
        },
    ),
    "example_short_circuit_operator": Expected(
        "success",
        {
            "condition_is_True": "success",
            "true_1": "success",
            "true_2": "success",
            "condition_is_False": "success",
            "false_1": "skipped",
            "false_2": "skipped",
            "task_1": "success",
            "task_2": "success",
            "short_circuit": "success",
            "task_3": "success",
            "task_4": "skipped",
            "task_5": "success",
            "task_6": "skipped",
            "task_7": "success",
        },
    ),
    "example_setup_teardown": Expected(
        "success",
        _all(
            "success",
            "root_setup",
            "normal",
            "root_teardown",
            "section_1.taskgroup_setup",
            "section_1.normal",
            "section_1.taskgroup_teardown",
        ),
    ),
    "example_setup_teardown_taskflow": Expected(
        "success",
        _all(
            "success",
            "my_first_task",
            "my_second_task",
            "my_third_task",
            "outer_setup",
            "outer_work",
            "outer_teardown",
            "section_1.inner_setup",
            "section_1.inner_work",
            "section_1.inner_teardown",
        ),
    ),
    "example_task_group": Expected(
        "success",
        _all(
            "success",
            "start",
            "section_1.task_1",
            "section_1.task_2",
            "section_1.task_3",
            "section_2.task_1",
            "section_2.inner_section_2.task_2",
            "section_2.inner_section_2.task_3",
            "section_2.inner_section_2.task_4",
            "end",
        ),
    ),
    "example_task_group_decorator": Expected(
        "success",
        {
            "task_start": "success",
            "task_end": "success",
            **_all(
                "success",
                *(
                    f"task_group_function{suffix}.task_{n}"
                    for suffix in ("", "__1", "__2", "__3", "__4")
                    for n in (1, 2, 3)
                ),
            ),
        },
    ),
    "example_xcom_args": Expected("success", _all("success", "generate_value", "print_value")),
    "example_xcom_args_with_operators": Expected(
        "success", _all("success", "c", "print_value", "print_value__1", "d")
    ),
    "example_nested_branch_dag": Expected(
        "success",
        {
            "branch_1": "success",
            "true_1": "success",
            "join_1": "success",
            "false_1": "skipped",
            "branch_2": "skipped",
            "true_2": "skipped",
            "false_2": "skipped",
            "join_2": "skipped",
            "false_3": "skipped",
        },
    ),
}
"""dag_id -> how its triggered run must end. Every DAG the stack loads must be listed here."""

KUBE_EXAMPLE_FILES: tuple[str, ...] = ("example_bash_operator", "example_short_circuit_operator",
                                       "example_setup_teardown")
"""The examples the Kubernetes end-to-end tests run beside every ``leoflow_*`` DAG (bash and a skip by exit code
99, short circuit, setup/teardown): the parity set those tests check cold (``test_kube_runtime_e2e.py``) and with
warm pools on (``test_kube_warm_e2e.py``). The full :data:`EXAMPLE_FILES` (24 DAG runs, about 190 pods, each a
cold Python start on a 2-core machine, 12 min) is what ``make demo-k8s`` runs."""
KUBE_DAGS: tuple[str, ...] = tuple(d for d in EXPECTED if d.startswith("leoflow_") or d in KUBE_EXAMPLE_FILES)
"""The DAG ids of the Kubernetes parity set, checked against :data:`EXPECTED` (each of :data:`KUBE_EXAMPLE_FILES`
holds one DAG of its own name)."""

EXPECTED_TRACES: tuple[str, ...] = (
    "leoflow_callbacks cb_fails 1 failure",
    "leoflow_callbacks cb_retries 1 retry",
    "leoflow_callbacks cb_retries 2 success",
    "leoflow_callbacks cb_succeeds 1 success",
)
"""Sorted callback trace lines (``dag_id task_id try_number kind``) one run of each DAG leaves."""


def mismatches(dag_id: str, run_state: str, task_states: Mapping[str, str]) -> list[str]:
    """Human-readable differences between an observed run and ``EXPECTED[dag_id]`` (empty = as expected).

    Raises ``KeyError`` for a DAG that is not listed.
    """
    want = EXPECTED[dag_id]
    problems = []
    if run_state != want.run_state:
        problems.append(f"run {run_state}, expected {want.run_state}")
    for key in sorted(set(want.tasks) | set(task_states)):
        got, expected = task_states.get(key, "absent"), want.tasks.get(key, "absent")
        if got != expected:
            problems.append(f"{key}: {got}, expected {expected}")
    return problems
