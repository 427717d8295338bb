/**
 * The simulated vLLM replica's HTTP server (node:http): vLLM's OpenAI-compatible surface
 * (vllm/entrypoints/openai/api_server.py) over one scaled-real-time Engine, with /metrics in vLLM's names, KV
 * events
 * over ZMQ when --kv-events-config enables them, P/D as vLLM's NixlConnector when
 * --kv-transfer-config sets one (nixl-connector.ts), and fault injection. Every handler is wrapped: bad
 * input is answered with vLLM-style error JSON and never takes the process down.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { Engine } from "../engine/engine.ts";
import { Faults, GARBLED_METRICS } from "./faults.ts";
import { publishesEvents } from "./kv-events-config.ts";
import { ZmqEventPublisher } from "./kv-publisher.ts";
import type { LoraAdapter } from "./lora-config.ts";
import { LoraAdapters } from "./lora-endpoints.ts";
import { LoraMetrics } from "./lora-metrics.ts";
import { NixlConnector } from "./nixl-connector.ts";
import { OffloadMetrics } from "./offload-metrics.ts";
import { ReplicaDriver } from "./replica-driver.ts";
import { type GenerateContext, handleGeneration } from "./replica-generate.ts";
import {
  engineConfigOf,
  type ReplicaOptions,
  type ReplicaSettings,
  resolveReplicaOptions,
} from "./replica-options.ts";
import {
  ApiError,
  parseChatRequest,
  parseCompletionRequest,
  parseDetokenizeRequest,
  parseJsonObject,
  parseTokenizeRequest,
  sendError,
  sendJson,
} from "./replica-protocol.ts";
import { modelList } from "./replica-responses.ts";
import { METRICS_CONTENT_TYPE, VllmMetrics } from "./vllm-metrics.ts";

/** Accept queue asked of the kernel (capped by net.core.somaxconn); Node's 511 overflows when a gateway opens
 * thousands of upstream connections at once. */
const LISTEN_BACKLOG = 8192;

/** The vLLM version whose wire formats the replica follows (KV events as maps, replay with topic). */
export const EMULATED_VLLM_VERSION = "0.26.0";

type Route = (req: IncomingMessage, res: ServerResponse) => Promise<void> | void;

export class ReplicaServer {
  readonly opts: ReplicaOptions;
  readonly engine: Engine;
  readonly driver: ReplicaDriver;
  readonly metrics: VllmMetrics;
  /** Adapters this replica serves (--lora-modules and runtime loads), or null without --enable-lora. */
  readonly lora: LoraAdapters | null;
  private readonly loraMetrics: LoraMetrics | null;
  private readonly offloadMetrics: OffloadMetrics | null;
  readonly faults: Faults;
  /** KV-event publisher when --kv-events-config enables ZMQ publishing. */
  readonly publisher: ZmqEventPublisher | null;
  /** The P/D connector when --kv-transfer-config sets one. */
  readonly nixl: NixlConnector | null;
  private readonly server: Server;
  private readonly sockets = new Set<Socket>();
  private readonly routes: Record<string, Record<string, Route>>;
  private readonly generateCtx: GenerateContext;
  private readonly startedAt = Math.floor(Date.now() / 1000);
  private nextId = 0;
  private closing: Promise<void> | null = null;

  private constructor(opts: ReplicaOptions, publisher: ZmqEventPublisher | null) {
    this.opts = opts;
    this.publisher = publisher;
    // Block hashes leave the replica only in KV events; without them a fast hash with the same
    // prefix-hit behaviour saves ~0.8 ms of CPU per 7,000-token prompt (fast-block-hash.ts).
    const blockHashAlgo = opts.kvEventsConfig?.enableKvCacheEvents ? "sha256_cbor" : "fast64";
    this.engine = new Engine(engineConfigOf(opts), { keepOffloadTransfers: true, blockHashAlgo });
    this.faults = new Faults(opts.faults, opts.seed, () => (opts.onCrash ?? (() => this.crash()))());
    this.driver = new ReplicaDriver(this.engine, {
      timeScale: opts.timeScale,
      log: opts.log,
      onStep: (step, lag) => {
        this.metrics.observeStep(step, lag);
        this.loraMetrics?.observe(Date.now() / 1000);
        if (step.kvEvents && this.publisher) {
          const b = step.kvEvents;
          this.publisher.publish({
            ...b,
            ts: Date.now() / 1000,
            dataParallelRank: b.dataParallelRank ?? opts.dataParallelRank,
          });
        }
      },
      onFinish: (record, receivedAt) => {
        this.metrics.observeFinished(record, receivedAt);
        this.nixl?.onFinished(record);
      },
      onRemoteKvNeeded: (needs) => this.nixl?.onRemoteKvNeeded(needs),
    });
    this.metrics = new VllmMetrics({
      modelName: opts.servedModelNames[0]!,
      engine: String(opts.dataParallelRank),
      maxModelLen: opts.maxModelLen,
      legacyNames: opts.legacyMetricNames,
      timeScale: opts.timeScale,
      stats: () => this.engine.stats(),
      lag: () => this.driver.lag,
      cacheConfig: {
        block_size: String(opts.blockSize),
        cache_dtype: "auto",
        enable_prefix_caching: opts.enablePrefixCaching ? "True" : "False",
        gpu_memory_utilization: "0.9",
        num_gpu_blocks: String(opts.numGpuBlocks),
        num_cpu_blocks: "None",
        prefix_caching_hash_algo: "sha256_cbor",
        sliding_window: "None",
      },
    });
    this.lora = opts.lora === null ? null : new LoraAdapters(opts.lora.adapters);
    this.loraMetrics =
      opts.lora === null ? null : new LoraMetrics(this.metrics.registry, () => this.engine.loraState());
    this.nixl = opts.kvTransferConfig
      ? NixlConnector.forReplica(opts, this.driver, this.metrics.registry)
      : null;
    const tier = this.engine.cpuTier;
    this.offloadMetrics =
      tier === null
        ? null
        : new OffloadMetrics(
            this.metrics.registry,
            { model_name: opts.servedModelNames[0]!, engine: String(opts.dataParallelRank) },
            () => this.engine.stats().offload,
            () => tier.takeTransfers(),
          );
    this.generateCtx = {
      nixl: this.nixl,
      opts,
      driver: this.driver,
      faults: this.faults,
      resolveModel: (name) => this.resolveModel(name),
      adapter: (name) => this.lora?.get(name),
      nextEngineId: () => `req-${++this.nextId}`,
    };
    this.routes = {
      "/health": { GET: (_q, res) => this.empty(res) },
      "/ping": { GET: (_q, res) => this.empty(res), POST: (_q, res) => this.empty(res) },
      "/version": { GET: (_q, res) => sendJson(res, 200, { version: EMULATED_VLLM_VERSION }) },
      "/v1/models": {
        GET: (_q, res) => sendJson(res, 200, modelList(this.opts, this.startedAt, this.lora?.list() ?? [])),
      },
      "/v1/load_lora_adapter": {
        POST: async (q, res) => this.loraRoute(res).load(await this.body(q, res), res),
      },
      "/v1/unload_lora_adapter": {
        POST: async (q, res) => this.loraRoute(res).unload(await this.body(q, res), res),
      },
      "/metrics": { GET: (_q, res) => this.serveMetrics(res) },
      "/v1/completions": {
        POST: async (q, res) =>
          handleGeneration(this.generateCtx, parseCompletionRequest(await this.body(q, res)), q, res),
      },
      "/v1/chat/completions": {
        POST: async (q, res) =>
          handleGeneration(this.generateCtx, parseChatRequest(await this.body(q, res)), q, res),
      },
      "/tokenize": { POST: async (q, res) => this.tokenize(await this.body(q, res), res) },
      "/detokenize": { POST: async (q, res) => this.detokenize(await this.body(q, res), res) },
    };
    this.server = createServer((req, res) => this.dispatch(req, res));
    this.server.on("connection", (s) => {
      this.sockets.add(s);
      s.on("close", () => this.sockets.delete(s));
    });
    this.server.on("clientError", (_err, socket) => {
      if (socket.writable) socket.end("HTTP/1.1 400 Bad Request\r\nconnection: close\r\n\r\n");
      else socket.destroy();
    });
  }

  /** Resolves settings, opens the KV-event publisher if configured, and listens. */
  static async start(settings: ReplicaSettings | ReplicaOptions = {}): Promise<ReplicaServer> {
    const opts = isResolved(settings) ? settings : await resolveReplicaOptions(settings);
    const kv = opts.kvEventsConfig;
    const publisher =
      kv && publishesEvents(kv)
        ? await ZmqEventPublisher.start(kv, {
            format: opts.kvEventsFormat,
            dataParallelRank: opts.dataParallelRank,
          })
        : null;
    let replica: ReplicaServer;
    try {
      replica = new ReplicaServer(opts, publisher);
    } catch (err) {
      await publisher?.close();
      throw err;
    }
    try {
      await replica.nixl?.start();
      await new Promise<void>((resolve, reject) => {
        replica.server.once("error", reject);
        replica.server.listen({ port: opts.port, host: opts.host, backlog: LISTEN_BACKLOG }, () => {
          replica.server.off("error", reject);
          resolve();
        });
      });
    } catch (err) {
      await publisher?.close();
      await replica.nixl?.close();
      replica.driver.close();
      throw err;
    }
    return replica;
  }

  get port(): number {
    return (this.server.address() as AddressInfo).port;
  }

  /** Base URL, e.g. http://127.0.0.1:8000 (IPv6 hosts bracketed; wildcard hosts shown as loopback). */
  get url(): string {
    const host =
      this.opts.host === "0.0.0.0" ? "127.0.0.1" : this.opts.host === "::" ? "::1" : this.opts.host;
    return `http://${host.includes(":") ? `[${host}]` : host}:${this.port}`;
  }

  /** One line describing the replica, printed by the CLI at startup. */
  describe(): string {
    const o = this.opts;
    const kv =
      (this.publisher ? ` kv_events=${this.publisher.endpoint} (${o.kvEventsFormat})` : "") +
      (this.nixl?.describe() ?? "");
    return (
      `kvgate sim-replica listening on ${this.url} model=${o.servedModelNames[0]} profile=${o.profile.name} ` +
      `blocks=${o.numGpuBlocks} block_size=${o.blockSize} max_model_len=${o.maxModelLen} ` +
      `time_scale=${o.timeScale}x tokenizer=${o.tokenizer.name}${kv}` +
      (o.lora ? ` lora=${o.lora.adapters.length} adapters, max_loras ${o.lora.maxLoras}` : "")
    );
  }

  /** The runtime-loading endpoints' handler; 404 as vLLM when runtime updating is not allowed. */
  private loraRoute(_res: ServerResponse): LoraAdapters {
    if (this.lora === null || !runtimeLoraUpdating())
      throw new ApiError(
        404,
        "Not Found: runtime LoRA loading needs --enable-lora and VLLM_ALLOW_RUNTIME_LORA_UPDATING=True",
        null,
        "NotFoundError",
      );
    return this.lora;
  }

  private resolveModel(name: string | undefined): string {
    if (name === undefined) return this.opts.servedModelNames[0]!;
    if (this.opts.servedModelNames.includes(name)) return name;
    if (this.lora?.get(name) !== undefined) return name;
    throw new ApiError(404, `The model \`${name}\` does not exist.`, "model", "NotFoundError");
  }

  private async dispatch(req: IncomingMessage, res: ServerResponse): Promise<void> {
    try {
      const path = (req.url ?? "/").split("?")[0]!;
      const methods = this.routes[path];
      if (!methods) throw new ApiError(404, `Not Found: ${path}`, null, "NotFoundError");
      const route = methods[req.method ?? ""];
      if (!route) {
        res.setHeader("allow", Object.keys(methods).join(", "));
        throw new ApiError(405, `Method Not Allowed: ${req.method} ${path}`);
      }
      await route(req, res);
    } catch (err) {
      if (!(err instanceof ApiError))
        this.opts.log(`sim-replica: handler error: ${(err as Error)?.stack ?? err}`);
      if (res.headersSent) {
        if (!res.writableEnded) res.end();
      } else {
        sendError(res, err);
      }
    }
  }

  /** Reads a JSON object body within the size limit; beyond it, 413 and the connection closes. */
  private body(req: IncomingMessage, res: ServerResponse): Promise<Record<string, unknown>> {
    const limit = this.opts.maxRequestBodyBytes;
    const tooLarge = () => {
      res.setHeader("connection", "close");
      return new ApiError(
        413,
        `Request body exceeds the limit of ${limit} bytes`,
        null,
        "RequestEntityTooLargeError",
      );
    };
    return new Promise((resolve, reject) => {
      if (Number(req.headers["content-length"]) > limit) {
        req.resume();
        reject(tooLarge());
        return;
      }
      const chunks: Buffer[] = [];
      let size = 0;
      let settled = false;
      req.on("data", (c: Buffer) => {
        if (settled) return;
        size += c.length;
        if (size > limit) {
          settled = true;
          chunks.length = 0;
          reject(tooLarge());
          return;
        }
        chunks.push(c);
      });
      req.on("end", () => {
        if (settled) return;
        settled = true;
        try {
          resolve(parseJsonObject(Buffer.concat(chunks).toString("utf8")));
        } catch (err) {
          reject(err);
        }
      });
      const gone = (err?: Error) => {
        if (!settled)
          reject(err ?? new ApiError(400, "Client closed the connection before sending the whole body"));
        settled = true;
      };
      req.on("error", gone);
      req.on("close", () => gone());
    });
  }

  private empty(res: ServerResponse): void {
    res.writeHead(200, { "content-length": 0 });
    res.end();
  }

  private async serveMetrics(res: ServerResponse): Promise<void> {
    const fault = this.opts.faults.metrics;
    if (fault === "stall") return; // never answered; the socket is destroyed on close()
    this.offloadMetrics?.refresh();
    const text = fault === "garbled" ? GARBLED_METRICS : await this.metrics.render();
    const data = Buffer.from(text);
    res.writeHead(200, { "content-type": METRICS_CONTENT_TYPE, "content-length": data.length });
    res.end(data);
  }

  private tokenize(body: Record<string, unknown>, res: ServerResponse): void {
    const p = parseTokenizeRequest(body);
    this.resolveModel(p.model);
    const tok = this.opts.tokenizer;
    const text =
      p.kind === "chat"
        ? tok.applyChatTemplate(p.messages, { addGenerationPrompt: p.addGenerationPrompt })
        : p.prompt;
    const tokens = tok.encode(text, p.addSpecialTokens);
    sendJson(res, 200, {
      count: tokens.length,
      max_model_len: this.opts.maxModelLen,
      tokens,
      token_strs: p.returnTokenStrs ? tokens.map((t) => tok.decode([t])) : null,
    });
  }

  private detokenize(body: Record<string, unknown>, res: ServerResponse): void {
    const p = parseDetokenizeRequest(body);
    this.resolveModel(p.model);
    const vocab = this.opts.tokenizer.vocabSize;
    const badId = p.tokens.find((t) => t >= vocab);
    if (badId !== undefined)
      throw new ApiError(400, `Token id ${badId} is out of vocabulary (vocab size ${vocab})`, "tokens");
    sendJson(res, 200, { prompt: this.opts.tokenizer.decode(p.tokens) });
  }

  /** In-process stand-in for a dying replica: every connection is cut and the listener stops. */
  crash(): void {
    this.driver.close();
    this.server.close();
    for (const s of this.sockets) s.destroy();
    void this.publisher?.close();
    void this.nixl?.close();
  }

  /** Stops listening, aborts requests in flight, cuts open connections and closes the publisher. */
  close(): Promise<void> {
    this.closing ??= (async () => {
      const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
      this.driver.close();
      for (const s of this.sockets) s.destroy();
      await closed;
      await this.publisher?.close();
      await this.nixl?.close();
    })();
    return this.closing;
  }
}

/** vLLM's VLLM_ALLOW_RUNTIME_LORA_UPDATING: "true" or "1", any case (vllm/envs.py). */
function runtimeLoraUpdating(env: NodeJS.ProcessEnv = process.env): boolean {
  const v = (env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] ?? "").trim().toLowerCase();
  return v === "true" || v === "1";
}

export type { LoraAdapter };

function isResolved(s: ReplicaSettings | ReplicaOptions): s is ReplicaOptions {
  return (
    typeof (s as ReplicaOptions).profile === "object" &&
    typeof (s as ReplicaOptions).tokenizer === "object" &&
    Array.isArray((s as ReplicaOptions).servedModelNames)
  );
}

/** Starts a replica from settings (convenience for `ReplicaServer.start`). */
export function startReplica(settings: ReplicaSettings = {}): Promise<ReplicaServer> {
  return ReplicaServer.start(settings);
}
