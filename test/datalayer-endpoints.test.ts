/** Endpoint list/file parsing, validation errors, and reload of a watched endpoints file. */
import assert from "node:assert/strict";
import { once } from "node:events";
import { mkdtempSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import {
  diffEndpoints,
  EndpointConfigError,
  EndpointSource,
  parseEndpointList,
  parseEndpointsFile,
  parseHostPort,
} from "../src/datalayer/endpoints.ts";

test("host:port parsing accepts names, IPv4 and bracketed IPv6, and lowercases hosts", () => {
  assert.deepEqual(parseHostPort("10.0.0.7:8000", "x"), {
    host: "10.0.0.7",
    port: 8000,
    id: "10.0.0.7:8000",
  });
  assert.deepEqual(parseHostPort(" Replica-1.NS.svc:80 ", "x"), {
    host: "replica-1.ns.svc",
    port: 80,
    id: "replica-1.ns.svc:80",
  });
  assert.deepEqual(parseHostPort("[::1]:9000", "x"), { host: "::1", port: 9000, id: "[::1]:9000" });
});

test("host:port parsing rejects malformed addresses with the location in the message", () => {
  for (const bad of [
    "nohost",
    ":80",
    "h:0",
    "h:65536",
    "h:8a",
    "h:80:90",
    "[::1]9000",
    "[zz]:80",
    "a b:80",
    "h:",
  ]) {
    assert.throws(
      () => parseHostPort(bad, "endpoints[3].address"),
      (e: Error) => e instanceof EndpointConfigError && e.message.startsWith("endpoints[3].address:"),
      bad,
    );
  }
});

test("a URL where host:port belongs says to drop the scheme, with or without a port or path", () => {
  for (const bad of ["http://127.0.0.1:8000", "http://127.0.0.1", "https://vllm.example:8000/v1"])
    assert.throws(
      () => parseEndpointList(bad),
      (e: Error) =>
        e instanceof EndpointConfigError &&
        e.message ===
          `--endpoints[0]: "${bad}" is not host:port; write it without the "${bad.slice(0, bad.indexOf("//") + 2)}" scheme, e.g. 127.0.0.1:8000`,
      bad,
    );
});

test("a host that is not a hostname or IPv4 says how to write it", () => {
  for (const [bad, advice] of [
    ["h/v1:8000", "write host:port without a path"],
    ["::1:8000", "write an IPv6 address in brackets, e.g. [::1]:8000"],
    ["a_b:80", "use a hostname (letters, digits, '-' and '.') or an IPv4 address"],
  ]) {
    assert.throws(
      () => parseEndpointList(bad),
      (e: Error) =>
        e instanceof EndpointConfigError &&
        e.message.startsWith("--endpoints[0]: ") &&
        e.message.includes(" is not a valid hostname or IPv4; ") &&
        e.message.includes(advice),
      bad,
    );
  }
});

test("--endpoints list: trims, skips empty items, rejects duplicates and empty lists", () => {
  const l = parseEndpointList("127.0.0.1:8001, 127.0.0.1:8002,");
  assert.deepEqual(
    l.map((e) => e.id),
    ["127.0.0.1:8001", "127.0.0.1:8002"],
  );
  assert.deepEqual(l[0].labels, {});
  assert.throws(() => parseEndpointList(" , "), /at least one/);
  assert.throws(() => parseEndpointList("a:1,A:1"), /listed twice/);
});

test("endpoints file: list form, {endpoints} form, plain strings, labels and kvEvents", () => {
  const a = parseEndpointsFile(
    [
      "- address: 10.0.0.1:8000",
      "  labels: { llm-d.ai/role: decode, zone: a }",
      "  kvEvents: tcp://10.0.0.1:5557",
      "- 10.0.0.2:8000",
    ].join("\n"),
    "eps.yaml",
  );
  assert.equal(a.length, 2);
  assert.deepEqual(a[0], {
    id: "10.0.0.1:8000",
    host: "10.0.0.1",
    port: 8000,
    labels: { "llm-d.ai/role": "decode", zone: "a" },
    kvEvents: "tcp://10.0.0.1:5557",
  });
  assert.equal(a[1].kvEvents, null);
  const b = parseEndpointsFile("endpoints:\n  - address: h:1\n", "eps.yaml");
  assert.deepEqual(
    b.map((e) => e.id),
    ["h:1"],
  );
  assert.deepEqual(parseEndpointsFile("", "eps.yaml"), []);
  assert.deepEqual(parseEndpointsFile("endpoints: []", "eps.yaml"), []);
});

test("endpoints file: every kind of bad file gets an error naming the file, entry and field", () => {
  const cases: Array<[string, RegExp]> = [
    ["- address: [unclosed", /eps\.yaml: not valid YAML/],
    ["address: h:1", /expected a list of endpoints/],
    ["endpoints: {a: 1}", /endpoints must be a list/],
    ["endpoints: []\nextra: 1", /unknown top-level field "extra"/],
    ["- 42", /endpoints\[0\]: expected \{address/],
    ["- labels: {a: b}", /endpoints\[0\]\.address: required/],
    ["- address: h:1\n  weight: 3", /endpoints\[0\]: unknown field "weight"/],
    ["- address: h:1\n- address: h:99999", /endpoints\[1\]\.address: port "99999"/],
    ["- address: h:1\n  labels: {gpu: 8}", /endpoints\[0\]\.labels\.gpu: value must be a string/],
    ["- address: h:1\n  labels: [a]", /endpoints\[0\]\.labels: expected a map/],
    ["- address: h:1\n  labels: {'bad key!': x}", /not a valid label key/],
    ["- address: h:1\n  kvEvents: udp://h:5557", /endpoints\[0\]\.kvEvents: expected "tcp:\/\/host:port"/],
    [
      "- address: h:1\n- address: H:1",
      /endpoints\[1\]: h:1 is listed twice \(also eps\.yaml: endpoints\[0\]\)/,
    ],
  ];
  for (const [text, re] of cases) {
    assert.throws(
      () => parseEndpointsFile(text, "eps.yaml"),
      (e: Error) => e instanceof EndpointConfigError && re.test(e.message),
      text,
    );
  }
});

test("diffEndpoints reports added, removed and relabelled endpoints", () => {
  const prev = parseEndpointsFile("- a:1\n- address: b:1\n  labels: {r: x}\n- c:1", "f");
  const next = parseEndpointsFile("- a:1\n- address: b:1\n  labels: {r: y}\n- d:1", "f");
  const d = diffEndpoints(prev, next);
  assert.deepEqual(
    d.added.map((e) => e.id),
    ["d:1"],
  );
  assert.deepEqual(
    d.removed.map((e) => e.id),
    ["c:1"],
  );
  assert.deepEqual(
    d.updated.map((e) => e.id),
    ["b:1"],
  );
});

function tmpFile(text: string): { dir: string; path: string } {
  const dir = mkdtempSync(join(tmpdir(), "kvgate-eps-"));
  const path = join(dir, "endpoints.yaml");
  writeFileSync(path, text);
  return { dir, path };
}

test("a missing or bad endpoints file fails at startup", () => {
  assert.throws(
    () => EndpointSource.fromFile("/nonexistent/kvgate/eps.yaml"),
    /cannot read endpoints file: ENOENT.*; check the path$/,
  );
  const { dir, path } = tmpFile("- address: nope");
  try {
    assert.throws(() => EndpointSource.fromFile(path), /is not host:port/);
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
});

test("the endpoints file is re-read on change; a bad edit keeps the old set", {
  timeout: 20_000,
}, async () => {
  const { dir, path } = tmpFile("- 127.0.0.1:8001\n- 127.0.0.1:8002\n");
  const logs: string[] = [];
  const src = EndpointSource.fromFile(path, { pollMs: 25, debounceMs: 5, log: (l) => logs.push(l) });
  try {
    assert.deepEqual(
      src.current().map((e) => e.id),
      ["127.0.0.1:8001", "127.0.0.1:8002"],
    );
    // In-place edit: one added, one removed.
    const added = once(src, "add");
    const removed = once(src, "remove");
    writeFileSync(path, "- 127.0.0.1:8002\n- address: 127.0.0.1:8003\n  labels: {zone: b}\n");
    assert.equal(((await added)[0] as { id: string }).id, "127.0.0.1:8003");
    assert.equal(((await removed)[0] as { id: string }).id, "127.0.0.1:8001");

    // Bad edit: error event, old set kept, message logged.
    const failed = once(src, "error");
    writeFileSync(path, "- address: 127.0.0.1:notaport\n");
    const [err] = (await failed) as [Error];
    assert.match(err.message, /port "notaport"/);
    assert.deepEqual(
      src.current().map((e) => e.id),
      ["127.0.0.1:8002", "127.0.0.1:8003"],
    );
    assert.ok(logs.some((l) => l.includes("keeping the previous 2 endpoint(s)")));

    // Editor-style atomic replace (write a temp file, rename over): relabel is an update.
    const updated = once(src, "update");
    writeFileSync(
      join(dir, "tmp.yaml"),
      "- 127.0.0.1:8002\n- address: 127.0.0.1:8003\n  labels: {zone: c}\n",
    );
    renameSync(join(dir, "tmp.yaml"), path);
    const [spec] = (await updated) as [{ id: string; labels: Record<string, string> }];
    assert.deepEqual([spec.id, spec.labels.zone], ["127.0.0.1:8003", "c"]);
  } finally {
    src.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("reload() reports the outcome; static lists never change", () => {
  const { dir, path } = tmpFile("- a:1\n");
  const src = EndpointSource.fromFile(path, { pollMs: 0, log: () => {} });
  try {
    writeFileSync(path, "- a:1\n- b:1\n");
    const ok = src.reload();
    assert.ok(ok.ok && ok.diff.added.length === 1);
    writeFileSync(path, "{{{");
    const bad = src.reload();
    assert.ok(!bad.ok && /not valid YAML/.test(bad.error));
    assert.equal(src.current().length, 2);
  } finally {
    src.close();
    rmSync(dir, { recursive: true, force: true });
  }
  const st = EndpointSource.fromList("x:1");
  assert.deepEqual(st.reload(), { ok: true, diff: { added: [], removed: [], updated: [] } });
  st.close();
});
