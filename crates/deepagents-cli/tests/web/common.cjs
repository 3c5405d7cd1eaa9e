// What the browser-test drivers (usestream.cjs, react_v2.cjs) share: serving a bundled page
// from another origin, reading the server directly, waiting and asserting.

"use strict";

const fs = require("fs");
const http = require("http");
const path = require("path");

/** How long a driver waits for anything, unless told otherwise. */
const TIMEOUT = 30_000;

function serveStatic(dir) {
  const types = { ".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8" };
  const server = http.createServer((req, res) => {
    const name = new URL(req.url, "http://x").pathname.replace(/^\/$/, "/index.html");
    const file = path.join(dir, path.basename(name));
    if (!fs.existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    res.writeHead(200, { "content-type": types[path.extname(file)] ?? "application/octet-stream" });
    fs.createReadStream(file).pipe(res);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => resolve({ server, url: `http://127.0.0.1:${server.address().port}` })),
  );
}

/** A function calling the server at `api` and answering its JSON (an error for a refusal). */
function caller(api) {
  return async function call(method, route, body) {
    const res = await fetch(api + route, {
      method,
      headers: body === undefined ? {} : { "content-type": "application/json" },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    const text = await res.text();
    if (!res.ok) throw new Error(`${method} ${route}: ${res.status} ${text}`);
    return text ? JSON.parse(text) : null;
  };
}

async function until(what, check, timeout = TIMEOUT) {
  const deadline = Date.now() + timeout;
  let last;
  for (;;) {
    try {
      last = await check();
      if (last) return last;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what} (last: ${describe(last)})`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

function describe(value) {
  if (value instanceof Error) return value.message;
  return JSON.stringify(value);
}

function assert(condition, message, detail) {
  if (!condition) throw new Error(detail === undefined ? message : `${message}: ${describe(detail)}`);
}

function textOf(content) {
  if (typeof content === "string") return content;
  return (content ?? []).map((b) => (b?.type === "text" ? b.text : "")).join("");
}


module.exports = { TIMEOUT, assert, caller, describe, serveStatic, textOf, until };
