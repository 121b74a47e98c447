"use strict";
const MiB = 1 << 20;
const charts = {};
let names = {};

function mib(x) { return (x / MiB).toFixed(1); }

// Application names come from the applications themselves: they are only ever shown as text
// (dygraphs 2.2.1 escapes series labels in its legend itself; the test checks the whole page).

// An element with text in it (never parsed as HTML), and an optional class.
function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined) e.textContent = text;
  if (cls) e.className = cls;
  return e;
}

// One chart per series family; columns follow the applications seen in the history.
function draw(id, labels, rows, extra) {
  const opts = Object.assign({ labels, legend: "always", labelsSeparateLines: false,
    xlabel: "seconds", connectSeparatedPoints: false, drawPoints: false }, extra || {});
  if (rows.length === 0) rows = [[0].concat(labels.slice(1).map(() => null))];
  if (charts[id] && charts[id].numColumns() === labels.length) {
    charts[id].updateOptions({ file: rows });
  } else {
    if (charts[id]) charts[id].destroy();
    charts[id] = new Dygraph(document.getElementById(id), rows, opts);
  }
}

function render(history, state) {
  for (const a of state.apps) names[a.id] = a.name + " #" + a.id;
  const ids = [];
  for (const s of history) for (const a of s.apps) if (!ids.includes(a[0])) ids.push(a[0]);
  const label = id => names[id] || ("#" + id);
  const col = (s, k) => ids.map(id => { const a = s.apps.find(x => x[0] === id); return a ? a[k] : null; });
  // Headroom on its own axis: on a big machine it dwarfs the pool.
  draw("idle", ["t", "idle pool", "soft held", "headroom"],
       history.map(s => [s.seconds, s.pool / MiB, s.held / MiB, s.headroom / MiB]),
       { series: { headroom: { axis: "y2" } }, axes: { y2: { independentTicks: true } },
         y2label: "headroom (MiB)" });
  const per = (k, scale) => history.map(s => [s.seconds].concat(col(s, k).map(v => v === null ? null : v / scale)));
  draw("budget", ["t"].concat(ids.map(label)), per(1, MiB));
  draw("held", ["t"].concat(ids.map(label)), per(2, MiB));
  draw("utility", ["t"].concat(ids.map(label)), per(3, 1));
  // Miss curves now: what more memory would save each application (log scale of MiB).
  const curveRows = (state.apps[0] ? state.apps[0].curve : []).map((p, k) =>
    [p.extra_mib].concat(state.apps.map(a => a.curve[k] ? a.curve[k].saved_ms_per_s : null)));
  draw("curve", ["extra MiB"].concat(state.apps.map(a => label(a.id))), curveRows,
       { xlabel: "MiB more", axes: { x: { logscale: true } } });
  document.getElementById("utility-title").textContent = state.policy === "hitrate"
    ? "Marginal utility: hits per second a MiB more would add"
    : "Marginal utility: miss ms per second a MiB more would save";
  // The summary: labels as text, figures in bold.
  const summary = document.getElementById("summary");
  const parts = [["policy ", state.policy], [" · idle pool ", mib(state.pool)],
    [" MiB · granted ", mib(state.granted)], [" · held ", mib(state.held)],
    [" · MemAvailable ", mib(state.mem_available)], [" · reserve ", mib(state.reserve)],
    [" · pressure ", (100 * state.pressure).toFixed(1) + "%"]];
  summary.replaceChildren();
  for (const [text, value] of parts) summary.append(text, el("b", value));
  summary.append(" · ", el("span", `longest under reserve ${state.longest_below_reserve_ms.toFixed(0)} ms`,
    state.longest_below_reserve_ms > 1000 ? "bad" : ""));
  summary.append(` · punched ${mib(state.punched_bytes)} MiB · up ${state.seconds.toFixed(0)} s`);
  const body = document.querySelector("#apps tbody");
  const editing = document.activeElement && document.activeElement.classList.contains("w");
  if (editing) return; // do not pull a weight field from under the operator's cursor
  body.replaceChildren();
  for (const a of state.apps) {
    const tr = document.createElement("tr");
    const input = document.createElement("input");
    Object.assign(input, { className: "w", type: "number", min: "0.1", step: "0.1", value: String(a.weight) });
    const weight = document.createElement("td");
    weight.append(input);
    const paged = a.kind === "paged";
    tr.append(el("td", `${a.name} #${a.id}`), el("td", a.kind), el("td", String(a.pid)), el("td", String(a.uid)), weight,
      el("td", mib(a.budget)), el("td", mib(a.held)), el("td", paged ? "-" : a.hit_rate.toFixed(3)),
      el("td", (a.reads_per_s * (1 - a.hit_rate)).toFixed(0)), el("td", a.miss_us.toFixed(1)),
      el("td", (100 * a.rebuild_share).toFixed(1) + "%"),
      el("td", a.utility_per_mib.toFixed(3)), el("td", mib(a.punched_bytes)));
    input.addEventListener("change", ev => setWeight(a.id, parseFloat(ev.target.value)));
    body.appendChild(tr);
  }
}

// Changes need the coordinator's token (its token file); asked once, kept for this tab only.
async function setWeight(id, weight) {
  let token = sessionStorage.getItem("tidepool-token");
  if (!token) {
    token = window.prompt("Changing a weight needs the coordinator's token (the file `tidepool coord` names when it starts):");
    if (!token) return;
    sessionStorage.setItem("tidepool-token", token.trim());
  }
  const r = await fetch(`/api/apps/${id}/weight`, {
    method: "POST",
    headers: { "content-type": "application/json", "authorization": `Bearer ${sessionStorage.getItem("tidepool-token")}` },
    body: JSON.stringify({ weight }),
  });
  if (r.status === 401) sessionStorage.removeItem("tidepool-token");
  if (!r.ok) window.alert(`The weight was not changed: ${r.status} ${await r.text()}`);
}

async function refresh() {
  try {
    const [h, s] = await Promise.all([fetch("/api/history"), fetch("/api/state")]);
    render(await h.json(), await s.json());
    document.body.dataset.samples = String(charts.idle ? charts.idle.numRows() : 0);
  } catch (e) {
    document.getElementById("summary").textContent = "coordinator unreachable: " + e;
  }
}
refresh();
setInterval(refresh, 1000);
