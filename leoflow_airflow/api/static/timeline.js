// leoflow's attempt timeline page (issue 12 item 5): reads the plugin's JSON API with the user's Airflow
// session (the same-origin `_token` cookie) and draws every attempt of one task instance, then the warm pools.
// Plain DOM, no build step; every value is inserted as text, never as HTML.
"use strict";

const API = new URL("../v1/ui/", window.location.href);
const FACT_KEYS = ["runtime", "pod_name", "pod_uid", "pid", "host", "credential_id", "reported_state",
                   "exit_status", "resolution", "evidence", "detail", "record_path", "note"];

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

function tiQuery() {
  const q = new URLSearchParams(window.location.search);
  const mapIndex = q.get("map_index");
  return {
    dag_id: q.get("dag_id") || "", run_id: q.get("run_id") || "", task_id: q.get("task_id") || "",
    // the Airflow UI leaves "{MAP_INDEX}" in the URL of an unmapped task
    map_index: mapIndex && /^-?\d+$/.test(mapIndex) ? mapIndex : "-1",
  };
}

async function getJson(path, params) {
  const url = new URL(path, API);
  for (const [k, v] of Object.entries(params || {})) url.searchParams.set(k, v);
  const resp = await fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } });
  if (resp.status === 401 || resp.status === 403) {
    throw new Error(`not allowed (${resp.status}): log in to Airflow with a user who may read this DAG`);
  }
  if (!resp.ok) throw new Error(`${resp.status}: ${(await resp.text()).slice(0, 300)}`);
  return resp.json();
}

function badgeClass(attempt) {
  if (!attempt.resolution) return "badge";
  if (attempt.resolution === "reported") return "badge ok";
  if (["executor_failed", "launch_failed", "abandoned"].includes(attempt.resolution)) return "badge bad";
  return "badge recovery";
}

function drawTimeline(body) {
  const box = document.getElementById("timeline");
  box.replaceChildren();
  if (!body.attempts.length) {
    box.append(el("p", { class: "note" }, "The ledger holds no attempt of this task instance."));
    return;
  }
  for (const a of body.attempts) {
    const rows = a.events.map((e) => {
      const facts = FACT_KEYS.filter((k) => e[k] !== undefined && e[k] !== null).map((k) => `${k}=${e[k]}`);
      return el("tr", { "data-event": e.event, "data-epoch": String(e.epoch), "data-try": String(e.try_number),
                        title: e.time || "" },
        el("td", { class: "ev" }, e.event),
        el("td", { class: "time" }, e.time ? e.time.slice(0, 10) + " " + e.time.slice(11, 23) : "(no time)"),
        el("td", { class: "facts" }, facts.join("  ")),
        el("td", { class: "note" }, e.source));
    });
    box.append(el("div", { class: "attempt", "data-epoch": String(a.attempt_epoch), "data-try": String(a.try_number) },
      el("header", {}, `try ${a.try_number} · epoch ${a.attempt_epoch}`,
        el("span", { class: "badge" }, a.state),
        el("span", { class: badgeClass(a) }, a.resolution ? `${a.resolution}: ${a.evidence}` : "open"),
        el("span", { class: "note" }, `  ti_id ${a.ti_id}`)),
      el("table", {}, el("tr", {}, el("th", { class: "c-ev" }, "event"), el("th", { class: "c-time" }, "time (UTC)"),
        el("th", {}, "facts"), el("th", { class: "c-src" }, "source")), ...rows)));
  }
}

function drawPools(body) {
  const box = document.getElementById("pools");
  box.replaceChildren();
  if (!body.pools.length) {
    box.append(el("p", { class: "note", id: "pools-note" },
      `No warm pool to show (runtime ${body.runtime}; source: ${body.source}). ${body.note}`));
    return;
  }
  box.append(el("table", {}, ...body.pools.map((p) => el("tr", {}, ...Object.values(p).map((v) => el("td", {}, v))))));
}

async function main() {
  const q = tiQuery();
  const form = document.getElementById("ti-form");
  for (const [k, v] of Object.entries(q)) form.elements[k].value = v;
  const status = document.getElementById("status");
  if (q.dag_id && q.run_id && q.task_id) {
    form.hidden = true;  // opened for one task instance (the Airflow UI's tab): the form would only repeat it
    status.textContent = `${q.dag_id} / ${q.run_id} / ${q.task_id} [${q.map_index}]`;
    try {
      drawTimeline(await getJson("timeline", q));
    } catch (err) {
      document.getElementById("timeline").replaceChildren(el("p", { class: "error", id: "timeline-error" }, err.message));
    }
  } else {
    status.textContent = "Name a task instance to see its attempts.";
  }
  try {
    drawPools(await getJson("pools"));
  } catch (err) {
    document.getElementById("pools").replaceChildren(el("p", { class: "error" }, err.message));
  }
  document.body.setAttribute("data-loaded", "true");
}

main();
