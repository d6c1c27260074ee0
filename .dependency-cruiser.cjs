/**
 * The layer boundaries of the server, checked by dependency-cruiser in
 * `npm test` (`npm run check:deps`). docs/architecture.md describes the layers;
 * this file is what holds the code to them. Type-only imports count
 * (`tsPreCompilationDeps`): a type import is still a dependency of the design.
 *
 * Layers, bottom up: errors.ts and util/ (clock, randomness) → store → model →
 * broker → telemetry → service → cli. A layer may use any layer below it,
 * never one above. The model is pure: itself, the errors module and a hash.
 * Telemetry observes the store and the broker through their observer seams and
 * is wired in by the service, so it sits between them.
 */

/** Production code: everything under server/src and sdk/ts/src except tests (generated code is not cruised). */
const PRODUCTION = "^(server/src|sdk/ts/src)/";
const TESTS = "\\.test\\.ts$";

/** A rule that forbids `from` (production files only) to import `to`. */
function forbid(name, comment, from, to) {
  return { name, comment, severity: "error", from: { path: from, pathNot: TESTS }, to };
}

module.exports = {
  forbidden: [
    {
      name: "no-circular",
      comment: "No import cycles, type-only ones included: a cycle makes two modules one concept.",
      severity: "error",
      from: { path: PRODUCTION },
      to: { circular: true },
    },
    forbid(
      "no-test-code-in-production",
      "Production code never imports test code: server/testing/, sdk/ts/testing/ or a *.test.ts file.",
      PRODUCTION,
      { path: ["^server/testing/", "^sdk/ts/testing/", TESTS] },
    ),
    {
      name: "production-reachable-from-cli",
      comment:
        "Every module under server/src is part of the casq program (reachable from cli/main.ts). " +
        "A module only tests use belongs in server/testing/.",
      severity: "error",
      from: { path: "^server/src/cli/main\\.ts$" },
      to: { path: "^server/src/", pathNot: TESTS, reachable: false },
    },
    forbid(
      "errors-and-util-are-leaves",
      "errors.ts and util/ (clock, randomness) are used by every layer and use none of them.",
      "^server/src/(errors\\.ts$|util/)",
      { path: "^server/src/", pathNot: "^server/src/(errors\\.ts$|util/)" },
    ),
    forbid(
      "model-is-pure",
      "The document model depends on nothing but itself, errors.ts and node:crypto's hash " +
        "(segment digests): no store, no clock, no randomness, no library.",
      "^server/src/model/",
      { pathNot: ["^server/src/model/", "^server/src/errors\\.ts$", "^(node:)?crypto$"] },
    ),
    forbid(
      "store-below-everything",
      "The object store knows nothing of documents, brokers, the service, the CLI or telemetry " +
        "(telemetry hooks in through the StoreObserver seam of instrumented-store.ts).",
      "^server/src/store/",
      { path: "^server/src/(model|broker|telemetry|service|cli)/" },
    ),
    forbid(
      "broker-below-telemetry-service-cli",
      "The broker uses the store and the model only; telemetry hooks in through its ShardObserver seam.",
      "^server/src/broker/",
      { path: "^server/src/(telemetry|service|cli)/" },
    ),
    forbid(
      "telemetry-below-service",
      "Telemetry observes the store and the broker and is wired in by the service; it never imports " +
        "the service or the CLI.",
      "^server/src/telemetry/",
      { path: "^server/src/(service|cli)/" },
    ),
    forbid("service-below-cli", "The service never imports the CLI.", "^server/src/service/", {
      path: "^server/src/cli/",
    }),
    forbid("sdk-is-standalone", "The SDK never imports the server.", "^sdk/ts/src/", { path: "^server/" }),
    forbid(
      "server-takes-generated-code-from-api",
      "The server imports generated code from @casq/api (api/ts), never through the SDK's " +
        "re-exports @casq/sdk/gen/*: the server does not depend on the SDK for its own wire API.",
      "^server/",
      { path: "^sdk/ts/src/gen/" },
    ),
    forbid(
      "sdk-takes-generated-code-from-api",
      "The SDK's own code imports @casq/api too; @casq/sdk/gen/* (sdk/ts/src/gen) only re-exports it " +
        "for applications that imported the generated code from the SDK.",
      "^sdk/ts/src/",
      { path: "^sdk/ts/src/gen/" },
    ),
    {
      name: "not-to-unresolvable",
      comment: "Every import resolves to a file or a package.",
      severity: "error",
      from: {},
      to: { couldNotResolve: true },
    },
  ],
  options: {
    doNotFollow: { path: "node_modules" },
    // Generated code is not cruised, except the SDK's re-exports in sdk/ts/src/gen, which the
    // *-takes-generated-code-from-api rules must see to catch an import of them.
    exclude: { path: ["^api/ts/src/", "(^|/)(dist|node_modules)/"] },
    tsPreCompilationDeps: true,
    tsConfig: { fileName: "tsconfig.json" },
    enhancedResolveOptions: {
      exportsFields: ["exports"],
      conditionNames: ["import", "require", "node", "default", "types"],
      mainFields: ["module", "main", "types", "typings"],
    },
    reporterOptions: { text: { highlightFocused: true } },
  },
};
