/**
 * An in-process fake Kubernetes API server (node:http) for the discovery tests. No real API server
 * can run on the machines kvgate is built on (no kube-apiserver package, no container engine for
 * kind/k3s), so this speaks the parts of the real protocol the client uses: namespaced collections
 * under `/api/v1/...` and `/apis/<group>/<version>/...`; GET list answering `kind: <Kind>List` with
 * metadata.resourceVersion; `?watch=true&resourceVersion=N` streaming newline-delimited JSON events
 * (ADDED / MODIFIED / DELETED / BOOKMARK / ERROR) in a chunked response, replayed from N, with a
 * `Status` 410 Expired ERROR event when N was compacted away; fieldSelector (metadata.name,
 * metadata.namespace) and equality labelSelector filtering, with objects that stop or start
 * matching a label selector sent as DELETED / ADDED as the real watch cache does; GET / POST / PUT
 * / DELETE of single objects with resourceVersion conflicts (409) for the Lease. Collections can
 * be made absent (404, a CRD not installed) or forbidden (403, RBAC), and watches can be ended, broken or fed raw lines.
 */
import { once } from "node:events";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { KubeConfig } from "@kubernetes/client-node";

type Obj = Record<string, unknown> & { metadata: Record<string, unknown> };
interface HistoryEntry {
  rv: number;
  type: "ADDED" | "MODIFIED" | "DELETED";
  obj: Obj;
  old: Obj | null;
}
interface Collection {
  kind: string;
  apiVersion: string;
  objects: Map<string, Obj>;
  history: HistoryEntry[];
  /** History up to here is gone: watches from a version below it get 410. */
  compactedRv: number;
}
interface OpenWatch {
  collection: string;
  res: ServerResponse;
  matches: (o: Obj) => boolean;
  bookmarks: boolean;
}

export const podsPath = (ns: string) => `/api/v1/namespaces/${ns}/pods`;
export const crdPath = (group: string, version: string, ns: string, plural: string) =>
  `/apis/${group}/${version}/namespaces/${ns}/${plural}`;

const KINDS: Record<string, string> = {
  pods: "Pod",
  inferencepools: "InferencePool",
  inferenceobjectives: "InferenceObjective",
  inferencemodelrewrites: "InferenceModelRewrite",
  leases: "Lease",
};

const ROUTE = /^(\/api\/v1|\/apis\/[^/]+\/[^/]+)\/namespaces\/([^/]+)\/([^/]+)(?:\/([^/]+))?$/;

function status(code: number, reason: string, message: string) {
  return { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message, reason, code };
}

const clone = (o: Obj): Obj => structuredClone(o);

/** Equality-based label selectors: `a=b`, `a==b`, `a!=b`, `a`, `!a`, comma-separated. */
export function labelSelectorMatches(selector: string, labels: Record<string, string>): boolean {
  for (const term of selector
    .split(",")
    .map((s) => s.trim())
    .filter(Boolean)) {
    let m: RegExpMatchArray | null;
    if ((m = term.match(/^([^!=]+)!=(.*)$/))) {
      if (labels[m[1]] === m[2]) return false;
    } else if ((m = term.match(/^([^!=]+)==?(.*)$/))) {
      if (labels[m[1]] !== m[2]) return false;
    } else if (term.startsWith("!")) {
      if (term.slice(1) in labels) return false;
    } else if (!(term in labels)) return false;
  }
  return true;
}

function fieldSelectorMatches(selector: string, o: Obj): boolean {
  for (const term of selector.split(",").filter(Boolean)) {
    const [k, v] = term.split("=");
    const actual =
      k === "metadata.name" ? o.metadata.name : k === "metadata.namespace" ? o.metadata.namespace : undefined;
    if (actual !== v) return false;
  }
  return true;
}

export class FakeKubeApi {
  readonly #server: Server;
  readonly url: string;
  #rv = 100;
  readonly #collections = new Map<string, Collection>();
  readonly #absent = new Set<string>();
  readonly #forbidden = new Set<string>();
  readonly #watches = new Set<OpenWatch>();
  /** Every request, for assertions on what the client asked for. */
  readonly requests: Array<{ method: string; path: string; query: URLSearchParams; authorization?: string }> =
    [];

  private constructor(server: Server) {
    this.#server = server;
    this.url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  }

  static async start(): Promise<FakeKubeApi> {
    let api: FakeKubeApi | null = null;
    const server = createServer((req, res) => api?.handle(req, res));
    server.listen(0, "127.0.0.1");
    await once(server, "listening");
    api = new FakeKubeApi(server);
    return api;
  }

  /** A client-node KubeConfig pointed at this server. */
  kubeConfig(): KubeConfig {
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: "fake", server: this.url, skipTLSVerify: true }],
      users: [{ name: "fake" }],
      contexts: [{ name: "fake", cluster: "fake", user: "fake", namespace: "default" }],
      currentContext: "fake",
    });
    return kc;
  }

  get resourceVersion(): number {
    return this.#rv;
  }

  #collection(path: string): Collection {
    let c = this.#collections.get(path);
    if (!c) {
      const m = path.match(ROUTE);
      if (!m) throw new Error(`fake-kube-api: not a collection path: ${path}`);
      const apiVersion = m[1] === "/api/v1" ? "v1" : m[1].slice("/apis/".length);
      c = { kind: KINDS[m[3]] ?? "Object", apiVersion, objects: new Map(), history: [], compactedRv: 0 };
      this.#collections.set(path, c);
    }
    return c;
  }

  /** Creates or replaces an object (ADDED / MODIFIED), stamping a new resourceVersion. */
  apply(path: string, obj: Record<string, unknown>): Obj {
    const c = this.#collection(path);
    const o = structuredClone(obj) as Obj;
    o.metadata = { ...(o.metadata ?? {}) };
    const name = String(o.metadata.name);
    const old = c.objects.get(name) ?? null;
    o.apiVersion ??= c.apiVersion;
    o.kind ??= c.kind;
    o.metadata.namespace ??= path.match(ROUTE)?.[2];
    o.metadata.uid ??= old?.metadata.uid ?? `uid-${name}-${this.#rv}`;
    o.metadata.creationTimestamp ??=
      old?.metadata.creationTimestamp ?? new Date(1_700_000_000_000).toISOString();
    o.metadata.resourceVersion = String(++this.#rv);
    c.objects.set(name, o);
    this.#record(path, c, { rv: this.#rv, type: old ? "MODIFIED" : "ADDED", obj: o, old });
    return clone(o);
  }

  /** Deletes an object (DELETED with a new resourceVersion); false if there was none. */
  remove(path: string, name: string): boolean {
    const c = this.#collection(path);
    const old = c.objects.get(name);
    if (!old) return false;
    c.objects.delete(name);
    const o = clone(old);
    o.metadata.resourceVersion = String(++this.#rv);
    this.#record(path, c, { rv: this.#rv, type: "DELETED", obj: o, old });
    return true;
  }

  get(path: string, name: string): Obj | undefined {
    const o = this.#collection(path).objects.get(name);
    return o && clone(o);
  }

  /** 404 for everything under the collection (a CRD that is not installed), or served again. */
  setAbsent(path: string, absent: boolean): void {
    if (absent) this.#absent.add(path);
    else this.#absent.delete(path);
  }

  /** 403 for everything under the collection (RBAC does not grant it), or allowed again. */
  setForbidden(path: string, forbidden: boolean): void {
    if (forbidden) this.#forbidden.add(path);
    else this.#forbidden.delete(path);
  }

  /** A BOOKMARK with the current resourceVersion to every watch that asked for bookmarks. */
  bookmark(): void {
    for (const w of this.#watches)
      if (w.bookmarks) {
        const c = this.#collection(w.collection);
        this.#send(w.res, "BOOKMARK", {
          kind: c.kind,
          apiVersion: c.apiVersion,
          metadata: { resourceVersion: String(this.#rv) },
        });
      }
  }

  /**
   * Compacts the collection's history (as etcd does): open watches get an ERROR 410 and end; a
   * watch from an older resourceVersion gets the same until the client lists again.
   */
  expire(path: string): void {
    const c = this.#collection(path);
    c.compactedRv = this.#rv;
    c.history = [];
    for (const w of [...this.#watches])
      if (w.collection === path) {
        this.#send(
          w.res,
          "ERROR",
          status(410, "Expired", `too old resource version: compacted to ${this.#rv}`),
        );
        this.#end(w);
      }
  }

  /** Ends every open watch normally (as the server does at timeoutSeconds). */
  endWatches(): void {
    for (const w of [...this.#watches]) this.#end(w);
  }

  /** Cuts every open watch's connection mid-stream. */
  breakWatches(): void {
    for (const w of [...this.#watches]) {
      this.#watches.delete(w);
      w.res.socket?.destroy();
    }
  }

  /** Writes a raw line (e.g. garbage, or an event with a malformed object) to the collection's watches. */
  injectLine(path: string, line: string): void {
    for (const w of this.#watches) if (w.collection === path) w.res.write(`${line}\n`);
  }

  watchCount(path: string): number {
    return [...this.#watches].filter((w) => w.collection === path).length;
  }

  async close(): Promise<void> {
    this.breakWatches();
    this.#server.closeAllConnections();
    this.#server.close();
    await once(this.#server, "close");
  }

  #record(path: string, c: Collection, e: HistoryEntry): void {
    c.history.push(e);
    for (const w of this.#watches) if (w.collection === path) this.#deliver(w, e);
  }

  #deliver(w: OpenWatch, e: HistoryEntry): void {
    const now = w.matches(e.obj);
    const before = e.old !== null && w.matches(e.old);
    if (e.type === "DELETED") {
      if (before) this.#send(w.res, "DELETED", e.obj);
    } else if (now && (before || e.type === "ADDED")) this.#send(w.res, before ? "MODIFIED" : "ADDED", e.obj);
    else if (now) this.#send(w.res, "ADDED", e.obj);
    else if (before) this.#send(w.res, "DELETED", e.obj);
  }

  #send(res: ServerResponse, type: string, object: unknown): void {
    res.write(`${JSON.stringify({ type, object })}\n`);
  }

  #end(w: OpenWatch): void {
    this.#watches.delete(w);
    w.res.end();
  }

  handle(req: IncomingMessage, res: ServerResponse): unknown {
    const url = new URL(req.url ?? "/", this.url);
    this.requests.push({
      method: req.method ?? "GET",
      path: url.pathname,
      query: url.searchParams,
      authorization: req.headers.authorization,
    });
    const json = (code: number, body: unknown) => {
      res.writeHead(code, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    };
    const m = url.pathname.match(ROUTE);
    if (!m) return json(404, status(404, "NotFound", `the server could not find the requested resource`));
    const path = `${m[1]}/namespaces/${m[2]}/${m[3]}`;
    if (this.#absent.has(path))
      return json(404, status(404, "NotFound", "the server could not find the requested resource"));
    if (this.#forbidden.has(path))
      return json(
        403,
        status(
          403,
          "Forbidden",
          `${m[3]} is forbidden: User "system:serviceaccount:${m[2]}:default" cannot list resource "${m[3]}" in the namespace "${m[2]}"`,
        ),
      );
    const c = this.#collection(path);
    const name = m[4];
    const q = url.searchParams;
    const matches = (o: Obj) =>
      fieldSelectorMatches(q.get("fieldSelector") ?? "", o) &&
      labelSelectorMatches(q.get("labelSelector") ?? "", (o.metadata.labels as Record<string, string>) ?? {});
    if (req.method === "GET" && !name && q.get("watch") === "true")
      return this.#watch(path, c, q, matches, res);
    if (req.method === "GET" && !name)
      return json(200, {
        kind: `${c.kind}List`,
        apiVersion: c.apiVersion,
        metadata: { resourceVersion: String(this.#rv) },
        items: [...c.objects.values()].filter(matches),
      });
    if (req.method === "GET") {
      const o = c.objects.get(name);
      return o
        ? json(200, o)
        : json(404, status(404, "NotFound", `${c.kind.toLowerCase()}s "${name}" not found`));
    }
    if (req.method === "DELETE") {
      return this.remove(path, name)
        ? json(200, status(200, "", "deleted"))
        : json(404, status(404, "NotFound", `${name} not found`));
    }
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (d) => (body += d));
    req.on("end", () => {
      let o: Obj;
      try {
        o = JSON.parse(body) as Obj;
      } catch {
        return json(400, status(400, "BadRequest", "body is not JSON"));
      }
      const oname = String(o.metadata?.name ?? "");
      if (req.method === "POST" && !name) {
        if (c.objects.has(oname))
          return json(
            409,
            status(409, "AlreadyExists", `${c.kind.toLowerCase()}s "${oname}" already exists`),
          );
        delete o.metadata.resourceVersion;
        return json(201, this.apply(path, o));
      }
      if (req.method === "PUT" && name) {
        const cur = c.objects.get(name);
        if (!cur) return json(404, status(404, "NotFound", `${c.kind.toLowerCase()}s "${name}" not found`));
        if (o.metadata.resourceVersion !== cur.metadata.resourceVersion)
          return json(
            409,
            status(
              409,
              "Conflict",
              `Operation cannot be fulfilled on ${c.kind.toLowerCase()}s "${name}": the object has been modified; please apply your changes to the latest version and try again`,
            ),
          );
        return json(200, this.apply(path, o));
      }
      json(405, status(405, "MethodNotAllowed", `${req.method} not supported here`));
    });
  }

  #watch(
    path: string,
    c: Collection,
    q: URLSearchParams,
    matches: (o: Obj) => boolean,
    res: ServerResponse,
  ): void {
    res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
    res.flushHeaders();
    const w: OpenWatch = {
      collection: path,
      res,
      matches,
      bookmarks: q.get("allowWatchBookmarks") === "true",
    };
    const from = q.get("resourceVersion") ?? "";
    if (from === "" || from === "0") {
      for (const o of c.objects.values()) if (matches(o)) this.#send(res, "ADDED", o);
    } else {
      const n = Number(from);
      if (!Number.isInteger(n) || n < c.compactedRv) {
        this.#send(
          res,
          "ERROR",
          status(410, "Expired", `too old resource version: ${from} (${c.compactedRv})`),
        );
        res.end();
        return;
      }
      for (const e of c.history) if (e.rv > n) this.#deliver(w, e);
    }
    this.#watches.add(w);
    const timeout = Number(q.get("timeoutSeconds") ?? "0");
    const timer = timeout > 0 ? setTimeout(() => this.#watches.has(w) && this.#end(w), timeout * 1000) : null;
    res.on("close", () => {
      if (timer) clearTimeout(timer);
      this.#watches.delete(w);
    });
  }
}
