"""XCom passing with TaskFlow: a dict, a derived int, and a check of both."""

from __future__ import annotations

from airflow.sdk import dag, task


@dag(dag_id="leoflow_xcom", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_xcom():
    """produce -> transform -> check (check also pulls produce's output directly)."""

    @task
    def produce() -> dict[str, list[int]]:
        """Return a small JSON-able dict."""
        return {"numbers": [1, 2, 3, 4]}

    @task
    def transform(payload: dict[str, list[int]]) -> int:
        """Return the sum of ``payload["numbers"]``."""
        return sum(payload["numbers"])

    @task
    def check(total: int, payload: dict[str, list[int]]) -> None:
        """Raise ``ValueError`` unless the values arrived intact (total 10, four numbers)."""
        if total != 10 or payload["numbers"] != [1, 2, 3, 4]:
            raise ValueError(f"xcom mismatch: total={total} payload={payload}")

    payload = produce()
    check(transform(payload), payload)


leoflow_xcom()
