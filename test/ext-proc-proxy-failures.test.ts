/**
 * The Envoy-like test proxy when things go wrong, as Envoy's ext_proc filter and router behave:
 * immediate responses, spurious replies, no or unreachable destination, the processor down
 * (FailClose 500 vs failOpen), the concurrent-stream cap, client disconnects, a clean server close,
 * and the BUFFERED message timeout.
 */
import assert from "node:assert/strict";
import { request as httpRequest } from "node:http";
import { createServer } from "node:net";
import { after, test } from "node:test";
import { type EnvoyLikeProxyOptions, startEnvoyLikeProxy } from "../src/bench/ext-proc/proxy.ts";
import {
  bodyOf,
  type FakeExtProc,
  headersOf,
  type Msg,
  readUntilEos,
  type Stream,
  setHeader,
  startBackend,
  startFakeExtProc,
  streamedReplies,
} from "./helpers/fake-ext-proc.ts";
import { waitFor } from "./helpers/replica.ts";

const DEST = "x-gateway-destination-endpoint";
const closers: (() => Promise<void>)[] = [];
after(async () => {
  for (const c of closers.reverse()) await c();
});

async function fakeExtProc(onStream: Parameters<typeof startFakeExtProc>[0]): Promise<FakeExtProc> {
  const fake = await startFakeExtProc(onStream);
  closers.push(() => fake.close());
  return fake;
}
async function proxyFor(extProc: string, opts: Partial<EnvoyLikeProxyOptions> = {}) {
  const proxy = await startEnvoyLikeProxy({ extProc, ...opts });
  closers.push(() => proxy.close());
  return proxy;
}
async function backend() {
  const b = await startBackend();
  closers.push(() => b.close());
  return b;
}
async function freePort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const port = (s.address() as { port: number }).port;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

/** Echoes the response phase unchanged (headers CONTINUE, each body chunk re-sent). */
async function passResponse(call: Stream, next: () => Promise<Msg | null>): Promise<Msg | null> {
  const head = await next();
  if (!head) return null;
  call.write({ response_headers: {} });
  if (!head.response_headers.end_of_stream) {
    for (let m = await next(); m; m = await next()) {
      call.write(streamedReplies("response_body", Buffer.from(m.response_body.body ?? []), 1)[0]!);
      if (m.response_body.end_of_stream) break;
    }
  }
  call.end();
  return head;
}

const post = (url: string, body = '{"model":"m"}') => fetch(url, { method: "POST", body });

test("immediate_response at request headers and after the body reaches the client; nothing goes upstream", async () => {
  const be = await backend();
  const fake = await fakeExtProc(async (call, _r, next) => {
    const first = await next();
    const early = headersOf(first)[":path"] === "/early";
    if (!early) await readUntilEos(next, "request_body");
    call.write({
      immediate_response: {
        status: { code: early ? 429 : 400 },
        headers: { set_headers: [setHeader("x-llm-d-request-dropped-reason", "rejected-saturated")] },
        body: Buffer.from(early ? "system saturated" : "bad body"),
      },
    });
  });
  const proxy = await proxyFor(fake.address);
  const early = await post(`${proxy.url}/early`);
  assert.equal(early.status, 429);
  assert.equal(early.headers.get("x-llm-d-request-dropped-reason"), "rejected-saturated");
  assert.equal(await early.text(), "system saturated");
  const late = await post(`${proxy.url}/late`);
  assert.equal(late.status, 400);
  assert.equal(await late.text(), "bad body");
  assert.equal(be.seen.length, 0);
  assert.equal(proxy.stats.immediateResponses, 2);
});

test("spurious replies fail the request with a 500: a plain body mutation in full duplex, a body reply before headers", async () => {
  const be = await backend();
  const fake = await fakeExtProc(async (call, _r, next) => {
    const head = await next();
    await readUntilEos(next, "request_body");
    if (headersOf(head)[":path"] === "/plain") {
      call.write({
        request_headers: { response: { header_mutation: { set_headers: [setHeader(DEST, be.endpoint)] } } },
      });
      call.write({ request_body: { response: { body_mutation: { body: Buffer.from("x") } } } });
    } else call.write(streamedReplies("request_body", Buffer.from("{}"), 1)[0]!);
  });
  const proxy = await proxyFor(fake.address, { failOpen: true, failOpenBackends: [be.endpoint] });
  assert.equal((await post(`${proxy.url}/plain`)).status, 500);
  assert.equal(
    (await post(`${proxy.url}/early-body`)).status,
    500,
    "fail-open is off once body data went out",
  );
  assert.equal(proxy.stats.spurious, 2);
  assert.equal(be.seen.length, 0);
});

test("no destination header is a 503 'no healthy upstream' and an unreachable one a 503 connect error, both seen by ext_proc", async () => {
  const dead = `127.0.0.1:${await freePort()}`;
  const heads: Msg[] = [];
  const fake = await fakeExtProc(async (call, _r, next) => {
    const head = await next();
    const set = headersOf(head)[":path"] === "/dead" ? [setHeader(DEST, dead)] : [];
    call.write({ request_headers: { response: { header_mutation: { set_headers: set } } } });
    heads.push(await passResponse(call, next));
  });
  const proxy = await proxyFor(fake.address);
  const none = await fetch(`${proxy.url}/none`);
  assert.equal(none.status, 503);
  assert.equal(await none.text(), "no healthy upstream");
  const refused = await fetch(`${proxy.url}/dead`);
  assert.equal(refused.status, 503);
  assert.match(await refused.text(), /^upstream connect error or disconnect\/reset before headers/);
  assert.equal(headersOf(heads[0])[":status"], "503");
  assert.equal(heads[0].metadata_context.filter_metadata, undefined);
  const served = heads[1].metadata_context.filter_metadata["envoy.lb"].fields;
  assert.equal(served["x-gateway-destination-endpoint-served"].stringValue, dead);
});

test("the processor down: FailClose answers 500, failOpen forwards the untouched request to a fallback", async () => {
  const be = await backend();
  const down = `127.0.0.1:${await freePort()}`;
  const closed = await proxyFor(down);
  assert.equal((await post(`${closed.url}/v1/completions`)).status, 500);
  assert.equal((await post(`${closed.url}/v1/completions`)).status, 500);
  const open = await proxyFor(down, { failOpen: true, failOpenBackends: [be.endpoint] });
  // The first stream's connection failure may come after its body went out: a 500 in full duplex,
  // as in Envoy. Once the channel knows the processor is down, streams fail before any body.
  await post(`${open.url}/warm`);
  const res = await post(`${open.url}/v1/completions`, '{"model":"m","prompt":"p"}');
  assert.equal(res.status, 200);
  assert.equal(be.seen.at(-1)!.body, '{"model":"m","prompt":"p"}');
  assert.equal(be.seen.at(-1)!.url, "/v1/completions");
});

test("the stream cap: one stream over maxStreams is refused (500, or fail-open), the held one still completes", async () => {
  const be = await backend();
  let release!: () => void;
  const held = new Promise<void>((r) => (release = r));
  const fake = await fakeExtProc(async (call, _r, next) => {
    await readUntilEos(next, "request_body");
    await held;
    call.write({
      request_headers: { response: { header_mutation: { set_headers: [setHeader(DEST, be.endpoint)] } } },
    });
    call.write(streamedReplies("request_body", Buffer.from("{}"), 1)[0]!);
    await passResponse(call, next);
  });
  const closed = await proxyFor(fake.address, { maxStreams: 1 });
  const first = post(`${closed.url}/a`);
  await waitFor(() => fake.streams.length === 1);
  assert.equal((await post(`${closed.url}/b`)).status, 500);
  assert.equal(closed.stats.overflows, 1);
  const open = await proxyFor(fake.address, {
    maxStreams: 0,
    failOpen: true,
    failOpenBackends: [be.endpoint],
  });
  assert.equal((await post(`${open.url}/c`)).status, 200);
  release();
  assert.equal((await first).status, 200);
  assert.deepEqual(
    be.seen.map((s) => s.url),
    ["/c", "/a"],
  );
  assert.equal(fake.streams.length, 1, "refused requests never opened a stream");
});

test("a client that disconnects mid-body cancels its ext_proc stream", async () => {
  const fake = await fakeExtProc(async () => {});
  const proxy = await proxyFor(fake.address);
  const req = httpRequest(`${proxy.url}/v1/completions`, {
    method: "POST",
    headers: { "content-length": "100000" },
  });
  req.on("error", () => {});
  req.write("x".repeat(1000));
  await waitFor(() => (fake.streams[0]?.length ?? 0) >= 2);
  req.destroy();
  await waitFor(() => fake.cancelled === 1);
  await waitFor(() => proxy.activeStreams() === 0);
  assert.equal(proxy.stats.clientAborts, 1);
});

test("a clean close by the server means carry on without ext_proc; an unanswered BUFFERED message is a 504", async () => {
  const be = await backend();
  const fake = await fakeExtProc(async (call, _r, next) => {
    const head = await next();
    if (headersOf(head)[":path"] === "/slow") return; // never answers
    call.write({
      request_headers: { response: { header_mutation: { set_headers: [setHeader(DEST, be.endpoint)] } } },
    });
    await next();
    call.end();
  });
  // Long enough that the answered messages never time out on a loaded machine (100 ms once did,
  // giving a 504 for the first request), short enough for /slow's wait to stay cheap.
  const proxy = await proxyFor(fake.address, { mode: "BUFFERED", messageTimeoutMs: 1000 });
  const res = await post(`${proxy.url}/v1/completions`, '{"model":"m","x":1}');
  assert.equal(res.status, 200);
  assert.equal(be.seen[0]!.body, '{"model":"m","x":1}');
  assert.equal(bodyOf(fake.streams[0]!, "request_body").toString(), '{"model":"m","x":1}');
  assert.equal((await post(`${proxy.url}/slow`)).status, 504);
  assert.equal(proxy.stats.timeouts, 1);
});
