// The chat page of `deepagents serve` in Chromium, driven by playwright-core as a person
// would use it. Run by tests/chat_page.rs:
//
//   node chat_page.mjs MAIN_URL KEYED_URL ARTIFACTS_DIR
//
// MAIN_URL serves the scripted model of chat_page.rs with the state backend and approvals for
// write_file; KEYED_URL the shell backend (a slow `sleep`) behind API key `k`. Screenshots go
// to ARTIFACTS_DIR. Every wait is on something the page shows, never a fixed time.
import { createRequire } from 'node:module';
import path from 'node:path';
import assert from 'node:assert/strict';

// playwright-core lives in the test dependencies' node_modules, not next to this file.
const require = createRequire(import.meta.url);
const { chromium } = require(path.join(process.env.DEEPAGENTS_TEST_WEB, 'playwright-core'));

const [mainUrl, keyedUrl, artifacts] = process.argv.slice(2);
const TIMEOUT = 30_000;
const shot = (page, name) => page.screenshot({ path: path.join(artifacts, name) });

const browser = await chromium.launch({
  executablePath: process.env.DEEPAGENTS_TEST_CHROMIUM,
  args: ['--headless', '--no-sandbox', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});

/** A browser context whose every request is recorded, and its page's errors. */
async function open(url, options = {}) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 }, ...options });
  context.setDefaultTimeout(TIMEOUT);
  const seen = { requests: [], errors: [] };
  context.on('request', (request) => seen.requests.push(`${request.method()} ${request.url()}`));
  const page = await context.newPage();
  page.on('pageerror', (error) => seen.errors.push(`page error: ${error.message}`));
  page.on('console', (message) => {
    // 401s are logged by the browser as it asks for the key; a policy violation is a bug.
    if (/Content.Security.Policy|Uncaught/i.test(message.text())) seen.errors.push(message.text());
  });
  const response = await page.goto(url);
  assert.equal(response.status(), 200);
  const policy = response.headers()['content-security-policy'] || '';
  assert.match(policy, /connect-src 'self'/, policy);
  assert.match(policy, /default-src 'none'/, policy);
  return { context, page, seen, origin: new URL(url).origin };
}

/** The page reached only its own server, and raised no error. */
function checkSeen({ seen, origin }) {
  assert.ok(seen.requests.length > 0);
  for (const request of seen.requests) {
    const url = request.split(' ')[1];
    assert.ok(url.startsWith('data:') || new URL(url).origin === origin, `request to another origin: ${request}`);
  }
  assert.deepEqual(seen.errors, []);
}

const card = (page, callId) => page.locator(`details.tool[data-call="${callId}"]`);

/** Opens a tool call's card and waits for `text` in its result. */
async function resultShows(page, callId, text) {
  const found = card(page, callId);
  if (!(await found.evaluate((el) => el.open))) await found.locator('summary').first().click();
  // Its own result, not one of the calls its subagent made.
  await found.locator(':scope > .body > .result').getByText(text).waitFor();
}

// ---- A conversation: streaming, tools, plan, an approval, a subagent, files, cost -------
const desktop = await open(mainUrl);
const { page } = desktop;
await page.locator('#input').fill('Please plan the notes');
await page.locator('#send').click();
const approval = page.locator('#approval');
await approval.getByText('Waiting for your decision').waitFor();
await approval.getByText('/notes.md').waitFor();
await page.locator('.msg.ai .text', { hasText: 'Planning the notes.' }).waitFor();
await page.locator('#todos li.in_progress', { hasText: 'Write the notes' }).waitFor();
await page.locator('#todos li.pending', { hasText: 'Have them reviewed' }).waitFor();
await resultShows(page, 't1', 'Plan updated');
await shot(page, 'desktop-approval.png');
await approval.getByRole('button', { name: 'Approve' }).click();
await page.locator('.msg.ai .text', { hasText: 'All done: the notes are written and reviewed.' }).waitFor();
await resultShows(page, 'w1', 'Wrote /notes.md');
// The subagent's work under its `task` call: its text and its own tool call.
const task = card(page, 'k1');
await task.locator('.subagent .text', { hasText: 'The notes look fine to the reviewer.' }).waitFor();
await task.locator('.subagent > .label', { hasText: 'general-purpose' }).waitFor();
await task.locator('.subagent details.tool[data-call="r1"]').waitFor();
await resultShows(page, 'k1', 'The notes look fine to the reviewer.');
// The file of the state, opened from the list.
await page.locator('#files').getByRole('button', { name: '/notes.md' }).click();
await page.locator('#file-content', { hasText: 'Written by the agent.' }).waitFor();
// What the run spent, from its `final` event.
await page.waitForFunction(() => /\$\d+\.\d+ · [\d,]+ tokens/.test(document.getElementById('cost').textContent));
// The run is over (the status cleared once its state is read back), nothing went wrong.
await page.waitForFunction(() => document.getElementById('status').textContent === '');
await task.locator('.subagent').scrollIntoViewIfNeeded();
await shot(page, 'desktop-conversation.png');

// ---- Another thread: several actions at once (edit one, reject one), then a question ------
await page.getByRole('button', { name: '+ New thread' }).click();
await page.locator('#transcript .msg').first().waitFor({ state: 'detached' });
await page.locator('#input').fill('Write two drafts');
await page.locator('#input').press('Enter');
await approval.getByText('2 actions wait for your decision').waitFor();
const rows = approval.locator('.action');
await rows.nth(0).getByRole('button', { name: 'Edit' }).click();
await rows.nth(0).locator('textarea').fill(JSON.stringify({ file_path: '/a.md', content: 'draft A, edited\n' }));
await rows.nth(0).getByRole('button', { name: 'Send edit' }).click();
await rows.nth(0).getByText('Edited and approved.').waitFor();
await rows.nth(1).getByRole('button', { name: 'Reject' }).click();
await rows.nth(1).locator('input').fill('Not this one.');
await rows.nth(1).getByRole('button', { name: 'Send rejection' }).click();
await approval.getByText('Which title should the drafts have?').waitFor();
// The question's options are answers a click sends; a typed answer goes too.
await approval.getByRole('button', { name: 'What is new' }).waitFor();
await approval.locator('textarea').fill('Release notes');
await approval.getByRole('button', { name: 'Send answer' }).click();
await page.locator('.msg.ai .text', { hasText: 'Done with the drafts.' }).waitFor();
await resultShows(page, 'b1', 'Not this one.');
await resultShows(page, 'q1', 'Release notes');
await page.locator('#files').getByRole('button', { name: '/a.md' }).click();
await page.locator('#file-content', { hasText: 'draft A, edited' }).waitFor();
assert.equal(await page.locator('#files').getByRole('button', { name: '/b.md' }).count(), 0);

// ---- Reload: both threads listed, newest first; the first one reopens whole -------------
await page.reload();
await page.locator('#threads button').nth(1).waitFor();
assert.match(await page.locator('#threads button').first().textContent(), /Write two drafts/);
await page.locator('#threads button', { hasText: 'Please plan the notes' }).click();
await page.locator('#threads button[aria-current="true"]', { hasText: 'Please plan the notes' }).waitFor();
await page.locator('.msg.human .text', { hasText: 'Please plan the notes' }).waitFor();
await page.locator('.msg.ai .text', { hasText: 'All done: the notes are written and reviewed.' }).waitFor();
await page.locator('#todos li', { hasText: 'Write the notes' }).waitFor();
await page.locator('#files').getByRole('button', { name: '/notes.md' }).waitFor();
await resultShows(page, 'k1', 'The notes look fine to the reviewer.');
checkSeen(desktop);

// ---- A phone: the conversation fills the screen, the panels slide over it ---------------
const phone = await open(mainUrl, { viewport: { width: 390, height: 844 }, deviceScaleFactor: 2, isMobile: true, hasTouch: true });
const small = phone.page;
const left = (id) => small.evaluate((el) => document.getElementById(el).getBoundingClientRect().left, id);
assert.ok((await left('sidebar')) < 0, 'the thread list starts hidden on a phone');
await small.locator('#toggle-threads').click();
await small.waitForFunction(() => document.getElementById('sidebar').getBoundingClientRect().left >= 0);
await small.locator('#threads button').nth(1).waitFor();
await shot(small, 'phone-threads.png');
await small.locator('#threads button', { hasText: 'Please plan the notes' }).click();
await small.locator('.msg.ai .text', { hasText: 'All done: the notes are written and reviewed.' }).waitFor();
await small.waitForFunction(() => document.getElementById('sidebar').getBoundingClientRect().right <= 0);
await shot(small, 'phone-conversation.png');
await small.locator('#toggle-state').click();
await small.waitForFunction(() => document.getElementById('state-panel').getBoundingClientRect().right <= innerWidth + 1);
await small.locator('#files').getByRole('button', { name: '/notes.md' }).click();
await small.locator('#file-content', { hasText: 'Written by the agent.' }).waitFor();
await shot(small, 'phone-plan-and-files.png');
checkSeen(phone);

// ---- A server with an API key: the page asks for it; then Stop cancels a slow run ---------
const keyed = await open(keyedUrl);
const guarded = keyed.page;
await guarded.locator('#key-dialog').waitFor();
await guarded.locator('#key-input').fill('wrong');
await guarded.getByRole('button', { name: 'Use this key' }).click();
await guarded.locator('#key-error', { hasText: 'refused' }).waitFor();
await guarded.locator('#key-input').fill('k');
await guarded.getByRole('button', { name: 'Use this key' }).click();
await guarded.locator('#key-dialog').waitFor({ state: 'hidden' });
await guarded.locator('#input').fill('Please sleep now');
await guarded.locator('#send').click();
await guarded.locator('details.tool.is-running[data-call="s1"]').waitFor();
await guarded.locator('#stop').click();
await guarded.locator('#status', { hasText: 'Stopped.' }).waitFor();
await guarded.locator('#stop').waitFor({ state: 'hidden' });
await resultShows(guarded, 's1', 'stopped before it finished');
await shot(guarded, 'desktop-stopped.png');
// Cancelled on the server, not only on the page: the run the page stopped ended so.
const cancel = keyed.seen.requests.find((request) => request.startsWith('POST ') && request.endsWith('/cancel'));
assert.ok(cancel, keyed.seen.requests.join('\n'));
const runUrl = cancel.split(' ')[1].replace(/\/cancel$/, '');
let run;
for (const deadline = Date.now() + TIMEOUT; ; ) {
  run = await (await fetch(runUrl, { headers: { 'x-api-key': 'k' } })).json();
  if (!['pending', 'running'].includes(run.status) || Date.now() > deadline) break;
  await new Promise((resolve) => setTimeout(resolve, 100)); // polling the server, not waiting on the page
}
assert.ok(['interrupted', 'cancelled'].includes(run.status), JSON.stringify(run));
// The key is kept: a reload asks for none.
await guarded.reload();
await guarded.locator('#threads button', { hasText: 'Please sleep now' }).waitFor();
assert.equal(await guarded.locator('#key-dialog').isVisible(), false);
checkSeen(keyed);

await browser.close();
console.log('chat page check passed');
