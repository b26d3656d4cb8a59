"""Chain: 10 Python tasks in sequence, each adding one to its upstream's XCom."""

from __future__ import annotations

from airflow.sdk import dag, task

LENGTH = 10


@dag(dag_id="leoflow_chain", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_chain():
    """link_00 -> ... -> link_09; the last link fails unless the count reached 10."""

    @task
    def link(previous: int, last: bool = False) -> int:
        """Return ``previous + 1``; on the last link raise ``ValueError`` unless that equals 10."""
        value = previous + 1
        if last and value != LENGTH:
            raise ValueError(f"chain counted {value}, expected {LENGTH}")
        return value

    value = 0
    for i in range(LENGTH):
        value = link.override(task_id=f"link_{i:02d}")(value, last=(i == LENGTH - 1))


leoflow_chain()
