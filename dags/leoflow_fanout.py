"""Fan-out: 20 trivial Python tasks in parallel, then a join that checks all 20 results arrived."""

from __future__ import annotations

from airflow.sdk import dag, task

WIDTH = 20


@dag(dag_id="leoflow_fanout", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_fanout():
    """20 parallel tasks -> join; the join fails unless it sees every branch's value."""

    @task
    def branch(index: int) -> int:
        """Return ``index`` (an int) as XCom."""
        return index

    @task
    def join(values: list[int]) -> int:
        """Check the 20 branch values are 0..19; raises ``ValueError`` otherwise. Returns their sum."""
        if sorted(values) != list(range(WIDTH)):
            raise ValueError(f"unexpected branch values: {values}")
        return sum(values)

    join([branch.override(task_id=f"branch_{i:02d}")(i) for i in range(WIDTH)])


leoflow_fanout()
