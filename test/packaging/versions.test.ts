/**
 * One version for every artifact: the repository's VERSION file. Each manifest
 * repeats it (npm and Python tools read their own manifest), and this test
 * fails naming every one that differs, including the dependencies on
 * @casq/sdk and @casq/api and the workspace entries of package-lock.json.
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { expect, test } from "vitest";
import { ROOT } from "./support.ts";

const read = (path: string) => readFileSync(join(ROOT, path), "utf8");
const json = (path: string) => JSON.parse(read(path));

test("every package carries the version in VERSION", () => {
  const version = read("VERSION").trim();
  expect(version).toMatch(/^\d+\.\d+\.\d+(-[0-9A-Za-z.-]+)?$/);
  const lock = json("package-lock.json").packages;
  const found = {
    "server/package.json version": json("server/package.json").version,
    "server/package.json dependency @casq/sdk": json("server/package.json").dependencies["@casq/sdk"],
    "server/package.json dependency @casq/api": json("server/package.json").dependencies["@casq/api"],
    "sdk/ts/package.json version": json("sdk/ts/package.json").version,
    "sdk/ts/package.json dependency @casq/api": json("sdk/ts/package.json").dependencies["@casq/api"],
    "api/ts/package.json version": json("api/ts/package.json").version,
    "package-lock.json server": lock.server.version,
    "package-lock.json sdk/ts": lock["sdk/ts"].version,
    "package-lock.json api/ts": lock["api/ts"].version,
    "sdk/python/pyproject.toml version": /^version = "([^"]+)"$/m.exec(
      read("sdk/python/pyproject.toml"),
    )?.[1],
  };
  expect(found).toEqual(Object.fromEntries(Object.keys(found).map((where) => [where, version])));
});
