"""leoflow's control plane inside Airflow: the executor, its ledger, reconciler and reapers (DESIGN §1)."""

__version__ = "0.1.0"
