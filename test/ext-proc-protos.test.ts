/**
 * The Envoy-like client's protocol: Envoy's own proto files from @grpc/grpc-js-xds, which predate
 * FULL_DUPLEX_STREAMED, plus the pieces current envoyproxy/data-plane-api has (and Envoy sends), pinned by
 * their wire numbers (hand-encoded bytes) rather than by the code that adds them; and header
 * mutations under Envoy's default rules.
 */
import assert from "node:assert/strict";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import protobuf from "protobufjs";
import { applyHeaderMutation, requestHeaderList, toHeaderMap } from "../src/bench/ext-proc/headers.ts";
import { extProcProtocol, upstreamProtoDirs } from "../src/bench/ext-proc/protos.ts";

test("the npm copy of Envoy's protos lacks the full-duplex pieces; the loaded protocol has them at upstream's numbers", () => {
  const dirs = upstreamProtoDirs();
  assert.ok(dirs, "@grpc/grpc-js-xds is installed (a devDependency)");
  const bare = new protobuf.Root();
  bare.resolvePath = (_o, target) => dirs.map((d) => join(d, target)).find((f) => existsSync(f)) ?? target;
  bare.loadSync("envoy/service/ext_proc/v3/external_processor.proto", { keepCase: true });
  assert.equal(
    bare.lookupType("envoy.service.ext_proc.v3.BodyMutation").fields["streamed_response"],
    undefined,
  );

  const { root, decodeResponse, encodeRequest } = extProcProtocol();
  // ProcessingRequest{ protocol_config(11): { request_body_mode(1): FULL_DUPLEX_STREAMED(4) } }
  assert.deepEqual(
    [...encodeRequest({ protocol_config: { request_body_mode: 4 } })],
    [0x5a, 0x02, 0x08, 0x04],
  );
  const mode = root.lookupEnum("envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode");
  assert.equal(mode.values["FULL_DUPLEX_STREAMED"], 4);
  // ProcessingResponse{ request_body(3): BodyResponse{ response(1): CommonResponse{ body_mutation(3):
  //   BodyMutation{ streamed_response(3): { body(1): "hi", end_of_stream(2): true } } } } }
  const streamed = Buffer.from([0x0a, 0x02, 0x68, 0x69, 0x10, 0x01]);
  const mutation = Buffer.concat([Buffer.from([0x1a, streamed.length]), streamed]);
  const common = Buffer.concat([Buffer.from([0x1a, mutation.length]), mutation]);
  const bodyResponse = Buffer.concat([Buffer.from([0x0a, common.length]), common]);
  const wire = Buffer.concat([Buffer.from([0x1a, bodyResponse.length]), bodyResponse]);
  const m = decodeResponse(wire);
  assert.equal(m.response, "request_body");
  const s = m.request_body?.response?.body_mutation?.streamed_response;
  assert.equal(s?.body?.toString(), "hi");
  assert.equal(s?.end_of_stream, true);
});

test("request headers go out lower-cased with pseudo-headers first and values as raw bytes", () => {
  const list = requestHeaderList("POST", "/v1/chat/completions", ["Host", "gw:80", "X-A", "1", "x-a", "2"]);
  const map = toHeaderMap(list);
  assert.deepEqual(
    map.headers.map((h) => [h.key, h.raw_value?.toString()]),
    [
      [":authority", "gw:80"],
      [":path", "/v1/chat/completions"],
      [":method", "POST"],
      [":scheme", "http"],
      ["x-a", "1"],
      ["x-a", "2"],
    ],
  );
});

test("header mutations follow Envoy's default rules", () => {
  const list = requestHeaderList("GET", "/", ["Host", "h", "x-keep", "k", "content-length", "5"]);
  const raw = (key: string, v: string) => ({ header: { key, raw_value: Buffer.from(v) } });
  const out = applyHeaderMutation(
    list,
    {
      set_headers: [
        raw(":authority", "x"),
        raw("x-envoy-foo", "1"),
        raw("x-new", "n"),
        raw("content-length", "9"),
        { header: { key: "x-k2", raw_value: Buffer.from("b") }, append: { value: true } },
      ],
      remove_headers: [":path", "host", "x-keep"],
    },
    true,
  );
  assert.equal(out.error, undefined);
  assert.deepEqual(
    out.ignored.sort(),
    [":authority", ":path", "content-length", "host", "x-envoy-foo"].sort(),
  );
  assert.deepEqual(list.get(":authority"), ["h"]);
  assert.deepEqual(list.get(":path"), ["/"]);
  assert.deepEqual(list.get("content-length"), ["5"], "streamed modes skip a processor's content-length");
  assert.equal(list.has("x-keep"), false);
  assert.deepEqual(list.get("x-new"), ["n"]);
  assert.deepEqual(list.get("x-k2"), ["b"]);
  const both = applyHeaderMutation(
    list,
    { set_headers: [{ header: { key: "x", value: "a", raw_value: Buffer.from("b") } }] },
    false,
  );
  assert.match(both.error ?? "", /Only one of value or raw_value/);
  const bad = applyHeaderMutation(list, { set_headers: [raw("x-bad", "a\nb")] }, false);
  assert.match(bad.error ?? "", /Invalid character/);
});
