// A page on `@langchain/react`'s v2 `useStream`, written as its README shows: what a user of
// the package's thread-centric ("v2") streaming protocol runs against `deepagents serve`. The
// browser test (tests/web/react_v2.cjs) bundles it with esbuild, serves it from another origin
// and drives it through the DOM. `?api=URL` names the server; `?threadId=ID` is the thread,
// kept in the URL so a reload opens it again.

import React, { useCallback, useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/react";

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("api");

// Every message list rendered, any that showed one id twice (even for one frame), and any
// that showed one text twice (the flows' texts are all different).
window.__renders = [];
window.__duplicates = [];
window.__shownTwice = [];

function useThreadIdParam() {
  const [threadId, setThreadId] = useState(params.get("threadId"));
  const update = useCallback((id) => {
    const url = new URL(window.location.href);
    if (id) url.searchParams.set("threadId", id);
    else url.searchParams.delete("threadId");
    window.history.replaceState(null, "", url);
    setThreadId(id ?? null);
  }, []);
  return [threadId, update];
}

function textOf(content) {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) {
    return content
      .map((block) => (typeof block === "string" ? block : block?.type === "text" ? block.text : ""))
      .join("");
  }
  return "";
}

// The package hands out @langchain/core message instances; older payloads are plain objects.
function typeOf(message) {
  return message.type ?? message.getType?.() ?? "";
}

function fileText(file) {
  if (typeof file === "string") return file;
  if (Array.isArray(file?.content)) return file.content.join("\n");
  return file?.content ?? "";
}

function Message({ message }) {
  const calls = message.tool_calls ?? [];
  return (
    <li className="message" data-id={message.id} data-type={typeOf(message)}>
      <span className="type">{typeOf(message)}</span>: <span className="text">{textOf(message.content)}</span>
      {calls.length ? (
        <span className="tool-calls">
          {calls.map((call) => (
            <span key={call.id} className="tool-call" data-name={call.name}>
              {call.name}({JSON.stringify(call.args)})
            </span>
          ))}
        </span>
      ) : null}
    </li>
  );
}

function Interrupt({ stream }) {
  const interrupt = stream.interrupt;
  if (!interrupt) return null;
  const request = interrupt.value?.action_requests?.[0];
  const allowed = interrupt.value?.review_configs?.[0]?.allowed_decisions ?? [];
  return (
    <div id="interrupt" data-action={request?.name ?? ""} data-allowed={allowed.join(",")}>
      <div className="action-name">{request?.name}</div>
      <div className="action-args">{JSON.stringify(request?.args ?? null)}</div>
      <button id="approve" onClick={() => stream.respond({ decisions: [{ type: "approve" }] })}>
        Approve
      </button>
    </div>
  );
}

function App() {
  const [threadId, setThreadId] = useThreadIdParam();
  const [input, setInput] = useState("");
  const stream = useStream({ apiUrl, assistantId: "agent", threadId, onThreadId: setThreadId });
  const ids = stream.messages.map((m) => m.id);
  window.__renders.push(ids);
  const duplicates = ids.filter((id, i) => ids.indexOf(id) !== i);
  if (duplicates.length) window.__duplicates.push({ ids, duplicates });
  const texts = stream.messages.map((m) => textOf(m.content)).filter((text) => text);
  const twice = texts.filter((text, i) => texts.indexOf(text) !== i);
  if (twice.length) window.__shownTwice.push({ ids, twice });
  const values = stream.values ?? {};
  const send = () => {
    const text = input.trim();
    if (!text) return;
    setInput("");
    stream.submit({ messages: [{ type: "human", content: text }] });
  };
  return (
    <main>
      <div
        id="status"
        data-loading={stream.isLoading ? "true" : "false"}
        data-thread-loading={stream.isThreadLoading ? "true" : "false"}
        data-thread={threadId ?? ""}
        data-interrupt={stream.interrupt ? "true" : "false"}
      >
        {stream.isLoading ? "running" : "idle"}
      </div>
      {stream.error ? <div id="error">{String(stream.error?.message ?? stream.error)}</div> : null}
      <ul id="messages">
        {stream.messages.map((message) => (
          <Message key={message.id} message={message} />
        ))}
      </ul>
      <Interrupt stream={stream} />
      <div id="composer">
        <input id="input" value={input} onChange={(e) => setInput(e.target.value)} />
        <button id="send" onClick={send} disabled={stream.isLoading}>
          Send
        </button>
      </div>
      <ul id="files">
        {Object.entries(values.files ?? {}).map(([path, file]) => (
          <li key={path} className="file" data-path={path}>
            <span className="file-content">{fileText(file)}</span>
          </li>
        ))}
      </ul>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
