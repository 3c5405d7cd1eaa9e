// The chat page of `deepagents serve`: a client of the server's LangGraph Platform API like
// any other (docs/server.md), written without a framework or a build step so it can be read
// as an example. It lists threads (`POST /threads/search`), reopens one (`GET
// /threads/{id}/state`), streams runs (`POST /threads/{id}/runs/stream`, read as server-sent
// events from `fetch`), stops them (`POST …/runs/{run}/cancel`) and answers approvals (a run
// with `command.resume`).
//
// Model and tool output is only ever put in the page as text (`textContent`, `append` of
// strings): nothing it says is parsed as markup.
'use strict';

const $ = (id) => document.getElementById(id);
// The hint of an empty conversation (the script runs once the page is parsed: `defer`).
const EMPTY = $('empty');
const KEY_STORE = 'deepagents.apiKey';
// Tokens as they stream, each state as it is saved, and our own events (tool calls starting
// and ending, usage, cost); subagents' frames too, namespaced `mode|tools:CALL`.
const STREAM = { stream_mode: ['messages-tuple', 'values', 'deepagents'], stream_subgraphs: true };
// Arguments that say best what a call does, shown on its collapsed line.
const PREVIEW_KEYS = ['file_path', 'path', 'command', 'question', 'description', 'pattern', 'query', 'url'];

const ui = {
  thread: null, // the open thread's id; null: a new thread, created with the first message
  assistant: 'agent',
  run: null, // the run streaming now: {path, stopping, outcome, failed, spent}
  interrupt: null, // the interrupt waiting for decisions
  messages: new Map(), // message id -> {el, text, tools, calls}
  cards: new Map(), // tool call id -> its card (see card())
  files: {}, // the thread's files, by path
  openFile: null,
  tokens: 0, // tokens the streaming run's model calls used so far
};

/** An element with a class and text (as text, never markup). */
function h(tag, className, text) {
  const el = document.createElement(tag);
  if (className) el.className = className;
  if (text !== undefined) el.textContent = text;
  return el;
}

function button(label, onClick, className) {
  const el = h('button', className, label);
  el.type = 'button';
  el.addEventListener('click', onClick);
  return el;
}

function status(text, isError = false) {
  $('status').textContent = text || '';
  $('status').classList.toggle('error', isError);
}

const enc = encodeURIComponent;

/** The text of LangChain message content: a string, or a list of blocks. */
function textOf(content) {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  return content
    .map((block) => (block.type === 'text' ? block.text : block.type === 'image' ? '[image]' : ''))
    .join('');
}

// ---- The API, with the key ----------------------------------------------------------------

let askingKey = null; // the key dialog's answer while it is open, shared by every refused call

/** Shows the key dialog; resolves once a key (or none, to forget it) is given. */
function askKey(refused) {
  if (!askingKey) {
    askingKey = new Promise((resolve) => {
      $('key-error').textContent = refused ? 'The server refused that key.' : '';
      $('key-input').value = '';
      $('key-form').onsubmit = (event) => {
        event.preventDefault();
        const key = $('key-input').value.trim();
        if (key) localStorage.setItem(KEY_STORE, key);
        else localStorage.removeItem(KEY_STORE);
        $('key-dialog').close();
        askingKey = null;
        resolve();
      };
      $('key-dialog').showModal();
    });
  }
  return askingKey;
}

/** A call of the API; a 401 asks for the key and tries again, other failures throw. */
async function api(method, path, body) {
  for (;;) {
    const headers = {};
    const key = localStorage.getItem(KEY_STORE);
    if (key) headers['x-api-key'] = key;
    if (body !== undefined) headers['content-type'] = 'application/json';
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    if (response.status === 401) {
      await askKey(Boolean(key));
      continue;
    }
    if (!response.ok) {
      let detail = response.statusText;
      try {
        const error = await response.json();
        detail = error.detail || error.message || detail;
      } catch {
        // Not JSON: the status says enough.
      }
      throw new Error(`${method} ${path}: ${response.status} ${detail}`);
    }
    return response;
  }
}

const getJson = async (method, path, body) => (await api(method, path, body)).json();

/** The frames of a `text/event-stream` response: `{event, data}` with `data` parsed. */
async function* frames(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    // The server ends lines with `\n` alone; a blank line ends a frame.
    buffer += value;
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        const colon = line.indexOf(':');
        if (colon <= 0) continue; // a comment (`: …`) or a field without a value
        const field = line.slice(0, colon);
        const text = line.slice(colon + 1).replace(/^ /, '');
        if (field === 'event') event = text;
        else if (field === 'data') data.push(text);
      }
      if (data.length) yield { event, data: JSON.parse(data.join('\n')) };
    }
  }
}

// ---- Threads ------------------------------------------------------------------------------

function threadLabel(values) {
  const first = (values?.messages || []).find((message) => message.type === 'human');
  return first ? textOf(first.content).slice(0, 80) || '(no text)' : 'Empty thread';
}

async function loadThreads() {
  const threads = await getJson('POST', '/threads/search', {
    limit: 50,
    sort_by: 'updated_at',
    sort_order: 'desc',
  });
  $('threads').replaceChildren(
    ...threads.map((thread) => {
      const item = h('li');
      const open = button('', () => openThread(thread.thread_id).catch((error) => status(error.message, true)));
      open.dataset.thread = thread.thread_id;
      if (thread.thread_id === ui.thread) open.setAttribute('aria-current', 'true');
      const when = new Date(thread.updated_at).toLocaleString([], { dateStyle: 'short', timeStyle: 'short' });
      const waiting = thread.status === 'interrupted' ? ' · waiting for you' : '';
      open.append(h('span', 'label', threadLabel(thread.values)), h('span', 'meta', when + waiting));
      item.append(open);
      return item;
    }),
  );
}

function closePanels() {
  $('sidebar').classList.remove('open');
  $('state-panel').classList.remove('open');
}

/** Empties the conversation and the panels, for another thread. */
function clearView() {
  ui.messages.clear();
  ui.cards.clear();
  ui.openFile = null;
  $('transcript').replaceChildren(EMPTY);
  EMPTY.hidden = false;
  applyValues({}, true);
  $('title').textContent = 'New thread';
  $('cost').textContent = '';
  status('');
}

function newThread() {
  if (ui.run) return status('Stop the run first.');
  ui.thread = null;
  clearView();
  closePanels();
  for (const open of $('threads').querySelectorAll('button')) open.removeAttribute('aria-current');
  $('input').focus();
}

async function openThread(id) {
  if (ui.run) return status('Stop the run first.');
  ui.thread = id;
  clearView();
  closePanels();
  for (const open of $('threads').querySelectorAll('button')) {
    if (open.dataset.thread === id) open.setAttribute('aria-current', 'true');
    else open.removeAttribute('aria-current');
  }
  const state = await getJson('GET', `/threads/${enc(id)}/state`);
  // Another thread may have been opened meanwhile.
  if (ui.thread === id) applyValues(state.values || {}, true);
}

// ---- The conversation ---------------------------------------------------------------------

/** The element of message `id`, made (at the end of the transcript) if it is new. */
function entryFor(id, type) {
  let entry = ui.messages.get(id);
  if (!entry) {
    const el = h('div', `msg ${type}`);
    entry = { el, text: h('div', 'text'), tools: h('div', 'tools'), calls: [] };
    el.append(entry.text, entry.tools);
    $('transcript').append(el);
    ui.messages.set(id, entry);
    EMPTY.hidden = true;
  }
  return entry;
}

/** A whole message, as the state or a `messages` frame has it. */
function upsert(message) {
  if (message.type === 'tool') {
    const state = message.status === 'error' ? 'error' : 'ok';
    return toolResult(message.tool_call_id, message.name, textOf(message.content), state);
  }
  if (message.type !== 'human' && message.type !== 'ai') return;
  const entry = entryFor(message.id, message.type);
  entry.text.textContent = textOf(message.content);
  for (const call of message.tool_calls || []) setArgs(card(call.id, call.name, entry.tools), call.args);
}

/** A piece of a streaming AI message: text to add, pieces of tool calls. */
function chunk(piece) {
  const entry = entryFor(piece.id, 'ai');
  const text = textOf(piece.content);
  if (text) entry.text.append(text);
  for (const part of piece.tool_call_chunks || []) {
    // A call's id and name come with its first piece; later pieces name it by index only.
    let call = entry.calls[part.index];
    if (!call && part.id) call = entry.calls[part.index] = card(part.id, part.name, entry.tools);
    if (!call) continue;
    call.argsText += part.args || '';
    call.args.textContent = call.argsText;
  }
}

/** The collapsible card of tool call `id`, made in `parent` if it is new. */
function card(id, name, parent) {
  let found = ui.cards.get(id);
  if (found) return found;
  const el = h('details', 'tool');
  const summary = h('summary');
  const preview = h('span', 'preview');
  summary.append(h('span', 'name', name || 'tool'), preview, h('span', 'state'));
  const body = h('div', 'body');
  const args = h('pre', 'args');
  const resultLabel = h('div', 'label', 'Result');
  const result = h('pre', 'result');
  resultLabel.hidden = result.hidden = true;
  body.append(h('div', 'label', 'Arguments'), args, resultLabel, result);
  el.append(summary, body);
  el.dataset.call = id;
  parent.append(el);
  found = { el, body, args, preview, resultLabel, result, argsText: '', sub: null, subText: null };
  ui.cards.set(id, found);
  return found;
}

function setArgs(card, args) {
  card.args.textContent = JSON.stringify(args, null, 2);
  const key = PREVIEW_KEYS.find((name) => typeof args?.[name] === 'string');
  card.preview.textContent = key ? args[key].split('\n')[0].slice(0, 100) : '';
}

function toolResult(callId, name, text, state) {
  const found = ui.cards.get(callId) || card(callId, name, $('transcript'));
  found.result.textContent = text;
  found.result.hidden = found.resultLabel.hidden = false;
  found.el.classList.remove('is-running', 'is-ok', 'is-error');
  found.el.classList.add(`is-${state}`);
}

/** The box under a `task` call where its subagent's work shows. */
function subagent(callId) {
  const found = ui.cards.get(callId) || card(callId, 'task', $('transcript'));
  if (!found.sub) {
    found.sub = h('div', 'subagent');
    found.sub.append(h('div', 'label', 'Subagent'));
    found.body.insertBefore(found.sub, found.resultLabel); // its work, then what it answered
    found.el.open = true; // its work is worth watching while it runs
  }
  return found;
}

/** One of our own events (docs/PROTOCOL.md); `callId`: the subagent's `task` call, if any. */
function onEvent(callId, event) {
  const sub = callId ? subagent(callId) : null;
  switch (event.type) {
    case 'run_started':
      if (sub) sub.sub.firstChild.textContent = `Subagent: ${event.agent}`;
      break;
    case 'model_call_started':
      if (sub) sub.subText = null; // its text starts a new paragraph
      break;
    case 'model_call_finished':
      ui.tokens += (event.usage?.input_tokens || 0) + (event.usage?.output_tokens || 0);
      $('cost').textContent = `${ui.tokens.toLocaleString()} tokens…`;
      break;
    case 'tool_call_started': {
      const started = sub ? card(event.call_id, event.name, sub.sub) : ui.cards.get(event.call_id);
      if (sub) {
        setArgs(started, event.arguments);
        sub.subText = null;
      }
      started?.el.classList.add('is-running');
      break;
    }
    case 'tool_call_finished':
      // The main agent's results come as tool messages; a subagent's only here.
      if (sub) toolResult(event.call_id, event.name, textOf(event.content), event.status === 'ok' ? 'ok' : 'error');
      break;
    case 'final':
      if (!sub) {
        showSpent(event.spent, event.total_spent);
        ui.run.spent = true;
      }
      break;
    case 'error':
      if (!sub && ui.run) {
        ui.run.outcome = event.kind === 'cancelled' ? 'Stopped.' : `The run failed (${event.kind}): ${event.message}`;
        ui.run.failed = event.kind !== 'cancelled';
      }
      break;
    default:
      break; // kinds this page does not show, or does not know yet
  }
}

function showSpent(spent, total) {
  const tokens = (usage) => (usage?.input_tokens || 0) + (usage?.output_tokens || 0);
  const money = (usd) => `$${(usd || 0).toFixed(usd > 0 && usd < 0.01 ? 4 : 2)}`;
  const unpriced = spent?.unpriced_tokens ? ' (some without a known price)' : '';
  $('cost').textContent = `${money(spent?.cost_usd)} · ${tokens(spent?.usage).toLocaleString()} tokens${unpriced}`;
  $('cost').title = `This turn; the whole thread: ${money(total?.cost_usd)} · ${tokens(total?.usage).toLocaleString()} tokens`;
}

/** A subagent's streaming text, under its `task` call. */
function subagentChunk(callId, piece) {
  const text = textOf(piece.content);
  if (!text) return;
  const sub = subagent(callId);
  if (!sub.subText) sub.sub.append((sub.subText = h('div', 'text')));
  sub.subText.append(text);
}

/** A thread's state: messages, plan, files and the interrupt waiting, if any. */
function applyValues(values, whole) {
  const messages = values.messages || [];
  // The message shown as it was sent is in the state now, under its id.
  for (const [id, entry] of ui.messages) {
    if (id.startsWith('local-') || (whole && !messages.some((message) => message.id === id))) {
      entry.el.remove();
      ui.messages.delete(id);
    }
  }
  for (const message of messages) upsert(message);
  if (messages.length) $('title').textContent = threadLabel(values);
  renderTodos(values.todos || []);
  renderFiles(values.files || {});
  showInterrupt((values.__interrupt__ || [])[0] || null);
}

function renderTodos(todos) {
  const known = ['pending', 'in_progress', 'completed'];
  $('todos').replaceChildren(
    ...todos.map((todo) => h('li', known.includes(todo.status) ? todo.status : 'pending', todo.content)),
  );
  if (!todos.length) $('todos').append(h('li', 'hint', 'No plan yet.'));
}

function renderFiles(files) {
  ui.files = files;
  const paths = Object.keys(files).sort();
  $('files').replaceChildren(
    ...paths.map((path) => {
      const item = h('li');
      item.append(button(path, () => showFile(path)));
      return item;
    }),
  );
  if (!paths.length) $('files').append(h('li', 'hint', 'No files yet.'));
  showFile(ui.openFile in files ? ui.openFile : null);
}

function showFile(path) {
  ui.openFile = path;
  const file = path === null ? null : ui.files[path];
  $('file-view').hidden = !file;
  if (!file) return;
  $('file-name').textContent = path;
  const view = $('file-content');
  if (file.encoding === 'base64' && String(file.mime_type).startsWith('image/')) {
    // Allowed by the page's policy (`img-src data:`); an image runs no script.
    const img = h('img');
    img.alt = path;
    img.src = `data:${file.mime_type};base64,${file.content}`;
    view.replaceChildren(img);
  } else if (file.encoding === 'base64') {
    view.textContent = `(binary, ${file.mime_type || 'of an unknown type'})`;
  } else {
    view.textContent = Array.isArray(file.content) ? file.content.join('\n') : String(file.content ?? '');
  }
}

// ---- Approvals ----------------------------------------------------------------------------

/** The decisions an interrupt waits for: one per action request, in order, sent together. */
function showInterrupt(interrupt) {
  const box = $('approval');
  // Frames repeat the same interrupt: keep what the person typed.
  if ((interrupt?.id || '') === box.dataset.interrupt) return;
  box.dataset.interrupt = interrupt?.id || '';
  ui.interrupt = interrupt;
  box.replaceChildren();
  box.hidden = !interrupt;
  updateComposer();
  if (!interrupt) return;
  if (!Array.isArray(interrupt.value?.action_requests)) return showQuestion(box, interrupt);
  const { action_requests: actions = [], review_configs: configs = [] } = interrupt.value || {};
  const decisions = [];
  let decided = 0;
  box.append(h('h2', null, actions.length > 1 ? `${actions.length} actions wait for your decision` : 'Waiting for your decision'));
  actions.forEach((action, index) => {
    let allowed = configs[index]?.allowed_decisions || ['approve', 'reject'];
    // A question is answered (`respond`); when it may also be declined, the v1 review config
    // lists only that (`reject`), so the answer is offered whatever the config says.
    if (action.name === 'ask_user' && !allowed.includes('respond')) allowed = ['respond', ...allowed];
    const row = h('div', 'action');
    row.append(h('h3', null, action.name), h('p', 'description', action.description || ''));
    if (action.name === 'ask_user' && typeof action.args?.question === 'string') {
      row.append(h('p', 'question', action.args.question));
    } else {
      row.append(h('pre', 'args', JSON.stringify(action.args, null, 2)));
    }
    const buttons = h('div', 'buttons');
    const editor = h('div', 'editor');
    row.append(buttons, editor);
    box.append(row);

    const decide = (decision, note) => {
      decisions[index] = decision;
      decided += 1;
      buttons.replaceWith(h('p', 'decided', note));
      editor.remove();
      if (decided < actions.length) return;
      showInterrupt(null);
      stream({ command: { resume: { [interrupt.id]: { decisions } } } });
    };
    // A field to fill before the decision is sent (the edited arguments, a reason, an answer).
    const ask = (field, label, send) => {
      editor.replaceChildren(field, button(label, send, 'primary'), button('Cancel', () => editor.replaceChildren(), 'quiet'));
      field.focus();
    };
    const actionsFor = {
      approve: () => decide({ type: 'approve' }, 'Approved.'),
      edit: () => {
        const field = h('textarea');
        field.value = JSON.stringify(action.args, null, 2);
        ask(field, 'Send edit', () => {
          let args;
          try {
            args = JSON.parse(field.value);
          } catch (error) {
            return status(`The arguments are not JSON: ${error.message}`, true);
          }
          decide({ type: 'edit', edited_action: { name: action.name, args } }, 'Edited and approved.');
        });
      },
      reject: () => {
        const field = h('input');
        field.placeholder = 'Why not? (optional; the agent reads it)';
        ask(field, 'Send rejection', () => decide({ type: 'reject', message: field.value || undefined }, 'Rejected.'));
      },
      respond: () => {
        const field = h('textarea');
        field.placeholder = 'Your answer';
        ask(field, 'Send answer', () => decide({ type: 'respond', message: field.value }, 'Answered.'));
      },
    };
    const labels = { approve: 'Approve', edit: 'Edit', reject: 'Reject', respond: 'Answer' };
    for (const kind of allowed) {
      if (actionsFor[kind]) buttons.append(button(labels[kind], actionsFor[kind], kind === 'approve' ? 'primary' : ''));
    }
    // A question is there to be answered: ask for the answer at once.
    if (allowed.includes('respond') && !allowed.includes('approve')) actionsFor.respond();
  });
}

/**
 * A question a tool asked (`interrupt(value)`): `ask_user`'s `{question, options}`, an MCP
 * server's `{kind: "mcp_elicitation", message, mode, requestedSchema | url}`, or any value.
 * The answer is the resume's value itself; declining sends a rejection.
 */
function showQuestion(box, interrupt) {
  const value = interrupt.value;
  const send = (resume) => {
    showInterrupt(null);
    stream({ command: { resume: { [interrupt.id]: resume } } });
  };
  const decline = (resume) => button('Decline', () => send(resume), 'quiet');
  const row = h('div', 'action');
  const buttons = h('div', 'buttons');
  if (value?.kind === 'mcp_elicitation') {
    box.append(h('h2', null, `${value.server || 'A tool'} asks`));
    row.append(h('p', 'question', value.message || ''));
    if (value.mode === 'url') {
      // Shown, never opened for the person: it is a server's link.
      row.append(h('pre', 'args', value.url || ''));
      buttons.append(button('Done', () => send({ action: 'accept' }), 'primary'));
    } else {
      const form = elicitationForm(value.requestedSchema || {});
      row.append(form.element);
      buttons.append(button('Send answer', () => {
        const content = form.read();
        if (content) send({ action: 'accept', content });
      }, 'primary'));
    }
    buttons.append(decline({ action: 'decline' }));
    row.append(buttons);
    box.append(row);
    return;
  }
  const text = typeof value === 'string' ? value : value?.question;
  box.append(h('h2', null, 'A question for you'));
  if (typeof text === 'string') row.append(h('p', 'question', text));
  else row.append(h('pre', 'args', JSON.stringify(value, null, 2)));
  const options = Array.isArray(value?.options) ? value.options : [];
  for (const option of options) buttons.append(button(String(option), () => send(String(option))));
  const field = h('textarea');
  field.placeholder = 'Your answer';
  buttons.append(button('Send answer', () => send(field.value), 'primary'));
  buttons.append(decline({ decisions: [{ type: 'reject' }] }));
  row.append(field, buttons);
  box.append(row);
  field.focus();
}

/** Inputs for an MCP form schema's flat fields; `read` gives the values, or null if invalid. */
function elicitationForm(schema) {
  const element = h('div', 'editor');
  const required = new Set(schema.required || []);
  const fields = Object.entries(schema.properties || {}).map(([name, field]) => {
    const label = h('label', null, `${field.title || name}${required.has(name) ? ' *' : ''}`);
    let input;
    if (Array.isArray(field.enum)) {
      input = h('select');
      for (const choice of field.enum) {
        const option = h('option', null, String(choice));
        option.value = String(choice);
        input.append(option);
      }
    } else if (field.type === 'boolean') {
      input = h('input');
      input.type = 'checkbox';
    } else {
      input = h('input');
      input.type = field.type === 'number' || field.type === 'integer' ? 'number' : 'text';
    }
    if (field.default !== undefined) {
      if (input.type === 'checkbox') input.checked = Boolean(field.default);
      else input.value = String(field.default);
    }
    label.append(input);
    element.append(label);
    return { name, field, input };
  });
  const read = () => {
    const content = {};
    for (const { name, field, input } of fields) {
      if (input.type === 'checkbox') {
        content[name] = input.checked;
        continue;
      }
      if (input.value === '') {
        if (required.has(name)) {
          status(`${field.title || name} is required.`, true);
          return null;
        }
        continue;
      }
      content[name] = input.type === 'number' ? Number(input.value) : input.value;
    }
    return content;
  };
  return { element, read };
}

// ---- Runs ---------------------------------------------------------------------------------

function updateComposer() {
  const busy = Boolean(ui.run);
  $('send').disabled = busy || Boolean(ui.interrupt);
  $('stop').hidden = !busy;
  $('new-thread').disabled = busy;
  $('input').placeholder = ui.interrupt
    ? 'Decide on the action above first.'
    : 'Message the agent (Enter sends, Shift+Enter for a new line)';
}

/** Streams a run of the open thread: new input, or the decisions a pause waits for. */
async function stream(payload) {
  const thread = ui.thread;
  ui.run = { path: null, stopping: false, outcome: '', failed: false, spent: false };
  ui.tokens = 0;
  $('stop').disabled = false;
  updateComposer();
  status('Running…');
  try {
    const response = await api('POST', `/threads/${enc(thread)}/runs/stream`, {
      assistant_id: ui.assistant,
      ...STREAM,
      ...payload,
    });
    // Where the run is, for Stop: `/threads/{thread}/runs/{run}`.
    ui.run.path = response.headers.get('content-location');
    for await (const { event, data } of frames(response)) {
      const transcript = $('transcript');
      const stick = transcript.scrollHeight - transcript.scrollTop - transcript.clientHeight < 80;
      onFrame(thread, event, data);
      if (stick) transcript.scrollTop = transcript.scrollHeight;
    }
  } catch (error) {
    ui.run.outcome = error.message;
    ui.run.failed = true;
  }
  const { outcome, failed, spent } = ui.run;
  ui.run = null;
  // A run that paused or stopped has no `final` to tell its cost: its tokens, then.
  if (!spent && ui.tokens) $('cost').textContent = `${ui.tokens.toLocaleString()} tokens`;
  updateComposer();
  try {
    // The saved state is the truth: what streamed but was not kept (a stopped model call)
    // goes, and the interrupt (if the run paused) shows.
    if (ui.thread === thread) {
      const state = await getJson('GET', `/threads/${enc(thread)}/state`);
      if (ui.thread === thread) applyValues(state.values || {}, true);
    }
    await loadThreads();
  } catch (error) {
    return status(error.message, true);
  }
  status(outcome || (ui.interrupt ? 'Waiting for your decision.' : ''), failed);
}

function onFrame(thread, event, data) {
  // `mode` or `mode|tools:CALL|…`: a subagent's frame names the `task` call that started it.
  const [mode, ...namespace] = event.split('|');
  const callId = namespace.length ? namespace[namespace.length - 1].replace(/^tools:/, '') : null;
  switch (mode) {
    case 'metadata':
      ui.run.path ||= `/threads/${enc(thread)}/runs/${enc(data.run_id)}`;
      break;
    case 'messages':
      if (callId) subagentChunk(callId, data[0]);
      else if (data[0]?.type === 'AIMessageChunk') chunk(data[0]);
      else upsert(data[0]);
      break;
    case 'values':
      if (!callId) applyValues(data, false);
      break;
    case 'deepagents':
      onEvent(callId, data);
      break;
    case 'error':
      ui.run.outcome = `The run failed: ${data.message || data.error}`;
      ui.run.failed = true;
      break;
    default:
      break;
  }
}

async function send(text) {
  if (!ui.thread) {
    const thread = await getJson('POST', '/threads', {});
    ui.thread = thread.thread_id;
    // The thread in the list; the list reloads once the run ends anyway.
    loadThreads().catch(() => {});
  }
  const shown = entryFor(`local-${Date.now()}`, 'human');
  shown.text.textContent = text;
  await stream({ input: { messages: [{ role: 'user', content: text }] } });
}

async function stop() {
  const run = ui.run;
  if (!run?.path || run.stopping) return;
  run.stopping = true;
  $('stop').disabled = true;
  status('Stopping…');
  try {
    // The run stops on the server; its stream then ends, which ends stream() above.
    await api('POST', `${run.path}/cancel`);
  } catch (error) {
    status(error.message, true);
  }
}

async function loadAssistants() {
  const assistants = await getJson('POST', '/assistants/search', { limit: 100 });
  if (!assistants.length) return;
  ui.assistant = assistants[0].graph_id;
  const select = $('assistant');
  select.replaceChildren(
    ...assistants.map((assistant) => {
      const option = h('option', null, assistant.name || assistant.graph_id);
      option.value = assistant.graph_id;
      return option;
    }),
  );
  select.hidden = assistants.length < 2;
}

function init() {
  $('approval').dataset.interrupt = '';
  $('composer').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = $('input').value.trim();
    if (!text || $('send').disabled) return;
    $('input').value = '';
    send(text).catch((error) => status(error.message, true));
  });
  $('input').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      $('composer').requestSubmit();
    }
  });
  $('stop').addEventListener('click', stop);
  $('new-thread').addEventListener('click', newThread);
  $('assistant').addEventListener('change', () => {
    ui.assistant = $('assistant').value;
  });
  $('toggle-threads').addEventListener('click', () => $('sidebar').classList.toggle('open'));
  $('toggle-state').addEventListener('click', () => $('state-panel').classList.toggle('open'));
  $('transcript').addEventListener('click', closePanels);
  $('file-close').addEventListener('click', () => showFile(null));
  // The key dialog closes only with a key (or none, to forget it): Escape would leave the
  // refused call waiting for it.
  $('key-dialog').addEventListener('cancel', (event) => event.preventDefault());
  $('change-key').addEventListener('click', () => askKey(false).then(refreshAll));
  updateComposer();
  renderTodos([]);
  renderFiles({});
  refreshAll();
}

/** The assistants and threads, asked one after the other so one key dialog asks for both. */
function refreshAll() {
  loadAssistants()
    .then(loadThreads)
    .catch((error) => status(error.message, true));
}

init();
