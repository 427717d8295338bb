/**
 * A strict check of an Envoy v3 config, in the YAML/JSON form Envoy loads, against Envoy's own API
 * protos (the copy of envoyproxy/envoy `api/` that @grpc/grpc-js-xds ships under deps/envoy-api). No
 * Envoy binary can run on the build machines, so this stands in for what Envoy's loader rejects
 * before anything else: a key that is not a field of its message (by proto or JSON name), an enum
 * value that is not one of the enum's names, an `Any` whose `@type` names no known type, a Duration
 * that is not "<seconds>s", a scalar of the wrong JSON type. It does not check Envoy's semantic
 * validation (required fields, ranges); the tests assert the fields that matter one by one.
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { loadSync } from "@grpc/proto-loader";

interface FieldDesc {
  name: string;
  label: string;
  type: string;
  typeName: string;
}
interface MessageDesc {
  name: string;
  field: FieldDesc[];
  nestedType: MessageDesc[];
  enumType: EnumDesc[];
  options: { mapEntry?: boolean } | null;
}
interface EnumDesc {
  name: string;
  value: { name: string; number: number }[];
}
type Known = { kind: "message"; desc: MessageDesc } | { kind: "enum"; desc: EnumDesc };

/**
 * Enum values added upstream after the copy of the protos bundled here: FULL_DUPLEX_STREAMED (= 4)
 * is in envoyproxy/envoy api/envoy/extensions/filters/http/ext_proc/v3/processing_mode.proto since
 * Envoy 1.33, and is the only body mode llm-d's EPP supports.
 */
const NEWER_ENUM_VALUES: Record<string, string[]> = {
  "envoy.extensions.filters.http.ext_proc.v3.ProcessingMode.BodySendMode": ["FULL_DUPLEX_STREAMED"],
};

const DURATION = /^-?\d+(\.\d{1,9})?s$/;
const INT_TYPES = new Set([
  "TYPE_INT32",
  "TYPE_UINT32",
  "TYPE_SINT32",
  "TYPE_FIXED32",
  "TYPE_SFIXED32",
  "TYPE_INT64",
  "TYPE_UINT64",
  "TYPE_SINT64",
  "TYPE_FIXED64",
  "TYPE_SFIXED64",
]);
const WRAPPERS: Record<string, string> = {
  "google.protobuf.BoolValue": "TYPE_BOOL",
  "google.protobuf.StringValue": "TYPE_STRING",
  "google.protobuf.BytesValue": "TYPE_BYTES",
  "google.protobuf.DoubleValue": "TYPE_DOUBLE",
  "google.protobuf.FloatValue": "TYPE_FLOAT",
  "google.protobuf.Int32Value": "TYPE_INT32",
  "google.protobuf.UInt32Value": "TYPE_UINT32",
  "google.protobuf.Int64Value": "TYPE_INT64",
  "google.protobuf.UInt64Value": "TYPE_UINT64",
};

function protoDepsDir(): string {
  const require = createRequire(import.meta.url);
  return join(dirname(require.resolve("@grpc/grpc-js-xds/package.json")), "deps");
}

function camel(name: string): string {
  return name.replace(/_([a-z0-9])/g, (_, c: string) => c.toUpperCase());
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export class EnvoyProtos {
  readonly #types = new Map<string, Known>();

  /** Loads the given files (paths under envoy-api, e.g. "envoy/config/bootstrap/v3/bootstrap.proto"). */
  constructor(files: string[]) {
    const deps = protoDepsDir();
    const pkg = loadSync(files, {
      keepCase: true,
      includeDirs: ["envoy-api", "xds", "googleapis", "protoc-gen-validate"].map((d) => join(deps, d)),
    });
    for (const [fullName, def] of Object.entries(pkg)) {
      const d = def as { format?: string; type?: unknown };
      if (d.format === "Protocol Buffer 3 DescriptorProto") this.#addMessage(fullName, d.type as MessageDesc);
      else if (d.format === "Protocol Buffer 3 EnumDescriptorProto")
        this.#types.set(fullName, { kind: "enum", desc: d.type as EnumDesc });
    }
  }

  #addMessage(fullName: string, desc: MessageDesc): void {
    this.#types.set(fullName, { kind: "message", desc });
    for (const n of desc.nestedType) this.#addMessage(`${fullName}.${n.name}`, n);
    for (const e of desc.enumType) this.#types.set(`${fullName}.${e.name}`, { kind: "enum", desc: e });
  }

  has(fullName: string): boolean {
    return this.#types.has(fullName);
  }

  /** Resolves a type reference as protoc does: from the referring message's scope outwards. */
  #resolve(scope: string, ref: string): string | null {
    if (ref.startsWith(".")) return this.#types.has(ref.slice(1)) ? ref.slice(1) : null;
    const parts = scope.split(".");
    for (let i = parts.length; i >= 0; i--) {
      const candidate = [...parts.slice(0, i), ref].join(".");
      if (this.#types.has(candidate)) return candidate;
    }
    return null;
  }

  /** Every problem found in `value` read as the message `typeName`, each with its path. */
  check(value: unknown, typeName: string, path = "$"): string[] {
    const problems: string[] = [];
    this.#checkMessage(value, typeName, path, problems);
    return problems;
  }

  #checkMessage(value: unknown, typeName: string, path: string, out: string[]): void {
    const wrapped = WRAPPERS[typeName];
    if (wrapped !== undefined) {
      this.#checkScalar(value, wrapped, path, out);
      return;
    }
    switch (typeName) {
      case "google.protobuf.Duration":
        if (typeof value !== "string" || !DURATION.test(value))
          out.push(`${path}: a Duration is written "<seconds>s" (e.g. "10s"), got ${JSON.stringify(value)}`);
        return;
      case "google.protobuf.Struct":
        if (!isObject(value)) out.push(`${path}: a Struct must be an object`);
        return;
      case "google.protobuf.Value":
      case "google.protobuf.ListValue":
        return;
      case "google.protobuf.Any":
        this.#checkAny(value, path, out);
        return;
    }
    const known = this.#types.get(typeName);
    if (known === undefined || known.kind !== "message") {
      out.push(`${path}: type ${typeName} is not loaded (add its .proto to the list)`);
      return;
    }
    if (!isObject(value)) {
      out.push(`${path}: ${typeName} must be an object, got ${JSON.stringify(value)}`);
      return;
    }
    const fields = new Map<string, FieldDesc>();
    for (const f of known.desc.field) {
      fields.set(f.name, f);
      fields.set(camel(f.name), f);
    }
    for (const [key, v] of Object.entries(value)) {
      const f = fields.get(key);
      if (f === undefined) {
        out.push(`${path}.${key}: ${typeName} has no field "${key}"`);
        continue;
      }
      this.#checkField(v, f, typeName, `${path}.${key}`, out);
    }
  }

  #checkField(value: unknown, f: FieldDesc, scope: string, path: string, out: string[]): void {
    const ref = f.typeName === "" ? null : this.#resolve(scope, f.typeName);
    if (f.typeName !== "" && ref === null) {
      out.push(`${path}: cannot resolve type ${f.typeName} from ${scope}`);
      return;
    }
    const entry = ref === null ? undefined : this.#types.get(ref);
    if (f.label === "LABEL_REPEATED" && entry?.kind === "message" && entry.desc.options?.mapEntry === true) {
      if (!isObject(value)) {
        out.push(`${path}: a map must be an object`);
        return;
      }
      const valueField = entry.desc.field.find((x) => x.name === "value");
      if (valueField === undefined) return;
      for (const [k, v] of Object.entries(value)) this.#checkField(v, valueField, ref!, `${path}.${k}`, out);
      return;
    }
    if (f.label === "LABEL_REPEATED") {
      if (!Array.isArray(value)) {
        out.push(`${path}: a repeated field must be a list`);
        return;
      }
      for (const [i, v] of value.entries()) this.#checkOne(v, f, ref, `${path}[${i}]`, out);
      return;
    }
    this.#checkOne(value, f, ref, path, out);
  }

  #checkOne(value: unknown, f: FieldDesc, ref: string | null, path: string, out: string[]): void {
    if (f.type === "TYPE_MESSAGE") this.#checkMessage(value, ref!, path, out);
    else if (f.type === "TYPE_ENUM") this.#checkEnum(value, ref!, path, out);
    else this.#checkScalar(value, f.type, path, out);
  }

  #checkEnum(value: unknown, enumName: string, path: string, out: string[]): void {
    const known = this.#types.get(enumName);
    if (known === undefined || known.kind !== "enum") {
      out.push(`${path}: enum ${enumName} is not loaded`);
      return;
    }
    const names = [...known.desc.value.map((v) => v.name), ...(NEWER_ENUM_VALUES[enumName] ?? [])];
    if (typeof value === "number" && known.desc.value.some((v) => v.number === value)) return;
    if (typeof value !== "string" || !names.includes(value))
      out.push(`${path}: ${JSON.stringify(value)} is not a value of ${enumName} (${names.join(", ")})`);
  }

  #checkScalar(value: unknown, type: string, path: string, out: string[]): void {
    const ok =
      type === "TYPE_STRING" || type === "TYPE_BYTES"
        ? typeof value === "string"
        : type === "TYPE_BOOL"
          ? typeof value === "boolean"
          : INT_TYPES.has(type)
            ? (typeof value === "number" && Number.isInteger(value)) ||
              (typeof value === "string" && /^-?\d+$/.test(value))
            : typeof value === "number";
    if (!ok) out.push(`${path}: ${JSON.stringify(value)} is not a valid ${type.slice(5).toLowerCase()}`);
  }

  #checkAny(value: unknown, path: string, out: string[]): void {
    if (!isObject(value) || typeof value["@type"] !== "string") {
      out.push(`${path}: an Any needs "@type": type.googleapis.com/<message>`);
      return;
    }
    const url = value["@type"];
    const prefix = "type.googleapis.com/";
    if (!url.startsWith(prefix)) {
      out.push(`${path}.@type: ${url} does not start with ${prefix}`);
      return;
    }
    const typeName = url.slice(prefix.length);
    if (!this.#types.has(typeName)) {
      out.push(`${path}.@type: ${typeName} is not a known message (misspelt, or its .proto is not loaded)`);
      return;
    }
    const { "@type": _, ...rest } = value;
    this.#checkMessage(rest, typeName, path, out);
  }
}
