/**
 * The dashboard page served at `GET /` on the admin port: one self-contained HTML document (inline
 * CSS and script, no external fetch; the only request it makes is the EventSource on
 * /dashboard/events). It draws the fleet at a glance — a row per replica (health, KV usage, queue,
 * running, prefix-hit rate, the gateway's picks), the gateway's TTFT, throughput and rejections over
 * the last five minutes as SVG lines, and flow control's bands and flows when it is on — and
 * redraws on every sample. Sized for a laptop screen (fits 1280×800 with 8 replicas).
 */

const CSS = `
*{box-sizing:border-box}body{margin:0;font:13px/1.35 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;background:#f5f6f8;color:#1d2330}
header{display:flex;align-items:center;gap:18px;padding:10px 18px;background:#1d2330;color:#fff;flex-wrap:wrap}
header h1{font-size:16px;margin:0;font-weight:600}header .pool{opacity:.7}
#live{margin-left:auto;font-size:12px}#live.on::before{content:"●";color:#3ecf8e;margin-right:5px}#live.off::before{content:"●";color:#e5484d;margin-right:5px}
.kpis{display:grid;grid-template-columns:repeat(6,1fr);gap:10px;padding:12px 18px 0}
.kpi{background:#fff;border-radius:8px;padding:8px 12px;box-shadow:0 1px 2px #0001}.kpi b{display:block;font-size:20px;font-variant-numeric:tabular-nums}.kpi span{color:#667;font-size:12px}
.charts{display:grid;grid-template-columns:repeat(3,1fr);gap:10px;padding:10px 18px 0}
.card{background:#fff;border-radius:8px;padding:8px 12px;box-shadow:0 1px 2px #0001}.card h2{font-size:12px;margin:0 0 4px;color:#445;font-weight:600}
svg.chart{width:100%;height:110px;display:block}.legend{font-size:11px;color:#667}.legend i{display:inline-block;width:10px;height:3px;margin:0 4px 2px 8px;vertical-align:middle}
section{padding:10px 18px 0}table{width:100%;border-collapse:collapse;background:#fff;border-radius:8px;overflow:hidden;box-shadow:0 1px 2px #0001}
th,td{padding:5px 8px;text-align:right;white-space:nowrap;font-variant-numeric:tabular-nums}th{background:#eef0f4;color:#445;font-weight:600;font-size:12px}
td:first-child,th:first-child{text-align:left}tr+tr td{border-top:1px solid #eef0f4}
.dot{display:inline-block;width:9px;height:9px;border-radius:50%;margin-right:6px}.healthy{background:#3ecf8e}.unhealthy{background:#e5484d}.unknown{background:#aab}.probation{background:#f5a524}
.bar{display:inline-block;width:90px;height:9px;background:#eef0f4;border-radius:5px;vertical-align:middle;margin-left:6px;overflow:hidden}.bar i{display:block;height:100%;background:#3b82f6}
.bar.kv i{background:#8b5cf6}.bar.hot i{background:#e5484d}
.empty{color:#889;padding:10px}.chip{display:inline-block;background:#eef0f4;border-radius:10px;padding:1px 8px;margin-left:4px}#flows td:last-child,#flows-section th:last-child{text-align:left;width:70%}footer{color:#889;font-size:11px;padding:10px 18px}
`;

const SCRIPT = `
const $ = (id) => document.getElementById(id);
const samples = [];
const WINDOW_MS = 300000;
const fmt = (v, d = 1) => v == null || !isFinite(v) ? "–" : v >= 1000 ? Math.round(v).toLocaleString("en") : v.toFixed(d);
const ms = (s) => s == null ? "–" : s < 1 ? Math.round(s * 1000) + " ms" : s.toFixed(2) + " s";
const pct = (v) => v == null ? "–" : Math.round(v * 100) + "%";
const esc = (s) => String(s).replace(/[&<>"']/g, (c) => "&#" + c.charCodeAt(0) + ";");
// hot: a bar where high is bad (KV cache nearly full) turns red past 90%.
function bar(frac, cls, hot) {
  const f = frac == null ? 0 : Math.max(0, Math.min(1, frac));
  return '<span class="bar ' + (cls || "") + (hot && f > 0.9 ? " hot" : "") + '"><i style="width:' + (f * 100).toFixed(1) + '%"></i></span>';
}
function chart(id, series) {
  const svg = $(id), w = 400, h = 110, pad = 22;
  const now = samples.length ? samples[samples.length - 1].t : Date.now();
  let max = 0;
  for (const s of series) for (const p of samples) { const v = s.get(p); if (v != null && v > max) max = v; }
  max = max > 0 ? max * 1.1 : 1;
  const x = (t) => pad + ((t - (now - WINDOW_MS)) / WINDOW_MS) * (w - pad - 4);
  const y = (v) => h - 14 - (v / max) * (h - 22);
  let out = '<line x1="' + pad + '" y1="' + (h - 14) + '" x2="' + w + '" y2="' + (h - 14) + '" stroke="#dde"/>';
  out += '<text x="2" y="12" font-size="10" fill="#889">' + esc(series[0].fmt(max)) + "</text>";
  out += '<text x="' + pad + '" y="' + (h - 2) + '" font-size="10" fill="#889">−5 min</text><text x="' + (w - 24) + '" y="' + (h - 2) + '" font-size="10" fill="#889">now</text>';
  for (const s of series) {
    let d = "", pen = false;
    for (const p of samples) {
      const v = s.get(p);
      if (v == null || p.t < now - WINDOW_MS) { pen = false; continue; }
      d += (pen ? "L" : "M") + x(p.t).toFixed(1) + " " + y(v).toFixed(1);
      pen = true;
    }
    out += '<path d="' + d + '" fill="none" stroke="' + s.color + '" stroke-width="1.6"/>';
  }
  svg.innerHTML = out;
}
function render() {
  const s = samples[samples.length - 1];
  if (!s) return;
  $("pool").textContent = "pool " + s.pool;
  const ready = s.replicas.filter((r) => r.eligible).length;
  $("k-ready").textContent = ready + " / " + s.replicas.length;
  $("k-inflight").textContent = fmt(s.inFlight, 0);
  $("k-rps").textContent = fmt(s.requestsPerS);
  $("k-tok").textContent = fmt(s.outputTokPerS, 0);
  $("k-ttft").textContent = ms(s.ttftP90);
  $("k-rej").textContent = fmt(s.rejectedPerS) + " / " + fmt(s.errorsPerS);
  chart("c-ttft", [
    { get: (p) => p.ttftP50, color: "#3b82f6", fmt: ms },
    { get: (p) => p.ttftP90, color: "#f97316", fmt: ms },
  ]);
  chart("c-tok", [{ get: (p) => p.outputTokPerS, color: "#8b5cf6", fmt: (v) => fmt(v, 0) }]);
  chart("c-rps", [
    { get: (p) => p.requestsPerS, color: "#3b82f6", fmt: (v) => fmt(v) },
    { get: (p) => p.rejectedPerS, color: "#f5a524", fmt: (v) => fmt(v) },
    { get: (p) => p.errorsPerS, color: "#e5484d", fmt: (v) => fmt(v) },
  ]);
  const minute = samples.filter((p) => p.t > s.t - 60000);
  const picksMin = {};
  for (const p of minute) for (const r of p.replicas) picksMin[r.address] = (picksMin[r.address] || 0) + r.picksPerS;
  const allPicks = Object.values(picksMin).reduce((a, b) => a + b, 0);
  const rows = s.replicas.map((r) => {
    const share = allPicks > 0 ? (picksMin[r.address] || 0) / allPicks : null;
    return '<tr data-replica="' + esc(r.address) + '">' +
      '<td><span class="dot ' + esc(r.health) + '"></span>' + esc(r.address) + (r.eligible ? "" : ' <small>(out)</small>') + "</td>" +
      '<td data-field="kv">' + pct(r.kv) + bar(r.kv, "kv", true) + "</td>" +
      '<td data-field="waiting">' + fmt(r.waiting, 0) + "</td>" +
      '<td data-field="running">' + fmt(r.running, 0) + "</td>" +
      '<td data-field="hit">' + pct(r.hitRate) + bar(r.hitRate) + "</td>" +
      '<td data-field="tok">' + fmt(r.outputTokPerS, 0) + "</td>" +
      '<td data-field="picks">' + fmt(r.picksPerS) + "</td>" +
      '<td data-field="share">' + pct(share) + bar(share) + "</td>" +
      '<td data-field="total">' + fmt(r.picksTotal, 0) + "</td></tr>";
  });
  $("replicas").innerHTML = rows.join("") || '<tr><td class="empty" colspan="9">no endpoints in the pool</td></tr>';
  const f = s.flows;
  $("flows-section").hidden = !f;
  if (f) {
    $("flows-head").textContent = "Flow control — " + f.queued + " queued, saturation " + fmt(f.saturation, 2);
    const fr = f.bands.map((b) => '<tr data-band="' + b.priority + '"><td>priority ' + b.priority + "</td><td>" + b.depth + "</td><td>" +
      (b.flows.map((x) => '<span class="chip" data-flow="' + esc(x.fairnessId) + '">' + esc(x.fairnessId) + " <b>" + x.depth + "</b></span>").join(" ") || "–") + "</td></tr>");
    $("flows").innerHTML = fr.join("");
  }
  $("updated").textContent = "updated " + new Date(s.t).toLocaleTimeString("en-GB") + " · " + samples.length + " samples";
}
function push(s) {
  samples.push(s);
  while (samples.length && samples[0].t < s.t - WINDOW_MS - 2000) samples.shift();
}
const es = new EventSource("dashboard/events");
es.addEventListener("history", (e) => { samples.length = 0; for (const s of JSON.parse(e.data)) push(s); render(); });
es.addEventListener("sample", (e) => { push(JSON.parse(e.data)); render(); });
es.onopen = () => { $("live").className = "on"; $("live").textContent = "live"; };
es.onerror = () => { $("live").className = "off"; $("live").textContent = "reconnecting…"; };
`;

const BODY = `
<header><h1>kvgate</h1><span class="pool" id="pool"></span><span id="live" class="off">connecting…</span></header>
<div class="kpis">
 <div class="kpi"><b id="k-ready">–</b><span>replicas ready</span></div>
 <div class="kpi"><b id="k-inflight">–</b><span>requests in flight</span></div>
 <div class="kpi"><b id="k-rps">–</b><span>requests / s</span></div>
 <div class="kpi"><b id="k-tok">–</b><span>output tokens / s (replicas)</span></div>
 <div class="kpi"><b id="k-ttft">–</b><span>TTFT p90 (last 10 s)</span></div>
 <div class="kpi"><b id="k-rej">–</b><span>rejected / errors per s</span></div>
</div>
<div class="charts">
 <div class="card"><h2>TTFT<span class="legend"><i style="background:#3b82f6"></i>p50<i style="background:#f97316"></i>p90</span></h2><svg class="chart" id="c-ttft" viewBox="0 0 400 110" preserveAspectRatio="none"></svg></div>
 <div class="card"><h2>Output tokens / s</h2><svg class="chart" id="c-tok" viewBox="0 0 400 110" preserveAspectRatio="none"></svg></div>
 <div class="card"><h2>Requests / s<span class="legend"><i style="background:#3b82f6"></i>answered<i style="background:#f5a524"></i>rejected<i style="background:#e5484d"></i>errors</span></h2><svg class="chart" id="c-rps" viewBox="0 0 400 110" preserveAspectRatio="none"></svg></div>
</div>
<section><table><thead><tr><th>replica</th><th>KV cache</th><th>queue</th><th>running</th><th>prefix hits (1 min)</th><th>output tok/s</th><th>picks / s</th><th>share of picks (1 min)</th><th>picks total</th></tr></thead><tbody id="replicas"><tr><td class="empty" colspan="9">waiting for the first sample…</td></tr></tbody></table></section>
<section id="flows-section" hidden><table><thead><tr><th id="flows-head" colspan="3">Flow control</th></tr><tr><th>band</th><th>queued</th><th>flows (queued)</th></tr></thead><tbody id="flows"></tbody></table></section>
<footer><span id="updated"></span> · queue, running, KV and hit rate as scraped from each replica's /metrics; picks and TTFT as the gateway saw them · JSON: /endpoints, /flows, /metrics</footer>
`;

export function dashboardPage(): string {
  return `<!doctype html><html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1"><title>kvgate dashboard</title><style>${CSS}</style></head><body>${BODY}<script>${SCRIPT}</script></body></html>`;
}
