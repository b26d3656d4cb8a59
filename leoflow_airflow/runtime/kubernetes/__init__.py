"""The Kubernetes runtime: a pod per attempt (DESIGN §1 "Runtimes", §3 "Dispatch" and "Start").

Built so far, each module one job: :mod:`.pod` builds an attempt's ``V1Pod`` (pure), :mod:`.merge` layers pods
the way the cncf KubernetesExecutor does, :mod:`.fields` names pod fields for the ``pod_override`` allowlist,
:mod:`.template` reads the operator's pod template and Airflow's ``pod_mutation_hook``, and :mod:`.classify`
maps a pod create's answer to a :class:`~leoflow_airflow.dispatch.disposition.Disposition` (pure). For the
token exchange (``leoflow_airflow.api.exchange``): :mod:`.identity` is the identity annotation the pod builder
stamps and the exchange parses (one format, pure), and :mod:`.review` the exchange's two Kubernetes reads
(TokenReview, pod GET) behind a narrow seam. :mod:`.runtime` is the runtime itself
(:class:`~.runtime.KubernetesRuntime`, ``[leoflow] runtime = kubernetes``): dispatch on a worker pool, presence
from the pod informer's cache (:mod:`.informer`, :mod:`.status`), its pure decisions in :mod:`.decide`;
:mod:`.callback` runs callback workloads on the scheduler's host. Both halves read one settings group,
:class:`~leoflow_airflow.settings.KubernetesSettings`.
"""
