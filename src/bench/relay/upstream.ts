/**
 * bench:relay's upstream: a stand-in for vLLM that costs next to nothing, so the CPU a relay run
 * reads is the gateway's. It serves /metrics and /v1/models as a replica does, and streams
 * completions and chat completions in vLLM's chunk shapes (chat: a role chunk first; then one
 * chunk per token, the last with its finish reason; the usage chunk when asked; `data: [DONE]`),
 * one token per stream per engine "step" of
 * --step-ms wall milliseconds: each stream gets one event per socket write, as a vLLM replica's
 * stream does at one token per step. Prints `listening on http://host:port` when ready.
 *
 *   node --import tsx src/bench/relay/upstream.ts [--step-ms 20] [--model relay-bench]
 */
import { createServer, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { parseBenchArgs } from "../cli-args.ts";

const USAGE = "usage: node --import tsx src/bench/relay/upstream.ts [--step-ms 20] [--model relay-bench]";

const { values: a } = parseBenchArgs("bench:relay upstream", USAGE, {
  options: {
    "step-ms": { type: "string", default: "20" },
    model: { type: "string", default: "relay-bench" },
  },
});
const stepMs = Number(a["step-ms"]);
const model = a.model;

interface Stream {
  res: ServerResponse;
  chat: boolean;
  id: string;
  left: number;
  sent: number;
  usage: boolean;
  promptChars: number;
}

const active = new Set<Stream>();
let nextId = 0;
let eventsWritten = 0;

const created = Math.floor(Date.now() / 1000);
const head = (s: { id: string; chat: boolean }) =>
  `data: {"id":"${s.id}","object":"${s.chat ? "chat.completion.chunk" : "text_completion"}","created":${created},"model":"${model}","choices":[`;

function send(s: Stream, text: string): void {
  eventsWritten++;
  s.res.write(text);
}

function step(): void {
  for (const s of active) {
    if (s.res.destroyed) {
      active.delete(s);
      continue;
    }
    s.left--;
    s.sent++;
    const last = s.left === 0;
    const tail = s.usage ? ',"usage":null}' : "}";
    const finish = last ? '"length"' : "null";
    send(
      s,
      s.chat
        ? `${head(s)}{"index":0,"delta":{"content":" tok${s.sent}"},"logprobs":null,"finish_reason":${finish}${last ? ',"stop_reason":null' : ""}}]${tail}\n\n`
        : `${head(s)}{"index":0,"text":" tok${s.sent}","logprobs":null,"finish_reason":${finish},"stop_reason":null}]${tail}\n\n`,
    );
    if (!last) continue;
    active.delete(s);
    if (s.usage) {
      const prompt = Math.round(s.promptChars / 4);
      send(
        s,
        `${head(s)}],"usage":{"prompt_tokens":${prompt},"total_tokens":${prompt + s.sent},"completion_tokens":${s.sent}}}\n\n`,
      );
    }
    eventsWritten++;
    s.res.end("data: [DONE]\n\n");
  }
}
setInterval(step, stepMs);

const metrics = () =>
  [
    "# TYPE vllm:num_requests_running gauge",
    `vllm:num_requests_running{engine="0",model_name="${model}"} ${active.size}.0`,
    "# TYPE vllm:num_requests_waiting gauge",
    `vllm:num_requests_waiting{engine="0",model_name="${model}"} 0.0`,
    "# TYPE vllm:kv_cache_usage_perc gauge",
    `vllm:kv_cache_usage_perc{engine="0",model_name="${model}"} 0.1`,
    "# TYPE vllm:cache_config_info gauge",
    'vllm:cache_config_info{block_size="16",engine="0",num_gpu_blocks="100000"} 1.0',
    "# TYPE relay_bench_events_written_total counter",
    `relay_bench_events_written_total ${eventsWritten}`,
    "",
  ].join("\n");

const server = createServer((req, res) => {
  const chunks: Buffer[] = [];
  req.on("data", (c: Buffer) => chunks.push(c));
  req.on("end", () => {
    const path = (req.url ?? "/").split("?")[0];
    if (req.method === "GET" && path === "/metrics") {
      res.writeHead(200, { "content-type": "text/plain; version=0.0.4" }).end(metrics());
      return;
    }
    if (req.method === "GET" && path === "/v1/models") {
      res
        .writeHead(200, { "content-type": "application/json" })
        .end(JSON.stringify({ object: "list", data: [{ id: model, object: "model", owned_by: "vllm" }] }));
      return;
    }
    const chat = path === "/v1/chat/completions";
    if (req.method !== "POST" || !(chat || path === "/v1/completions")) {
      res.writeHead(404, { "content-type": "application/json" }).end('{"error":{"message":"no route"}}');
      return;
    }
    const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as {
      max_tokens?: number;
      stream_options?: { include_usage?: boolean };
    };
    const id = `${chat ? "chatcmpl" : "cmpl"}-${++nextId}`;
    res.writeHead(200, { "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache" });
    const s: Stream = {
      res,
      chat,
      id,
      left: Math.max(1, body.max_tokens ?? 16),
      sent: 0,
      usage: body.stream_options?.include_usage === true,
      promptChars: chunks.reduce((n, c) => n + c.length, 0),
    };
    if (chat)
      send(
        s,
        `${head(s)}{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]${s.usage ? ',"usage":null}' : "}"}\n\n`,
      );
    else res.flushHeaders();
    active.add(s);
  });
});
server.keepAliveTimeout = 60_000;
server.listen(0, "127.0.0.1", () => {
  const { port } = server.address() as AddressInfo;
  process.stdout.write(`relay upstream listening on http://127.0.0.1:${port}\n`);
});
process.on("SIGTERM", () => process.exit(0));
