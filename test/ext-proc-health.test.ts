/**
 * `kvgate epp` around its streams: gRPC health on the health port and the ext_proc port ("",
 * liveness, readiness, the ext_proc service) SERVING only while discovery is ready and this replica
 * leads, NOT_SERVING at once on drain while an open stream still finishes; the seams Kubernetes
 * discovery uses (an EndpointSource replaced at run time, InferenceObjectives from `resources`);
 * TLS from a --cert-path directory; and the CLI's flag checks and its startup/SIGTERM cycle.
 */
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, test } from "node:test";
import { credentials, makeClientConstructor } from "@grpc/grpc-js";
import { service as healthService } from "grpc-health-check";
import { checkEppFlags, durationMs } from "../src/cli/epp.ts";
import { EndpointSource } from "../src/datalayer/endpoints.ts";
import type { EppHandle } from "../src/gateway/ext-proc/epp.ts";
import { readTlsDir, selfSigned } from "../src/gateway/ext-proc/tls.ts";
import {
  CHAT_PATH,
  chatBody,
  clientCtor,
  connect,
  ExtProcCall,
  kvgateRoot,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  setHeaders,
  startPool,
  startTestEpp,
} from "./helpers/ext-proc-client.ts";
import { type FakeServer, waitFor } from "./helpers/gateway-fakes.ts";
import { KVGATE_BIN } from "./helpers/replica.ts";

const Health = makeClientConstructor(healthService, "Health");
const ctor = clientCtor(kvgateRoot());
const pools: FakeServer[] = [];
after(() => Promise.all(pools.map((f) => f.close())));

function check(port: number, svc: string, cert: string | null = null): Promise<string> {
  const creds = cert ? credentials.createSsl(Buffer.from(cert)) : credentials.createInsecure();
  const c = new Health(
    `127.0.0.1:${port}`,
    creds,
    cert ? { "grpc.ssl_target_name_override": "localhost" } : {},
  );
  return new Promise((resolve, reject) =>
    (
      c as unknown as {
        check: (r: object, cb: (e: Error | null, r: { status: string | number }) => void) => void;
      }
    ).check({ service: svc }, (err, r) => {
      c.close();
      if (err) reject(err);
      else resolve(typeof r.status === "number" ? ["UNKNOWN", "SERVING", "NOT_SERVING"][r.status] : r.status);
    }),
  );
}

const SVC = ["", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"];
async function statuses(epp: EppHandle): Promise<string[]> {
  return Promise.all([
    ...SVC.map((s) => check(epp.healthPort, s)),
    check(epp.healthPort, "liveness"),
    check(epp.grpc.port, SVC[2], epp.certificate),
  ]);
}

test("health follows readiness and leadership; drain flips it at once and lets the open stream finish", async () => {
  const pool = await startPool(1);
  pools.push(...pool);
  let ready = false;
  let leader = true;
  const epp = await startTestEpp(pool, { ready: () => ready, isLeader: () => leader });
  try {
    assert.deepEqual(await statuses(epp), [
      "NOT_SERVING",
      "NOT_SERVING",
      "NOT_SERVING",
      "SERVING",
      "NOT_SERVING",
    ]);
    ready = true;
    await waitFor(() => epp.serving(), "serving");
    assert.deepEqual(await statuses(epp), ["SERVING", "SERVING", "SERVING", "SERVING", "SERVING"]);
    leader = false;
    await waitFor(() => !epp.serving(), "not serving off the leader");
    assert.equal(await check(epp.healthPort, SVC[2]), "NOT_SERVING");
    leader = true;
    await waitFor(() => epp.serving(), "serving again");

    const c = new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate));
    c.send(requestHeaders(CHAT_PATH), requestBody(chatBody("drain me"), true));
    await c.waitFor(2);
    const drained = epp.drain();
    assert.equal(await check(epp.healthPort, SVC[2]), "NOT_SERVING", "NOT_SERVING while the stream is open");
    c.send(responseHeaders({ ":status": "200" }), responseBody("{}", true));
    await c.waitFor(4);
    c.end();
    assert.equal((await c.status).code, 0);
    await drained;
  } finally {
    await epp.close();
  }
});

test("endpoints from a replaced EndpointSource and objectives from `resources` take effect at run time", async () => {
  const [idle, busy] = await Promise.all([startPool(1), startPool(1, { waiting: 100, kv: 0.95 })]);
  pools.push(...idle, ...busy);
  const source = EndpointSource.fromList([]);
  const objectives = new Map([["batch", -1]]);
  const epp = await startTestEpp([], { source, resources: () => ({ objectives, rewrites: [] }) });
  const ask = async (headers: Record<string, string> = {}) => {
    const c = new ExtProcCall(connect(ctor, epp.grpc.port, epp.certificate));
    c.send(requestHeaders({ ...CHAT_PATH, ...headers }), requestBody(chatBody("dynamic"), true));
    const [r] = await c.waitFor(1);
    c.call.cancel();
    return (
      r.immediate_response?.status.code ??
      setHeaders(r.request_headers?.response.header_mutation)["x-gateway-destination-endpoint"]
    );
  };
  try {
    assert.equal(await ask(), 503);
    source.replace([{ id: busy[0].id, host: "127.0.0.1", port: busy[0].port, labels: {}, kvEvents: null }]);
    await waitFor(
      () => epp.gateway.data.store.get(busy[0].id)?.modelIds != null,
      "discovered replica scraped",
    );
    assert.equal(await ask(), busy[0].id);
    assert.equal(await ask({ "x-llm-d-inference-objective": "batch" }), 429, "a cluster objective sheds");
    source.replace([]);
    await waitFor(() => epp.gateway.data.store.size === 0, "replica dropped");
    assert.equal(await ask(), 503);
  } finally {
    await epp.close();
  }
});

test("--cert-path serves the given certificate; a directory without it says what to give", async () => {
  const pool = await startPool(1);
  pools.push(...pool);
  const dir = mkdtempSync(join(tmpdir(), "kvgate-tls-"));
  const id = await selfSigned();
  writeFileSync(join(dir, "tls.crt"), id.cert);
  writeFileSync(join(dir, "tls.key"), id.key);
  const epp = await startTestEpp(pool, { certPath: dir });
  try {
    assert.equal(epp.certificate, id.cert);
    assert.equal(epp.tlsOrigin, dir);
    await waitFor(() => epp.serving(), "serving");
    assert.equal(await check(epp.grpc.port, SVC[2], id.cert), "SERVING");
  } finally {
    await epp.close();
  }
  assert.throws(() => readTlsDir(tmpdir()), /cannot read tls\.crt.*tls\.crt and tls\.key/);
});

test("the CLI's flag checks say what to do", () => {
  const base = { secureServing: true, haEnableLeaderElection: false } as Parameters<typeof checkEppFlags>[0];
  assert.match(checkEppFlags(base) ?? "", /--pool-name NAME .* --endpoints/);
  assert.equal(checkEppFlags({ ...base, endpoints: "1.2.3.4:8000" }), null);
  assert.match(checkEppFlags({ ...base, endpoints: "a:1", endpointsFile: "f" }) ?? "", /at most one/);
  assert.match(
    checkEppFlags({ ...base, endpoints: "a:1", haEnableLeaderElection: true }) ?? "",
    /Lease.*--pool-name/,
  );
  assert.match(
    checkEppFlags({ ...base, endpoints: "a:1", secureServing: false, certPath: "/x" }) ?? "",
    /--cert-path/,
  );
  assert.equal(
    checkEppFlags({ ...base, endpoints: "a:1", kvCacheUsagePercentageMetric: "vllm:kv_cache_usage_perc" }),
    null,
  );
  assert.match(
    checkEppFlags({ ...base, endpoints: "a:1", totalQueuedRequestsMetric: "tgi_queue_size" }) ?? "",
    /--total-queued-requests-metric tgi_queue_size: .*vllm:num_requests_waiting/,
  );
  assert.deepEqual(
    ["30s", "1m30s", "500ms", "2", "1.5h"].map(durationMs),
    [30_000, 90_000, 500, 2000, 5_400_000],
  );
  assert.throws(() => durationMs("soon"), /not a duration/);
});

test("kvgate epp starts, prints where it listens, serves health and exits 0 on SIGTERM", {
  timeout: 60_000,
}, async () => {
  const pool = await startPool(1);
  pools.push(...pool);
  const args = ["epp", "--endpoints", pool[0].id, "--host", "127.0.0.1", "--grpc-port", "0"];
  args.push(
    "--grpc-health-port",
    "0",
    "--metrics-port",
    "0",
    "--scrape-interval-ms",
    "20",
    "--drain-timeout",
    "2s",
  );
  const child = spawn(process.execPath, [KVGATE_BIN, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise<number | null>((r) => child.on("exit", (code) => r(code)));
  try {
    await waitFor(() => /health on/.test(out), "startup line", 45_000);
    const m =
      /ext_proc on 127\.0\.0\.1:(\d+) \(TLS self-signed\), health on 127\.0\.0\.1:(\d+), metrics (http:\S+)\/metrics, 1 endpoint\(s\)/.exec(
        out,
      );
    assert.ok(m, out);
    const healthPort = Number(m[2]);
    let st = "";
    for (let i = 0; i < 100 && st !== "SERVING"; i++) {
      st = await check(healthPort, "");
      if (st !== "SERVING") await new Promise((r) => setTimeout(r, 100));
    }
    assert.equal(st, "SERVING");
    const metrics = await (await fetch(`${m[3]}/metrics`)).text();
    assert.match(metrics, /^llm_d_epp_ready_endpoints\{name="kvgate"\} 1$/m);
  } finally {
    child.kill("SIGTERM");
  }
  assert.equal(await exited, 0, out);
  assert.match(out, /SIGTERM: health NOT_SERVING, draining/);
});
