// A STAND-IN WebSocket server for the client's unit tests: a node:http server that answers
// the upgrade and then speaks raw RFC 6455 frames as each test scripts it (including broken
// ones no real server sends). It is not `sbx serve`; the tests against that are server.test.ts.
import { createHash } from "node:crypto";
import * as http from "node:http";
import type { AddressInfo } from "node:net";
import type { Duplex } from "node:stream";

export interface Peer {
  socket: Duplex;
  path: string;
  headers: http.IncomingHttpHeaders;
  /** Frames the client sent, unmasked (the test checks they were masked). */
  frames: Array<{ fin: boolean; op: number; masked: boolean; payload: Buffer }>;
  nextFrame(): Promise<{ fin: boolean; op: number; masked: boolean; payload: Buffer }>;
  send(op: number, payload: Buffer | string, options?: { fin?: boolean; mask?: boolean }): void;
}

export function serverFrame(op: number, payload: Buffer, fin = true, mask = false): Buffer {
  const length = payload.length;
  const head = length < 126 ? 2 : length < 65536 ? 4 : 10;
  const out = Buffer.alloc(head + (mask ? 4 : 0) + length);
  out[0] = (fin ? 0x80 : 0) | op;
  const maskBit = mask ? 0x80 : 0;
  if (length < 126) out[1] = maskBit | length;
  else if (length < 65536) {
    out[1] = maskBit | 126;
    out.writeUInt16BE(length, 2);
  } else {
    out[1] = maskBit | 127;
    out.writeBigUInt64BE(BigInt(length), 2);
  }
  if (mask) {
    const key = Buffer.from([1, 2, 3, 4]);
    key.copy(out, head);
    for (let i = 0; i < length; i++) out[head + 4 + i] = payload[i] ^ key[i & 3];
  } else {
    payload.copy(out, head);
  }
  return out;
}

export async function standIn(
  onPeer: (peer: Peer) => void,
  refuse?: { status: number; body: unknown },
): Promise<{ url: string; close: () => Promise<void> }> {
  const sockets = new Set<Duplex>();
  const server = http.createServer((_req: http.IncomingMessage, res: http.ServerResponse) => {
    res.writeHead(404).end();
  });
  server.on("upgrade", (req: http.IncomingMessage, socket: Duplex) => {
    sockets.add(socket);
    if (refuse !== undefined) {
      const body = JSON.stringify(refuse.body);
      socket.end(
        `HTTP/1.1 ${refuse.status} No\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
      );
      return;
    }
    const accept = createHash("sha1")
      .update(`${req.headers["sec-websocket-key"]}258EAFA5-E914-47DA-95CA-C5AB0DC85B11`)
      .digest("base64");
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`,
    );
    let buffered = Buffer.alloc(0);
    const frames: Peer["frames"] = [];
    const waiting: Array<(f: Peer["frames"][number]) => void> = [];
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      for (;;) {
        if (buffered.length < 2) return;
        let length = buffered[1] & 0x7f;
        let offset = 2;
        if (length === 126) {
          if (buffered.length < 4) return;
          length = buffered.readUInt16BE(2);
          offset = 4;
        } else if (length === 127) {
          if (buffered.length < 10) return;
          length = Number(buffered.readBigUInt64BE(2));
          offset = 10;
        }
        const masked = (buffered[1] & 0x80) !== 0;
        const total = offset + (masked ? 4 : 0) + length;
        if (buffered.length < total) return;
        const payload = Buffer.from(buffered.subarray(total - length, total));
        if (masked) {
          const key = buffered.subarray(offset, offset + 4);
          for (let i = 0; i < length; i++) payload[i] ^= key[i & 3];
        }
        const f = { fin: (buffered[0] & 0x80) !== 0, op: buffered[0] & 0x0f, masked, payload };
        buffered = buffered.subarray(total);
        const waiter = waiting.shift();
        if (waiter) waiter(f);
        else frames.push(f);
      }
    });
    socket.on("error", () => {});
    onPeer({
      socket,
      path: req.url ?? "",
      headers: req.headers,
      frames,
      nextFrame: () => {
        const f = frames.shift();
        return f ? Promise.resolve(f) : new Promise((resolve) => waiting.push(resolve));
      },
      send: (op, payload, options = {}) => {
        const bytes = typeof payload === "string" ? Buffer.from(payload) : payload;
        socket.write(serverFrame(op, bytes, options.fin ?? true, options.mask ?? false));
      },
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
