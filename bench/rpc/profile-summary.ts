/**
 * Summarizes a V8 `.cpuprofile` (from `node --cpu-prof`, e.g. written by
 * `npm run bench:rpc -- --cpu-prof DIR`): the functions with the most self
 * time and the most total time (self plus callees; a function that is on the
 * stack more than once per sample counts once), and the self time per
 * package or file group.
 *
 *   npx tsx bench/rpc/profile-summary.ts FILE.cpuprofile [--top 25] [--match TEXT]
 *
 * `--match TEXT` limits the total-time table to functions whose name or file
 * contains TEXT.
 */
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";

interface ProfileNode {
  id: number;
  callFrame: { functionName: string; url: string; lineNumber: number };
  children?: number[];
}
interface Profile {
  nodes: ProfileNode[];
  samples: number[];
  timeDeltas: number[];
  startTime: number;
  endTime: number;
}

const { values, positionals } = parseArgs({
  allowPositionals: true,
  options: { top: { type: "string", default: "25" }, match: { type: "string" } },
});
const top = Number(values.top);
const file = positionals[0];
if (!file) {
  console.error("usage: profile-summary.ts FILE.cpuprofile [--top N] [--match TEXT]");
  process.exit(2);
}
const profile = JSON.parse(readFileSync(file, "utf8")) as Profile;

const byId = new Map(profile.nodes.map((n) => [n.id, n]));
const parent = new Map<number, number>();
for (const n of profile.nodes) for (const c of n.children ?? []) parent.set(c, n.id);

/** Short location: the package name (node_modules/...) or the path from server/, sdk/, bench/. */
function where(url: string): string {
  if (url === "") return "";
  const nm = url.lastIndexOf("node_modules/");
  if (nm >= 0) {
    const rest = url.slice(nm + "node_modules/".length).split("/");
    const pkg = rest[0]?.startsWith("@") ? `${rest[0]}/${rest[1]}` : (rest[0] ?? "");
    return `${pkg}/${rest.at(-1)}`;
  }
  const m = /\/(server|sdk|bench)\/.*$/.exec(url);
  if (m) return m[0].slice(1);
  return url.replace(/^file:\/\//, "").replace(/^node:/, "node:");
}
function group(url: string): string {
  if (url === "") return "(native/V8)";
  if (url.startsWith("node:")) return url.split("/").slice(0, 2).join("/");
  const nm = url.lastIndexOf("node_modules/");
  if (nm >= 0) {
    const rest = url.slice(nm + "node_modules/".length).split("/");
    return rest[0]?.startsWith("@") ? `${rest[0]}/${rest[1]}` : (rest[0] ?? "");
  }
  const m = /\/(server|sdk|bench)\/src\/([^/]+)/.exec(url);
  return m ? `casq ${m[1]}/${m[2]}` : url;
}
const key = (n: ProfileNode) =>
  `${n.callFrame.functionName || "(anonymous)"}  ${where(n.callFrame.url)}:${n.callFrame.lineNumber + 1}`;

const self = new Map<string, number>();
const total = new Map<string, number>();
const groups = new Map<string, number>();
let all = 0;
let idle = 0;
for (let i = 0; i < profile.samples.length; i += 1) {
  const dt = profile.timeDeltas[i] ?? 0;
  const node = byId.get(profile.samples[i] as number);
  if (!node) continue;
  all += dt;
  if (node.callFrame.functionName === "(idle)") {
    idle += dt;
    continue;
  }
  self.set(key(node), (self.get(key(node)) ?? 0) + dt);
  groups.set(group(node.callFrame.url), (groups.get(group(node.callFrame.url)) ?? 0) + dt);
  const seen = new Set<string>();
  for (let id: number | undefined = node.id; id !== undefined; id = parent.get(id)) {
    const k = key(byId.get(id) as ProfileNode);
    if (seen.has(k)) continue;
    seen.add(k);
    total.set(k, (total.get(k) ?? 0) + dt);
  }
}
const busy = all - idle;
const ms = (us: number) =>
  `${(us / 1000).toFixed(0).padStart(7)} ms ${((100 * us) / busy).toFixed(1).padStart(5)}%`;
const print = (title: string, m: Map<string, number>, filter?: (k: string) => boolean) => {
  console.log(`\n${title}`);
  for (const [k, v] of [...m]
    .filter(([k]) => !filter || filter(k))
    .sort((a, b) => b[1] - a[1])
    .slice(0, top))
    console.log(`${ms(v)}  ${k}`);
};
console.log(
  `${file}: ${(all / 1000).toFixed(0)} ms sampled, ${(busy / 1000).toFixed(0)} ms busy (percentages of busy)`,
);
print("self time by package / area", groups);
print("self time", self);
const match = values.match;
print("total time", total, (k) => !k.startsWith("(root)") && (match === undefined || k.includes(match)));
