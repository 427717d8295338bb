// Tests for the Prometheus text-format parser (src/datalayer/prom-text.ts): vLLM's exposition,
// prom-client output, escapes and special values, a render/parse property test, garbled input.

import assert from "node:assert/strict";
import { test } from "node:test";
import client from "prom-client";
import {
  first,
  gauge,
  histogram,
  PromParseError,
  type PromSample,
  parsePromText,
  parseValue,
  samplesOf,
  sumOf,
} from "../src/datalayer/prom-text.ts";
import { rng } from "./helpers/rng.ts";

// biome-ignore format: one table
const TTFT_LE = [
  "0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "0.25", "0.5", "0.75", "1.0", "2.5",
  "5.0", "7.5", "10.0", "20.0", "40.0", "80.0", "160.0", "640.0", "2560.0", "+Inf",
];

const L = 'engine="0",model_name="Qwen/Qwen3-8B"';
// vLLM's /metrics (vllm/v1/metrics/loggers.py, exposed by prometheus_client 0.26), with the elided bucket
// lines and CacheConfig labels written out.
const VLLM = `# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{${L}} 3.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{${L}} 1.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{${L}} 0.4215
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{${L}} 8192.0
# HELP vllm:prefix_cache_queries_created Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_created gauge
vllm:prefix_cache_queries_created{${L}} 1.795995045309403e+09
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="Qwen/Qwen3-8B"} 5.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="Qwen/Qwen3-8B"} 0.0
vllm:request_success_total{engine="0",finished_reason="abort",model_name="Qwen/Qwen3-8B"} 0.0
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
${TTFT_LE.map((le) => `vllm:time_to_first_token_seconds_bucket{engine="0",le="${le}",model_name="Qwen/Qwen3-8B"} ${le === "+Inf" || Number(le) >= 0.06 ? "1.0" : "0.0"}`).join("\n")}
vllm:time_to_first_token_seconds_count{${L}} 1.0
vllm:time_to_first_token_seconds_sum{${L}} 0.052
# HELP vllm:time_to_first_token_seconds_created Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds_created gauge
vllm:time_to_first_token_seconds_created{${L}} 1.7959950453095396e+09
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",engine="0",gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="27355",prefix_caching_hash_algo="sha256"} 1.0
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="sql-lora",waiting_lora_adapters=""} 1.7959950e+09
`;

test("vLLM exposition: every family, label and histogram series survives", () => {
  const { families, skippedLines } = parsePromText(VLLM);
  assert.equal(skippedLines, 0);
  const model = { model_name: "Qwen/Qwen3-8B", engine: "0" };
  assert.equal(gauge(families, "vllm:num_requests_running", model), 3);
  assert.equal(gauge(families, "vllm:num_requests_waiting"), 1);
  assert.equal(first(families, "vllm:kv_cache_usage_perc"), 0.4215);
  assert.equal(first(families, "vllm:prefix_cache_queries_created"), 1.795995045309403e9);
  assert.equal(families.get("vllm:prefix_cache_queries_total")?.type, "counter");
  assert.equal(families.get("vllm:kv_cache_usage_perc")?.help, "KV-cache usage. 1 means 100 percent usage.");
  assert.equal(first(families, "vllm:request_success_total", { finished_reason: "stop" }), 5);
  assert.equal(sumOf(families, "vllm:request_success_total"), 5);
  assert.equal(samplesOf(families, "vllm:request_success_total").length, 3);

  const ttft = families.get("vllm:time_to_first_token_seconds");
  assert.equal(ttft?.type, "histogram");
  assert.equal(ttft?.samples.length, TTFT_LE.length + 2);
  const b = ttft?.samples.find((s) => s.labels.le === "0.06");
  assert.deepEqual(b?.labels, { engine: "0", le: "0.06", model_name: "Qwen/Qwen3-8B" });
  const h = histogram(families, "vllm:time_to_first_token_seconds", model);
  assert.ok(h);
  assert.equal(h.buckets.length, TTFT_LE.length);
  assert.deepEqual(h.buckets[0], [0.001, 0]);
  assert.deepEqual(h.buckets[5], [0.06, 1]);
  assert.deepEqual(h.buckets.at(-1), [Infinity, 1]);
  assert.equal(h.sum, 0.052);
  assert.equal(h.count, 1);
  assert.equal(histogram(families, "vllm:time_to_first_token_seconds", { engine: "1" }), undefined);
  assert.equal(families.get("vllm:time_to_first_token_seconds_created")?.samples.length, 1);

  const info = samplesOf(families, "vllm:cache_config_info")[0];
  assert.equal(info?.labels.block_size, "16");
  assert.equal(info?.labels.num_gpu_blocks, "27355");
  assert.equal(info?.labels.num_cpu_blocks, "None");
  assert.equal(info?.labels.model_name, undefined);
  const lora = samplesOf(families, "vllm:lora_requests_info")[0];
  assert.equal(lora?.labels.waiting_lora_adapters, "");
  assert.equal(lora?.labels.running_lora_adapters, "sql-lora");
  assert.equal(lora?.value, 1.795995e9);
});

test("a vLLM-sized scrape of two DP engines parses, their histograms merged", () => {
  // Two DP engines and four histograms: about 150 lines, like a real single-replica scrape.
  const itl = ["0.01", "0.025", "0.05", "0.1", "0.2", "0.5", "1.0", "2.5", "5.0", "10.0", "20.0", "+Inf"];
  const extra = ["vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds"].map(
    (n) =>
      `# HELP ${n} h\n# TYPE ${n} histogram\n${itl.map((le) => `${n}_bucket{${L},le="${le}"} 2.0`).join("\n")}\n`,
  );
  const one = VLLM + extra.join("");
  const text = one + one.replaceAll('engine="0"', 'engine="1"').replace(/^# .*\n/gm, "");
  const { families } = parsePromText(text);
  assert.equal(gauge(families, "vllm:num_requests_running"), 6);
  const merged = histogram(families, "vllm:time_to_first_token_seconds");
  assert.equal(merged?.count, 2);
  assert.deepEqual(merged?.buckets[5], [0.06, 2]);
  assert.equal(first(families, "vllm:num_requests_running", { engine: "1" }), 3);
});

test("label escapes, order, spacing, trailing comma, CRLF, timestamps, NaN and Inf", () => {
  const text = [
    "# TYPE x gauge",
    'x{b="q\\"uote",a="back\\\\slash",c="new\\nline",} 1 1700000000000',
    'x { a = "2" , b="" } -Inf -5',
    "x{} +Inf",
    "x NaN",
    'x{a="\\\\n"} 1.5E-3',
    "# a plain comment",
    "y:z:w 8.0e+04",
    "",
    "   ",
    'x{a="ünï ✓ 😀"} Nan',
  ].join("\r\n");
  const { families } = parsePromText(text);
  const xs = families.get("x")?.samples ?? [];
  assert.deepEqual(xs[0], {
    name: "x",
    labels: { a: "back\\slash", b: 'q"uote', c: "new\nline" },
    value: 1,
    timestampMs: 1700000000000,
  });
  assert.deepEqual(xs[1], { name: "x", labels: { a: "2", b: "" }, value: -Infinity, timestampMs: -5 });
  assert.equal(xs[2]?.value, Infinity);
  assert.ok(Number.isNaN(xs[3]?.value));
  assert.deepEqual(xs[4]?.labels, { a: "\\n" });
  assert.equal(xs[4]?.value, 0.0015);
  assert.equal(xs[5]?.labels.a, "ünï ✓ 😀");
  assert.ok(Number.isNaN(xs[5]?.value));
  assert.equal(families.get("y:z:w")?.type, "untyped");
  assert.equal(first(families, "y:z:w"), 80000);
  // A label named __proto__ is an ordinary label, not a prototype change.
  const proto = parsePromText('p{__proto__="v"} 1').families.get("p")?.samples[0];
  assert.deepEqual(Object.entries(proto?.labels ?? {}), [["__proto__", "v"]]);
  assert.equal(Object.getPrototypeOf(proto?.labels), Object.prototype);
  // HELP escapes.
  assert.equal(parsePromText("# HELP h a\\\\b\\nc\\d").families.get("h")?.help, "a\\b\nc\\d");
});

test("summary and histogram series group under their family", () => {
  const text = `# TYPE s summary
s{quantile="0.5"} 1
s{quantile="0.9"} 2
s_sum 10
s_count 4
# TYPE c counter
c_total 3
c_created 1.7e9
other_count 1`;
  const { families } = parsePromText(text);
  assert.equal(families.get("s")?.samples.length, 4);
  assert.equal(first(families, "s_count"), 4);
  assert.equal(families.get("c")?.samples.length, 2);
  assert.equal(first(families, "c_total"), 3);
  assert.equal(families.has("c_total"), false);
  assert.equal(families.get("other_count")?.samples.length, 1);
});

test("prom-client rendered registry parses back to the values set", async () => {
  const reg = new client.Registry();
  const c = new client.Counter({
    name: "vllm:prompt_tokens_total",
    help: "p",
    labelNames: ["m"],
    registers: [reg],
  });
  const g = new client.Gauge({
    name: "kvgate_queue",
    help: 'q "x"\nmore',
    labelNames: ["pool"],
    registers: [reg],
  });
  const h = new client.Histogram({
    name: "vllm:e2e_seconds",
    help: "e",
    labelNames: ["model_name", "engine"],
    buckets: [0.1, 1, 10],
    registers: [reg],
  });
  c.inc({ m: 'a"b\\c\nd' }, 42);
  g.set({ pool: "p1" }, 7.25);
  g.set({ pool: "p2" }, Number.NaN);
  for (const v of [0.05, 0.5, 5, 50]) h.observe({ model_name: "m", engine: "0" }, v);
  h.observe({ model_name: "m", engine: "1" }, 0.5);
  const { families } = parsePromText(await reg.metrics());
  assert.equal(first(families, "vllm:prompt_tokens_total", { m: 'a"b\\c\nd' }), 42);
  assert.equal(first(families, "kvgate_queue", { pool: "p1" }), 7.25);
  assert.ok(Number.isNaN(first(families, "kvgate_queue", { pool: "p2" }) ?? 0));
  assert.equal(families.get("kvgate_queue")?.help, 'q "x"\nmore');
  const h0 = histogram(families, "vllm:e2e_seconds", { engine: "0" });
  assert.deepEqual(h0, {
    buckets: [
      [0.1, 1],
      [1, 2],
      [10, 3],
      [Infinity, 4],
    ],
    sum: 55.55,
    count: 4,
  });
  const all = histogram(families, "vllm:e2e_seconds");
  assert.equal(all?.count, 5);
  assert.deepEqual(all?.buckets[1], [1, 3]);
});

// ---- property test: random families rendered by a tiny renderer of our own ----

const ALPHABET = ['"', "\\", "\n", "a", "Z", "0", " ", ",", "}", "{", "=", "é", "漢", "😀", "#", "\t", "n"];

function renderValue(v: number, r: () => number): string {
  if (Number.isNaN(v)) return r() < 0.5 ? "NaN" : "Nan";
  if (v === Infinity) return "+Inf";
  if (v === -Infinity) return "-Inf";
  if (Number.isInteger(v) && r() < 0.3) return `${v}.0`; // Python style
  return r() < 0.5 ? String(v) : v.toExponential();
}

const escapeLabel = (s: string) => s.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");

test("property: render random samples, parse, get them back", () => {
  for (let seed = 1; seed <= 300; seed++) {
    const r = rng(seed);
    const pick = <T>(xs: T[]): T => xs[Math.floor(r() * xs.length)] as T;
    const expected: PromSample[] = [];
    const lines: string[] = [];
    const nFam = 1 + Math.floor(r() * 5);
    for (let f = 0; f < nFam; f++) {
      const fam = `${pick(["a", "vllm:", "x_", "B"])}${f}${pick(["", ":y", "_z"])}`;
      lines.push(`# HELP ${fam} help ${f}`, `# TYPE ${fam} ${pick(["gauge", "counter", "untyped"])}`);
      const nSamples = 1 + Math.floor(r() * 6);
      for (let i = 0; i < nSamples; i++) {
        const labels: Record<string, string> = {};
        const nLabels = Math.floor(r() * 4);
        for (let k = 0; k < nLabels; k++) {
          let v = "";
          const len = Math.floor(r() * 8);
          for (let j = 0; j < len; j++) v += pick(ALPHABET);
          labels[`${pick(["l", "_m", "le", "Q"])}${k}`] = v;
        }
        const value = pick([
          0,
          -1,
          Number.NaN,
          Infinity,
          -Infinity,
          (r() - 0.5) * 10 ** Math.floor(r() * 40 - 20),
          Math.floor(r() * 1e6),
        ]);
        const ts = r() < 0.3 ? Math.floor((r() - 0.2) * 2e12) : undefined;
        const keys = Object.keys(labels).sort(() => r() - 0.5);
        const sp = () => (r() < 0.2 ? " " : "");
        const body = keys.map(
          (k) => `${sp()}${k}${sp()}=${sp()}"${escapeLabel(labels[k] as string)}"${sp()}`,
        );
        const set =
          keys.length > 0 || r() < 0.2 ? `{${body.join(",")}${keys.length > 0 && r() < 0.2 ? "," : ""}}` : "";
        lines.push(`${fam}${set} ${renderValue(value, r)}${ts === undefined ? "" : ` ${ts}`}${sp()}`);
        if (r() < 0.1) lines.push(r() < 0.5 ? "" : "# just a comment");
        const sample: PromSample = { name: fam, labels, value };
        if (ts !== undefined) sample.timestampMs = ts;
        expected.push(sample);
      }
    }
    const text = lines.join(r() < 0.3 ? "\r\n" : "\n") + (r() < 0.5 ? "\n" : "");
    let families: ReturnType<typeof parsePromText>["families"];
    try {
      families = parsePromText(text).families;
    } catch (e) {
      assert.fail(`seed ${seed}: ${e}\n${JSON.stringify(text)}`);
    }
    const got = [...families.values()].flatMap((f) => f.samples);
    assert.deepEqual(got, expected, `seed ${seed}:\n${text}`);
  }
});

test("garbled input: strict throws with the line number, lenient keeps the good lines", () => {
  const bad = [
    "# TYPE good gauge",
    "good 1",
    'bad{a="unterminated} 1',
    "good 2",
    "bad_value abc",
    "bad_label{a=1} 1",
    "good{} 3 notatimestamp",
    "# TYPE t nonsense",
    'bad{a="\\x"} 1',
    "g!ood 4",
    "good 5",
    "9starts_with_digit 1",
    "novalue",
    'trailing{a="b"} 1 2 3',
    "\u0000\u0001binary junk",
  ];
  assert.throws(
    () => parsePromText(bad.join("\n")),
    (e: unknown) => e instanceof PromParseError && e.line === 3 && /line 3/.test(e.message),
  );
  const res = parsePromText(bad.join("\n"), { lenient: true });
  assert.equal(res.skippedLines, 11);
  assert.equal(res.errors.length, 5);
  assert.deepEqual(
    res.errors.map((e) => e.line),
    [3, 5, 6, 7, 8],
  );
  assert.deepEqual(
    res.families.get("good")?.samples.map((s) => s.value),
    [1, 2, 5],
  );
  // Every single bad line alone throws in strict mode.
  for (const [i, line] of bad.entries()) {
    if (line.startsWith("good ") || i === 0) continue;
    assert.throws(() => parsePromText(`ok 1\n${line}`), PromParseError, line);
  }
  // Random garbage after a cut-off exposition: lenient mode never throws, keeps every sample of the
  // complete lines before the cut and skips only lines after it; strict mode throws a PromParseError
  // exactly when lenient mode skipped something, at the first line lenient mode skipped.
  let withSkips = 0;
  for (let seed = 1; seed <= 200; seed++) {
    const r = rng(seed);
    let junk = "";
    const len = Math.floor(r() * 300);
    for (let j = 0; j < len; j++) junk += String.fromCharCode(Math.floor(r() * 130));
    const head = VLLM.slice(0, Math.floor(r() * VLLM.length));
    const complete = head.slice(0, head.lastIndexOf("\n") + 1);
    const completeLines = complete.split("\n").length - 1;
    const mixed = `${head}${junk}`;
    const lenient = parsePromText(mixed, { lenient: true });
    const what = `seed ${seed}`;
    assert.ok(lenient.skippedLines <= mixed.split("\n").length - completeLines, what);
    assert.equal(lenient.errors.length, Math.min(lenient.skippedLines, 5), what);
    for (const e of lenient.errors) assert.ok(e.line > completeLines, `${what}: line ${e.line} skipped`);
    for (const [name, fam] of parsePromText(complete).families) {
      const got = lenient.families.get(name);
      assert.ok(got, `${what}: family ${name} lost`);
      assert.deepEqual(got.samples.slice(0, fam.samples.length), fam.samples, `${what}: ${name}`);
    }
    let strictError: unknown;
    try {
      parsePromText(mixed);
    } catch (e) {
      strictError = e;
    }
    if (lenient.skippedLines === 0) assert.equal(strictError, undefined, what);
    else {
      withSkips++;
      assert.ok(strictError instanceof PromParseError, `${what}: ${strictError}`);
      assert.equal(strictError.line, lenient.errors[0].line, what);
    }
  }
  // Both branches ran: most inputs have a bad line, some (short or no junk) none.
  assert.ok(withSkips > 100 && withSkips < 200, `${withSkips} of 200 inputs had a bad line`);
});

test("property: parseValue agrees bit for bit with Number() on decimal strings", () => {
  const r = rng(7);
  const digits = (n: number) => Array.from({ length: n }, () => Math.floor(r() * 10)).join("");
  for (let k = 0; k < 20000; k++) {
    const sign = ["", "-", "+"][Math.floor(r() * 3)];
    const int = digits(Math.floor(r() * 12));
    const frac = r() < 0.6 ? `.${digits(Math.floor(r() * 12))}` : "";
    const exp =
      r() < 0.4
        ? `${r() < 0.5 ? "e" : "E"}${["", "+", "-"][Math.floor(r() * 3)]}${digits(1 + Math.floor(r() * 3))}`
        : "";
    const tok = `${sign}${int}${frac}${exp}`;
    const valid = /\d/.test(int + frac);
    const got = parseValue(tok);
    if (valid) assert.ok(Object.is(got, Number(tok)), `${tok}: ${got} vs ${Number(tok)}`);
    else assert.equal(got, undefined, tok);
  }
  for (const v of [0.1, 1 / 3, 1e-300, 5e-324, 1.7976931348623157e308, 123456789.12345679]) {
    assert.ok(Object.is(parseValue(String(v)), v));
    assert.ok(Object.is(parseValue(v.toExponential()), v));
  }
  assert.ok(Object.is(parseValue("-0.0"), -0));
  for (const bad of ["", "1e", "0x10", "1_0", "--1", "1.2.3", "inf1", "Infinit", "nanx", "__proto__", " 1"]) {
    assert.equal(parseValue(bad), undefined, bad);
  }
});
