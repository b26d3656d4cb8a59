"""Alembic environment of leoflow's tables, driven by ``LeoflowDBManager`` (``airflow db migrate``)."""
