"""The pure decision of ``get_task_log`` on pods (:func:`leoflow_airflow.runtime.kubernetes.tasklog.
task_log_answer`): which source line and text for which evidence."""

from __future__ import annotations

import pytest

from leoflow_airflow.runtime.kubernetes.tasklog import LogPlace, PodLogRead, Seen, task_log_answer

LOG_PATH = "dag_id=d/run_id=r/task_id=t/attempt=1.log"
LOCAL = LogPlace(base_log_folder="/opt/airflow/logs", log_path=LOG_PATH)
REMOTE = LogPlace(base_log_folder="/opt/airflow/logs", log_path=LOG_PATH, remote_logging=True,
                  remote_base_log_folder="s3://bucket/logs/")


@pytest.mark.parametrize("place", [LOCAL, REMOTE])
def test_a_pod_that_is_there_gives_its_log_and_names_itself_and_the_api(place):
    sources, texts = task_log_answer(PodLogRead(Seen.LOG, "ns", "p-1", text="a\nb\n"), place)
    assert texts == ["a\nb\n"]
    assert sources == ["pod ns/p-1: log of its agent container through the Kubernetes API (pods/log; the last "
                       "10000 lines, at most 4 MiB)"]


def test_an_empty_log_is_still_the_pods_answer():
    """A pod that wrote nothing yet is there: Airflow must still skip the served-logs fetch (a source line)."""
    sources, texts = task_log_answer(PodLogRead(Seen.LOG, "ns", "p-1", text=""), LOCAL)
    assert len(sources) == 1 and texts == [""]


def test_a_gone_pod_without_remote_logging_says_the_log_left_with_it_and_how_to_keep_logs():
    sources, texts = task_log_answer(PodLogRead(Seen.GONE, "ns", "p-1"), LOCAL)
    assert texts == []
    assert sources == [f"pod ns/p-1 is gone; its log file lived in the pod at /opt/airflow/logs/{LOG_PATH} and "
                       "left with the pod, as did its container's stdout. Set [logging] remote_logging (with "
                       "remote_base_log_folder) to keep task logs after their pods"]


def test_a_gone_pod_with_remote_logging_names_the_remote_location():
    sources, texts = task_log_answer(PodLogRead(Seen.GONE, "ns", "p-1"), REMOTE)
    assert (sources, texts) == ([f"pod ns/p-1 is gone; its log was uploaded by [logging] remote_logging to "
                                 f"s3://bucket/logs/{LOG_PATH}"], [])


def test_a_pod_replaced_under_its_name_is_gone_and_the_other_uid_is_named():
    sources, _ = task_log_answer(PodLogRead(Seen.GONE, "ns", "p-1", other_uid="u-2"), REMOTE)
    assert sources[0].startswith("pod ns/p-1 is gone (the name now holds another pod, uid u-2); its log was ")


def test_remote_logging_without_a_folder_does_not_invent_a_location():
    place = LogPlace(base_log_folder="/logs", log_path=LOG_PATH, remote_logging=True, remote_base_log_folder="")
    sources, texts = task_log_answer(PodLogRead(Seen.GONE, "ns", "p-1"), place)
    assert texts == []
    assert "remote_base_log_folder or the workload's log_path is empty" in sources[0]
    assert "s3://" not in sources[0] and "/logs/" not in sources[0]


def test_an_unknown_log_path_names_the_folder_only():
    sources, _ = task_log_answer(PodLogRead(Seen.GONE, "ns", "p-1"),
                                 LogPlace(base_log_folder="/opt/airflow/logs", log_path=""))
    assert "lived in the pod at /opt/airflow/logs and left with the pod" in sources[0]


def test_an_error_is_one_source_line_naming_it_and_no_text():
    read = PodLogRead(Seen.ERROR, "ns", "p-1", error="pods/log GET: HTTP 403 Forbidden")
    assert task_log_answer(read, REMOTE) == (
        ["pod ns/p-1: its log could not be read through the Kubernetes API: pods/log GET: HTTP 403 Forbidden"], [])


def test_the_api_servers_rules_name_get_pods_log():
    """``airflow leoflow check`` names what the api-server's identity needs: the log view needs ``get pods/log``
    (a subresource: its SelfSubjectAccessReview asks resource ``pods``, subresource ``log``)."""
    from leoflow_airflow.runtime.kubernetes.access import EXCHANGE_RULES

    assert [str(r) for r in EXCHANGE_RULES] == ["create tokenreviews.authentication.k8s.io", "get pods",
                                                "get pods/log"]
    assert [(r.resource, r.subresource) for r in EXCHANGE_RULES if r.subresource] == [("pods", "log")]
