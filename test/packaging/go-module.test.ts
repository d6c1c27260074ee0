/**
 * The Go SDK from a module outside the repository, with the recipe of
 * docs/sdk-go.md ("Install"): `go mod init`, `go mod edit -require
 * ...@v0.0.0 -replace ...=CHECKOUT/sdk/go`, `go mod tidy`, `go build`, in a
 * directory under the system temp dir (the Go module cache is shared). The
 * program it builds enqueues a job in a real `casq serve` and prints its id.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { CASQ_BIN } from "../e2e/support/processes.ts";
import { cleanEnv, expectOk, outsideDir, ROOT, runProgram, startBroker, within } from "./support.ts";

const MODULE = "github.com/casq/casq/sdk/go";

const MAIN = `package main

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	casq "${MODULE}"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	client, err := casq.Dial(ctx, casq.Options{Brokers: []string{os.Args[1]}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	result, err := client.Producer().Enqueue(ctx, "emails", []byte("hello from an outside module"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(result.ID)
}
`;

describe("the Go SDK from a module outside the repository", () => {
  const dir = outsideDir("go-module");
  const store = outsideDir("go-store");
  afterAll(() => {
    dir.remove();
    store.remove();
  });

  test("the documented replace recipe builds a program that enqueues through the SDK", async () => {
    const doc = readFileSync(join(ROOT, "docs", "sdk-go.md"), "utf8");
    expect(doc).toContain(`-replace=${MODULE}=/path/to/casq/sdk/go`);
    const env = cleanEnv({ GOFLAGS: "-mod=mod" });
    const go = (args: string[]) => runProgram("go", args, { cwd: dir.path, env });
    expectOk("go mod init", await go(["mod", "init", "example.com/outside"]));
    expectOk(
      "go mod edit",
      await go(["mod", "edit", `-require=${MODULE}@v0.0.0`, `-replace=${MODULE}=${join(ROOT, "sdk", "go")}`]),
    );
    writeFileSync(join(dir.path, "main.go"), MAIN);
    expectOk("go mod tidy", await go(["mod", "tidy"]));
    expectOk("go build", await go(["build", "-o", "outside", "."]));

    const broker = await startBroker(
      ["node", CASQ_BIN, "serve", "--store", `file:${store.path}`, "--listen", "127.0.0.1:0"],
      { cwd: ROOT },
    );
    try {
      const ran = expectOk(
        "the built program",
        await runProgram(join(dir.path, "outside"), [broker.address], { cwd: dir.path, env }),
      );
      expect(ran.stdout.trim()).toMatch(/^[0-9A-Z]{26}$/);
    } finally {
      broker.child.kill("SIGTERM");
      await within("the broker to exit", broker.exited, 30_000);
    }
  }, 300_000);
});
