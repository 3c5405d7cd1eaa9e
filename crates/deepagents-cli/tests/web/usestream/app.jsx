// A LangGraph web client in the style of agent-chat-ui, on the official JS SDK's React
// `useStream`: what a LangGraph user's page does against `deepagents serve`. The browser test
// (tests/web/usestream.cjs) bundles it with esbuild, serves it from another origin and drives it
// through the DOM. `?api=URL` names the server; `?threadId=ID` is the thread, kept in the URL
// as agent-chat-ui keeps it, so a reload rejoins it.

import React, { useCallback, useEffect, useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);
const apiUrl = params.get("api");

// Every message list rendered, and any that showed one id twice (even for one frame).
window.__renders = [];
window.__duplicates = [];

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

const DO_NOT_RENDER = "do-not-render-";

// agent-chat-ui's ensureToolCallsHaveResponses: a reply for every tool call left without one
// (an approval still waiting), sent before the new human message.
function ensureToolCallsHaveResponses(messages) {
  const replies = [];
  messages.forEach((message, index) => {
    if (message.type !== "ai" || !message.tool_calls?.length) return;
    const following = messages[index + 1];
    if (following && following.type === "tool") return;
    for (const call of message.tool_calls) {
      replies.push({
        type: "tool",
        tool_call_id: call.id ?? "",
        id: `${DO_NOT_RENDER}${crypto.randomUUID()}`,
        name: call.name,
        content: "Successfully handled tool call.",
      });
    }
  });
  return replies;
}

const RUN_OPTIONS = { streamMode: ["values"], streamSubgraphs: true, streamResumable: true };

function fileText(file) {
  if (typeof file === "string") return file;
  if (Array.isArray(file?.content)) return file.content.join("\n");
  return file?.content ?? "";
}

function Message({ stream, message }) {
  const meta = stream.getMessagesMetadata(message);
  const parentCheckpoint = meta?.firstSeenState?.parent_checkpoint;
  const [editing, setEditing] = useState(null);
  const regenerate = () =>
    stream.submit(undefined, { ...RUN_OPTIONS, checkpoint: parentCheckpoint });
  const saveEdit = () => {
    const edited = { type: "human", content: editing };
    setEditing(null);
    stream.submit(
      { messages: [edited] },
      {
        ...RUN_OPTIONS,
        checkpoint: parentCheckpoint,
        optimisticValues: (prev) => {
          const values = meta?.firstSeenState?.values;
          if (!values) return prev;
          return { ...values, messages: [...(values.messages ?? []), edited] };
        },
      },
    );
  };
  const options = meta?.branchOptions ?? [];
  const at = options.indexOf(meta?.branch);
  return (
    <li
      className="message"
      data-id={message.id}
      data-type={message.type}
      data-parent-checkpoint={parentCheckpoint?.checkpoint_id ?? ""}
    >
      <span className="type">{message.type}</span>: <span className="text">{textOf(message.content)}</span>
      {message.tool_calls?.length ? (
        <span className="tool-calls">
          {message.tool_calls.map((call) => (
            <span key={call.id} className="tool-call" data-name={call.name}>
              {call.name}({JSON.stringify(call.args)})
            </span>
          ))}
        </span>
      ) : null}
      {options.length > 1 ? (
        <span className="branch" data-count={options.length}>
          <button className="branch-prev" onClick={() => stream.setBranch(options[at - 1])} disabled={at <= 0}>
            ‹
          </button>
          {at + 1}/{options.length}
          <button
            className="branch-next"
            onClick={() => stream.setBranch(options[at + 1])}
            disabled={at >= options.length - 1}
          >
            ›
          </button>
        </span>
      ) : null}
      {message.type === "ai" ? (
        <button className="regenerate" onClick={regenerate} disabled={stream.isLoading}>
          Regenerate
        </button>
      ) : null}
      {message.type === "human" && editing == null ? (
        <button className="edit" onClick={() => setEditing(textOf(message.content))} disabled={stream.isLoading}>
          Edit
        </button>
      ) : null}
      {editing != null ? (
        <span>
          <input className="edit-input" value={editing} onChange={(e) => setEditing(e.target.value)} />
          <button className="edit-save" onClick={saveEdit}>
            Save
          </button>
        </span>
      ) : null}
    </li>
  );
}

function Interrupt({ stream }) {
  const all = stream.interrupt;
  const interrupt = Array.isArray(all) ? all[0] : all;
  const request = interrupt?.value?.action_requests?.[0] ?? interrupt?.value?.actionRequests?.[0];
  const [editedArgs, setEditedArgs] = useState("");
  const [rejection, setRejection] = useState("");
  useEffect(() => setEditedArgs(request ? JSON.stringify(request.args) : ""), [request?.name, JSON.stringify(request?.args)]);
  if (!interrupt) return null;
  const resume = (decision) =>
    stream.submit({}, { ...RUN_OPTIONS, command: { resume: { decisions: [decision] } } });
  return (
    <div id="interrupt" data-action={request?.name ?? ""}>
      <div className="action-name">{request?.name}</div>
      <div className="action-args">{JSON.stringify(request?.args)}</div>
      <div className="action-description">{request?.description}</div>
      <button id="approve" onClick={() => resume({ type: "approve" })}>
        Approve
      </button>
      <textarea id="edit-args" value={editedArgs} onChange={(e) => setEditedArgs(e.target.value)} />
      <button
        id="edit"
        onClick={() => resume({ type: "edit", edited_action: { name: request.name, args: JSON.parse(editedArgs) } })}
      >
        Edit
      </button>
      <input id="reject-message" value={rejection} onChange={(e) => setRejection(e.target.value)} />
      <button id="reject" onClick={() => rejection.trim() && resume({ type: "reject", message: rejection })}>
        Reject
      </button>
      <button id="resolve" onClick={() => stream.submit({}, { ...RUN_OPTIONS, command: { goto: "__end__" } })}>
        Mark as resolved
      </button>
    </div>
  );
}

function Threads({ stream, threadId, setThreadId }) {
  const [threads, setThreads] = useState(null);
  const [error, setError] = useState(null);
  const refresh = useCallback(() => {
    stream.client.threads
      .search({ metadata: { graph_id: "agent" }, limit: 100 })
      .then((found) => {
        setThreads(found);
        setError(null);
      })
      .catch((e) => setError(String(e)));
  }, [stream.client]);
  useEffect(refresh, [refresh]);
  return (
    <div id="threads" data-loaded={threads != null ? "true" : "false"}>
      <button id="refresh-threads" onClick={refresh}>
        Refresh
      </button>
      <button id="new-thread" onClick={() => setThreadId(null)}>
        New thread
      </button>
      {error ? <div id="threads-error">{error}</div> : null}
      <ul>
        {(threads ?? []).map((thread) => (
          <li
            key={thread.thread_id}
            className="thread"
            data-thread-id={thread.thread_id}
            data-current={thread.thread_id === threadId ? "true" : "false"}
            onClick={() => setThreadId(thread.thread_id)}
          >
            {textOf(thread.values?.messages?.[0]?.content) || thread.thread_id}
          </li>
        ))}
      </ul>
    </div>
  );
}

function App() {
  const [threadId, setThreadId] = useThreadIdParam();
  const [connection, setConnection] = useState("connecting");
  const [input, setInput] = useState("");
  useEffect(() => {
    fetch(`${apiUrl}/info`)
      .then((res) => setConnection(res.ok ? "connected" : `failed: ${res.status}`))
      .catch((e) => setConnection(`failed: ${e}`));
  }, []);
  const stream = useStream({
    apiUrl,
    assistantId: "agent",
    threadId,
    onThreadId: setThreadId,
    messagesKey: "messages",
    fetchStateHistory: true,
    reconnectOnMount: true,
  });
  const messages = stream.messages.filter((m) => !m.id?.startsWith(DO_NOT_RENDER));
  const ids = messages.map((m) => m.id);
  window.__renders.push(ids);
  const duplicates = ids.filter((id, i) => ids.indexOf(id) !== i);
  if (duplicates.length) window.__duplicates.push({ ids, duplicates });
  const values = stream.values ?? {};
  const send = () => {
    const text = input.trim();
    if (!text) return;
    setInput("");
    const human = { id: crypto.randomUUID(), type: "human", content: text };
    const toolMessages = ensureToolCallsHaveResponses(stream.messages);
    stream.submit(
      { messages: [...toolMessages, human] },
      {
        ...RUN_OPTIONS,
        optimisticValues: (prev) => ({
          ...prev,
          messages: [...(prev.messages ?? []), ...toolMessages, human],
        }),
      },
    );
  };
  const interrupt = stream.interrupt;
  return (
    <main>
      <div id="connection">{connection}</div>
      <div
        id="status"
        data-loading={stream.isLoading ? "true" : "false"}
        data-thread={threadId ?? ""}
        data-interrupt={interrupt ? "true" : "false"}
      >
        {stream.isLoading ? "running" : "idle"}
      </div>
      {stream.error ? <div id="error">{String(stream.error?.message ?? stream.error)}</div> : null}
      <Threads stream={stream} threadId={threadId} setThreadId={setThreadId} />
      <ul id="messages">
        {messages.map((message, index) => (
          // agent-chat-ui's key: the id, or (for an edited message not yet in the state) its place.
          <Message key={message.id || `${message.type}-${index}`} stream={stream} message={message} />
        ))}
      </ul>
      <Interrupt stream={stream} />
      <div id="composer">
        <input id="input" value={input} onChange={(e) => setInput(e.target.value)} />
        <button id="send" onClick={send}>
          Send
        </button>
        <button id="stop" onClick={() => stream.stop()} disabled={!stream.isLoading}>
          Stop
        </button>
      </div>
      <ul id="todos">
        {(values.todos ?? []).map((todo, i) => (
          <li key={todo.id ?? i} className="todo" data-status={todo.status}>
            {todo.content}
          </li>
        ))}
      </ul>
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
