/**
 * Keeps the links between the repository's Markdown documents honest: every
 * relative link in README.md and docs/ (decision records included) names a
 * file that exists and, for a `#fragment` into a Markdown file, a heading
 * that file has (GitHub's anchor rules). Links inside code blocks and to
 * other sites are not checked.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

function markdownFiles(dir: string): string[] {
  return readdirSync(dir, { withFileTypes: true }).flatMap((entry) => {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) return markdownFiles(path);
    return entry.name.endsWith(".md") ? [path] : [];
  });
}

/** The text outside fenced code blocks and inline code. */
function prose(markdown: string): string {
  return markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "").replace(/`[^`\n]*`/g, "");
}

/** GitHub's anchor of a heading: lowercase, punctuation dropped, spaces to dashes. */
function anchor(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/[^\p{L}\p{N} _-]/gu, "")
    .replace(/ /g, "-");
}

function anchorsOf(file: string): Set<string> {
  const text = readFileSync(file, "utf8").replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, "");
  const seen = new Map<string, number>();
  const anchors = new Set<string>();
  for (const [, heading] of text.matchAll(/^#{1,6} +(.+?) *#* *$/gm)) {
    const base = anchor(heading ?? "");
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    anchors.add(n === 0 ? base : `${base}-${n}`);
  }
  return anchors;
}

const FILES = [join(ROOT, "README.md"), ...markdownFiles(join(ROOT, "docs"))];

describe("links between the Markdown documents", () => {
  it("finds the documents, the decision records among them", () => {
    expect(FILES.map((f) => relative(ROOT, f))).toContain("docs/decisions/README.md");
  });

  for (const file of FILES) {
    it(`${relative(ROOT, file)}: every relative link resolves`, () => {
      const broken: string[] = [];
      for (const [, target] of prose(readFileSync(file, "utf8")).matchAll(/\]\(([^)\s]+)(?: "[^"]*")?\)/g)) {
        if (target === undefined || /^[a-z][a-z0-9+.-]*:/i.test(target)) continue;
        const [path = "", fragment] = target.split("#", 2);
        const resolved = path === "" ? file : resolve(dirname(file), decodeURI(path));
        if (!existsSync(resolved)) {
          broken.push(`${target}: no such file`);
          continue;
        }
        if (fragment !== undefined && resolved.endsWith(".md") && statSync(resolved).isFile()) {
          if (!anchorsOf(resolved).has(fragment)) broken.push(`${target}: no such heading`);
        }
      }
      expect(broken).toEqual([]);
    });
  }
});
