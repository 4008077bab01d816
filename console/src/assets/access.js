// The console's access section (DESIGN §2.11): pending access requests with
// approve and deny, and who may call what (acl.yaml's permissions beside the
// live grants this router applies) with revoke. Self-contained: it uses the
// page's helpers (api, rows, cell, button, confirmAction, notify, problem,
// ago) and refreshes itself every second while the Capabilities page shows.
"use strict";

(() => {
  const byId = (id) => document.getElementById(id);

  function visible() {
    return signedIn && !byId("page-capabilities").hidden;
  }

  function decide(request, verb) {
    const what = verb === "approve" ? "Approve" : "Deny";
    confirmAction(what + " access", request.caller + " asks to call " + request.capability + ": " + request.reason,
      [{ name: "note", label: "Note (kept with the decision)", value: "" }], async (values) => {
        const body = values.note ? { note: values.note } : {};
        const answer = await api("POST", "/v1/access-requests/" + encodeURIComponent(request.id) + "/" + verb, body);
        if (answer.status >= 300) return problem(answer);
        notify(what + "d " + request.id + ": " + request.caller + (verb === "approve" ? " may" : " may not") + " call " + request.capability + ".");
        load();
        return true;
      });
  }

  function revoke(grant) {
    confirmAction("Revoke access", grant.caller + " may call " + grant.capability + " by grant " + grant.id +
      " (approved by " + (grant.granted_by || "–") + "). Every router refuses its calls once revoked.", [], async () => {
      const answer = await api("DELETE", "/v1/grants/" + encodeURIComponent(grant.id));
      if (answer.status >= 300) return problem(answer);
      notify("Revoked " + grant.id + ".");
      load();
      return true;
    });
  }

  function expiry(grant) {
    if (!grant.live) return " (expired)";
    if (!grant.expires_at_ms) return "";
    const minutes = Math.max(0, Math.round((grant.expires_at_ms - Date.now()) / 60000));
    return " (expires in " + minutes + " min)";
  }

  async function load() {
    const pending = await api("GET", "/v1/access-requests?status=pending");
    const view = await api("GET", "/v1/routing/access");
    const requests = pending.status === 200 ? pending.body.requests : [];
    rows(byId("access-requests").tBodies[0], requests, (r) => r.id, (row, r) => {
      cell(row, 0, r.id); cell(row, 1, r.caller); cell(row, 2, r.capability); cell(row, 3, r.reason, "wrap");
      cell(row, 4, (r.approvers || []).join(", ")); cell(row, 5, ago(r.requested_at_ms), "age");
      const actions = row.cells[6] || row.insertCell();
      button(actions, "Approve…", () => decide(r, "approve"), "approve");
      button(actions, "Deny…", () => decide(r, "deny"), "deny");
    });
    byId("access-requests-empty").hidden = requests.length > 0 || pending.status !== 200;
    if (view.status !== 200) {
      byId("access-updated").textContent = problem(view);
      return;
    }
    const callers = new Map();
    for (const rule of view.body.permissions) callers.set(rule.caller, { caller: rule.caller, allow: rule.allow, grants: [] });
    for (const grant of view.body.grants) {
      if (!callers.has(grant.caller)) callers.set(grant.caller, { caller: grant.caller, allow: [], grants: [] });
      callers.get(grant.caller).grants.push(grant);
    }
    const items = Array.from(callers.values()).sort((a, b) => a.caller.localeCompare(b.caller));
    rows(byId("access-rules").tBodies[0], items, (item) => item.caller, (row, item) => {
      cell(row, 0, item.caller);
      cell(row, 1, item.allow.length ? item.allow.join(", ") : "–", "wrap");
      cell(row, 2, item.grants.map((g) => g.capability + expiry(g)).join(", ") || "–", "wrap");
      const actions = row.cells[3] || row.insertCell();
      for (const old of Array.from(actions.querySelectorAll("button"))) {
        if (!item.grants.some((g) => "revoke-" + g.id === old.dataset.name)) old.remove();
      }
      for (const grant of item.grants) button(actions, "Revoke " + grant.capability + "…", () => revoke(grant), "revoke-" + grant.id);
    });
    const note = pending.status === 200 ? "" : "requests: " + problem(pending);
    byId("access-updated").textContent = "updated " + new Date().toLocaleTimeString() + (note ? "; " + note : "");
  }

  let busy = false;
  setInterval(async () => {
    if (!visible() || busy) return;
    busy = true;
    try { await load(); } finally { busy = false; }
  }, 1000);
})();
