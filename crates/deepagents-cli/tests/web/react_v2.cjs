// Drives tests/web/react_v2 (a page on `@langchain/react`'s v2 `useStream`, which speaks the
// thread-centric streaming protocol through its own `@langchain/langgraph-sdk`) in headless
// Chromium against a running `deepagents serve`, the page served from another origin.
//
//   node react_v2.cjs API_URL FLOW...
//
// $DEEPAGENTS_TEST_WEB is a node_modules with playwright-core, esbuild, react, react-dom,
// @langchain/core and @langchain/react; $DEEPAGENTS_TEST_CHROMIUM is the browser. Each flow
// runs in a fresh browser context and prints `ok FLOW (time)` or `FAILED FLOW: why` with what
// the page showed, its console and its requests; the exit status is 1 when one failed.

"use strict";

const fs = require("fs");
const os = require("os");
const path = require("path");

const modules = process.env.DEEPAGENTS_TEST_WEB;
const { chromium } = require(path.join(modules, "playwright-core"));
const esbuild = require(path.join(modules, "esbuild"));
const { TIMEOUT, assert, caller, describe, serveStatic, textOf, until } = require("./common.cjs");

const [api, ...flowNames] = process.argv.slice(2);

// --- The page: bundled and served from another origin -------------------------------------

// The SDK the page runs on: @langchain/react pins its own, which esbuild takes from the
// package's nested node_modules, as a bundler does in a user's app.
function sdkVersions() {
  const react = path.join(modules, "@langchain/react");
  const version = (dir) => JSON.parse(fs.readFileSync(path.join(dir, "package.json"), "utf8")).version;
  const nested = path.join(react, "node_modules/@langchain/langgraph-sdk");
  return {
    react: version(react),
    sdk: fs.existsSync(nested) ? version(nested) : version(path.join(modules, "@langchain/langgraph-sdk")),
  };
}

async function bundle(dir) {
  const source = path.join(__dirname, "react_v2");
  const result = await esbuild.build({
    entryPoints: [path.join(source, "app.jsx")],
    bundle: true,
    outfile: path.join(dir, "app.js"),
    nodePaths: [modules],
    platform: "browser",
    format: "iife",
    target: "chrome120",
    // React's development build: it reports duplicate keys.
    define: { "process.env.NODE_ENV": '"development"' },
    logLevel: "error",
    metafile: true,
  });
  fs.copyFileSync(path.join(source, "index.html"), path.join(dir, "index.html"));
  return Object.keys(result.metafile.inputs);
}

const call = caller(api);
// Equal as JSON, whatever the order of object keys.
function same(a, b) {
  const canonical = (value) =>
    Array.isArray(value)
      ? value.map(canonical)
      : value && typeof value === "object"
        ? Object.fromEntries(Object.keys(value).sort().map((key) => [key, canonical(value[key])]))
        : value;
  return JSON.stringify(canonical(a)) === JSON.stringify(canonical(b));
}

// --- One page, with what it logged and sent -------------------------------------------------

class Page {
  constructor(context, page, pageUrl) {
    this.context = context;
    this.page = page;
    this.pageUrl = pageUrl;
    this.console = [];
    this.requests = [];
    this.elsewhere = [];
    page.on("console", (msg) => {
      if (msg.type() === "warning" || msg.type() === "error") this.console.push(`${msg.type()}: ${msg.text()}`);
    });
    page.on("pageerror", (error) => this.console.push(`pageerror: ${error.message}`));
    page.on("request", (req) => {
      const url = req.url();
      if (url.startsWith(`${this.pageUrl}/`) || url.startsWith("data:")) return;
      if (!url.startsWith(`${api}/`)) {
        this.elsewhere.push(`${req.method()} ${url}`);
        return;
      }
      this.requests.push({ method: req.method(), path: url.slice(api.length), body: req.postData(), req });
    });
    page.on("response", async (res) => {
      const record = this.requests.find((r) => r.req === res.request());
      if (!record) return;
      record.status = res.status();
      if (res.status() >= 400) record.response = await res.text().catch(() => "");
    });
    page.on("requestfailed", (req) => {
      const record = this.requests.find((r) => r.req === req);
      if (record) record.failure = req.failure()?.errorText;
    });
  }

  static async create(browser, pageUrl) {
    // Nothing but the page's origin and the server answers: a request elsewhere is recorded
    // (and fails the flow) without leaving the machine.
    const context = await browser.newContext();
    await context.route(
      (url) => !url.href.startsWith(`${pageUrl}/`) && !url.href.startsWith(`${api}/`),
      (route) => route.abort("blockedbyclient"),
    );
    const page = await context.newPage();
    page.setDefaultTimeout(TIMEOUT);
    return new Page(context, page, pageUrl);
  }

  // Opens the page, on `threadId` if given, and waits until it has read the thread.
  async goto(threadId) {
    const query = new URLSearchParams({ api });
    if (threadId) query.set("threadId", threadId);
    await this.page.goto(`${this.pageUrl}/?${query}`);
    await this.page.locator("#status[data-thread-loading=false]").waitFor();
  }

  async send(text) {
    await this.page.fill("#input", text);
    await this.page.click("#send");
  }

  // The final text of an AI message shown, and the page idle.
  async answer(text) {
    await this.page.locator(".message[data-type=ai] .text", { hasText: text }).first().waitFor();
    await this.idle();
  }

  async idle() {
    await this.page.locator("#status[data-loading=false]").waitFor();
  }

  async threadId() {
    return this.page.locator("#status").getAttribute("data-thread");
  }

  async messages() {
    return this.page.$$eval(".message", (items) =>
      items.map((item) => ({
        id: item.dataset.id,
        type: item.dataset.type,
        text: item.querySelector(".text")?.textContent ?? "",
        calls: [...item.querySelectorAll(".tool-call")].map((c) => c.dataset.name),
      })),
    );
  }

  async files() {
    return this.page.$$eval(".file", (items) =>
      Object.fromEntries(items.map((i) => [i.dataset.path, i.querySelector(".file-content").textContent])),
    );
  }

  // The protocol's commands the page sent, parsed.
  commands() {
    return this.requests
      .filter((r) => r.method === "POST" && /^\/threads\/[^/]+\/commands$/.test(r.path))
      .map((r) => JSON.parse(r.body));
  }

  // The ids the page gave the messages it sent (the SDK names its optimistic copies).
  sentIds() {
    return this.commands()
      .filter((c) => c.method === "run.start")
      .flatMap((c) => c.params?.input?.messages ?? [])
      .map((m) => m.id)
      .filter((id) => id);
  }

  subscriptions() {
    return this.requests
      .filter((r) => r.method === "POST" && /^\/threads\/[^/]+\/stream\/events$/.test(r.path))
      .map((r) => JSON.parse(r.body));
  }

  // Waits until the page renders nothing new for `quiet` ms: a late event (a replay of the
  // thread's earlier runs) has had its chance to show.
  async settled(quiet = 500) {
    let count = -1;
    let since = Date.now();
    await until("the page to stop rendering", async () => {
      const now = await this.page.evaluate(() => window.__renders.length);
      if (now !== count) {
        count = now;
        since = Date.now();
      }
      return Date.now() - since >= quiet;
    });
  }

  // What every flow must hold: no message shown twice, by id or by text (React warns on
  // duplicate keys, and the page records every render), nothing logged as an error, no request
  // refused, none to another host.
  async clean() {
    const duplicates = await this.page.evaluate(() => window.__duplicates);
    assert(duplicates.length === 0, "a message id was rendered twice", duplicates.slice(0, 3));
    const shownTwice = await this.page.evaluate(() => window.__shownTwice);
    assert(shownTwice.length === 0, "a message was rendered twice", shownTwice.slice(0, 3));
    const unnamed = await this.page.$$eval(".message:not([data-id])", (items) => items.map((i) => i.textContent));
    assert(unnamed.length === 0, "messages without an id are shown", unnamed);
    const keyWarnings = this.console.filter((line) => /same key|unique "key"/.test(line));
    assert(keyWarnings.length === 0, "React warned about keys", keyWarnings);
    const refused = this.requests.filter((r) => r.status >= 400 || (r.failure && r.failure !== "net::ERR_ABORTED"));
    assert(
      refused.length === 0,
      "the server refused or failed requests",
      refused.map((r) => `${r.method} ${r.path} ${r.body ?? ""} -> ${r.status ?? r.failure} ${r.response ?? ""}`),
    );
    assert(this.elsewhere.length === 0, "the page sent requests to other hosts", this.elsewhere);
    assert(this.console.length === 0, "the page logged errors or warnings", this.console);
  }

  async report() {
    const lines = [];
    try {
      lines.push(`  url: ${this.page.url()}`);
      lines.push(`  status: ${await this.page.locator("#status").evaluate((e) => e.outerHTML)}`);
      const error = await this.page.$eval("#error", (e) => e.textContent).catch(() => null);
      if (error) lines.push(`  stream error: ${error}`);
      lines.push(`  interrupt: ${await this.page.$eval("#interrupt", (e) => e.outerHTML).catch(() => "(none)")}`);
      for (const m of await this.messages()) lines.push(`  message ${m.type} ${m.id}: ${m.text} ${m.calls.join(",")}`);
      lines.push(`  files: ${describe(await this.files())}`);
    } catch (e) {
      lines.push(`  (page unreadable: ${e.message})`);
    }
    for (const line of this.console) lines.push(`  console ${line}`);
    for (const line of this.elsewhere) lines.push(`  elsewhere ${line}`);
    for (const r of this.requests) {
      lines.push(`  ${r.method} ${r.path} ${r.body ?? ""} -> ${r.status ?? r.failure ?? "pending"} ${r.response ?? ""}`);
    }
    return lines.join("\n");
  }

  async close() {
    await this.context.close();
  }
}

// --- The flows ------------------------------------------------------------------------------

async function threadState(threadId) {
  return call("GET", `/threads/${threadId}/state`);
}

// The page shows the thread's messages, in order, with the ids the thread's state gives
// them; a message the page sent may keep the id the page gave it, which the server streams
// (so the SDK matches its optimistic copy) but its state does not keep (docs/server.md).
async function showsTheThread(page, threadId, types) {
  const shown = await page.messages();
  const state = await threadState(threadId);
  const held = state.values.messages;
  assert(same(shown.map((m) => m.type), types), `the page does not show ${types.join(", ")}`, shown);
  assert(
    same(shown.map((m) => m.text), held.map((m) => textOf(m.content))),
    "the page shows other messages than the thread holds",
    { shown, held },
  );
  const sent = page.sentIds();
  const named = shown.every((m, i) => m.id === held[i].id || (m.type === "human" && sent.includes(m.id)));
  assert(named, "the page shows other message ids than the thread holds (or the page gave)", {
    shown: shown.map((m) => m.id),
    held: held.map((m) => m.id),
    sent,
  });
  return shown;
}

// Sends `text` and waits for the approval card of `tool`, with the call's arguments.
async function approval(page, text, tool, args) {
  await page.send(text);
  const card = page.page.locator(`#interrupt[data-action=${tool}]`);
  await card.waitFor();
  await page.idle();
  const shownArgs = JSON.parse(await card.locator(".action-args").textContent());
  assert(same(shownArgs, args), "the approval card does not show the call's arguments", shownArgs);
  const allowed = await card.getAttribute("data-allowed");
  assert(allowed === "approve,edit,reject", "the approval card does not say what may be decided", allowed);
  const threadId = await until("the page to learn the thread id", () => page.threadId());
  // The pause is announced a moment before the run has saved its status and ended.
  await until("the thread waiting for approval to be interrupted", async () => {
    const thread = await call("GET", `/threads/${threadId}`);
    return thread.status === "interrupted" ? thread : null;
  });
  return threadId;
}

async function approve(page, answer) {
  await page.page.click("#approve");
  await page.answer(answer);
  await page.page.locator("#status[data-interrupt=false]").waitFor();
  const respond = page.commands().filter((c) => c.method === "input.respond");
  assert(
    respond.length === 1 && same(respond[0].params?.response, { decisions: [{ type: "approve" }] }),
    "the page did not send the approval as one input.respond",
    respond,
  );
}

const flows = {
  // A message goes out as `run.start` on a thread the page names, the answer streams in on
  // the thread's event stream and shows once, with the ids the thread keeps.
  async send_and_stream(page) {
    await page.send("hello there");
    await page.answer("Hello from the scripted model.");
    const threadId = await page.threadId();
    assert(threadId, "the page has no thread id after a run");
    assert(new URL(page.page.url()).searchParams.get("threadId") === threadId, "onThreadId was not called");
    const thread = await call("GET", `/threads/${threadId}`);
    assert(thread.status === "idle", "the thread is not idle after the run", thread.status);
    const starts = page.commands().filter((c) => c.method === "run.start");
    assert(
      starts.length === 1 && textOf(starts[0].params?.input?.messages?.[0]?.content) === "hello there",
      "the message did not go out as one run.start",
      page.commands(),
    );
    const channels = new Set(page.subscriptions().flatMap((s) => s.channels ?? []));
    for (const channel of ["messages", "values", "lifecycle"]) {
      assert(channels.has(channel), `the page did not subscribe to ${channel}`, page.subscriptions());
    }
    await page.settled();
    await showsTheThread(page, threadId, ["human", "ai"]);
  },

  // The write waits for approval: the card shows the call; approved, the run goes on to the
  // answer and the file is in the state the page shows.
  async approve(page) {
    const threadId = await approval(page, "approve the file", "write_file", {
      file_path: "/approved.md",
      content: "approved\n",
    });
    // The pause (from the lifecycle stream) may show a moment before the call (from the
    // content stream).
    let paused;
    await until("the question and the call waiting for approval", async () => {
      paused = await page.messages();
      return same(paused.map((m) => [m.type, m.calls]), [["human", []], ["ai", ["write_file"]]]);
    }, 10_000).catch((e) => {
      throw new Error(`${e.message}; shown: ${describe(paused)}`);
    });
    await approve(page, "Approved and written.");
    await page.settled();
    assert((await page.page.locator("#interrupt").count()) === 0, "the approval card is still shown");
    const shown = await page.files();
    assert(shown["/approved.md"] === "approved\n", "the approved file is not in the values shown", shown);
    const state = await threadState(threadId);
    assert(state.values.files?.["/approved.md"], "the thread's state holds no /approved.md", state.values.files);
    assert((state.next ?? []).length === 0 && !(state.interrupts ?? []).length, "the thread still waits", state);
    await showsTheThread(page, threadId, ["human", "ai", "tool", "ai"]);
  },

  // A reload on the thread: the transcript and the files come back from the thread (the
  // approval answered stays answered), and the next message streams on it, each message once.
  async reload(page) {
    const threadId = await approval(page, "reload me", "write_file", {
      file_path: "/reloaded.md",
      content: "before the reload\n",
    });
    await approve(page, "Written before the reload.");
    const before = await page.messages();
    await page.goto(threadId);
    await page.page.locator(".message").nth(3).waitFor();
    await page.settled();
    const after = await page.messages();
    const content = (messages) => messages.map(({ type, text, calls }) => ({ type, text, calls }));
    assert(same(content(after), content(before)), "after a reload the page shows another transcript", {
      before,
      after,
    });
    const held = (await threadState(threadId)).values.messages.map((m) => m.id);
    assert(same(after.map((m) => m.id), held), "after a reload the page shows other ids than the thread's", {
      after,
      held,
    });
    assert((await page.page.locator("#interrupt").count()) === 0, "the answered approval shows again");
    const shown = await page.files();
    assert(shown["/reloaded.md"] === "before the reload\n", "the file is not in the values after a reload", shown);
    await page.send("one more");
    await page.answer("Answered after the reload.");
    await page.settled();
    await showsTheThread(page, threadId, ["human", "ai", "tool", "ai", "human", "ai"]);
    assert((await page.page.locator("#interrupt").count()) === 0, "the answered approval shows again");
  },
};

async function main() {
  const unknown = flowNames.filter((name) => !flows[name]);
  if (!api || !flowNames.length || unknown.length) {
    console.error(`usage: react_v2.cjs API_URL FLOW...; flows: ${Object.keys(flows).join(" ")}`);
    process.exit(2);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "react-v2-"));
  const started = Date.now();
  const versions = sdkVersions();
  const inputs = await bundle(dir);
  // The bundle must hold the SDK @langchain/react brings, not the workspace's newer one.
  const sdkInputs = [...new Set(inputs.filter((i) => i.includes("@langchain/langgraph-sdk/")).map((i) => i.split("/@langchain/langgraph-sdk/")[0]))];
  const nestedOnly = sdkInputs.every((prefix) => prefix.endsWith("@langchain/react/node_modules"));
  console.log(`@langchain/react ${versions.react} on @langchain/langgraph-sdk ${versions.sdk}`);
  if (!nestedOnly) {
    console.log(`FAILED bundle: the page is not built on @langchain/react's own SDK: ${describe(sdkInputs)}`);
    process.exit(1);
  }
  const { server, url } = await serveStatic(dir);
  const browser = await chromium.launch({
    executablePath: process.env.DEEPAGENTS_TEST_CHROMIUM,
    args: [
      "--headless",
      "--no-sandbox",
      "--disable-gpu",
      "--disable-background-networking",
      "--disable-component-update",
      "--disable-sync",
    ],
  });
  console.log(`bundled and started in ${Date.now() - started} ms`);
  const failed = [];
  for (const name of flowNames) {
    const begun = Date.now();
    let page;
    try {
      page = await Page.create(browser, url);
      await page.goto();
      await flows[name](page);
      await page.clean();
      console.log(`ok ${name} (${Date.now() - begun} ms)`);
    } catch (error) {
      failed.push(name);
      const why = String(error?.message ?? error).replace(/\x1b\[[0-9;]*m/g, "");
      console.log(`FAILED ${name} (${Date.now() - begun} ms): ${why}`);
      if (page) console.log(await page.report());
    } finally {
      await page?.close().catch(() => {});
    }
  }
  await browser.close();
  server.close();
  fs.rmSync(dir, { recursive: true, force: true });
  console.log(failed.length ? `failed: ${failed.join(" ")}` : "all flows passed");
  process.exit(failed.length ? 1 : 0);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
