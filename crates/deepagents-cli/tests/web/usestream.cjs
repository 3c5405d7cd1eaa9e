// Drives tests/web/usestream (a useStream page in the style of agent-chat-ui) in headless
// Chromium against a running `deepagents serve`, the page served from another origin.
//
//   node usestream.cjs API_URL FLOW...
//
// $DEEPAGENTS_TEST_WEB is a node_modules with playwright-core, esbuild, react, react-dom and
// @langchain/langgraph-sdk; $DEEPAGENTS_TEST_CHROMIUM is the browser. Each flow runs in a
// fresh browser context and prints `ok FLOW (time)` or `FAILED FLOW: why` with what the page
// showed, its console and its requests to the server; the exit status is 1 when one failed.

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

async function bundle(dir) {
  const source = path.join(__dirname, "usestream");
  await esbuild.build({
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
  });
  fs.copyFileSync(path.join(source, "index.html"), path.join(dir, "index.html"));
}

const call = caller(api);
// --- One page, with what it logged and sent -------------------------------------------------

class Page {
  constructor(context, page, pageUrl) {
    this.context = context;
    this.page = page;
    this.pageUrl = pageUrl;
    this.console = [];
    this.requests = [];
    page.on("console", (msg) => {
      if (msg.type() === "warning" || msg.type() === "error") this.console.push(`${msg.type()}: ${msg.text()}`);
    });
    page.on("pageerror", (error) => this.console.push(`pageerror: ${error.message}`));
    page.on("request", (req) => {
      if (!req.url().startsWith(api)) return;
      this.requests.push({
        method: req.method(),
        path: req.url().slice(api.length),
        body: req.postData(),
        headers: req.headers(),
        req,
      });
    });
    page.on("response", async (res) => {
      const record = this.requests.find((r) => r.req === res.request());
      if (!record) return;
      record.status = res.status();
      record.responseHeaders = res.headers();
      if (res.status() >= 400) record.response = await res.text().catch(() => "");
    });
    page.on("requestfailed", (req) => {
      const record = this.requests.find((r) => r.req === req);
      if (record) record.failure = req.failure()?.errorText;
    });
  }

  static async create(browser, pageUrl) {
    const context = await browser.newContext();
    const page = await context.newPage();
    page.setDefaultTimeout(TIMEOUT);
    return new Page(context, page, pageUrl);
  }

  async goto(threadId) {
    const query = new URLSearchParams({ api });
    if (threadId) query.set("threadId", threadId);
    await this.page.goto(`${this.pageUrl}/?${query}`);
    await this.page.waitForFunction(() => document.querySelector("#connection")?.textContent !== "connecting");
    const connection = await this.page.locator("#connection").textContent();
    assert(connection === "connected", "the page cannot reach the server (GET /info)", connection);
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

  runs() {
    return this.requests.filter((r) => r.method === "POST" && /^\/threads\/[^/]+\/runs\/stream$/.test(r.path));
  }

  lastRunBody() {
    const runs = this.runs();
    assert(runs.length > 0, "no run was started");
    return JSON.parse(runs[runs.length - 1].body);
  }

  // What every flow must hold: no message id shown twice (React warns on duplicate keys, and
  // the page records every render), nothing logged as an error, no request refused.
  async clean() {
    const duplicates = await this.page.evaluate(() => window.__duplicates);
    assert(duplicates.length === 0, "a message id was rendered twice", duplicates.slice(0, 3));
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
    assert(this.console.length === 0, "the page logged errors or warnings", this.console);
  }

  async report() {
    const lines = [];
    try {
      lines.push(`  url: ${this.page.url()}`);
      lines.push(`  status: ${await this.page.locator("#status").evaluate((e) => e.outerHTML)}`);
      const error = await this.page.$eval("#error", (e) => e.textContent).catch(() => null);
      if (error) lines.push(`  stream error: ${error}`);
      lines.push(`  interrupt: ${await this.page.$eval("#interrupt", (e) => e.textContent).catch(() => "(none)")}`);
      for (const m of await this.messages()) lines.push(`  message ${m.type} ${m.id}: ${m.text} ${m.calls.join(",")}`);
    } catch (e) {
      lines.push(`  (page unreadable: ${e.message})`);
    }
    for (const line of this.console) lines.push(`  console ${line}`);
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

async function history(threadId) {
  return call("POST", `/threads/${threadId}/history`, { limit: 100 });
}

// Sends `text` in a new thread and waits for `answer`; the thread id.
async function converse(page, text, answer) {
  await page.send(text);
  await page.answer(answer);
  const threadId = await page.threadId();
  assert(threadId, "the page has no thread id after a run");
  return threadId;
}

// Waits for the approval card of `tool`; the thread id.
async function approval(page, text, tool) {
  await page.send(text);
  await page.page.locator(`#interrupt[data-action=${tool}]`).waitFor();
  await page.idle();
  const threadId = await page.threadId();
  // The pause is announced a moment before the run has saved its status and ended.
  await until("the thread waiting for approval to be interrupted", async () => {
    const thread = await call("GET", `/threads/${threadId}`);
    return thread.status === "interrupted" ? thread : null;
  });
  return threadId;
}

async function files(page) {
  return page.page.$$eval(".file", (items) =>
    Object.fromEntries(items.map((i) => [i.dataset.path, i.querySelector(".file-content").textContent])),
  );
}

async function expectNoInterrupt(page, threadId) {
  await page.page.locator("#status[data-interrupt=false]").waitFor();
  assert((await page.page.locator("#interrupt").count()) === 0, "the approval card is still shown");
  const thread = await call("GET", `/threads/${threadId}`);
  assert(thread.status === "idle", "the thread is not idle", thread.status);
  const state = await threadState(threadId);
  assert(!state.values.__interrupt__, "the state still holds an interrupt", state.values.__interrupt__);
  assert((state.next ?? []).length === 0, "the state still has next steps", state.next);
  assert(
    (state.tasks ?? []).every((t) => !(t.interrupts ?? []).length),
    "the state still has task interrupts",
    state.tasks,
  );
}

const flows = {
  // The page reaches the server from its own origin (CORS): /info and a thread search.
  async connect(page) {
    await page.page.locator("#threads[data-loaded=true]").waitFor();
    const info = page.requests.find((r) => r.path === "/info");
    assert(info?.status === 200, "GET /info did not answer 200", info?.status);
  },

  // A message streams in, each message shown once with the id the state keeps; the next run
  // of the thread and a reload show the same ids.
  async send_and_stream(page) {
    const threadId = await converse(page, "hello there", "Hello from the scripted model.");
    const body = page.lastRunBody();
    for (const mode of ["values", "messages-tuple"]) {
      assert(body.stream_mode.includes(mode), `the run did not ask for ${mode}`, body.stream_mode);
    }
    const run = page.runs()[0];
    assert(
      run.responseHeaders["content-type"]?.startsWith("text/event-stream"),
      "the run stream is not text/event-stream",
      run.responseHeaders,
    );
    assert(/\/runs\/[^/]+$/.test(run.responseHeaders["content-location"] ?? ""), "no Content-Location", run.responseHeaders);
    let shown = await page.messages();
    assert(
      shown.length === 2 && shown[0].type === "human" && shown[0].text === "hello there" && shown[1].type === "ai",
      "the thread does not show the question and its answer",
      shown,
    );
    const state = await threadState(threadId);
    assert(
      JSON.stringify(state.values.messages.map((m) => m.id)) === JSON.stringify(shown.map((m) => m.id)),
      "the page shows other message ids than the state holds",
      { shown: shown.map((m) => m.id), state: state.values.messages.map((m) => m.id) },
    );
    await page.send("and again");
    await page.answer("Hello again.");
    shown = await page.messages();
    assert(
      JSON.stringify(shown.map((m) => m.type)) === JSON.stringify(["human", "ai", "human", "ai"]),
      "a second run does not show four messages",
      shown,
    );
    const before = shown.map((m) => m.id);
    await page.goto(threadId);
    await page.page.locator(".message").nth(3).waitFor();
    await page.idle();
    shown = await page.messages();
    assert(
      JSON.stringify(shown.map((m) => m.id)) === JSON.stringify(before),
      "after a reload the page shows other messages",
      { before, after: shown },
    );
  },

  // The thread shows in the list of the graph's threads and opens from there.
  async thread_list(page) {
    const threadId = await converse(page, "list me", "Listed.");
    await page.page.click("#refresh-threads");
    const entry = page.page.locator(`.thread[data-thread-id="${threadId}"]`);
    await entry.waitFor();
    const title = await entry.textContent();
    assert(title === "list me", "the thread's title is not its first message", title);
    await page.page.click("#new-thread");
    await page.page.locator(".message").first().waitFor({ state: "detached" });
    await entry.click();
    await page.page.locator(".message[data-type=ai] .text", { hasText: "Listed." }).waitFor();
    await page.idle();
  },

  async approve(page) {
    const threadId = await approval(page, "approve the file", "write_file");
    await page.page.click("#approve");
    await page.answer("Approved and written.");
    const body = page.lastRunBody();
    assert(
      JSON.stringify(body.command) === JSON.stringify({ resume: { decisions: [{ type: "approve" }] } }),
      "the resume sent is not the approval",
      body.command,
    );
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(shown["/approved.md"] === "approved\n", "the approved file is not in the state", shown);
  },

  async edit(page) {
    const threadId = await approval(page, "edit the file", "write_file");
    await page.page.fill("#edit-args", JSON.stringify({ file_path: "/edited.md", content: "edited\n" }));
    await page.page.click("#edit");
    await page.answer("Edited and written.");
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(shown["/edited.md"] === "edited\n", "the edited file is not in the state", shown);
  },

  async reject(page) {
    const threadId = await approval(page, "reject the file", "write_file");
    await page.page.fill("#reject-message", "No, thanks.");
    await page.page.click("#reject");
    await page.answer("Understood, not written.");
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(!("/rejected.md" in shown), "the rejected file was written", shown);
    const tool = (await page.messages()).find((m) => m.type === "tool");
    assert(tool?.text.includes("No, thanks."), "the tool result does not carry the rejection", tool);
  },

  // agent-chat-ui's "Mark as resolved": command.goto "__end__" ends the paused turn.
  async mark_resolved(page) {
    const threadId = await approval(page, "resolve the file", "write_file");
    await page.page.click("#resolve");
    await until("a run with goto __end__", () => page.lastRunBody().command?.goto === "__end__");
    await until("the resolving run to be answered", () => page.runs().at(-1).status);
    await page.idle();
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(!("/resolved.md" in shown), "the resolved call ran", shown);
    await page.send("what now");
    await page.answer("A new turn.");
    await expectNoInterrupt(page, threadId);
  },

  // Typing while an approval waits: a tool message for the dangling call, then the message.
  async type_while_waiting(page) {
    const threadId = await approval(page, "wait for me", "write_file");
    await page.send("never mind, just say hi");
    await page.answer("Fine, nothing written.");
    const input = page.lastRunBody().input.messages;
    assert(
      input.length === 2 && input[0].type === "tool" && input[0].tool_call_id === "w_wait" && input[1].type === "human",
      "the page did not send the tool reply and the message",
      input,
    );
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(!("/waiting.md" in shown), "the dangling call ran", shown);
    const state = await threadState(threadId);
    const kinds = state.values.messages.map((m) => m.type);
    assert(
      JSON.stringify(kinds) === JSON.stringify(["human", "ai", "tool", "human", "ai"]),
      "the thread does not hold the call, its reply, the new message and the answer",
      state.values.messages,
    );
    assert(
      textOf(state.values.messages[2].content) === "Successfully handled tool call.",
      "the tool reply is not the page's",
      state.values.messages[2],
    );
  },

  // Todos and files as deep-agents-ui reads them from the state.
  async files_and_todos(page) {
    const threadId = await approval(page, "plan the notes", "write_file");
    const todos = await page.page.$$eval(".todo", (items) => items.map((i) => [i.textContent, i.dataset.status]));
    assert(
      JSON.stringify(todos) ===
        JSON.stringify([
          ["Write the notes", "in_progress"],
          ["Check them", "pending"],
        ]),
      "the todos are not shown from the state",
      todos,
    );
    await page.page.click("#approve");
    await page.answer("Noted.");
    await expectNoInterrupt(page, threadId);
    const shown = await files(page);
    assert(shown["/notes.md"] === "# Notes\n", "the written file is not shown from the state", shown);
    const state = await threadState(threadId);
    assert(state.values.files["/notes.md"], "the state holds no /notes.md", state.values.files);
  },

  // Regenerate: a run from the answer's parent checkpoint; the new answer replaces the old one
  // in the view, the history keeps both, and the page offers both branches.
  async regenerate(page) {
    const threadId = await converse(page, "regenerate this", "An answer to regenerate.");
    const before = await page.messages();
    assert(before.length === 2, "the thread does not show the question and its answer", before);
    const oldAnswer = before[1].id;
    const parent = await page.page.locator(`.message[data-id="${oldAnswer}"]`).getAttribute("data-parent-checkpoint");
    assert(parent, "the answer has no parent checkpoint in the page's history (getMessagesMetadata)");
    const runsBefore = page.runs().length;
    await page.page.click(`.message[data-id="${oldAnswer}"] .regenerate`);
    await until("the regenerating run", () => page.runs().length > runsBefore);
    await until("the regenerating run to end", () => page.runs().at(-1).status);
    await page.idle();
    const body = page.lastRunBody();
    assert(body.checkpoint?.checkpoint_id === parent, "the run was not sent from the parent checkpoint", body.checkpoint);
    const after = await until("one new answer", async () => {
      const shown = await page.messages();
      return shown.length === 2 && shown[1].type === "ai" && shown[1].id !== oldAnswer ? shown : null;
    }, 10_000).catch(async (e) => {
      throw new Error(`${e.message}; shown: ${describe(await page.messages())}`);
    });
    assert(after[1].text === "An answer to regenerate.", "the new answer is not the script's", after[1]);
    const states = await history(threadId);
    const ids = new Set(states.flatMap((s) => (s.values?.messages ?? []).map((m) => m.id)));
    assert(ids.has(oldAnswer) && ids.has(after[1].id), "the history does not hold both answers", [...ids]);
    const head = await threadState(threadId);
    assert(
      JSON.stringify(head.values.messages.map((m) => m.id)) === JSON.stringify(after.map((m) => m.id)),
      "the thread's head is not the regenerated branch",
      head.values.messages,
    );
    await page.page.locator(".branch[data-count='2']").first().waitFor();
  },

  // Edit: the edited message from the human message's parent checkpoint; the new exchange
  // replaces the old one in the view, the history keeps both.
  async edit_message(page) {
    const threadId = await converse(page, "first version", "Answer to the first version.");
    const before = await page.messages();
    const human = before[0];
    const parent = await page.page.locator(`.message[data-id="${human.id}"]`).getAttribute("data-parent-checkpoint");
    assert(parent, "the human message has no parent checkpoint in the page's history (getMessagesMetadata)");
    await page.page.click(`.message[data-id="${human.id}"] .edit`);
    await page.page.fill(".edit-input", "second version");
    const runsBefore = page.runs().length;
    await page.page.click(".edit-save");
    await until("the editing run", () => page.runs().length > runsBefore);
    await page.answer("Answer to the second version.");
    const body = page.lastRunBody();
    assert(body.checkpoint?.checkpoint_id === parent, "the run was not sent from the parent checkpoint", body.checkpoint);
    const after = await page.messages();
    assert(
      JSON.stringify(after.map((m) => m.text)) ===
        JSON.stringify(["second version", "Answer to the second version."]),
      "the edited exchange does not replace the old one",
      after,
    );
    const states = await history(threadId);
    const texts = new Set(states.flatMap((s) => (s.values?.messages ?? []).map((m) => textOf(m.content))));
    assert(texts.has("first version") && texts.has("second version"), "the history does not hold both versions", [
      ...texts,
    ]);
    // Regenerating the new answer forks the edited branch, not the first one.
    const answer = after[1];
    const runs = page.runs().length;
    await page.page.click(`.message[data-id="${answer.id}"] .regenerate`);
    await until("the regenerating run", () => page.runs().length > runs);
    await until("the regenerating run to end", () => page.runs().at(-1).status);
    await page.idle();
    const regenerated = await page.messages();
    const head = (await threadState(threadId)).values.messages.map((m) => textOf(m.content));
    assert(
      JSON.stringify(regenerated.map((m) => m.text)) ===
        JSON.stringify(["second version", "Answer to the second version."]) &&
        regenerated[1].id !== answer.id &&
        JSON.stringify(head) === JSON.stringify(regenerated.map((m) => m.text)),
      "regenerating the edited exchange's answer does not give a new answer to the edited message",
      { regenerated, threadHead: head, sentFrom: page.lastRunBody().checkpoint },
    );
    // agent-chat-ui's branch switcher: the first question and the edited one.
    await page.page.locator(".message[data-type=human] .branch[data-count]").first().waitFor();
  },

  // Stop: the page cancels the run on the server (reconnectOnMount keeps its id).
  async stop(page) {
    await page.send("sleep long");
    await page.page.locator(".message[data-type=ai] .tool-call[data-name=execute]").waitFor();
    const threadId = await page.threadId();
    const runs = await call("GET", `/threads/${threadId}/runs`);
    assert(runs.length === 1 && runs[0].status === "running", "the run is not running", runs);
    await page.page.click("#stop");
    await page.idle();
    const cancelled = await until(
      "the run to be cancelled",
      async () => {
        const run = await call("GET", `/threads/${threadId}/runs/${runs[0].run_id}`);
        return run.status === "interrupted" ? run : null;
      },
      15_000,
    );
    assert(cancelled.status === "interrupted", "the run was not cancelled", cancelled);
    assert(
      page.requests.some((r) => r.method === "POST" && r.path.startsWith(`/threads/${threadId}/runs/${runs[0].run_id}/cancel`)),
      "the page sent no cancel",
    );
    const thread = await until("the thread to be idle", async () => {
      const t = await call("GET", `/threads/${threadId}`);
      return t.status === "idle" ? t : null;
    });
    assert(thread.status === "idle", "the thread is not idle after Stop", thread);
    const shown = await page.messages();
    assert(!shown.some((m) => m.text.includes("Slept.")), "the stopped run went on", shown);
  },

  // Reload mid-run: the page rejoins the run (reconnectOnMount) and shows its end.
  async rejoin(page) {
    await page.send("sleep briefly");
    await page.page.locator(".message[data-type=ai] .tool-call[data-name=execute]").waitFor();
    const threadId = await page.threadId();
    const [run] = await call("GET", `/threads/${threadId}/runs`);
    assert(run?.status === "running", "the run is not running", run);
    const stored = await page.page.evaluate((t) => sessionStorage.getItem(`lg:stream:${t}`), threadId);
    assert(stored === run.run_id, "the page did not keep the run id for rejoining", stored);
    await page.page.reload();
    const join = await until("the page to rejoin the run", () =>
      page.requests.find((r) => r.method === "GET" && r.path.startsWith(`/threads/${threadId}/runs/${run.run_id}/stream`)),
    );
    const status = (await call("GET", `/threads/${threadId}/runs/${run.run_id}`)).status;
    assert(status === "running", "the run ended before the page rejoined it (sleep longer)", status);
    await page.page.locator("#status[data-loading=true]").waitFor();
    await page.answer("Woke up.");
    assert(join.headers["last-event-id"] === "-1", "the rejoin did not ask for the whole stream", join.headers);
    const shown = await page.messages();
    assert(
      JSON.stringify(shown.map((m) => m.type)) === JSON.stringify(["human", "ai", "tool", "ai"]),
      "the rejoined run does not show the whole turn",
      shown,
    );
  },
};

async function main() {
  const unknown = flowNames.filter((name) => !flows[name]);
  if (!api || !flowNames.length || unknown.length) {
    console.error(`usage: usestream.cjs API_URL FLOW...; flows: ${Object.keys(flows).join(" ")}`);
    process.exit(2);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), "usestream-"));
  const started = Date.now();
  await bundle(dir);
  const { server, url } = await serveStatic(dir);
  const browser = await chromium.launch({
    executablePath: process.env.DEEPAGENTS_TEST_CHROMIUM,
    args: ["--headless", "--no-sandbox", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
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
