// The console's pictures of the trail (DESIGN §3.13, docs/console.md):
// a request's collaboration (its session's or run's records, every router's)
// drawn as a graph of hops, and per capability a small chart of calls,
// failure rate and p99 over the last hour, from every router's records.
// Inline SVG, built with createElementNS and textContent (data is never
// parsed as markup). It uses the page's `api` and `problem` (console.js),
// which calls `trailLookup`, `drawHops`, `trailFigures` and `drawSpark`.
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
// The figures are read from the trail at most this often (the page refreshes every second).
const FIGURES_EVERY_MS = 10000;
// A collaboration larger than this is drawn in part (and says so).
const HOPS_DRAWN = 200;

function svgElement(name, attributes, text) {
  const element = document.createElementNS(SVG_NS, name);
  for (const [key, value] of Object.entries(attributes || {})) element.setAttribute(key, String(value));
  if (text !== undefined) element.textContent = text;
  return element;
}

function trailCode(answer) {
  return answer.body && answer.body.error && answer.body.error.code;
}

// === A request's collaboration ===

// The trail's records of request `id` and of the collaboration it belongs to
// (its run's, else its session's, else its own), with the tree of hops:
// {state: "found", records, collaboration: {kind, id, tree, count}},
// {state: "missing"}, {state: "off", message} or {state: "error", message}.
async function trailLookup(id) {
  const own = await api("GET", "/v1/trail?view=tree&limit=1000&request_id=" + encodeURIComponent(id));
  if (own.status === 501 || trailCode(own) === "TRAIL_DISABLED") return { state: "off", message: problem(own) };
  if (own.status !== 200) return { state: "error", message: problem(own) };
  const records = own.body.records;
  if (!records.length) return { state: "missing" };
  const last = records[records.length - 1];
  let collaboration = { kind: "request", id, tree: own.body.tree, count: records.length };
  const wider = last.run_id ? ["run", last.run_id] : last.session_id ? ["session", last.session_id] : null;
  if (wider) {
    const answer = await api("GET", "/v1/trail?view=tree&limit=1000&" + wider[0] + "_id=" + encodeURIComponent(wider[1]));
    if (answer.status === 200 && answer.body.records.length) {
      collaboration = { kind: wider[0], id: wider[1], tree: answer.body.tree, count: answer.body.records.length, more: !!answer.body.next_cursor };
    }
  }
  return { state: "found", records, collaboration };
}

// Draws `tree` (the trail's hops, each with `children`) into `svg`: one box
// per hop (capability@version, instance, time, outcome), an edge from each
// hop to the hops made while serving it; the hop `focus` (a request id) is
// outlined. Depth runs left to right, siblings top to bottom.
function drawHops(svg, tree, focus) {
  const W = 210, H = 58, GX = 44, GY = 12;
  svg.replaceChildren();
  const placed = [];
  let row = 0;
  let drawn = 0;
  const place = (hop, depth, parent) => {
    if (drawn >= HOPS_DRAWN) return;
    drawn += 1;
    const at = { hop, depth, parent, row };
    placed.push(at);
    const children = hop.children || [];
    if (!children.length) row += 1;
    for (const child of children) place(child, depth + 1, at);
    // A parent without drawn children still takes its own row.
    if (children.length && at.row === row) row += 1;
  };
  for (const root of tree) place(root, 0, null);
  const depth = Math.max(0, ...placed.map((p) => p.depth));
  svg.setAttribute("width", (depth + 1) * (W + GX));
  svg.setAttribute("height", Math.max(1, row) * (H + GY) + 8);
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "The collaboration as a graph of " + placed.length + " hops");
  const x = (p) => p.depth * (W + GX) + 4;
  const y = (p) => p.row * (H + GY) + 4;
  for (const p of placed) {
    if (!p.parent) continue;
    const [x1, y1, x2, y2] = [x(p.parent) + W, y(p.parent) + H / 2, x(p), y(p) + H / 2];
    const edge = svgElement("path", { d: `M${x1},${y1} C${x1 + GX / 2},${y1} ${x2 - GX / 2},${y2} ${x2},${y2}`, class: "edge" });
    edge.dataset.from = p.parent.hop.request_id;
    edge.dataset.to = p.hop.request_id;
    svg.appendChild(edge);
  }
  for (const p of placed) {
    const hop = p.hop;
    const failed = hop.status === "failed";
    const g = svgElement("g", { class: "hop" + (failed ? " failed" : "") + (hop.request_id === focus ? " focus" : ""), transform: `translate(${x(p)},${y(p)})` });
    g.dataset.request = hop.request_id;
    g.dataset.status = hop.status;
    const outcome = hop.code ? hop.code : hop.status;
    g.append(
      svgElement("rect", { width: W, height: H, rx: 6 }),
      svgElement("text", { x: 8, y: 17, class: "cap" }, hop.capability + "@" + (hop.capability_version || "?")),
      svgElement("text", { x: 8, y: 34 }, (hop.agent_id || "–") + " · " + Number(hop.duration_ms).toFixed(1) + " ms"),
      svgElement("text", { x: 8, y: 50, class: "outcome" }, outcome + " · " + hop.attempts + (hop.attempts === 1 ? " attempt" : " attempts") + " · " + hop.door),
      svgElement("title", {}, hop.request_id + ": " + (hop.caller || "anonymous") + " → " + hop.capability + ", via router " + hop.router + ", " + new Date(hop.at_ms).toISOString()),
    );
    svg.appendChild(g);
  }
  return placed.length;
}

// === The installation's figures ===

let figures = { at: 0, pending: null, value: null };

// The trail's figures of the last hour (`GET /v1/trail/stats`), read at most
// every FIGURES_EVERY_MS: {state: "trail", data, byName}, {state: "off", message}
// or {state: "error", message}.
async function trailFigures() {
  if (figures.value && Date.now() - figures.at < FIGURES_EVERY_MS) return figures.value;
  if (!figures.pending) {
    figures.pending = (async () => {
      const answer = await api("GET", "/v1/trail/stats?buckets=12");
      let value;
      if (answer.status === 200) {
        value = { state: "trail", data: answer.body, byName: new Map(answer.body.capabilities.map((c) => [c.name, c])) };
      } else if (answer.status === 501 || trailCode(answer) === "TRAIL_DISABLED") {
        value = { state: "off", message: problem(answer) };
      } else {
        value = { state: "error", message: problem(answer) };
      }
      figures = { at: Date.now(), pending: null, value };
      return value;
    })();
  }
  return figures.pending;
}

// Where the capabilities page's figures come from, in words.
function figuresSource(state) {
  if (state.state === "trail") {
    const data = state.data;
    let text = "Calls, failure rate and latency from the trail, all routers, last hour (" + data.routers + " router chain(s), " + data.records_read + " records read";
    if (data.capped) text += "; capped: the newest records only, from " + new Date(data.oldest_read_ms).toLocaleTimeString();
    return text + "). Charts: calls (bars), failure rate (red) and p99 (dark line) in 5-minute buckets.";
  }
  const why = state.state === "off" ? "the trail is off on this router" : "the trail could not be read: " + state.message;
  return "Calls, failure rate and latency over the last five minutes, from this router's recent calls only (" + why + ").";
}

// A capability's last hour in `svg`: a bar per bucket for its calls, a red
// line for the failure rate (0–100 %) and a dark line for p99 (0 to the
// hour's highest); each bucket's numbers in its bar's tooltip.
function drawSpark(svg, capability, bucketMs) {
  const W = 156, H = 40, PAD = 2;
  const buckets = capability ? capability.buckets : [];
  const shape = buckets.map((b) => b.start_ms + ":" + b.calls + ":" + b.failed + ":" + b.p99_ms).join(";");
  if (svg.dataset.shape === shape) return;
  svg.dataset.shape = shape;
  svg.replaceChildren();
  svg.setAttribute("width", W);
  svg.setAttribute("height", H);
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("role", "img");
  const calls = buckets.reduce((sum, b) => sum + b.calls, 0);
  svg.setAttribute("aria-label", calls + " calls in the last hour");
  if (!buckets.length) {
    svg.appendChild(svgElement("text", { x: PAD, y: H / 2 + 4, class: "none" }, "no calls"));
    return;
  }
  // The hour's axis, so a quiet hour still reads as an hour.
  svg.appendChild(svgElement("line", { class: "axis", x1: PAD, y1: H - PAD + 0.5, x2: W - PAD, y2: H - PAD + 0.5 }));
  const step = (W - 2 * PAD) / buckets.length;
  const most = Math.max(1, ...buckets.map((b) => b.calls));
  const slowest = Math.max(0, ...buckets.map((b) => b.p99_ms || 0));
  const bars = svgElement("g", { class: "calls" });
  buckets.forEach((b, i) => {
    const height = Math.max(b.calls ? 1 : 0, (b.calls / most) * (H - 2 * PAD));
    const bar = svgElement("rect", { x: (PAD + i * step + 1).toFixed(1), y: (H - PAD - height).toFixed(1), width: Math.max(1, step - 2).toFixed(1), height: height.toFixed(1) });
    const end = new Date(b.start_ms + bucketMs);
    bar.appendChild(svgElement("title", {}, new Date(b.start_ms).toLocaleTimeString() + "–" + end.toLocaleTimeString() + ": " + b.calls + " calls, " +
      (b.failure_rate * 100).toFixed(1) + " % failed, p99 " + (b.p99_ms === null ? "–" : b.p99_ms.toFixed(1) + " ms")));
    bars.appendChild(bar);
  });
  svg.appendChild(bars);
  const line = (cls, value) => {
    const points = [];
    buckets.forEach((b, i) => {
      const v = value(b);
      if (v !== null) points.push((PAD + (i + 0.5) * step).toFixed(1) + "," + (H - PAD - v * (H - 2 * PAD)).toFixed(1));
    });
    if (!points.length) return;
    svg.appendChild(svgElement("polyline", { class: cls, points: points.join(" ") }));
    // The latest value as a dot (a single bucket's line is only that dot).
    const [cx, cy] = points[points.length - 1].split(",");
    svg.appendChild(svgElement("circle", { class: cls, cx, cy, r: 2 }));
  };
  line("failures", (b) => (b.calls ? b.failure_rate : null));
  line("p99", (b) => (b.p99_ms === null || !slowest ? null : b.p99_ms / slowest));
}
