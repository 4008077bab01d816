// The Agent-Reach console: one page over the router's operator API (the
// same JSON routes the CLI uses). Data is always written with textContent,
// never parsed as HTML. Live pages refresh every second, rows in place.
"use strict";

const REFRESH_MS = 1000;
const PAGES = ["agents", "capabilities", "slow", "requests"];
const $ = (id) => document.getElementById(id);
let signedIn = false;
let timer = null;

// === The API ===

async function api(method, path, body) {
  const init = { method, credentials: "same-origin", headers: { "x-agent-reach-console": "1" } };
  if (body !== undefined) {
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response;
  try {
    response = await fetch(path, init);
  } catch (error) {
    return { status: 0, body: { error: { code: "UNREACHABLE", message: "the router did not answer: " + error } } };
  }
  let data = null;
  const text = await response.text();
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = { error: { code: "NOT_JSON", message: text.slice(0, 200) } }; }
  }
  return { status: response.status, body: data };
}

function problem(answer) {
  const error = (answer.body && answer.body.error) || {};
  return (error.code || "HTTP " + answer.status) + ": " + (error.message || "no message");
}

function notify(text, isError) {
  const box = $("notice");
  box.textContent = text;
  box.className = isError ? "notice error" : "notice";
  box.hidden = false;
}

function say(id, text, isError) {
  const box = $(id);
  box.textContent = text;
  box.className = isError ? "message error" : "message";
  box.hidden = false;
}

// === Small DOM helpers ===

function cell(row, index, value, className) {
  while (row.cells.length <= index) row.insertCell();
  const td = row.cells[index];
  const text = value === null || value === undefined ? "–" : String(value);
  if (td.textContent !== text || td.childElementCount) { td.textContent = text; }
  td.className = className || "";
  return td;
}

// Names each cell after its column, for the phone layout's stacked rows.
function labels(tbody, row) {
  const heads = tbody.parentElement.tHead ? tbody.parentElement.tHead.rows[0].cells : [];
  Array.from(row.cells).forEach((td, i) => { if (heads[i] && td.dataset.label !== heads[i].textContent) td.dataset.label = heads[i].textContent; });
}

// Updates `tbody` to one row per item keyed by `key`, in order, filling each with `fill`.
function rows(tbody, items, key, fill) {
  const existing = new Map();
  for (const row of Array.from(tbody.rows)) existing.set(row.dataset.key, row);
  let index = 0;
  for (const item of items) {
    const id = key(item);
    let row = existing.get(id);
    if (row) existing.delete(id); else { row = document.createElement("tr"); row.dataset.key = id; }
    if (tbody.rows[index] !== row) tbody.insertBefore(row, tbody.rows[index] || null);
    fill(row, item);
    labels(tbody, row);
    index += 1;
  }
  for (const row of existing.values()) row.remove();
}

function button(td, label, action, name) {
  let found = td.querySelector('button[data-name="' + name + '"]');
  if (!found) {
    found = document.createElement("button");
    found.type = "button";
    found.dataset.name = name;
    found.textContent = label;
    td.appendChild(found);
  }
  found.onclick = action;
  return found;
}

// The colours follow the alert rule's threshold (deploy/: health score < 60).
function level(score, breaker) {
  if (breaker === "open" || score < 60) return "bad";
  if (score < 80) return "warn";
  return "good";
}

function ago(ms) {
  if (!ms) return "–";
  const seconds = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (seconds < 60) return seconds + " s ago";
  if (seconds < 3600) return Math.round(seconds / 60) + " min ago";
  return Math.round(seconds / 3600) + " h ago";
}

function stamp(id, warning) {
  $(id).textContent = "updated " + new Date().toLocaleTimeString() + (warning ? "; " + warning : "");
}

// === Confirmation ===

// Opens the dialog; `fields` are {name, label, value}; resolves to the values or null.
function confirmAction(title, text, fields, run) {
  const dialog = $("confirm");
  $("confirm-title").textContent = title;
  $("confirm-text").textContent = text;
  const box = $("confirm-fields");
  box.replaceChildren();
  for (const field of fields) {
    const label = document.createElement("label");
    label.textContent = field.label;
    label.htmlFor = "field-" + field.name;
    const input = document.createElement("input");
    input.id = "field-" + field.name;
    input.name = field.name;
    input.value = field.value;
    box.append(label, input);
  }
  $("confirm-error").hidden = true;
  $("confirm-cancel").onclick = () => dialog.close();
  $("confirm-form").onsubmit = async (event) => {
    event.preventDefault();
    const values = {};
    for (const field of fields) values[field.name] = $("field-" + field.name).value.trim();
    const outcome = await run(values);
    if (outcome === true) { dialog.close(); return; }
    say("confirm-error", outcome, true);
  };
  dialog.showModal();
  const first = box.querySelector("input") || $("confirm-ok");
  first.focus();
}

// === Agents ===

// The registry's heartbeat ages by agent_id; empty when it cannot say (the
// cells then show "—", and the reason is in their tooltip).
function heartbeatAges(answer) {
  const ages = new Map();
  if (answer.status === 200 && answer.body && Array.isArray(answer.body.heartbeats)) {
    for (const beat of answer.body.heartbeats) ages.set(beat.agent_id, beat);
    return { ages, why: "" };
  }
  return { ages, why: "heartbeat ages unavailable: " + problem(answer) };
}

async function loadAgents() {
  const [answer, beats] = await Promise.all([api("GET", "/v1/routing/instances"), api("GET", "/v1/heartbeats")]);
  if (answer.status !== 200) return failed(answer);
  const data = answer.body;
  const stale = !data.snapshot.registry_connected;
  const heartbeats = heartbeatAges(beats);
  const items = data.instances;
  $("agents-empty").hidden = items.length > 0;
  rows($("agents").tBodies[0], items, (item) => item.agent_id + "|" + item.capability + "|" + item.version, (row, item) => {
    const grade = level(item.health, item.breaker);
    row.className = grade === "bad" ? "bad" : "";
    row.dataset.agent = item.agent_id;
    row.dataset.health = grade;
    cell(row, 0, item.agent_id);
    cell(row, 1, item.capability);
    cell(row, 2, item.version);
    cell(row, 3, item.status + (item.routable ? "" : " (not routable)"));
    cell(row, 4, item.weight, "num");
    const health = row.cells[5] || row.insertCell();
    let pill = health.querySelector(".pill");
    if (!pill) {
      health.replaceChildren();
      const wrap = document.createElement("span"); wrap.className = "health";
      const bar = document.createElement("span"); bar.className = "bar"; bar.appendChild(document.createElement("i"));
      pill = document.createElement("span");
      wrap.append(pill, bar); health.appendChild(wrap);
    }
    pill.className = "pill " + grade;
    pill.textContent = String(item.health);
    const fill = health.querySelector(".bar i");
    fill.className = grade; fill.style.width = item.health + "%";
    health.title = "health " + item.health + "/100";
    cell(row, 6, item.breaker, item.breaker === "open" ? "bad-text" : "");
    cell(row, 7, item.inflight, "num");
    const beat = heartbeats.ages.get(item.agent_id);
    const age = cell(row, 8, beat ? beat.age_s + " s ago" : "—", "num age");
    age.title = beat ? "lease " + beat.ttl_s + " s, expires in " + beat.remaining_s + " s without a heartbeat" : (heartbeats.why || "no live lease for this instance");
    const actions = row.cells[9] || row.insertCell();
    button(actions, "Weight…", () => changeWeight(item), "weight");
    button(actions, "Drain…", () => drain(item), "drain").disabled = item.status === "draining";
  });
  stamp("agents-updated", stale ? "registry lost " + Math.round(data.snapshot.staleness_ms / 1000) + " s ago" : "");
}

function drain(item) {
  confirmAction("Drain instance", "Drain " + item.agent_id + "? Routers send it no new call; calls in flight finish. Draining is final: it leaves when it stops or deregisters.",
    [], async () => {
      const answer = await api("POST", "/v1/agents/" + encodeURIComponent(item.agent_id) + "/drain");
      if (answer.status >= 300) return problem(answer);
      notify(item.agent_id + " is draining.");
      refresh();
      return true;
    });
}

function changeWeight(item) {
  confirmAction("Change weight", "Set the live weight of " + item.agent_id + " (1–1000). Its next registration sets its own again.",
    [{ name: "weight", label: "Weight", value: String(item.weight) }], async (values) => {
      const weight = Number(values.weight);
      if (!Number.isInteger(weight)) return "the weight must be a whole number";
      const answer = await api("PUT", "/v1/agents/" + encodeURIComponent(item.agent_id) + "/weight", { weight });
      if (answer.status >= 300) return problem(answer);
      notify("Weight of " + item.agent_id + " set to " + weight + ".");
      refresh();
      return true;
    });
}

// === Capabilities ===

async function loadCapabilities() {
  const answer = await api("GET", "/v1/routing/capabilities");
  if (answer.status !== 200) return failed(answer);
  rows($("capabilities").tBodies[0], answer.body.capabilities, (item) => item.name, (row, item) => {
    const stats = item.stats;
    row.dataset.capability = item.name;
    cell(row, 0, item.name);
    cell(row, 1, item.versions.map((v) => v.version + " (" + v.routable + "/" + v.instances + ")").join(", "));
    cell(row, 2, item.split ? item.split.map((s) => s.version + "=" + s.weight).join(" ") : "highest routable");
    cell(row, 3, stats.calls, "num");
    cell(row, 4, (stats.failure_rate * 100).toFixed(1) + " %", "num");
    cell(row, 5, stats.p50_ms === null ? null : stats.p50_ms.toFixed(1), "num");
    cell(row, 6, stats.p90_ms === null ? null : stats.p90_ms.toFixed(1), "num");
    cell(row, 7, stats.p99_ms === null ? null : stats.p99_ms.toFixed(1), "num");
    cell(row, 8, item.policy || "router default");
    const actions = row.cells[9] || row.insertCell();
    button(actions, "Split…", () => changeSplit(item), "split");
    button(actions, "Policy…", () => changePolicy(item), "policy");
  });
  const changes = await api("GET", "/v1/routing/changes?limit=50");
  if (changes.status === 200) {
    rows($("weight-changes").tBodies[0], changes.body.changes, (c) => c.at_ms + "|" + c.capability + "|" + c.version + "|" + c.agent_id, (row, c) => {
      cell(row, 0, new Date(c.at_ms).toLocaleTimeString());
      cell(row, 1, c.capability);
      cell(row, 2, c.version);
      cell(row, 3, c.agent_id);
      cell(row, 4, c.from_permille + " → " + c.to_permille, "num");
      cell(row, 5, c.reason);
    });
  }
  stamp("capabilities-updated");
}

function changePolicy(item) {
  confirmAction("Change default policy", "Calls to " + item.name + " that name no target_policy use this one: weighted_round_robin, least_connections, consistent_hash, p2c_ewma, adaptive or plugin:NAME. Leave empty for the router's default.",
    [{ name: "policy", label: "Policy", value: item.policy || "" }], async (values) => {
      const path = "/v1/capabilities/" + encodeURIComponent(item.name) + "/policy";
      const answer = values.policy ? await api("PUT", path, { policy: values.policy }) : await api("DELETE", path);
      if (answer.status >= 300) return problem(answer);
      notify("Policy of " + item.name + (values.policy ? " set to " + values.policy : " cleared") + ".");
      refresh();
      return true;
    });
}

function changeSplit(item) {
  const current = item.split ? item.split.map((s) => s.version + "=" + s.weight).join(" ")
    : item.versions.map((v, i) => v.version + "=" + (i === 0 ? 100 : 0)).join(" ");
  confirmAction("Change traffic split", "Unpinned calls to " + item.name + " are drawn by these weights (VERSION=WEIGHT …). Leave empty to clear the split.",
    [{ name: "split", label: "Split", value: current }], async (values) => {
      const path = "/v1/capabilities/" + encodeURIComponent(item.name) + "/split";
      let answer;
      if (!values.split) {
        answer = await api("DELETE", path);
      } else {
        const weights = {};
        for (const pair of values.split.split(/\s+/)) {
          const at = pair.lastIndexOf("=");
          if (at < 1) return "`" + pair + "` is not VERSION=WEIGHT";
          weights[pair.slice(0, at)] = Number(pair.slice(at + 1));
        }
        answer = await api("PUT", path, { weights });
      }
      if (answer.status >= 300) return problem(answer);
      notify("Traffic split of " + item.name + (values.split ? " set to " + values.split : " cleared") + ".");
      refresh();
      return true;
    });
}

// === Slow path ===

async function loadSlow() {
  const summary = await api("GET", "/v1/backlog");
  if (summary.status !== 200) {
    say("slow-message", problem(summary), true);
    return;
  }
  $("slow-message").hidden = true;
  rows($("waiting").tBodies[0], summary.body.waiting.filter((w) => w.count > 0), (w) => w.capability + "|" + w.priority, (row, w) => {
    cell(row, 0, w.capability); cell(row, 1, w.priority); cell(row, 2, w.count, "num");
  });
  rows($("running").tBodies[0], summary.body.running, (r) => r.priority, (row, r) => {
    cell(row, 0, r.priority); cell(row, 1, r.count, "num");
  });
  $("dead-count").textContent = String(summary.body.dead_letters);
  const letters = await api("GET", "/v1/dead-letters?limit=50");
  if (letters.status !== 200) return failed(letters);
  rows($("letters").tBodies[0], letters.body.dead_letters, (l) => l.id, (row, l) => {
    row.dataset.letter = l.id;
    cell(row, 0, l.id); cell(row, 1, l.task_id); cell(row, 2, l.url, "wrap"); cell(row, 3, l.error, "wrap");
    cell(row, 4, ago(l.parked_at));
    const actions = row.cells[5] || row.insertCell();
    button(actions, "Inspect", () => inspect(l.id), "inspect");
    button(actions, "Replay…", () => replay(l.id), "replay");
  });
  stamp("slow-updated");
}

async function inspect(id) {
  const answer = await api("GET", "/v1/dead-letters/" + encodeURIComponent(id));
  $("letter").hidden = false;
  $("letter-id").textContent = id;
  $("letter-body").textContent = answer.status === 200 ? JSON.stringify(answer.body, null, 2) : problem(answer);
  $("letter-replay").onclick = () => replay(id);
  $("letter-close").onclick = () => { $("letter").hidden = true; };
  $("letter-replay").focus();
}

function replay(id) {
  confirmAction("Replay dead letter", "Send the callback of " + id + " again, from its first attempt?", [], async () => {
    const answer = await api("POST", "/v1/dead-letters/" + encodeURIComponent(id) + "/replay");
    $("confirm").close();
    if (answer.status !== 200) {
      const code = answer.body && answer.body.error && answer.body.error.code;
      const text = code === "DEAD_LETTER_NOT_FOUND"
        ? "Dead letter " + id + " was already replayed (or is gone). " + problem(answer)
        : problem(answer);
      notify(text, true);
      return true;
    }
    notify("Dead letter " + id + " replayed: the callback of task " + answer.body.task_id + " is scheduled again.");
    refresh();
    return true;
  });
}

// === Requests ===

async function lookup(id) {
  $("request-id").value = id;
  const answer = await api("GET", "/v1/requests/" + encodeURIComponent(id));
  if (answer.status !== 200) {
    $("request").hidden = true;
    const code = answer.body && answer.body.error && answer.body.error.code;
    say("request-message", code === "NOT_FOUND" ? "Unknown request id. " + problem(answer) : problem(answer), true);
    return;
  }
  const data = answer.body;
  const last = data.calls[0];
  say("request-message", "Found " + data.calls.length + " call(s) for " + id + ".", false);
  const summary = $("request-summary");
  summary.replaceChildren();
  const add = (name, value) => {
    const dt = document.createElement("dt"); dt.textContent = name;
    const dd = document.createElement("dd"); dd.textContent = value === null || value === undefined ? "–" : String(value);
    dd.dataset.field = name;
    summary.append(dt, dd);
  };
  if (last) {
    add("outcome", last.outcome + (last.error ? " (" + last.error.code + ": " + last.error.message + ")" : ""));
    add("route", last.capability + (last.capability_version ? " @ " + last.capability_version : "") + " via " + last.entry);
    add("caller", last.caller);
    add("attempts", last.attempts.length);
    add("duration", last.duration_ms.toFixed(1) + " ms");
    add("trace id", last.trace_id);
    add("task", last.task_id);
    add("when", new Date(last.started_at_ms).toISOString());
  }
  const attempts = [];
  data.calls.forEach((call, n) => call.attempts.forEach((a) => attempts.push({ call: n + 1, ...a })));
  rows($("attempts").tBodies[0], attempts, (a) => a.call + "|" + a.attempt, (row, a) => {
    cell(row, 0, a.call); cell(row, 1, a.attempt); cell(row, 2, a.agent_id);
    cell(row, 3, a.duration_ms.toFixed(1), "num"); cell(row, 4, a.outcome);
  });
  $("request-task").textContent = data.task ? JSON.stringify(data.task, null, 2) : "– (not a task)";
  $("request").hidden = false;
}

async function loadRequests() {
  const answer = await api("GET", "/v1/requests?outcome=failed&limit=20");
  if (answer.status !== 200) return failed(answer);
  rows($("failed").tBodies[0], answer.body.calls, (c) => c.request_id + "|" + c.started_at_ms, (row, c) => {
    const first = row.cells[0] || row.insertCell();
    let link = first.querySelector("a");
    if (!link) { link = document.createElement("a"); link.href = "#/requests"; first.replaceChildren(link); }
    link.textContent = c.request_id;
    link.onclick = (event) => { event.preventDefault(); lookup(c.request_id); };
    cell(row, 1, c.capability); cell(row, 2, c.error ? c.error.code : ""); cell(row, 3, c.duration_ms.toFixed(1), "num");
    cell(row, 4, ago(c.started_at_ms));
  });
}

// === Pages, sign-in, refresh ===

function failed(answer) {
  if (answer.status === 401) return signedOut("Signed out. " + problem(answer));
  if (answer.status === 403) return signedOut("Refused. " + problem(answer));
  notify(problem(answer), true);
}

function current() {
  const page = (location.hash.match(/^#\/(\w+)/) || [])[1];
  return PAGES.includes(page) ? page : "agents";
}

async function refresh() {
  if (!signedIn) return;
  const page = current();
  if (page === "agents") await loadAgents();
  else if (page === "capabilities") await loadCapabilities();
  else if (page === "slow") await loadSlow();
  else await loadRequests();
}

function show() {
  const page = current();
  if (document.body.dataset.page !== page) $("notice").hidden = true;
  document.body.dataset.page = page;
  for (const name of PAGES) $("page-" + name).hidden = name !== page;
  for (const link of document.querySelectorAll("nav a")) {
    if (link.dataset.page === page) link.setAttribute("aria-current", "page"); else link.removeAttribute("aria-current");
  }
  refresh();
}

function signedOut(message) {
  signedIn = false;
  if (timer) { clearInterval(timer); timer = null; }
  for (const name of PAGES) $("page-" + name).hidden = true;
  $("nav").hidden = true;
  $("sign-out").hidden = true;
  $("operator").textContent = "";
  $("signin").hidden = false;
  say("signin-message", message, true);
}

function signedInAs(name) {
  signedIn = true;
  $("signin").hidden = true;
  $("nav").hidden = false;
  $("sign-out").hidden = false;
  $("operator").textContent = "operator: " + name;
  if (!PAGES.includes((location.hash.match(/^#\/(\w+)/) || [])[1])) history.replaceState(null, "", "#/agents");
  show();
  if (!timer) timer = setInterval(refresh, REFRESH_MS);
}

async function boot() {
  const code = (location.hash.match(/^#code=([0-9a-f]+)$/) || [])[1];
  if (code) {
    // The link's code is spent at once and never stays in the address bar.
    history.replaceState(null, "", "#/agents");
    const answer = await api("POST", "/v1/console/session", { code });
    if (answer.status !== 200) return signedOut("Sign-in failed. " + problem(answer));
    return signedInAs(answer.body.operator);
  }
  const answer = await api("GET", "/v1/console/session");
  if (answer.status === 200) return signedInAs(answer.body.operator);
  signedOut((answer.status === 403 ? "Refused. " : "Not signed in. ") + problem(answer));
}

window.addEventListener("hashchange", () => {
  // A sign-in link opened in a tab already showing the console changes only the fragment.
  if (/^#code=/.test(location.hash)) boot();
  else if (signedIn) show();
});
document.addEventListener("keydown", (event) => {
  if (!signedIn || event.target.closest("input, textarea, dialog")) return;
  if (event.key === "/") { event.preventDefault(); location.hash = "#/requests"; $("request-id").focus(); }
  const index = "1234".indexOf(event.key);
  if (index >= 0 && !event.altKey && !event.ctrlKey && !event.metaKey) location.hash = "#/" + PAGES[index];
});
document.addEventListener("DOMContentLoaded", () => {
  $("lookup").addEventListener("submit", (event) => { event.preventDefault(); const id = $("request-id").value.trim(); if (id) lookup(id); });
  $("sign-out").addEventListener("click", async () => { await api("DELETE", "/v1/console/session"); signedOut("Signed out."); });
  boot();
});
