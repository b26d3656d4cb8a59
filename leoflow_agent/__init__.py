"""leoflow's agent: the process that runs one task attempt (a Lite subprocess, a task pod, a warm worker).

It never imports ``leoflow_airflow``. Its wire contracts (the outcome record in :mod:`leoflow_agent.outcome`,
the zygote messages in :mod:`leoflow_agent.protocol`) are standard-library only so the control plane can
import them from here (DESIGN §1).
"""
