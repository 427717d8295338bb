/**
 * kvgate's hand-written ext_proc protos against the full upstream definitions (the Envoy API copy in
 * @grpc/grpc-js-xds, plus the newer pieces its helper adds): every message and enum kvgate
 * declares exists upstream with the same fields, numbers, types and labels; and messages encoded with
 * either decode identically with the other for the fields both have, including the
 * google.protobuf.Struct metadata (whose fields are camelCase even with keepCase).
 */
import assert from "node:assert/strict";
import { test } from "node:test";
import type protobuf from "protobufjs";
import { kvgateRoot, structOf, upstreamRoot } from "./helpers/ext-proc-client.ts";

const ours = kvgateRoot();
const theirs = upstreamRoot();

function walk(
  ns: protobuf.NamespaceBase,
  out: protobuf.ReflectionObject[] = [],
): protobuf.ReflectionObject[] {
  for (const o of ns.nestedArray) {
    if (o.fullName.startsWith(".google.")) continue;
    out.push(o);
    if ("nestedArray" in o) walk(o as protobuf.NamespaceBase, out);
  }
  return out;
}

test("every kvgate message and enum matches upstream's names, numbers, types and labels", () => {
  const objects = walk(ours);
  const types = objects.filter((o): o is protobuf.Type => "fieldsArray" in o);
  assert.ok(types.length >= 20, `${types.length} messages checked`);
  for (const t of types) {
    const u = theirs.lookupType(t.fullName);
    for (const f of t.fieldsArray) {
      const g = u.fields[f.name];
      assert.ok(g, `${t.fullName}.${f.name} exists upstream`);
      assert.equal(g.id, f.id, `${t.fullName}.${f.name} number`);
      f.resolve();
      g.resolve();
      const typeName = (x: protobuf.Field) => x.resolvedType?.fullName ?? x.type;
      assert.equal(typeName(g), typeName(f), `${t.fullName}.${f.name} type`);
      assert.equal(g.repeated, f.repeated, `${t.fullName}.${f.name} repeated`);
      assert.equal(g.map, f.map, `${t.fullName}.${f.name} map`);
      assert.equal(g.partOf?.name, f.partOf?.name, `${t.fullName}.${f.name} oneof`);
    }
  }
  for (const e of objects.filter((o): o is protobuf.Enum => "valuesById" in o)) {
    const u = theirs.lookupEnum(e.fullName);
    for (const [name, id] of Object.entries(e.values))
      assert.equal(u.values[name], id, `${e.fullName}.${name}`);
  }
  assert.equal(
    ours.lookupEnum("envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode").values
      .FULL_DUPLEX_STREAMED,
    4,
  );
});

const request = {
  request_body: { body: Buffer.from('{"model":"m"}'), end_of_stream: true },
  metadata_context: {
    filter_metadata: {
      "envoy.lb.subset_hint": structOf({
        "x-gateway-destination-endpoint-subset": ["10.0.0.1:8000", "10.0.0.2:8000"],
      }),
      "envoy.lb": structOf({ "x-gateway-destination-endpoint-served": "10.0.0.2:8000" }),
    },
  },
  protocol_config: { request_body_mode: 4, response_body_mode: 4 },
};
const headersRequest = {
  request_headers: {
    headers: {
      headers: [
        { key: ":path", raw_value: Buffer.from("/v1/chat/completions") },
        { key: "x-a", value: "b" },
      ],
    },
    end_of_stream: false,
  },
};
const responses = [
  {
    request_headers: {
      response: {
        clear_route_cache: true,
        header_mutation: {
          set_headers: [
            {
              header: { key: "x-gateway-destination-endpoint", raw_value: Buffer.from("10.0.0.1:8000") },
              append_action: 2,
            },
          ],
          remove_headers: ["x-prefiller-host-port"],
        },
      },
    },
    dynamic_metadata: structOf({ "x-gateway-destination-endpoint": "10.0.0.1:8000,10.0.0.2:8000" }),
  },
  {
    request_body: {
      response: { body_mutation: { streamed_response: { body: Buffer.from("abc"), end_of_stream: true } } },
    },
  },
  { response_body: { response: { body_mutation: { body: Buffer.from("xyz") } } } },
  {
    immediate_response: {
      status: { code: 429 },
      headers: {
        set_headers: [
          { header: { key: "x-llm-d-request-dropped-reason", raw_value: Buffer.from("rejected-saturated") } },
        ],
      },
      body: Buffer.from('{"error":{}}'),
      details: "saturated",
    },
  },
  { response_trailers: {} },
];

function roundTrip(name: string, msg: object, from: protobuf.Root, to: protobuf.Root) {
  const enc = from.lookupType(name);
  const dec = to.lookupType(name);
  const err = enc.verify(msg);
  assert.equal(err, null, `${name}: ${err}`);
  const bytes = enc.encode(enc.fromObject(msg)).finish();
  const opts = { bytes: Buffer, enums: Number, longs: Number, oneofs: true } as const;
  return { via: dec.toObject(dec.decode(bytes), opts), direct: enc.toObject(enc.decode(bytes), opts) };
}

test("messages encoded with either proto decode identically with the other", () => {
  const P = "envoy.service.ext_proc.v3.";
  for (const [from, to] of [
    [theirs, ours],
    [ours, theirs],
  ] as const) {
    for (const m of [request, headersRequest]) {
      const { via, direct } = roundTrip(`${P}ProcessingRequest`, m, from, to);
      assert.deepEqual(via, direct);
    }
    for (const m of responses) {
      const { via, direct } = roundTrip(`${P}ProcessingResponse`, m, from, to);
      assert.deepEqual(via, direct);
    }
  }
  // The Struct round-trips with its camelCase kinds: the subset list and the served endpoint survive.
  const { via } = roundTrip(`${P}ProcessingRequest`, request, theirs, ours);
  const fm = (via as typeof request).metadata_context.filter_metadata;
  assert.deepEqual(
    fm["envoy.lb.subset_hint"].fields?.["x-gateway-destination-endpoint-subset"]?.listValue?.values?.map(
      (v) => v.stringValue,
    ),
    ["10.0.0.1:8000", "10.0.0.2:8000"],
  );
  assert.equal(
    fm["envoy.lb"].fields?.["x-gateway-destination-endpoint-served"]?.stringValue,
    "10.0.0.2:8000",
  );
});

test("upstream fields kvgate leaves out are skipped when decoding, not an error", () => {
  const P = "envoy.service.ext_proc.v3.";
  const full = theirs.lookupType(`${P}ProcessingRequest`);
  const bytes = full
    .encode(
      full.fromObject({
        ...headersRequest,
        observability_mode: true,
        attributes: { "envoy.x": structOf({ a: "b" }) },
      }),
    )
    .finish();
  const got = ours
    .lookupType(`${P}ProcessingRequest`)
    .toObject(ours.lookupType(`${P}ProcessingRequest`).decode(bytes));
  assert.equal(got.observability_mode, true);
  assert.equal(got.request_headers.headers.headers[1].value, "b");
});
