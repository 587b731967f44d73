// Drives atfill's admin dashboard in headless Chromium the way a person would: gives the token,
// starts a backfill from the form, watches the job's row until it reaches "completed", then
// reads what the page shows (the rate chart from the audit trail, the work units, the per-PDS
// bars, the live consumer's lag chart, the recent repos 20 a page) and saves a screenshot.
// Prints one JSON object on stdout.
//
//   node dashboard.mjs URL TOKEN COLLECTION SCREENSHOT [ADD_TO_LIVE [LEXICON_FILE]]
//
// With ADD_TO_LIVE (an NSID), it then adds that collection to the live consumer from the
// collections panel and follows the backfill job that starts to its end. With LEXICON_FILE (a
// record lexicon), it then pastes that lexicon into the lexicons panel (without a backfill), reads
// the list and the live collections, and removes it again.
//
// Run by tests/integration/admin_run_test.cpp (DashboardTest), which starts atfill against simnet and checks the
// numbers printed here against the API and the database.
import { readFileSync } from 'node:fs';
import { chromium } from 'playwright-core';

const [url, token, collection, screenshot, addToLive, lexiconFile] = process.argv.slice(2);
if (!screenshot) {
  console.error('usage: node dashboard.mjs URL TOKEN COLLECTION SCREENSHOT');
  process.exit(2);
}

const browser = await chromium.launch({
  executablePath: process.env.ATFILL_CHROMIUM || '/usr/bin/chromium',
  // No sandbox (tests run as root); no background traffic (the machine has no internet).
  args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
         '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  timeout: 60_000,
});
const out = {};
try {
  const page = await browser.newPage({ viewport: { width: 1400, height: 1000 } });
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(String(e)));
  await page.goto(url, { waitUntil: 'load' });

  // A wrong token first: the page says so and asks again.
  await page.getByTestId('token-input').fill(token + '-wrong');
  await page.getByTestId('token-submit').click();
  await page.getByTestId('auth-message').waitFor({ state: 'visible', timeout: 10_000 });
  out.wrong_token_message = (await page.getByTestId('auth-message').innerText()).trim();
  out.errors_for_wrong_token = consoleErrors.splice(0);  // the refused calls (401) are logged
  await page.getByTestId('token-input').fill(token);
  await page.getByTestId('token-submit').click();
  await page.getByTestId('jobs-table').waitFor({ state: 'visible', timeout: 10_000 });
  out.token_panel_visible = await page.getByTestId('token-panel').isVisible();

  // Start a backfill from the form.
  await page.getByTestId('backfill-collections').fill(collection);
  await page.getByTestId('backfill-submit').click();
  const message = page.getByTestId('backfill-message');
  await page.waitForFunction(
    () => /job \d+/.test(document.querySelector('[data-testid="backfill-message"]')?.textContent || ''),
    null, { timeout: 20_000 });
  const started = (await message.innerText()).trim();
  out.backfill_message = started;
  const id = Number(started.match(/job (\d+)/)[1]);
  out.id = id;

  // Its row shows up and is followed live until it completes.
  const status = page.getByTestId(`job-status-${id}`);
  await status.waitFor({ state: 'visible', timeout: 20_000 });
  // Checked at every frame the page renders, so each status it shows is seen; done once the job
  // has ended.
  const seen = await page.waitForFunction((testid) => {
    const s = (document.querySelector(`[data-testid="${testid}"]`)?.innerText || '').trim();
    window.atfillStatusesSeen = window.atfillStatusesSeen || [];
    if (s && !window.atfillStatusesSeen.includes(s)) window.atfillStatusesSeen.push(s);
    return ['completed', 'failed', 'cancelled'].includes(s) && window.atfillStatusesSeen;
  }, `job-status-${id}`, { polling: 'raf', timeout: 120_000 });
  out.statuses_seen = await seen.jsonValue();
  out.status = (await status.innerText()).trim();
  out.records = (await page.getByTestId(`job-records-${id}`).innerText()).trim();
  out.progress = (await page.getByTestId(`job-progress-${id}`).innerText()).trim();

  // The job's details: open them and wait for the per-PDS table and the stage log.
  await page.getByTestId(`job-row-${id}`).click();
  await page.getByTestId('job-detail').waitFor({ state: 'visible', timeout: 10_000 });
  await page.waitForFunction(
    (jid) => document.querySelector('[data-testid="job-detail"]')?.getAttribute('data-job-id') === String(jid)
      && document.querySelectorAll('[data-testid^="host-row-"]').length > 0,
    id, { timeout: 20_000 });
  out.detail_status = (await page.getByTestId('detail-status').innerText()).trim();
  out.detail_records = (await page.getByTestId('detail-records').innerText()).trim();
  out.hosts = await page.locator('[data-testid^="host-row-"]').count();
  out.recent = await page.locator('[data-testid^="recent-row-"]').count();
  out.stages = await page.locator('[data-testid^="stage-change-"]').allInnerTexts();
  out.pause_enabled = await page.getByTestId(`job-pause-${id}`).isEnabled();

  // The job's rate over time, drawn from its per-batch audit trail.
  await page.waitForFunction(() => {
    const c = document.querySelector('[data-testid="rate-chart"]');
    return c && c.dataset.source === 'batches' && Number(c.dataset.points) >= 2;
  }, null, { timeout: 20_000 });
  out.rate_chart = await page.evaluate(() => {
    const c = document.querySelector('[data-testid="rate-chart"]');
    const line = c.querySelector('polyline');
    const ys = (line?.getAttribute('points') || '').split(' ').map((p) => Number(p.split(',')[1]));
    return { source: c.dataset.source, points: Number(c.dataset.points),
      line_points: ys.length, line_height: ys.length ? Math.max(...ys) - Math.min(...ys) : 0,
      caption: document.querySelector('[data-testid="rate-source"]').textContent };
  });
  // The work units and the per-PDS bars, from the job's counters and hosts.
  out.units = await page.evaluate(() => Object.fromEntries(['discovered', 'resolved', 'fetched']
    .map((k) => [k, Number(document.querySelector(`[data-testid="units-bar-${k}"]`)?.dataset.value ?? -1)])));
  out.host_bars = await page.evaluate(() => [...document.querySelectorAll('[data-testid^="host-done-"]')]
    .map((r) => ({ done: Number(r.dataset.done), width: Number(r.getAttribute('width')) })));
  // The live consumer's lag over time (sampled once a second by the server).
  await page.waitForFunction(() =>
    Number(document.querySelector('[data-testid="lag-chart"]')?.dataset.points || 0) >= 3,
    null, { timeout: 30_000 });
  out.lag_points = await page.evaluate(() =>
    Number(document.querySelector('[data-testid="lag-chart"]').dataset.points));
  out.lag_line = await page.locator('[data-testid="lag-chart"] polyline').count();

  // The recent repos, 20 a page: the next page shows the next ones.
  out.recent_page = (await page.getByTestId('recent-page').innerText()).trim();
  out.recent_prev_enabled = await page.getByTestId('recent-prev').isEnabled();
  out.recent_next_enabled = await page.getByTestId('recent-next').isEnabled();
  const firstDids = await page.locator('[data-testid^="recent-row-"]').evaluateAll(
    (rows) => rows.map((r) => r.getAttribute('data-testid')));
  await page.screenshot({ path: screenshot, fullPage: true });
  await page.getByTestId('recent-next').click();
  await page.waitForFunction(
    () => /^page 2 /.test(document.querySelector('[data-testid="recent-page"]')?.textContent || ''),
    null, { timeout: 10_000 });
  const secondDids = await page.locator('[data-testid^="recent-row-"]').evaluateAll(
    (rows) => rows.map((r) => r.getAttribute('data-testid')));
  out.recent_page2 = (await page.getByTestId('recent-page').innerText()).trim();
  out.recent_page2_rows = secondDids.length;
  out.recent_pages_overlap = secondDids.filter((d) => firstDids.includes(d)).length;
  out.recent_page2_prev_enabled = await page.getByTestId('recent-prev').isEnabled();

  if (addToLive) {
    // The live consumer's collections: add one from the page; its backfill starts and completes.
    await page.getByTestId('collections-box').waitFor({ state: 'visible', timeout: 20_000 });
    out.live_collections_before = await page.locator('#collections-list li code').allInnerTexts();
    await page.getByTestId('collections-add').fill(addToLive);
    await page.getByTestId('collections-submit').click();
    await page.waitForFunction(
      () => /Backfill job \d+ started/.test(
        document.querySelector('[data-testid="collections-message"]')?.textContent || ''),
      null, { timeout: 20_000 });
    const text = (await page.getByTestId('collections-message').innerText()).trim();
    out.collections_message = text;
    const job = Number(text.match(/Backfill job (\d+)/)[1]);
    out.collections_job = job;
    await page.waitForFunction((testid) => ['completed', 'failed', 'cancelled'].includes(
      (document.querySelector(`[data-testid="${testid}"]`)?.innerText || '').trim()),
    `job-status-${job}`, { timeout: 120_000 });
    out.collections_job_status = (await page.getByTestId(`job-status-${job}`).innerText()).trim();
    out.live_collections_after = await page.locator('#collections-list li code').allInnerTexts();
  }
  if (lexiconFile) {
    const lexicon = JSON.parse(readFileSync(lexiconFile, 'utf8'));
    await page.getByTestId('lexicons-panel').waitFor({ state: 'visible', timeout: 20_000 });
    await page.getByTestId('lexicon-document').fill('{"lexicon": 1, "id": "not-an-nsid"}');
    await page.getByTestId('lexicon-submit').click();
    await page.waitForFunction(
      () => /^Not added: /.test(
        document.querySelector('[data-testid="lexicon-message"]')?.textContent || ''),
      null, { timeout: 20_000 });
    out.lexicon_refused = (await page.getByTestId('lexicon-message').innerText()).trim();
    // The refused call (400) is logged; only errors other than it count below.
    out.errors_for_refused_lexicon = consoleErrors.splice(0);
    await page.getByTestId('lexicon-backfill').uncheck();
    await page.getByTestId('lexicon-document').fill(JSON.stringify(lexicon, null, 2));
    await page.getByTestId('lexicon-submit').click();
    await page.waitForFunction(
      () => /^Lexicon .* added\./.test(
        document.querySelector('[data-testid="lexicon-message"]')?.textContent || ''),
      null, { timeout: 20_000 });
    out.lexicon_message = (await page.getByTestId('lexicon-message').innerText()).trim();
    await page.getByTestId(`lexicon-${lexicon.id}`).waitFor({ state: 'visible', timeout: 20_000 });
    out.lexicons_listed = (await page.getByTestId('lexicons-list').innerText()).trim();
    out.live_collections_with_lexicon =
      await page.locator('#collections-list li code').allInnerTexts();
    await page.getByTestId(`lexicon-remove-${lexicon.id}`).click();
    await page.getByTestId(`lexicon-${lexicon.id}`).waitFor({ state: 'detached', timeout: 20_000 });
    out.lexicon_removed = (await page.getByTestId('lexicon-message').innerText()).trim();
  }
  out.console_errors = consoleErrors;
} finally {
  await browser.close();
}
console.log(JSON.stringify(out));
