/**
 * Every citation in the repository must point at something a user can open: an upstream project,
 * file and version, or a URL. This fails on citations of research notes that only existed on the
 * machine kvgate was written on: a path into the shared notes folder, the word "reference" followed by a
 * section sign, or a note's file name with or without a section sign. README.md is left to its own review.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative } from "node:path";
import { test } from "node:test";

const ROOT = join(import.meta.dirname, "..");
const SECTION = "\u00a7";
const NOTES = [
  "llm-d-router-epp",
  "vllm-wire-formats",
  "simulation-benchmarks-flow-control",
  "peer-routers",
  "node-ecosystem",
  "style-anchors",
  "wave2-facts",
];
/** What counts as an unopenable citation, with the name the failure message gives it. */
const PATTERNS: Array<[string, RegExp]> = [
  ["a path into the shared notes", new RegExp(["shared", "reference"].join("\\s*/\\s*"), "i")],
  // "reference" then a section number, also when a comment wraps between the two.
  ["a reference section", new RegExp(`reference\\s*(?:(?:#|//|\\*)\\s*)*${SECTION}`, "i")],
  ["a research note's name", new RegExp(`\\b(?:${NOTES.join("|")})(?:\\.md\\b|\\s*${SECTION})`, "i")],
];

/** The repository's files: git's list when this is a checkout, else every file outside node_modules. */
function repoFiles(): string[] {
  try {
    return execFileSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" })
      .split("\0")
      .filter(Boolean);
  } catch {
    const out: string[] = [];
    const walk = (dir: string) => {
      for (const name of readdirSync(dir)) {
        if (name === "node_modules" || name === ".git") continue;
        const p = join(dir, name);
        if (statSync(p).isDirectory()) walk(p);
        else out.push(relative(ROOT, p));
      }
    };
    walk(ROOT);
    return out;
  }
}

/** The findings in one text: "file:line: what". */
function findCitations(file: string, text: string): string[] {
  const found: string[] = [];
  for (const [what, re] of PATTERNS) {
    const g = new RegExp(re.source, `${re.flags}g`);
    for (const m of text.matchAll(g)) {
      const line = text.slice(0, m.index).split("\n").length;
      found.push(`${file}:${line}: ${what} (${JSON.stringify(m[0])})`);
    }
  }
  return found;
}

test("the citation check recognises each form it forbids, and not an RFC section or a plain word", () => {
  const sample = [
    `see ${["shared", "reference"].join("/")}/x.md`,
    `(reference ${SECTION}2.5)`,
    `# kvgate's default (llm-d's shape, reference\n# ${SECTION}2.5)`,
    `(${NOTES[1]}.md ${SECTION}3)`,
    `(${NOTES[3]} ${SECTION}4.1)`,
  ];
  for (const s of sample) assert.equal(findCitations("x", s).length, 1, s);
  for (const s of [
    `Hop-by-hop headers (RFC 9110 ${SECTION}7.6.1)`,
    "the reference decoder",
    "reference-counted blocks",
  ])
    assert.deepEqual(findCitations("x", s), [], s);
});

test("no file except README.md cites notes a user cannot open", () => {
  const files = repoFiles().filter((f) => f !== "README.md" && f !== "package-lock.json");
  assert.ok(files.includes("src/cli/main.ts"), `file list looks wrong: ${files.length} files`);
  const found: string[] = [];
  for (const f of files) {
    let text: string;
    try {
      text = readFileSync(join(ROOT, f), "utf8");
    } catch {
      continue; // listed but deleted in the working tree
    }
    if (text.includes("\0")) continue; // binary
    found.push(...findCitations(f, text));
  }
  assert.deepEqual(found, [], "cite the upstream project, file and version (or a URL) instead");
});
