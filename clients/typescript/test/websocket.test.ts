// The WebSocket client against a scripted STAND-IN server (test/standin.ts): framing cases a
// real server rarely produces (fragments around a ping, 64-bit lengths, broken frames).
import assert from "node:assert/strict";
import * as net from "node:net";
import { after, before, describe, test } from "node:test";

import { CommunicationError, PermanentError } from "../src/errors.ts";
import { type ClientOptions, Transport } from "../src/transport.ts";
import { type Peer, standIn } from "./standin.ts";

const TEXT = 0x1;
const BINARY = 0x2;
const CONTINUATION = 0x0;
const CLOSE = 0x8;
const PING = 0x9;
const PONG = 0xa;

describe("WebSocket client (stand-in server)", { timeout: 20_000 }, () => {
  let server: { url: string; close: () => Promise<void> };
  let script: (peer: Peer) => void = () => {};

  before(async () => {
    server = await standIn((peer) => script(peer));
  });
  after(async () => {
    await server.close();
  });

  function open(maxMessageBytes?: number, options: ClientOptions = {}) {
    return new Transport({ url: server.url, token: "t0k" }, { maxMessageBytes, ...options }).websocket("/echo", {
      a: 1,
    });
  }

  test("the handshake carries the token and path, and client frames are masked", async () => {
    let seen: Peer | undefined;
    script = (peer) => {
      seen = peer;
      peer.nextFrame().then((f) => peer.send(TEXT, `echo:${f.payload.toString()}:${f.masked}`));
    };
    const ws = await open();
    await ws.sendText("hi");
    const message = await ws.receive();
    assert.deepEqual(message, { type: "text", data: "echo:hi:true" });
    assert.equal(seen?.path, "/v1/echo?a=1");
    assert.equal(seen?.headers.authorization, "Bearer t0k");
    ws.destroy();
  });

  test("a fragmented message with a ping between its fragments arrives whole, the ping answered", async () => {
    let pong: Promise<{ op: number; payload: Buffer }> | undefined;
    script = (peer) => {
      peer.send(TEXT, "one ", { fin: false });
      peer.send(PING, "are you there");
      pong = peer.nextFrame();
      peer.send(CONTINUATION, "two ", { fin: false });
      peer.send(CONTINUATION, "three", { fin: true });
    };
    const ws = await open();
    assert.deepEqual(await ws.receive(), { type: "text", data: "one two three" });
    const answer = await pong;
    assert.equal(answer?.op, PONG);
    assert.equal(answer?.payload.toString(), "are you there");
    ws.destroy();
  });

  test("a binary message with a 64-bit length and a 16-bit one arrive intact", async () => {
    const big = Buffer.alloc(70_000, 7);
    const mid = Buffer.alloc(300, 9);
    script = (peer) => {
      peer.send(BINARY, big);
      peer.send(BINARY, mid);
    };
    const ws = await open();
    const first = await ws.receive();
    assert.equal(first?.type, "binary");
    assert.deepEqual(Buffer.from(first?.data as Uint8Array), big);
    const second = await ws.receive();
    assert.deepEqual(Buffer.from(second?.data as Uint8Array), mid);
    ws.destroy();
  });

  test("a reader that falls behind gets every message in order once it reads again", async () => {
    // Past 64 queued messages the client pauses the socket; reading resumes it.
    script = (peer) => {
      for (let i = 0; i < 300; i++) peer.send(TEXT, `m${i}:${"x".repeat(1000)}`);
    };
    const ws = await open();
    await new Promise((r) => setTimeout(r, 100));
    for (let i = 0; i < 300; i++) {
      const message = await ws.receive();
      assert.equal(message?.type === "text" && message.data.split(":")[0], `m${i}`);
    }
    ws.destroy();
  });

  test("close() of a reader that stopped reading gets the server's close at once", async () => {
    script = (peer) => {
      for (let i = 0; i < 200; i++) peer.send(TEXT, "y".repeat(1000));
      peer.nextFrame().then((f) => {
        if (f.op === CLOSE) peer.send(CLOSE, f.payload.subarray(0, 2));
      });
    };
    const ws = await open();
    await new Promise((r) => setTimeout(r, 100)); // the queue fills, the socket pauses
    const started = Date.now();
    await ws.close();
    assert.ok(Date.now() - started < 2000, `close took ${Date.now() - started} ms`);
    assert.equal(ws.closeCode, 1000);
  });

  test("a message over the limit is refused, not buffered", async () => {
    script = (peer) => peer.send(BINARY, Buffer.alloc(2048));
    const ws = await open(1024);
    await assert.rejects(ws.receive(), (err: Error) => err instanceof CommunicationError && /1024/.test(err.message));
  });

  test("fragments that add up past the limit are refused", async () => {
    script = (peer) => {
      peer.send(TEXT, "x".repeat(600), { fin: false });
      peer.send(CONTINUATION, "x".repeat(600), { fin: true });
    };
    const ws = await open(1024);
    await assert.rejects(ws.receive(), CommunicationError);
  });

  test("a masked server frame is a protocol error", async () => {
    script = (peer) => peer.send(TEXT, "sneaky", { mask: true });
    const ws = await open();
    await assert.rejects(ws.receive(), /masked/);
  });

  test("text that is not UTF-8 is a protocol error", async () => {
    script = (peer) => peer.send(TEXT, Buffer.from([0xff, 0xfe]));
    const ws = await open();
    await assert.rejects(ws.receive(), /UTF-8/);
  });

  test("the server's close ends the stream after the queued messages and is echoed", async () => {
    let echoed: Promise<{ op: number; payload: Buffer }> | undefined;
    script = (peer) => {
      peer.send(TEXT, "last words");
      const body = Buffer.alloc(2);
      body.writeUInt16BE(1000);
      peer.send(CLOSE, body);
      echoed = peer.nextFrame();
    };
    const ws = await open();
    assert.deepEqual(await ws.receive(), { type: "text", data: "last words" });
    assert.equal(await ws.receive(), null);
    assert.equal(ws.closeCode, 1000);
    const echo = await echoed;
    assert.equal(echo?.op, CLOSE);
    assert.equal(echo?.payload.readUInt16BE(0), 1000);
    await ws.close();
  });

  test("a connection dropped without a close frame is an error, not a clean end", async () => {
    script = (peer) => peer.socket.destroy();
    const ws = await open();
    await assert.rejects(ws.receive(), /dropped/);
    assert.equal(ws.closeCode, 1006);
  });

  test("an upgrade refused with an error body raises its code", async () => {
    const refusing = await standIn(() => {}, {
      status: 401,
      body: { error: { code: "unauthorized", message: "unknown token", details: {} } },
    });
    try {
      const transport = new Transport({ url: refusing.url, token: "bad" });
      await assert.rejects(
        transport.websocket("/run"),
        (err: Error) => err instanceof PermanentError && (err as PermanentError).code === "unauthorized",
      );
      transport.close();
    } finally {
      await refusing.close();
    }
  });

  test("close() sends a close frame with the code and ends once the server answers", async () => {
    let got: Promise<{ op: number; payload: Buffer }> | undefined;
    script = (peer) => {
      got = peer.nextFrame().then((f) => {
        peer.send(CLOSE, f.payload.subarray(0, 2));
        peer.socket.end();
        return f;
      });
    };
    const ws = await open();
    await new Promise((r) => setTimeout(r, 20)); // the script above has run
    await ws.close(4000, "bye");
    const f = await got;
    assert.equal(f?.op, CLOSE);
    assert.equal(f?.payload.readUInt16BE(0), 4000);
    assert.equal(f?.payload.subarray(2).toString(), "bye");
  });

  test("a server that stops answering pings fails the connection; answered pings keep it", async () => {
    script = (peer) => {
      // Answers the first two pings, then goes quiet (a hung server keeps its socket open).
      let answered = 0;
      const loop = async () => {
        for (;;) {
          const f = await peer.nextFrame();
          if (f.op === PING && answered < 2) {
            answered += 1;
            peer.send(PONG, f.payload);
            if (answered === 2) peer.send(TEXT, "still here");
          }
        }
      };
      void loop();
    };
    const ws = await open(undefined, { pingIntervalMs: 30, pingTimeoutMs: 200 });
    assert.deepEqual(await ws.receive(), { type: "text", data: "still here" });
    const started = Date.now();
    await assert.rejects(ws.receive(), /did not answer a ping within 200 ms/);
    assert.ok(Date.now() - started >= 150, "failed only once the ping went unanswered");
    assert.equal(ws.closeCode, 1006);
  });

  test("a server that never answers the handshake is given up on", async () => {
    const silent = net.createServer((socket) => socket.resume()); // reads, never answers
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
    const { port } = silent.address() as net.AddressInfo;
    const transport = new Transport({ url: `http://127.0.0.1:${port}`, token: "t" }, { handshakeTimeoutMs: 150 });
    try {
      await assert.rejects(transport.websocket("/run"), (err: Error) => {
        return err instanceof CommunicationError && /no answer to the handshake within 150 ms/.test(err.message);
      });
    } finally {
      transport.close();
      await new Promise((resolve) => silent.close(resolve));
    }
  });
});
