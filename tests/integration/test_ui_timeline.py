"""Issue 12 item 5 acceptance: the attempt-timeline page in the Airflow UI, in a real headless Chromium.

One real Airflow stack (Lite runtime, SQLite, Airflow's SimpleAuthManager). One DAG run is made to recover twice
through ``[leoflow] test_fault_plan``: the agent of ``work``'s epoch 1 is killed before ``/run`` (leoflow
re-dispatches the same ``ti_id`` as epoch 2), and the agent of epoch 2 is killed after it wrote its outcome record
and before its terminal ``PATCH`` (the reconciler settles it by replaying the record). Then a user logs in through
Airflow's real login form, opens the task instance's "Attempts (leoflow)" tab and must see both recoveries: the
epochs, the events and the evidence. The JSON API refuses a caller without credentials (401), with a forged
token (403), and a logged-in user whom Airflow's auth manager denies the DAG (403). For that last one the stack's
``[core] auth_manager`` is ``tests/integration/ui_auth_manager.py``: Airflow's SimpleAuthManager (which lets every
role read every DAG) that denies :data:`DAG_ID` to user :data:`OUTSIDER` (a ``viewer``).

Chromium is Debian's ``chromium`` with its ``chromium-driver`` (``scripts/run-tests all`` installs them and sets
``LEOFLOW_BROWSER_REQUIRED=1``, which turns a missing browser into a failure instead of a skip). The test
writes a screenshot of the tab to ``$LEOFLOW_UI_SCREENSHOT`` (default: the test's tmp folder); the one in
``docs/ui-timeline.png`` was taken by this test.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest

from devtools.stack import API_USER, AirflowStack
from ui_auth_manager import DENY_ENV

pytestmark = pytest.mark.airflow

FAULT_DAGS = Path(__file__).resolve().parent.parent / "fault_dags"
EXECUTOR = "leoflow_airflow.executor.LeoflowExecutor"
CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
DAG_ID = "leoflow_faulty_r0"
OUTSIDER = "outsider"
"""A ``viewer`` whom the stack's auth manager denies :data:`DAG_ID` (and only it)."""
OUTSIDER_PASSWORD = "outsider-password"


def _browser_or_skip() -> None:
    missing = [p for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        why = f"{', '.join(missing)} missing: apt-get install chromium chromium-driver"
        if os.environ.get("LEOFLOW_BROWSER_REQUIRED") == "1":
            pytest.fail(why)
        pytest.skip(why)


@pytest.fixture(scope="module")
def recovered(tmp_path_factory: pytest.TempPathFactory):
    """The stack and ``(run_id)`` of a finished run whose ``work`` was re-dispatched, then replayed."""
    home = tmp_path_factory.mktemp("ui")
    plan = home / "fault-plan.json"
    run_id = f"ui_{time.monotonic_ns()}"
    plan.write_text(json.dumps({f"{DAG_ID}/{run_id}/work/1/1": "before_run",
                                f"{DAG_ID}/{run_id}/work/1/2": "after_record"}))
    extra = {
        "AIRFLOW__LEOFLOW__TEST_FAULT_INJECTION": "True",
        "AIRFLOW__LEOFLOW__TEST_FAULT_PLAN": str(plan),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.integration.ui_auth_manager.DagDenyingAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"{API_USER}:admin,{OUTSIDER}:viewer",
        DENY_ENV: f"{OUTSIDER}:{DAG_ID}",
    }
    with AirflowStack(home, executor=EXECUTOR, parallelism=4, dags_folder=FAULT_DAGS, extra_env=extra) as stack:
        stack.migrate()
        passwords = home / "passwords.json"  # SimpleAuthManager's file: the stack wrote its own user's
        passwords.write_text(json.dumps({**json.loads(passwords.read_text()), OUTSIDER: OUTSIDER_PASSWORD}))
        stack.start(wait_for_dags=[DAG_ID])
        body = {"dag_run_id": run_id, "logical_date": datetime.now(timezone.utc).isoformat(), "conf": {}}
        stack._call("POST", f"/dags/{DAG_ID}/dagRuns", json=body)
        assert stack.wait_for_run(DAG_ID, run_id, timeout=180) == "success"
        assert stack.task_states(DAG_ID, run_id)["work"] == "success"
        yield stack, run_id


def _timeline_url(stack: AirflowStack, run_id: str) -> str:
    return f"{stack.public_url}/leoflow/v1/ui/timeline?dag_id={DAG_ID}&run_id={quote(run_id)}&task_id=work"


def test_api_refuses_callers_without_an_airflow_login(recovered) -> None:
    """No credential: 401; a token Airflow did not sign: 403. Neither answer carries a timeline."""
    stack, run_id = recovered
    url = _timeline_url(stack, run_id)
    anonymous = httpx.get(url, timeout=30)
    assert anonymous.status_code == 401, anonymous.text
    assert "attempts" not in anonymous.text
    forged = httpx.get(url, headers={"Authorization": "Bearer not.a.jwt"}, timeout=30)
    assert forged.status_code == 403, forged.text
    assert httpx.get(f"{stack.public_url}/leoflow/v1/ui/pools", timeout=30).status_code == 401


def test_api_refuses_a_logged_in_user_the_auth_manager_denies_the_dag(recovered) -> None:
    """:data:`OUTSIDER` logs in (Airflow issues a token), but the auth manager denies it :data:`DAG_ID`: the timeline
    of that DAG's task answers 403 and carries no attempt, as Airflow's own task-instance API does for it; the
    same user reads another DAG's timeline (200): the refusal is the auth manager's per-DAG decision, not a
    failed login or a role without read access."""
    stack, run_id = recovered
    login = httpx.post(f"{stack.public_url}/auth/token", json={"username": OUTSIDER, "password": OUTSIDER_PASSWORD},
                       timeout=30)
    assert login.status_code in (200, 201), login.text
    auth = {"Authorization": f"Bearer {login.json()['access_token']}"}
    denied = httpx.get(_timeline_url(stack, run_id), headers=auth, timeout=30)
    assert denied.status_code == 403, denied.text
    assert "attempts" not in denied.text and "redispatched" not in denied.text, denied.text
    airflow_says = httpx.get(f"{stack.public_url}/api/v2/dags/{DAG_ID}/dagRuns/{quote(run_id)}/taskInstances/work",
                             headers=auth, timeout=30)
    assert airflow_says.status_code == 403, airflow_says.text
    other = httpx.get(_timeline_url(stack, run_id).replace(f"dag_id={DAG_ID}", "dag_id=leoflow_other_dag"),
                      headers=auth, timeout=30)
    assert other.status_code == 200 and other.json()["attempts"] == [], other.text


def test_api_answers_the_recovery_to_a_logged_in_user(recovered) -> None:
    """The JSON API, called with the user's token, names both epochs and what settled each."""
    stack, run_id = recovered
    token = httpx.post(f"{stack.public_url}/auth/token", json={"username": API_USER, "password": stack._password},
                       timeout=30).json()["access_token"]
    resp = httpx.get(_timeline_url(stack, run_id), headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert resp.status_code == 200, resp.text
    attempts = resp.json()["attempts"]
    assert [(a["try_number"], a["attempt_epoch"], a["resolution"]) for a in attempts] == [
        (1, 1, "redispatched"), (1, 2, "replayed")], attempts
    first, second = attempts
    assert first["ti_id"] == second["ti_id"], "a re-dispatch keeps the ti_id"
    assert [e["event"] for e in first["events"]][:2] == ["claim", "dispatch"]
    assert "run" not in [e["event"] for e in first["events"]], "epoch 1 never reached /run"
    names = [e["event"] for e in second["events"]]
    assert names[:3] == ["claim", "dispatch", "run"] and names[-2:] == ["record", "settle"], names
    dispatch = second["events"][1]
    assert dispatch["pid"] > 0 and dispatch["host"], dispatch
    settle = second["events"][-1]
    assert settle["evidence"] == "replayed record" and settle["epoch"] == 2, settle
    at = {e["event"]: e["time"] for e in second["events"]}
    # the dispatch time is when the scheduler recorded the agent's start, which may come after the agent's /run
    assert at["claim"] <= at["dispatch"] and at["claim"] <= at["run"] <= at["record"] <= at["settle"], at
    plugin = next(p for p in stack._call("GET", "/plugins")["plugins"] if p["name"] == "leoflow")
    views = {v["url_route"]: (v["destination"], v["href"]) for v in plugin["external_views"]}
    assert views["leoflow"] == ("nav", "/leoflow/ui/timeline"), views
    assert views["leoflow-attempts"][0] == "task_instance" and "task_id={TASK_ID}" in views["leoflow-attempts"][1]
    pools = httpx.get(f"{stack.public_url}/leoflow/v1/ui/pools", headers={"Authorization": f"Bearer {token}"},
                      timeout=30).json()
    assert pools["pools"] == [] and pools["runtime"] == "lite" and "zygote" in pools["note"], pools


@pytest.fixture
def browser(tmp_path: Path):
    """A fresh headless Chromium driven through chromedriver (selenium), with its own profile folder."""
    _browser_or_skip()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1440,1150", f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER, log_output=str(tmp_path / "chromedriver.log")),
                              options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_the_timeline_tab_shows_the_recovery(recovered, browser, tmp_path: Path) -> None:
    """Log in through Airflow's login form, open the task instance's "Attempts (leoflow)" tab, see both epochs,
    the re-dispatch and the replayed record."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    stack, run_id = recovered
    wait = WebDriverWait(browser, 60)
    tab = f"/dags/{DAG_ID}/runs/{quote(run_id)}/tasks/work/plugin/leoflow-attempts"

    browser.get(f"{stack.public_url}/auth/login?next={quote(stack.public_url + tab, safe='')}")
    wait.until(ec.element_to_be_clickable((By.NAME, "username"))).send_keys(API_USER)
    browser.find_element(By.NAME, "password").send_keys(stack._password)
    browser.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    wait.until(lambda d: any(c["name"] == "_token" for c in d.get_cookies()))

    browser.get(stack.public_url + tab)
    frame = wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, "iframe[src*='/leoflow/ui/timeline']")))
    assert "task_id=work" in frame.get_attribute("src")
    browser.switch_to.frame(frame)
    wait.until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded") == "true")
    text = browser.find_element(By.ID, "timeline").text
    assert not browser.find_elements(By.ID, "timeline-error"), text
    attempts = browser.find_elements(By.CSS_SELECTOR, ".attempt")
    assert [a.get_attribute("data-epoch") for a in attempts] == ["1", "2"], text
    assert "redispatched: re-dispatch" in attempts[0].text
    assert "replayed: replayed record" in attempts[1].text
    events = [r.get_attribute("data-event") for r in attempts[1].find_elements(By.CSS_SELECTOR, "tr[data-event]")]
    assert events[:3] == ["claim", "dispatch", "run"] and events[-2:] == ["record", "settle"], events
    assert "evidence=replayed record" in attempts[1].text
    assert "No warm pool to show (runtime lite" in browser.find_element(By.ID, "pools").text

    browser.switch_to.default_content()
    shot = Path(os.environ.get("LEOFLOW_UI_SCREENSHOT", str(tmp_path / "ui-timeline.png")))
    assert browser.save_screenshot(str(shot)), "the screenshot was not written"
    assert shot.stat().st_size > 10_000


def test_a_browser_without_a_login_sees_no_timeline(recovered, browser) -> None:
    """The page opened without logging in shows the refusal, not the attempts."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    stack, run_id = recovered
    browser.get(f"{stack.public_url}/leoflow/ui/timeline?dag_id={DAG_ID}&run_id={quote(run_id)}&task_id=work")
    WebDriverWait(browser, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-loaded"))
    assert "not allowed (401)" in browser.find_element(By.ID, "timeline-error").text
    assert not browser.find_elements(By.CSS_SELECTOR, ".attempt")
