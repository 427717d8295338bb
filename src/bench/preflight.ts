/**
 * What `kvgate bench` settles before it sends a request: that every URL it was given is an
 * http(s) URL, where the fleet's /metrics are (the targets, --metrics-endpoints, or the replicas
 * a kvgate gateway lists at its admin API's GET /endpoints), and which clock the fleet runs on.
 * kvgate's simulated replicas publish kvgate:sim_time_scale on /metrics, so bench reads it and
 * reports simulated seconds at that scale without being told; an explicit --time-scale wins (with
 * a warning when it disagrees), and replicas on different clocks are refused: one run has one clock.
 */
import { Agent, request } from "undici";
import { type ReplicaSnapshot, scrapeReplica } from "./fleet-metrics.ts";

/** A problem with the command line or the setup, found before any request was sent (exit 2). */
export class BenchSetupError extends Error {
  override name = "BenchSetupError";
}

/** Checks that `value` (given to `flag`) is an http(s) base URL; returns it without a trailing "/". */
export function checkBaseUrl(flag: string, value: string): string {
  let url: URL | undefined;
  try {
    url = new URL(value);
  } catch {
    url = undefined;
  }
  if (url?.protocol === "http:" || url?.protocol === "https:") {
    if (!url.hostname) throw new BenchSetupError(`${flag} ${value}: no host; use http://HOST:PORT`);
    return value.replace(/\/+$/, "");
  }
  if (!value.includes("://"))
    throw new BenchSetupError(`${flag} ${value} has no scheme: use http://${value.replace(/^\/+/, "")}`);
  throw new BenchSetupError(`${flag} ${value}: only http:// and https:// URLs are supported`);
}

/**
 * The base URLs of the replicas behind a kvgate gateway, from its admin API (`kvgate serve
 * --admin-port`, default 9090): GET {admin}/endpoints lists each endpoint's "host:port" address.
 */
export async function gatewayReplicas(admin: string, timeoutMs = 5000): Promise<string[]> {
  const dispatcher = new Agent();
  const url = `${admin.replace(/\/+$/, "")}/endpoints`;
  const hint =
    "--gateway-admin takes the admin API of `kvgate serve` (its --admin-port, default 9090), " +
    "not the public port";
  try {
    let status: number;
    let body: unknown;
    try {
      const res = await request(url, { dispatcher, signal: AbortSignal.timeout(timeoutMs) });
      status = res.statusCode;
      const text = await res.body.text();
      try {
        body = JSON.parse(text);
      } catch {
        body = undefined;
      }
    } catch (e) {
      throw new BenchSetupError(
        `cannot reach the gateway admin API at ${url} (${(e as Error).message}): is the gateway ` +
          `running? ${hint}`,
      );
    }
    const list = (body as { endpoints?: unknown } | undefined)?.endpoints;
    if (status !== 200 || !Array.isArray(list))
      throw new BenchSetupError(`${url} answered HTTP ${status} without an endpoint list: ${hint}`);
    const addresses = list.flatMap((e) => {
      const a = (e as { address?: unknown } | null)?.address;
      return typeof a === "string" ? [a] : [];
    });
    if (addresses.length === 0)
      throw new BenchSetupError(
        `the gateway at ${admin} lists no endpoints (GET /endpoints): give it replicas ` +
          "(kvgate serve --endpoints or --endpoints-file) before benchmarking it",
      );
    return addresses.map((a) => `http://${a}`);
  } finally {
    await dispatcher.close();
  }
}

/** Scrapes each base URL's /metrics once. */
export async function probeMetrics(metricUrls: string[], timeoutMs = 5000): Promise<ReplicaSnapshot[]> {
  const dispatcher = new Agent();
  try {
    return await Promise.all(metricUrls.map((u) => scrapeReplica(u, dispatcher, timeoutMs)));
  } finally {
    await dispatcher.close();
  }
}

export interface Clock {
  /** Simulated seconds per wall second of the fleet: what the driver schedules and reports in. */
  timeScale: number;
  /** The results are simulated seconds (a simulated fleet, or a scale given by hand). */
  simulated: boolean;
  /** The scale the replicas published, when they all answered with one. */
  detected?: number;
  /** Where the scale came from, for the user. */
  source: "flag" | "replicas" | "default";
  warnings: string[];
  notes: string[];
}

/** A snapshot that came from a vLLM-style /metrics page (not just any 200). */
const answered = (s: ReplicaSnapshot) =>
  s.ok &&
  (s.simTimeScale !== undefined ||
    s.queries !== undefined ||
    s.kvUsage !== undefined ||
    s.preemptions !== undefined);

/**
 * The run's clock from the replicas' /metrics (`probes`, one per metrics endpoint) and the
 * explicit --time-scale, if any. Throws BenchSetupError when the replicas disagree.
 */
export function decideClock(explicit: number | undefined, probes: ReplicaSnapshot[]): Clock {
  const warnings: string[] = [];
  const notes: string[] = [];
  const ok = probes.filter(answered);
  const sim = ok.filter((s) => s.simTimeScale !== undefined);
  const plain = ok.filter((s) => s.simTimeScale === undefined);
  const host = (s: ReplicaSnapshot) => s.url.replace(/\/metrics$/, "");
  if (sim.length && plain.length)
    throw new BenchSetupError(
      `the fleet mixes clocks: ${sim.map((s) => `${host(s)} is simulated at ${s.simTimeScale}×`).join(", ")}, ` +
        `but ${plain.map(host).join(", ")} publish${plain.length === 1 ? "es" : ""} no kvgate:sim_time_scale ` +
        "(real time): benchmark simulated and real replicas separately",
    );
  const scales = [...new Set(sim.map((s) => s.simTimeScale as number))];
  if (scales.length > 1)
    throw new BenchSetupError(
      `the replicas run at different time scales (${sim.map((s) => `${host(s)} ${s.simTimeScale}×`).join(", ")}): ` +
        "one run has one clock; restart them with the same `kvgate sim-replica --time-scale N`",
    );
  const detected = scales.length === 1 ? scales[0] : ok.length ? 1 : undefined;
  const silent = probes.filter((s) => !answered(s));
  if (silent.length && ok.length)
    notes.push(
      `no vLLM metrics from ${silent.map((s) => `${s.url} (${s.error ?? "no vllm:* families"})`).join(", ")}; ` +
        "fleet figures leave them out",
    );
  if (explicit !== undefined) {
    if (detected !== undefined && detected !== explicit)
      warnings.push(
        `--time-scale ${explicit} given, but the replicas run at ${detected}× ` +
          `(${detected === 1 ? "no kvgate:sim_time_scale: real time" : "kvgate:sim_time_scale"}); using ${explicit}. ` +
          "Times are wrong unless that is really their clock: drop --time-scale to use theirs",
      );
    return {
      timeScale: explicit,
      simulated: explicit !== 1 || sim.length > 0,
      ...(detected !== undefined ? { detected } : {}),
      source: "flag",
      warnings,
      notes,
    };
  }
  if (detected === undefined) {
    const why = probes.map((s) => `${s.url} (${s.error ?? "no vllm:* families"})`).join(", ");
    notes.push(
      `no vLLM /metrics answered (${why || "none to ask"}), so the fleet's clock is unknown and times ` +
        "are reported as wall seconds. If the target is a kvgate gateway, pass --gateway-admin " +
        "http://HOST:ADMIN_PORT (kvgate serve's admin API, default port 9090) or --metrics-endpoints " +
        "with the replicas' URLs; for simulated replicas, --time-scale N also sets the clock",
    );
    return { timeScale: 1, simulated: false, source: "default", warnings, notes };
  }
  return {
    timeScale: detected,
    simulated: sim.length > 0,
    detected,
    source: "replicas",
    warnings,
    notes,
  };
}
