/**
 * ext_proc fuzz property: arbitrary sequences of Envoy ProcessingRequest messages — request and
 * response headers, body chunks, trailers, in any order or with phases missing, with bad :path,
 * invalid JSON, bodies over --max-body-bytes, arbitrary bytes, messages carrying no phase — sent
 * over a real gRPC Process stream to a live `kvgate epp` on loopback (plaintext; TLS is covered by
 * the interop tests). Every stream ends with an OK or a documented gRPC status (FAILED_PRECONDITION
 * or UNIMPLEMENTED for protocol errors, never INTERNAL/UNKNOWN); every ImmediateResponse carries a
 * documented HTTP status, content-type application/json and an OpenAI error body whose code is
 * that status; each stream is counted exactly once in kvgate_ext_proc_streams_total, a rejection
 * under outcome "rejected"; the EPP keeps serving. Used by test/fuzz-ext-proc.test.ts (bounded)
 * and `npm run fuzz` (long).
 */
import assert from "node:assert/strict";
import type { StatusObject } from "@grpc/grpc-js";
import fc from "fast-check";
import type { EppHandle } from "../../src/gateway/ext-proc/epp.ts";
import type { ProcessingResponse } from "../../src/gateway/ext-proc/proto.ts";
import {
  clientCtor,
  connect,
  ExtProcCall,
  kvgateRoot,
  type Req,
  requestBody,
  requestHeaders,
  responseBody,
  responseHeaders,
  startPool,
  startTestEpp,
} from "../helpers/ext-proc-client.ts";
import type { FakeServer } from "../helpers/gateway-fakes.ts";

/** --max-body-bytes of the fuzzed EPP: small, so "huge" bodies are cheap to send. */
export const FUZZ_MAX_BODY = 4096;
/** HTTP statuses kvgate's ext_proc server answers with (README: ext_proc errors). */
const STATUSES = new Set([400, 404, 413, 429, 500, 503]);
/** gRPC status codes a Process stream may end with: OK, FAILED_PRECONDITION, UNIMPLEMENTED. */
const GRPC_CODES = new Set([0, 9, 12]);

export interface ExtProcFuzzFixture {
  epp: EppHandle;
  client: InstanceType<ReturnType<typeof clientCtor>>;
  close(): Promise<void>;
}

export async function startExtProcFuzz(): Promise<ExtProcFuzzFixture> {
  const pool: FakeServer[] = await startPool(2);
  const epp = await startTestEpp(pool, { maxBodyBytes: FUZZ_MAX_BODY });
  const client = connect(clientCtor(kvgateRoot()), epp.grpc.port, epp.certificate);
  return {
    epp,
    client,
    async close() {
      client.close();
      await epp.close();
      await Promise.all(pool.map((f) => f.close()));
    },
  };
}

const paths = fc.oneof(
  fc.constantFrom(
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/",
    "",
    "/v1/chat/completions?x=1",
  ),
  fc.string({ maxLength: 40 }),
  fc.string({ maxLength: 20 }).map((s) => `/v1/${s}`),
);
const headerSet = fc.record(
  {
    ":method": fc.constantFrom("POST", "GET", "PUT", ""),
    ":path": paths,
    "content-type": fc.constantFrom("application/json", "text/plain", ""),
    "x-request-id": fc.string({ maxLength: 10 }),
    "x-gateway-destination-endpoint": fc.constantFrom("10.0.0.1:80", "garbage", ""),
    "x-gateway-inference-objective": fc.constantFrom("batch", "", "unknown"),
  },
  { requiredKeys: [":path"] },
);
const chat = (model: string, content: string, stream: boolean) =>
  JSON.stringify({ model, messages: [{ role: "user", content }], stream, max_tokens: 4 });
const bodies = fc.oneof(
  fc
    .tuple(fc.constantFrom("m", "nope", ""), fc.string({ maxLength: 60 }), fc.boolean())
    .map(([m, c, s]) => Buffer.from(chat(m, c, s))),
  fc.string({ maxLength: 80 }).map((s) => Buffer.from(s)), // mostly invalid JSON
  fc.jsonValue({ maxDepth: 3 }).map((v) => Buffer.from(JSON.stringify(v) ?? "null")),
  fc.uint8Array({ maxLength: 200 }).map((u) => Buffer.from(u)),
  fc.integer({ min: FUZZ_MAX_BODY, max: FUZZ_MAX_BODY * 3 }).map((n) => Buffer.alloc(n, 0x61)), // over the limit
);
/** A body cut into 1–4 chunks at arbitrary points. */
const chunked = fc
  .tuple(bodies, fc.array(fc.double({ min: 0, max: 1, noNaN: true }), { maxLength: 3 }))
  .map(([b, cuts]) => {
    const at = [...new Set(cuts.map((c) => Math.floor(c * b.length)))].sort((x, y) => x - y);
    const out: Buffer[] = [];
    let from = 0;
    for (const c of at) {
      out.push(b.subarray(from, c));
      from = c;
    }
    out.push(b.subarray(from));
    return out;
  });

const message: fc.Arbitrary<Req[]> = fc.oneof(
  {
    weight: 3,
    arbitrary: fc
      .tuple(headerSet, fc.boolean())
      .map(([h, e]) => [requestHeaders(h as Record<string, string>, e)]),
  },
  {
    weight: 3,
    arbitrary: fc
      .tuple(chunked, fc.boolean())
      .map(([cs, e]) => cs.map((c, i) => requestBody(c, e && i === cs.length - 1))),
  },
  { weight: 1, arbitrary: fc.constant<Req[]>([{ request_trailers: { trailers: { headers: [] } } }]) },
  {
    weight: 2,
    arbitrary: fc
      .tuple(fc.constantFrom("200", "500", "abc"), fc.boolean())
      .map(([s, e]) => [
        responseHeaders({ ":status": s, "content-type": "text/event-stream" }, undefined, e),
      ]),
  },
  {
    weight: 2,
    arbitrary: fc.tuple(bodies, fc.boolean()).map(([b, e]) => [responseBody(b, e)]),
  },
  { weight: 1, arbitrary: fc.constant<Req[]>([{ response_trailers: { trailers: { headers: [] } } }]) },
  { weight: 1, arbitrary: fc.constant<Req[]>([{}]) }, // no phase at all
  {
    weight: 1,
    arbitrary: fc.constantFrom(0, 1, 2, 3, 4, 5, 99).map((mode) => [
      {
        protocol_config: { request_body_mode: mode, response_body_mode: mode },
        ...requestHeaders({ ":path": "/v1/chat/completions", ":method": "POST" }),
      },
    ]),
  },
);
/** Mostly well-begun streams (headers first), with arbitrary messages after. */
export const sequences = fc
  .tuple(fc.boolean(), headerSet, fc.array(message, { maxLength: 6 }))
  .map(([start, h, rest]) => [
    ...(start ? [requestHeaders(h as Record<string, string>)] : []),
    ...rest.flat(),
  ]);

export async function streamCounts(epp: EppHandle): Promise<Map<string, number>> {
  const m = epp.gateway.metrics.registry.getSingleMetric("kvgate_ext_proc_streams_total");
  const out = new Map<string, number>();
  for (const v of (await m?.get())?.values ?? []) out.set(String(v.labels.outcome), v.value);
  return out;
}
const total = (m: Map<string, number>) => [...m.values()].reduce((s, v) => s + v, 0);

/** Sends `msgs` on one Process stream, ends it, and waits for its status (or 10 s). */
async function run(
  fx: ExtProcFuzzFixture,
  msgs: Req[],
): Promise<{ rs: ProcessingResponse[]; status: StatusObject }> {
  const c = new ExtProcCall(fx.client);
  c.send(...msgs);
  c.end();
  let timer: NodeJS.Timeout | undefined;
  const status = await Promise.race([
    c.status,
    new Promise<never>((_, rej) => {
      timer = setTimeout(() => rej(new Error("the Process stream did not end within 10 s")), 10_000);
    }),
  ]).finally(() => clearTimeout(timer));
  return { rs: c.responses, status };
}

export function extProcProperty(fx: ExtProcFuzzFixture): fc.IAsyncPropertyWithHooks<[Req[]]> {
  return fc.asyncProperty(sequences, async (msgs) => {
    const before = await streamCounts(fx.epp);
    const { rs, status } = await run(fx, msgs);
    assert.ok(GRPC_CODES.has(status.code), `stream ended with gRPC ${status.code}: ${status.details}`);
    const irs = rs.flatMap((r) => (r.immediate_response ? [r.immediate_response] : []));
    assert.ok(irs.length <= 1, `${irs.length} ImmediateResponses on one stream`);
    for (const ir of irs) {
      assert.ok(STATUSES.has(ir.status.code), `ImmediateResponse status ${ir.status.code}`);
      const ct = ir.headers?.set_headers?.find((h) => h.header?.key === "content-type");
      assert.equal(Buffer.from(ct?.header?.raw_value ?? "").toString(), "application/json");
      const j = JSON.parse(Buffer.from(ir.body ?? "").toString()) as {
        error: { code: number; message: string };
      };
      assert.equal(j.error.code, ir.status.code);
      assert.ok(j.error.message.length > 0, "an error without a message");
    }
    // Counted once, after the stream's status: the server counts before it ends the call.
    const after = await streamCounts(fx.epp);
    assert.equal(total(after) - total(before), 1, "each Process stream is counted once");
    const delta = (o: string) => (after.get(o) ?? 0) - (before.get(o) ?? 0);
    if (irs.length === 1)
      assert.equal(delta("rejected") + delta("internal-error"), 1, "a rejection is counted");
    if (status.code !== 0) assert.equal(delta("protocol-error"), 1, "a protocol error is counted");
    assert.equal(delta("internal-error"), 0, "no internal error");
  });
}

/** A well-formed chat request still gets a pick after fuzzing (the process is alive and serving). */
export async function stillServes(fx: ExtProcFuzzFixture): Promise<void> {
  const { rs, status } = await run(fx, [
    requestHeaders({
      ":method": "POST",
      ":path": "/v1/chat/completions",
      "content-type": "application/json",
    }),
    requestBody(chat("m", "still there?", true), true),
  ]);
  assert.equal(status.code, 0);
  assert.ok(
    rs.some((r) => r.request_headers?.response?.header_mutation),
    `no pick after fuzzing: ${JSON.stringify(rs).slice(0, 300)}`,
  );
}
