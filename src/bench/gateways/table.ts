/** bench:gateways' per-run figures and their Markdown table. Pure. */

export interface GatewayRun {
  gateways: number;
  synced: boolean;
  requests: number;
  errors: number;
  hit_rate: number | null;
  hit_rate_source: "metrics" | "usage" | null;
  output_tokens_per_s: number | null;
  ttft_p90_s: number | null;
  /** The replicas' worst clock lag behind their time scale (kvgate:sim_lag_max_seconds). */
  replica_lag_max_s: number;
  /** CPU seconds all gateway processes used during the workload. */
  gateway_cpu_s: number;
  bench_wall_s: number;
  run_wall_s: number;
  load_avg_1m: number;
}

const pct = (x: number | null) => (x === null ? "-" : `${(x * 100).toFixed(1)}%`);
const num = (x: number | null, d = 0) => (x === null ? "-" : x.toFixed(d));

export function formatTable(runs: readonly GatewayRun[]): string {
  const rows = [
    "| gateways | sync | hit rate | out tok/s | TTFT p90 s | errors | replica lag max s | gateway CPU s / wall s |",
    "|---:|---|---:|---:|---:|---:|---:|---:|",
  ];
  for (const r of runs)
    rows.push(
      `| ${r.gateways} | ${r.gateways === 1 ? "-" : r.synced ? "synced" : "unsynced"} | ${pct(r.hit_rate)} | ` +
        `${num(r.output_tokens_per_s)} | ${num(r.ttft_p90_s, 3)} | ${r.errors} | ${r.replica_lag_max_s.toFixed(2)} | ` +
        `${r.gateway_cpu_s.toFixed(1)} / ${r.bench_wall_s.toFixed(0)} |`,
    );
  return rows.join("\n");
}
