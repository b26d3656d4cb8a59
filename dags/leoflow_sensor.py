"""A PythonSensor in reschedule mode that succeeds on its second poke (one reschedule).

The poke interval is 10 s, not 1-2 s, on purpose: under LocalExecutor the supervisor of a finished poke
lingers about 5 s before its process exits, and the executor's "success" event for that poke then reaches a
TI that the *next* poke already set RUNNING; the scheduler reads that as "killed externally" and fails the
sensor (seen here with poke_interval 1 s). An interval well above the linger keeps LocalExecutor, the
reference, deterministic.
"""

from __future__ import annotations

from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import dag, task

RESCHEDULES_BEFORE_SUCCESS = 1
POKE_INTERVAL_SECONDS = 10


def _ready(task_reschedule_count: int) -> bool:
    """True once the sensor has been rescheduled once (Airflow passes the count from the context)."""
    return task_reschedule_count >= RESCHEDULES_BEFORE_SUCCESS


@dag(dag_id="leoflow_sensor", schedule=None, catchup=False, tags=["leoflow"])
def leoflow_sensor():
    """wait_a_bit (reschedule mode, poke every 10 s, 120 s timeout) -> after_sensor."""
    sensor = PythonSensor(
        task_id="wait_a_bit",
        python_callable=_ready,
        mode="reschedule",
        poke_interval=POKE_INTERVAL_SECONDS,
        timeout=120,
    )

    @task
    def after_sensor() -> None:
        """A trivial downstream task: runs only once the sensor succeeded."""

    sensor >> after_sensor()


leoflow_sensor()
