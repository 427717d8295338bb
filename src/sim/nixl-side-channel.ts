/**
 * The simulated NIXL side channel between a decoder (consumer) and a prefiller (producer): a real TCP
 * connection carrying newline-delimited JSON, one object per line. It stands in for vLLM's ZMQ
 * handshake at remote_host:remote_port plus the NIXL READ and notifications that follow.
 *
 * Consumer → producer, each with a `seq` the reply echoes:
 *   {"type":"handshake","seq","engine_id"}                        → {"type":"handshake","seq","engine_id"}
 *   {"type":"read","seq","remote_engine_id","remote_request_id","block_ids":[...]}
 *                                         → {"type":"read","seq","status":"ok"|"expired"|"unknown"|"wrong_engine"}
 *   {"type":"done","seq","remote_request_id"}       (read complete)  → {"type":"done","seq","released":bool}
 *   {"type":"release","seq","remote_request_id"}    (consumer abort) → {"type":"release","seq","released":bool}
 * and without a reply: {"type":"heartbeat","remote_request_ids":[...]} (lease renewal).
 * A malformed line is answered {"type":"error","message"} and the connection closed; nothing a peer
 * sends can take the process down.
 */
import { createConnection, createServer, type Server, type Socket } from "node:net";

/** What the producer answers to a read. */
export type ReadStatus = "ok" | "expired" | "unknown" | "wrong_engine";

/** The producer's side: the replica's answers, called from socket events. */
export interface SideChannelHandlers {
  engineId: string;
  read(requestId: string, blockIds: number[]): ReadStatus;
  /** Frees the blocks held for `requestId`; `why` says who asked. */
  release(requestId: string, why: "read" | "abort"): boolean;
  heartbeat(requestIds: string[]): void;
  log(line: string): void;
}

/** Longest line either side accepts. */
const MAX_LINE = 1 << 20;

type Msg = Record<string, unknown>;

/** Splits a socket's data into JSON lines; calls `onMsg` per object, `onBad` once on garbage. */
function readLines(sock: Socket, onMsg: (m: Msg) => void, onBad: (why: string) => void): void {
  let buf = "";
  sock.setEncoding("utf8");
  sock.on("data", (chunk: string) => {
    buf += chunk;
    if (buf.length > MAX_LINE && !buf.includes("\n")) {
      buf = "";
      onBad(`line longer than ${MAX_LINE} bytes`);
      return;
    }
    for (let nl = buf.indexOf("\n"); nl >= 0; nl = buf.indexOf("\n")) {
      const line = buf.slice(0, nl).trim();
      buf = buf.slice(nl + 1);
      if (line === "") continue;
      let m: unknown;
      try {
        m = JSON.parse(line);
      } catch {
        onBad("not JSON");
        return;
      }
      if (typeof m !== "object" || m === null || Array.isArray(m)) {
        onBad("not a JSON object");
        return;
      }
      onMsg(m as Msg);
    }
  });
}

const send = (sock: Socket, m: Msg) => {
  if (!sock.destroyed && sock.writable) sock.write(`${JSON.stringify(m)}\n`);
};

const isIdList = (v: unknown): v is number[] => Array.isArray(v) && v.every((x) => Number.isInteger(x));

/** The producer's listening side channel. */
export class SideChannelServer {
  private readonly sockets = new Set<Socket>();
  private constructor(
    private readonly server: Server,
    private readonly h: SideChannelHandlers,
  ) {
    server.on("connection", (s) => this.accept(s));
  }

  /** Listens on host:port (0 = any free port). */
  static async listen(host: string, port: number, h: SideChannelHandlers): Promise<SideChannelServer> {
    const server = createServer();
    const sc = new SideChannelServer(server, h);
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    return sc;
  }

  get port(): number {
    const a = this.server.address();
    return typeof a === "object" && a !== null ? a.port : 0;
  }

  private accept(sock: Socket): void {
    this.sockets.add(sock);
    sock.on("close", () => this.sockets.delete(sock));
    sock.on("error", () => sock.destroy());
    const bad = (why: string) => {
      send(sock, {
        type: "error",
        message: `kvgate NIXL side channel: ${why}; send one JSON object per line (handshake, read, done, release, heartbeat)`,
      });
      sock.end();
    };
    readLines(sock, (m) => this.handle(sock, m, bad), bad);
  }

  private handle(sock: Socket, m: Msg, bad: (why: string) => void): void {
    const seq = m["seq"];
    const id = m["remote_request_id"];
    try {
      switch (m["type"]) {
        case "handshake":
          send(sock, { type: "handshake", seq, engine_id: this.h.engineId });
          return;
        case "read": {
          if (typeof id !== "string" || !isIdList(m["block_ids"])) {
            bad("read needs remote_request_id (string) and block_ids (integers)");
            return;
          }
          const status: ReadStatus =
            m["remote_engine_id"] !== this.h.engineId ? "wrong_engine" : this.h.read(id, m["block_ids"]);
          send(sock, { type: "read", seq, status });
          return;
        }
        case "done":
        case "release": {
          if (typeof id !== "string") {
            bad(`${m["type"]} needs remote_request_id (string)`);
            return;
          }
          const released = this.h.release(id, m["type"] === "done" ? "read" : "abort");
          send(sock, { type: m["type"], seq, released });
          return;
        }
        case "heartbeat": {
          const ids = m["remote_request_ids"];
          if (!Array.isArray(ids) || !ids.every((x) => typeof x === "string")) {
            bad("heartbeat needs remote_request_ids (strings)");
            return;
          }
          this.h.heartbeat(ids);
          return;
        }
        default:
          bad(`unknown message type ${JSON.stringify(m["type"])}`);
      }
    } catch (err) {
      this.h.log(`sim-replica: NIXL side channel handler failed: ${(err as Error)?.stack ?? err}`);
      bad("internal error");
    }
  }

  close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    for (const s of this.sockets) s.destroy();
    return closed;
  }
}

/** A consumer's connection to one producer's side channel; connects on first use. */
export class SideChannelClient {
  private sock: Socket | null = null;
  private connecting: Promise<Socket> | null = null;
  private seq = 0;
  private readonly waiting = new Map<number, { resolve: (m: Msg) => void; reject: (e: Error) => void }>();
  /** The producer's engine id once a handshake succeeded on the current connection. */
  peerEngineId: string | null = null;

  constructor(
    readonly host: string,
    readonly port: number,
    private readonly timeoutMs = 10_000,
  ) {}

  get address(): string {
    return `${this.host.includes(":") ? `[${this.host}]` : this.host}:${this.port}`;
  }

  /** True while connected. */
  get alive(): boolean {
    return this.sock !== null && !this.sock.destroyed;
  }

  private connect(): Promise<Socket> {
    if (this.alive) return Promise.resolve(this.sock!);
    this.connecting ??= new Promise<Socket>((resolve, reject) => {
      const s = createConnection({ host: this.host, port: this.port });
      const fail = (err: Error) => {
        this.connecting = null;
        reject(new Error(`cannot reach the prefiller's side channel at ${this.address}: ${err.message}`));
      };
      s.once("error", fail);
      s.setTimeout(this.timeoutMs, () => s.destroy(new Error("connect timed out")));
      s.once("connect", () => {
        s.off("error", fail);
        s.setTimeout(0);
        this.sock = s;
        this.connecting = null;
        this.peerEngineId = null;
        s.on("error", () => s.destroy());
        s.on("close", () => this.dropped(s));
        readLines(
          s,
          (m) => {
            const w = this.waiting.get(m["seq"] as number);
            if (w === undefined) return;
            this.waiting.delete(m["seq"] as number);
            w.resolve(m);
          },
          () => s.destroy(),
        );
        resolve(s);
      });
    });
    return this.connecting;
  }

  private dropped(s: Socket): void {
    if (this.sock === s) {
      this.sock = null;
      this.peerEngineId = null;
    }
    const err = new Error(`the prefiller's side channel at ${this.address} closed the connection`);
    for (const w of this.waiting.values()) w.reject(err);
    this.waiting.clear();
  }

  /** Sends `m` and resolves with the reply of the same seq; rejects if the connection drops. */
  async request(m: Msg): Promise<Msg> {
    const s = await this.connect();
    const seq = ++this.seq;
    return new Promise<Msg>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.waiting.delete(seq);
        reject(
          new Error(`the prefiller's side channel at ${this.address} did not answer in ${this.timeoutMs} ms`),
        );
      }, this.timeoutMs);
      this.waiting.set(seq, {
        resolve: (r) => {
          clearTimeout(timer);
          resolve(r);
        },
        reject: (e) => {
          clearTimeout(timer);
          reject(e);
        },
      });
      send(s, { ...m, seq });
    });
  }

  /** Sends `m` without waiting for a reply, if connected (heartbeats). */
  notify(m: Msg): void {
    if (this.alive) send(this.sock!, m);
  }

  close(): void {
    this.sock?.destroy();
    this.sock = null;
  }
}
