// The client's side of exec_sandbox/wire.py, without a server: option names, error classes.
import assert from "node:assert/strict";
import { test } from "node:test";

import {
  defaultSocketPath,
  errorFromBody,
  InputValidationError,
  PackageNotAllowedError,
  SandboxError,
  SessionClosedError,
  TemplateBuildError,
  TransientError,
  VmCapacityError,
} from "../src/index.ts";
import { optionsToWire, resultFromWire } from "../src/wire.ts";

test("options go out by their Python names; user keys and nested forms as the server reads them", () => {
  const body = optionsToWire({
    language: "python",
    timeoutSeconds: 5,
    memoryMb: 256,
    allowNetwork: true,
    envVars: { myVar: "1" },
    exposePorts: [8080, { internal: 3000, external: 13000 }],
    secrets: [{ name: "KEY", value: "v", hosts: ["api.example.com"], replaceInBody: true }],
    volumes: { "/mnt/a": "data", "/mnt/b": { volume: "ro", readOnly: true } },
    onStdout: () => {},
    template: undefined,
  } as never);
  assert.deepEqual(body, {
    language: "python",
    timeout_seconds: 5,
    memory_mb: 256,
    allow_network: true,
    env_vars: { myVar: "1" },
    expose_ports: [8080, { internal: 3000, external: 13000 }],
    secrets: [{ name: "KEY", value: "v", hosts: ["api.example.com"], replace_in_body: true }],
    volumes: { "/mnt/a": "data", "/mnt/b": { volume: "ro", read_only: true } },
  });
});

test("a function option other than the output callbacks is refused before any request", () => {
  assert.throws(() => optionsToWire({ tools: { f: () => 1 } } as never), InputValidationError);
  assert.throws(() => optionsToWire({ tools: () => 1 } as never), InputValidationError);
});

test("error codes map to the library's classes and keep the server's code", () => {
  const capacity = errorFromBody({ error: { code: "vm_capacity", message: "full", details: {} } }, 503);
  assert.ok(capacity instanceof VmCapacityError && capacity instanceof TransientError);
  assert.equal(capacity.code, "vm_capacity");
  assert.equal(capacity.status, 503);
  assert.equal(capacity.message, "full");

  const pkg = errorFromBody({ error: { code: "package_not_allowed", message: "no", details: {} } });
  assert.ok(pkg instanceof PackageNotAllowedError && pkg instanceof InputValidationError);

  const missing = errorFromBody({ error: { code: "not_found", message: "no such session" } }, 404);
  assert.ok(missing instanceof SessionClosedError);
  assert.equal(missing.code, "not_found");

  const build = errorFromBody({ error: { code: "template_build", message: "x", details: { step: 2, exit_code: 1 } } });
  assert.ok(build instanceof TemplateBuildError);
  assert.equal((build as TemplateBuildError).step, 2);
  assert.equal((build as TemplateBuildError).exitCode, 1);

  const future = errorFromBody({ error: { code: "something_new", message: "?" } });
  assert.equal(future.constructor, SandboxError);
  assert.equal(future.code, "something_new");

  const prototypeKey = errorFromBody({ error: { code: "constructor", message: "?" } });
  assert.equal(prototypeKey.constructor, SandboxError);

  assert.equal(new SessionClosedError("gone").code, "session_closed"); // made by the client
  assert.equal(new VmCapacityError("full").code, "vm_capacity");

  const garbage = errorFromBody("<html>", 502);
  assert.equal(garbage.code, "internal");
});

test("binary outputs arrive as bytes, text ones as text", () => {
  const result = resultFromWire({
    stdout: "",
    stderr: "",
    exit_code: 0,
    outputs: [
      { mime_type: "image/png", data: { base64: Buffer.from([137, 80, 78, 71]).toString("base64") } },
      { mime_type: "text/plain", data: "42" },
    ],
  });
  assert.deepEqual(result.outputs[0].data, new Uint8Array([137, 80, 78, 71]));
  assert.equal(result.outputs[1].data, "42");
  assert.throws(() => resultFromWire({ stdout: "" }), /exit_code/);
});

test("the default socket is where sbx serve listens by default", () => {
  assert.equal(defaultSocketPath({ XDG_RUNTIME_DIR: "/run/user/7" }), "/run/user/7/exec-sandbox/sbx.sock");
  assert.equal(defaultSocketPath({ EXEC_SANDBOX_STATE_DIR: "/s", XDG_STATE_HOME: "/x" }), "/s/sbx.sock");
  assert.equal(defaultSocketPath({ XDG_STATE_HOME: "/x" }), "/x/exec-sandbox/sbx.sock");
  assert.match(defaultSocketPath({}), /\/\.local\/state\/exec-sandbox\/sbx\.sock$/);
});
