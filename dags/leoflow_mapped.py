"""Dynamic task mapping: one task expanded over five inputs, then a reduce that checks the results."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="leoflow_mapped", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_mapped():
    """square[0..4] -> total; total fails unless it sees 0+1+4+9+16 = 30."""

    @task
    def square(x: int) -> int:
        """Return ``x * x``."""
        return x * x

    @task
    def total(values: list[int]) -> int:
        """Raise ``ValueError`` unless the mapped results sum to 30; return the sum."""
        result = sum(values)
        if result != 30:
            raise ValueError(f"mapped results {list(values)} sum to {result}, expected 30")
        return result

    total(square.expand(x=[0, 1, 2, 3, 4]))


leoflow_mapped()
