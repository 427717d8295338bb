/**
 * The gateway's autoscaling surface: the recommender's count exported as kvgate_desired_replicas
 * and WVA's wva_desired_replicas (its labels), the admin view with the reason, and the actuator's
 * calls to a Deployment's scale subresource, against a small API server that keeps a Scale object
 * and records every request (GET, then a JSON merge patch only when the count changes).
 */
import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { createServer, type IncomingMessage } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { KubeConfig } from "@kubernetes/client-node";
import { Registry } from "prom-client";
import { parse, parseAllDocuments } from "yaml";
import { poolCapacity } from "../src/autoscale/recommender.ts";
import { AutoscaleService, loadAutoscaleConfig } from "../src/gateway/autoscale.ts";
import { ScaleActuator } from "../src/gateway/autoscale-actuator.ts";
import { loadProfile } from "../src/sim/profiles.ts";
import { checkK8s } from "./helpers/k8s-schema-check.ts";

const CFG = {
  pools: [
    {
      name: "vllm",
      profile: "qwen3-32b-tp2-h100",
      min: 1,
      max: 10,
      deployment: "vllm-decode",
      accelerator: "H100",
    },
  ],
  namespace: "llm",
  slo: { ttft: 2, itl: 0.05 },
  startupDelay: 120,
  load: { inputTokens: 1000, outputTokens: 200, hitRate: 0 },
};

function endpoint(id: string) {
  return {
    spec: { id, host: id, port: 8000, labels: {}, kvEvents: null },
    health: "healthy" as const,
    state: {
      id,
      address: id,
      labels: {},
      metrics: {
        waitingQueueSize: 0,
        runningRequestsSize: 8,
        kvCacheUsagePercent: 0.4,
        cacheBlockSize: 16,
        cacheNumBlocks: 1000,
        updateTime: 0,
      },
    },
  };
}

describe("gateway autoscaling", () => {
  test("the desired count is exported under kvgate's and WVA's names and shown with its reason", async () => {
    let now = 0;
    const registry = new Registry();
    const store = { all: () => [endpoint("10.0.0.1:8000"), endpoint("10.0.0.2:8000")] as never };
    const svc = new AutoscaleService(CFG, store, registry, () => now);
    // 60 req/s of 1,000-token prompts answered with 200 tokens, sampled every 2 s for a minute.
    for (let t = 2; t <= 60; t += 2) {
      for (let k = 0; k < 120; k++) {
        svc.arrived(1000);
        svc.finished({ promptTokens: 1000, outputTokens: 200, ttft: 0.2, e2e: 0.2 + 199 * 0.02 });
      }
      now = t;
      await svc.tick();
    }
    const spec = {
      name: "vllm",
      role: "aggregated" as const,
      profile: loadProfile("qwen3-32b-tp2-h100"),
      limits: {
        maxNumSeqs: 1024,
        maxNumBatchedTokens: 8192,
        kvTokens: loadProfile("qwen3-32b-tp2-h100").kvCapacityTokens,
      },
      bounds: { min: 1, max: 10 },
    };
    const cap = poolCapacity(
      spec,
      { inputTokens: 1000, outputTokens: 200, hitRate: 0 },
      { ttft: 2, itl: 0.05, attainment: 0.95 },
    );
    const expected = Math.min(10, Math.ceil(60 / (0.8 * cap)));
    assert.ok(expected > 2, `the load needs more than the 2 ready replicas (${expected})`);
    const text = await registry.metrics();
    assert.match(
      text,
      new RegExp(`^kvgate_desired_replicas\\{pool="vllm",role="aggregated"\\} ${expected}$`, "m"),
    );
    assert.match(
      text,
      new RegExp(
        `^wva_desired_replicas\\{variant_name="vllm-decode",namespace="llm",accelerator_type="H100"\\} ${expected}$`,
        "m",
      ),
    );
    assert.match(
      text,
      /^wva_current_replicas\{variant_name="vllm-decode",namespace="llm",accelerator_type="H100"\} 2$/m,
    );
    const view = svc.view();
    assert.equal(view.pools[0].desired, expected);
    assert.equal(view.pools[0].ready, 2);
    assert.match(
      view.pools[0].reason,
      new RegExp(`^(up|hold): 60\\.00 req/s .* ÷ ${(0.8 * cap).toFixed(2)} req/s per replica`),
    );
  });

  test("the actuator reads the scale subresource and merge-patches spec.replicas only when it differs", async () => {
    const requests: { method: string; path: string; type?: string; body: string }[] = [];
    let replicas = 2;
    const server = createServer(async (req: IncomingMessage, res) => {
      let body = "";
      for await (const c of req) body += c;
      requests.push({
        method: req.method ?? "",
        path: req.url ?? "",
        type: req.headers["content-type"],
        body,
      });
      if (req.url?.split("?")[0] !== "/apis/apps/v1/namespaces/llm/deployments/vllm-decode/scale") {
        res.writeHead(404, { "content-type": "application/json" });
        res.end(
          JSON.stringify({
            kind: "Status",
            apiVersion: "v1",
            status: "Failure",
            message: 'deployments.apps "x" not found',
            reason: "NotFound",
            code: 404,
          }),
        );
        return;
      }
      if (req.method === "PATCH")
        replicas = (JSON.parse(body) as { spec: { replicas: number } }).spec.replicas;
      res.writeHead(200, { "content-type": "application/json" });
      res.end(
        JSON.stringify({
          kind: "Scale",
          apiVersion: "autoscaling/v1",
          metadata: { name: "vllm-decode", namespace: "llm" },
          spec: { replicas },
          status: { replicas },
        }),
      );
    });
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [
        {
          name: "c",
          server: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
          skipTLSVerify: true,
        },
      ],
      users: [{ name: "u" }],
      contexts: [{ name: "x", cluster: "c", user: "u" }],
      currentContext: "x",
    });
    const logs: string[] = [];
    const act = new ScaleActuator(kc, (l) => logs.push(l));
    try {
      assert.equal(await act.scale({ namespace: "llm", name: "vllm-decode" }, 5), 2);
      assert.equal(replicas, 5);
      assert.deepEqual(
        requests.map((r) => r.method),
        ["GET", "PATCH"],
      );
      assert.equal(requests[1].type, "application/merge-patch+json");
      assert.deepEqual(JSON.parse(requests[1].body), { spec: { replicas: 5 } });
      assert.equal(await act.scale({ namespace: "llm", name: "vllm-decode" }, 5), 5);
      assert.equal(requests.length, 3, "no write when the count is already right");
      assert.equal(await act.scale({ namespace: "llm", name: "missing" }, 3), null);
      assert.match(logs.at(-1) ?? "", /cannot scale deployment llm\/missing to 3: HTTP 404/);
    } finally {
      server.close();
    }
  });

  test("a bad autoscale config file is an error naming the field and saying what to do", () => {
    const dir = mkdtempSync(join(tmpdir(), "kvgate-as-"));
    const load = (text: string) => {
      const file = join(dir, "autoscale.yaml");
      writeFileSync(file, text);
      return () => loadAutoscaleConfig(file);
    };
    const pool = "{ name: p, profile: llama-3.1-8b-h100, min: 1, max: 2";
    const rest = "slo: { ttft: 2, itl: 0.05 }\nstartupDelay: 30\n";
    assert.throws(
      load(`pools: [${pool}, replicas: 3 }]\n${rest}`),
      /autoscale\.yaml: pools\.0\.replicas: unknown field; allowed: name, role, profile, min, max, maxNumSeqs, .*, accelerator$/,
    );
    assert.throws(
      load(`pools: [${pool} }]\n${rest}slos: 1\n`),
      /autoscale\.yaml: slos: unknown field; allowed: pools, namespace, slo, startupDelay, .*, actuate$/,
    );
    assert.throws(
      load(`pools: [${pool} }]\nslo: { ttft: 2, itl: 0.05, p99: true }\nstartupDelay: 30\n`),
      /slo\.p99: unknown field; allowed: ttft, itl, attainment$/,
    );
    assert.throws(
      load(`pools: [{ name: p, profile: llama-3.1-8b-h100, min: 3, max: 2 }]\n${rest}`),
      /pool p: min 3 > max 2; make min ≤ max$/,
    );
    assert.throws(
      () => loadAutoscaleConfig(join(dir, "absent.yaml")),
      /absent\.yaml: ENOENT.*; check the path$/,
    );
  });

  test("deploy/autoscale: the example config loads, and the HPA and KEDA select the series it exports", async () => {
    const cm = parse(readFileSync("deploy/autoscale/autoscale-config.yaml", "utf8")) as {
      data: Record<string, string>;
    };
    assert.deepEqual(checkK8s(cm, "V1ConfigMap"), []);
    const file = join(mkdtempSync(join(tmpdir(), "kvgate-as-")), "autoscale.yaml");
    writeFileSync(file, cm.data["autoscale.yaml"]);
    const cfg = loadAutoscaleConfig(file);
    const registry = new Registry();
    const svc = new AutoscaleService(
      cfg,
      { all: () => [endpoint("10.0.0.1:8000")] as never },
      registry,
      () => 2,
    );
    await svc.tick();
    const text = await registry.metrics();
    const hpa = parse(readFileSync("deploy/autoscale/hpa.yaml", "utf8"));
    const m = hpa.spec.metrics[0].external.metric;
    const sel = Object.entries(m.selector.matchLabels as Record<string, string>)
      .map(([k, v]) => `${k}="${v}"`)
      .join(",");
    assert.match(text, new RegExp(`^${m.name}\\{${sel}\\} \\d+$`, "m"), `${m.name}{${sel}} is exported`);
    assert.equal(hpa.spec.scaleTargetRef.name, cfg.pools[0].deployment);
    const keda = parse(readFileSync("deploy/autoscale/keda-scaledobject.yaml", "utf8"));
    assert.match(keda.spec.triggers[0].metadata.query, new RegExp(`kvgate_desired_replicas\\{${sel}\\}`));
    assert.match(
      text,
      new RegExp(
        `^wva_desired_replicas\\{variant_name="${cfg.pools[0].deployment}",namespace="${cfg.namespace}"`,
        "m",
      ),
    );
    for (const d of parseAllDocuments(readFileSync("deploy/autoscale/rbac-actuator.yaml", "utf8"))) {
      const o = d.toJS();
      assert.deepEqual(checkK8s(o, o.kind === "Role" ? "V1Role" : "V1RoleBinding"), []);
    }
  });
});
