"""``airflow leoflow doctor`` (issue 12 item 3): one command that checks, against the live Airflow config and
cluster, what a working leoflow install needs, and names the fix for each miss.

* :mod:`leoflow_airflow.doctor.findings`: pure. The facts the probes gathered in, :class:`~.findings.Finding`
  rows out (``name``, ``status`` ok/warn/fail/skip, ``detail``, ``fix``), the table, the JSON and the exit code.
* :mod:`leoflow_airflow.doctor.probe_token`: the mint-key probe's wire contract, shared by the doctor (which
  mints the probe token) and the api-server's ``POST /leoflow/v1/doctor/verify`` (which only verifies it).
* :mod:`leoflow_airflow.doctor.probes`: the I/O: Airflow's config, the api-server's ``/leoflow`` app, the
  Kubernetes API and the ledger; :func:`~.probes.run` gathers everything and returns the findings.
"""
