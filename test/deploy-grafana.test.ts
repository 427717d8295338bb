/**
 * deploy/grafana/kvgate-epp.json: every query uses only series kvgate really exposes (read from the
 * GatewayMetrics registry, so a renamed or removed metric fails here rather than as an empty panel),
 * every panel has a query, and the panels the deployment guide promises are there.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { test } from "node:test";
import { GatewayMetrics } from "../src/gateway/metrics.ts";

interface Target {
  expr: string;
  refId: string;
}
interface Panel {
  type: string;
  title: string;
  targets?: Target[];
  gridPos: { x: number; y: number; w: number; h: number };
}
const dashboard = JSON.parse(
  readFileSync(new URL("../deploy/grafana/kvgate-epp.json", import.meta.url), "utf8"),
) as { uid: string; panels: Panel[]; templating: { list: { name: string; query: unknown }[] } };

/** The series names Prometheus stores for kvgate's metrics (a histogram is _bucket, _sum, _count). */
async function exposedSeries(): Promise<Set<string>> {
  const metrics = await new GatewayMetrics().registry.getMetricsAsJSON();
  const names = new Set<string>();
  for (const m of metrics) {
    if (String(m.type) === "histogram")
      for (const s of ["_bucket", "_sum", "_count"]) names.add(`${m.name}${s}`);
    else names.add(m.name);
  }
  return names;
}

/** PromQL functions, aggregations and keywords the queries may use. */
const PROMQL = new Set([
  "sum",
  "avg",
  "max",
  "min",
  "count",
  "rate",
  "irate",
  "increase",
  "histogram_quantile",
  "clamp_min",
  "by",
  "without",
  "on",
  "ignoring",
  "and",
  "or",
  "unless",
]);

/** The identifiers of a PromQL expression that are metric names (strings, label sets, ranges removed). */
function metricNames(expr: string): string[] {
  const bare = expr
    .replace(/"(?:[^"\\]|\\.)*"/g, "")
    .replace(/\{[^}]*\}/g, "")
    .replace(/\[[^\]]*\]/g, "")
    .replace(/\b(by|without|on|ignoring)\s*\([^)]*\)/g, "");
  return (bare.match(/[a-zA-Z_:][a-zA-Z0-9_:]*/g) ?? []).filter((t) => !PROMQL.has(t));
}

const queries = () =>
  dashboard.panels.flatMap((p) => (p.targets ?? []).map((t) => ({ panel: p.title, expr: t.expr })));

test("grafana: every query names only series kvgate exposes", async () => {
  const exposed = await exposedSeries();
  assert.ok(queries().length > 0);
  for (const { panel, expr } of queries()) {
    const names = metricNames(expr);
    assert.ok(names.length > 0, `${panel}: the query names a metric`);
    for (const n of names)
      assert.ok(exposed.has(n), `${panel}: ${n} is not a series kvgate exposes (${expr})`);
  }
  // Query variables read label values of a metric: label_values(<metric>{...}, <label>).
  for (const v of dashboard.templating.list) {
    const text = typeof v.query === "string" ? v.query : String((v.query as { query?: string }).query ?? "");
    const m = /^label_values\(([a-zA-Z_:][a-zA-Z0-9_:]*)/.exec(text);
    if (m !== null)
      assert.ok(exposed.has(m[1]), `variable ${v.name}: ${m[1]} is not a series kvgate exposes`);
  }
});

test("grafana: the metric-name check catches a name kvgate does not expose", async () => {
  const exposed = await exposedSeries();
  const names = metricNames('sum by (le) (rate(llm_d_epp_request_ttft_secs_bucket{namespace=~"a|b"}[5m]))');
  assert.deepEqual(names, ["llm_d_epp_request_ttft_secs_bucket"]);
  assert.equal(exposed.has(names[0]), false);
});

test("grafana: the panels the guide names, each with a query, laid out without overlap", () => {
  const all = queries()
    .map((q) => q.expr)
    .join("\n");
  for (const m of [
    "llm_d_epp_request_total",
    "llm_d_epp_request_error_total",
    "llm_d_epp_request_ttft_seconds_bucket",
    "llm_d_epp_scheduler_e2e_duration_seconds_bucket",
    "llm_d_epp_ready_endpoints",
    "llm_d_epp_average_kv_cache_utilization",
    "llm_d_epp_per_endpoint_queue_size",
    "llm_d_epp_prefix_indexer_hit_ratio_sum",
  ])
    assert.ok(all.includes(m), `a panel plots ${m}`);
  assert.match(all, /histogram_quantile\(0\.9, [^\n]*llm_d_epp_request_ttft_seconds_bucket/);
  assert.match(all, /histogram_quantile\(0\.99, [^\n]*llm_d_epp_scheduler_e2e_duration_seconds_bucket/);
  const cells = new Set<string>();
  for (const p of dashboard.panels) {
    if (p.type !== "row") assert.ok((p.targets ?? []).length > 0, `${p.title}: has a query`);
    const { x, y, w, h } = p.gridPos;
    assert.ok(x >= 0 && x + w <= 24, `${p.title}: fits the 24-column grid`);
    for (let i = x; i < x + w; i++)
      for (let j = y; j < y + h; j++) {
        assert.ok(!cells.has(`${i},${j}`), `${p.title} overlaps another panel at ${i},${j}`);
        cells.add(`${i},${j}`);
      }
  }
});
