// The atfill admin dashboard (docs/admin.md "Dashboard"). Plain JavaScript, no framework: it
// asks for the admin token once (kept in sessionStorage), lists the jobs every few seconds, and
// follows the selected job through its event stream, read with fetch() because EventSource
// cannot send the Authorization header. Everything shown is set with textContent, never HTML.
// The charts are inline SVG drawn here from the API's data: the job's rate from its per-batch
// audit trail, its work units, per-PDS progress bars, and the live consumer's lag history.
'use strict';

(() => {
  const TOKEN_KEY = 'atfill-admin-token';
  const REFRESH_MS = 2000;
  const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
  // A stream ends at these statuses (docs/admin.md): nothing moves the job until someone acts.
  const ENDS_STREAM = new Set(['completed', 'failed', 'cancelled', 'paused']);
  const RECENT_PAGE = 20;      // recent repos per page
  const HOSTS_SHOWN = 20;      // PDS bars shown before "show all"
  const RATE_BINS = 60;        // at most this many points in the rate chart
  const BATCH_PAGE = 5000;     // audit entries asked for per call

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    jobs: [],           // as listed by GET /admin/backfill
    selected: null,     // the selected job's id
    detail: null,       // the selected job's details (snapshot, then events applied)
    stream: null,       // AbortController of the open event stream
    streamJob: null,    // the job id it follows
    timer: null,
    batches: null,      // {job, list: [{t ms, count}], next} the selected job's audit trail
    batchesBusy: false,
    samples: [],        // [{t ms, records}] of the selected job, while this page watches it
    recentPage: 0,
    hostsAll: false,
    lag: [],            // the live consumer's lag samples, as last fetched
  };

  const $ = (id) => document.getElementById(id);

  class AuthError extends Error {}

  // --- Formatting ---

  const fmtCount = (n) => (n == null ? '-' : Number(n).toLocaleString('en-US'));
  function fmtRate(perS) {
    if (perS == null) return '-';
    if (perS >= 1e6) return (perS / 1e6).toFixed(2) + 'M/s';
    if (perS >= 1e4) return (perS / 1e3).toFixed(0) + 'k/s';
    return perS.toFixed(0) + '/s';
  }
  function fmtDuration(s) {
    if (s == null || s < 0) return '-';
    const h = Math.floor(s / 3600);
    const m = Math.floor((s % 3600) / 60);
    const sec = Math.floor(s % 60);
    const mm = String(m).padStart(h > 0 ? 2 : 1, '0');
    return (h > 0 ? h + ':' : '') + mm + ':' + String(sec).padStart(2, '0');
  }
  function fmtLag(s) {
    if (s < 120) return s.toFixed(s < 10 && s > 0 ? 1 : 0) + ' s';
    if (s < 7200) return (s / 60).toFixed(0) + ' min';
    if (s < 172800) return (s / 3600).toFixed(1) + ' h';
    return (s / 86400).toFixed(0) + ' d';
  }
  const fmtPercent = (p) => (p == null ? '-' : p.toFixed(1) + '%');

  function el(tag, props, children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (k === 'text') e.textContent = v;
      else if (k === 'class') e.className = v;
      else e.setAttribute(k, v);
    }
    for (const c of children || []) e.appendChild(c);
    return e;
  }

  function fillFields(dl, obj) {
    dl.replaceChildren();
    if (Object.keys(obj || {}).length === 0) dl.appendChild(el('dd', { text: 'none', class: 'muted' }));
    for (const [k, v] of Object.entries(obj || {})) {
      dl.appendChild(el('dt', { text: k }));
      dl.appendChild(el('dd', { text: typeof v === 'number' ? fmtCount(v) : String(v),
        'data-testid': dl.id + '-' + k }));
    }
  }

  // --- Charts (inline SVG) ---

  const SVG_NS = 'http://www.w3.org/2000/svg';
  const CHART_W = 640;

  function svg(tag, attrs, children) {
    const e = document.createElementNS(SVG_NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === 'text') e.textContent = v;
      else e.setAttribute(k, String(v));
    }
    for (const c of children || []) e.appendChild(c);
    return e;
  }

  // The smallest 1, 2, 2.5 or 5 times a power of ten at or above v.
  function niceMax(v) {
    if (!(v > 0)) return 1;
    const pow = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * pow >= v) return m * pow;
    return 10 * pow;
  }

  const fmtClock = (ms) => new Date(ms).toISOString().slice(11, 19);
  function fmtShort(v) {
    if (v >= 1e6) return (v / 1e6).toFixed(v >= 1e7 ? 0 : 1) + 'M';
    if (v >= 1e3) return (v / 1e3).toFixed(v >= 1e4 ? 0 : 1) + 'k';
    return v >= 10 || v === 0 ? v.toFixed(0) : v.toFixed(1);
  }

  // A line chart of points [{t: ms, v}] (ascending t) with its area filled, a 0..max scale and
  // the first, middle and last times. data-points tells tests how many points it drew.
  function lineChart(root, points, opts) {
    const H = 170;
    const m = { l: 48, r: 14, t: 12, b: 22 };
    root.setAttribute('viewBox', '0 0 ' + CHART_W + ' ' + H);
    root.replaceChildren();
    root.dataset.points = String(points.length);
    if (points.length < 2) {
      root.appendChild(svg('text', { x: CHART_W / 2, y: H / 2, 'text-anchor': 'middle',
        class: 'chart-empty', text: opts.empty }));
      return;
    }
    const t0 = points[0].t;
    const t1 = points[points.length - 1].t;
    let top = 0;
    for (const p of points) top = Math.max(top, p.v);
    const vmax = niceMax(top);
    const x = (t) => m.l + ((t - t0) / (t1 - t0 || 1)) * (CHART_W - m.l - m.r);
    const y = (v) => H - m.b - (v / vmax) * (H - m.t - m.b);
    for (const f of [0, 0.5, 1]) {
      root.appendChild(svg('line', { x1: m.l, x2: CHART_W - m.r, y1: y(f * vmax), y2: y(f * vmax),
        class: 'chart-grid' }));
      root.appendChild(svg('text', { x: m.l - 6, y: y(f * vmax) + 4, 'text-anchor': 'end',
        class: 'chart-label', text: (opts.axis || fmtShort)(f * vmax) }));
    }
    [[t0, 'start'], [(t0 + t1) / 2, 'middle'], [t1, 'end']].forEach(([t, anchor]) => {
      root.appendChild(svg('text', { x: x(t), y: H - 6, 'text-anchor': anchor,
        class: 'chart-label', text: fmtClock(t) }));
    });
    const line = points.map((p) => x(p.t).toFixed(1) + ',' + y(p.v).toFixed(1)).join(' ');
    root.appendChild(svg('polygon', { class: 'chart-area',
      points: x(t0).toFixed(1) + ',' + y(0) + ' ' + line + ' ' + x(t1).toFixed(1) + ',' + y(0) }));
    root.appendChild(svg('polyline', { class: 'chart-line', points: line }));
    const last = points[points.length - 1];
    root.appendChild(svg('circle', { cx: x(last.t), cy: y(last.v), r: 3, class: 'chart-dot' }));
    root.appendChild(svg('text', { x: CHART_W - m.r, y: m.t, 'text-anchor': 'end',
      class: 'chart-value', text: opts.format(last.v) }));
  }

  // Records per second over the job's life from its audit trail: the committed batches summed
  // into at most RATE_BINS equal spans from its start to its last batch (or now, if it runs).
  function rateFromBatches(d, list) {
    if (list.length === 0) return [];
    const first = list[0].t;
    const lastT = list[list.length - 1].t;
    let start = Date.parse(d.started_at);
    if (!(start <= first)) start = first;
    const end = ENDS_STREAM.has(d.status) ? lastT : Math.max(lastT, Date.now());
    const span = Math.max(end - start, 1);
    const n = Math.max(2, Math.min(RATE_BINS, Math.ceil(span / 1000)));
    const width = span / n;
    const sums = new Array(n).fill(0);
    for (const b of list) sums[Math.min(n - 1, Math.floor((b.t - start) / width))] += b.count;
    // Each span drawn as a step: its rate from its start to its end.
    return sums.flatMap((sum, i) => [{ t: start + i * width, v: sum / (width / 1000) },
      { t: start + (i + 1) * width, v: sum / (width / 1000) }]);
  }

  // Without an audit trail: the rate between the samples this page took of records_written.
  function rateFromSamples(samples) {
    const out = [];
    for (let i = 1; i < samples.length; ++i) {
      const a = samples[i - 1];
      const b = samples[i];
      if (b.t > a.t) out.push({ t: b.t, v: Math.max(0, b.records - a.records) / ((b.t - a.t) / 1000) });
    }
    return out;
  }

  function renderRate(d) {
    const list = state.batches && state.batches.job === d.id ? state.batches.list : [];
    const fromTrail = list.length > 0;
    const points = fromTrail ? rateFromBatches(d, list) : rateFromSamples(state.samples);
    $('rate-source').textContent = fromTrail
      ? '(from ' + fmtCount(list.length) + ' committed batches)'
      : '(while this page watched; [jobs] record_batches = true keeps the whole history)';
    $('rate-chart').dataset.source = fromTrail ? 'batches' : 'samples';
    lineChart($('rate-chart'), points, { format: fmtRate,
      empty: ENDS_STREAM.has(d.status)
        ? 'no audit trail for this job ([jobs] record_batches = true keeps one)'
        : 'no batches committed yet' });
  }

  // Discovered, resolved and fetched units as three bars on one scale.
  function renderUnits(d) {
    const root = $('units-chart');
    const c = d.counters || {};
    const rows = [['discovered', c.total_repos || 0], ['resolved', c.resolved_repos || 0],
      ['fetched', c.processed_repos || 0]];
    const H = 96;
    root.setAttribute('viewBox', '0 0 ' + CHART_W + ' ' + H);
    root.replaceChildren();
    const total = Math.max(1, ...rows.map((r) => r[1]));
    if (!(c.total_repos > 0)) {
      root.appendChild(svg('text', { x: CHART_W / 2, y: H / 2, 'text-anchor': 'middle',
        class: 'chart-empty', text: 'no work units (only crawls count them)' }));
      return;
    }
    const x0 = 90;
    const w = CHART_W - x0 - 110;
    rows.forEach(([name, v], i) => {
      const yy = 8 + i * 29;
      root.appendChild(svg('text', { x: x0 - 8, y: yy + 15, 'text-anchor': 'end',
        class: 'chart-label', text: name }));
      root.appendChild(svg('rect', { x: x0, y: yy, width: w, height: 20, class: 'bar-left' }));
      root.appendChild(svg('rect', { x: x0, y: yy, width: (w * v) / total, height: 20,
        class: 'bar-units', 'data-testid': 'units-bar-' + name, 'data-value': v }));
      root.appendChild(svg('text', { x: x0 + w + 8, y: yy + 15, class: 'chart-label',
        text: fmtCount(v) }));
    });
  }

  // One bar per PDS, the hosts with the most units first, on one scale (the busiest host's units):
  // its units done and failed so far. The crawl counts a host's units as they end (a unit's host
  // is known once its DID resolves), so a bar grows as its host is worked through.
  function renderHosts(d) {
    const root = $('hosts-chart');
    const hosts = [...(d.hosts || [])].sort((a, b) => b.units - a.units || (a.host < b.host ? -1 : 1));
    const shown = state.hostsAll ? hosts : hosts.slice(0, HOSTS_SHOWN);
    const rowH = 24;
    const H = Math.max(1, shown.length) * rowH + 4;
    root.setAttribute('viewBox', '0 0 ' + CHART_W + ' ' + H);
    root.replaceChildren();
    let units = 0;
    let errors = 0;
    for (const h of hosts) { units += h.units; errors += h.errors; }
    $('hosts-summary').textContent = hosts.length
      ? '(' + fmtCount(hosts.length) + ' hosts, ' + fmtCount(units) + ' units ended, ' +
        fmtCount(errors) + ' with errors)'
      : '';
    if (hosts.length === 0) {
      root.appendChild(svg('text', { x: CHART_W / 2, y: 16, 'text-anchor': 'middle',
        class: 'chart-empty', text: 'no PDS seen yet' }));
    }
    const x0 = 200;
    const w = CHART_W - x0 - 150;
    const scale = hosts.length && hosts[0].units > 0 ? w / hosts[0].units : 0;
    shown.forEach((h, i) => {
      const yy = 2 + i * rowH;
      const doneW = Math.min(w, h.done * scale);
      const errW = Math.min(w - doneW, h.errors * scale);
      const name = h.host.replace(/^https?:\/\//, '');
      root.appendChild(svg('g', { 'data-testid': 'host-row-' + i, 'data-host': h.host }, [
        svg('title', { text: h.host + ': ' + h.done + ' done, ' + h.errors + ' errors of ' +
          h.units + ' units, ' + h.records + ' records' }),
        svg('text', { x: x0 - 8, y: yy + 14, 'text-anchor': 'end', class: 'chart-label',
          text: name.length > 30 ? name.slice(0, 29) + '…' : name }),
        svg('rect', { x: x0, y: yy, width: w, height: 18, class: 'bar-left' }),
        svg('rect', { x: x0, y: yy, width: doneW, height: 18, class: 'bar-done',
          'data-testid': 'host-done-' + i, 'data-done': h.done }),
        svg('rect', { x: x0 + doneW, y: yy, width: errW, height: 18, class: 'bar-errors' }),
        svg('text', { x: x0 + w + 8, y: yy + 14, class: 'chart-label',
          text: fmtCount(h.units) + ' units · ' + fmtShort(h.records) + ' rec' +
            (h.errors ? ' · ' + fmtCount(h.errors) + ' err' : '') }),
      ]));
    });
    const toggle = $('hosts-toggle');
    toggle.hidden = hosts.length <= HOSTS_SHOWN;
    toggle.textContent = state.hostsAll ? 'Show the ' + HOSTS_SHOWN + ' largest'
      : 'Show all ' + fmtCount(hosts.length) + ' hosts';
  }

  function renderRecent(d) {
    const recent = d.recent || [];
    const pages = Math.max(1, Math.ceil(recent.length / RECENT_PAGE));
    state.recentPage = Math.min(state.recentPage, pages - 1);
    const from = state.recentPage * RECENT_PAGE;
    $('recent-body').replaceChildren(...recent.slice(from, from + RECENT_PAGE).map((r) =>
      el('tr', { 'data-testid': 'recent-row-' + r.seq, 'data-did': r.did }, [
        el('td', { text: r.did }), el('td', { text: r.host }), el('td', { text: r.rev || '-' }),
        el('td', { class: 'num', text: fmtCount(r.records) }),
        el('td', { text: r.outcome, class: r.outcome === 'ok' ? '' : 'status-failed' }),
        el('td', { text: r.fetched_at }),
      ])));
    $('recent-page').textContent = recent.length === 0 ? 'none yet'
      : 'page ' + (state.recentPage + 1) + ' of ' + pages + ' (' + fmtCount(from + 1) + '–' +
        fmtCount(Math.min(recent.length, from + RECENT_PAGE)) + ' of ' + fmtCount(recent.length) +
        ')';
    $('recent-prev').disabled = state.recentPage === 0;
    $('recent-next').disabled = state.recentPage >= pages - 1;
  }

  function renderLag() {
    const points = state.lag.filter((s) => s.lag_s != null)
      .map((s) => ({ t: s.at_us / 1000, v: s.lag_s }));
    lineChart($('lag-chart'), points, { format: fmtLag, axis: fmtLag, empty: 'no lag samples yet' });
  }

  // The selected job's audit trail, read on from where the last call stopped.
  async function loadBatches(id) {
    if (state.batchesBusy) return;
    if (!state.batches || state.batches.job !== id) state.batches = { job: id, list: [], next: 0 };
    const b = state.batches;
    state.batchesBusy = true;
    try {
      for (;;) {
        const r = await api('GET', '/admin/backfill/' + id + '/batches?from=' + b.next +
          '&limit=' + BATCH_PAGE);
        if (state.batches !== b) return;
        for (const x of r.batches) b.list.push({ t: x.committed_us / 1000, count: x.count });
        b.next = r.next;
        if (r.batches.length < BATCH_PAGE) break;
      }
    } catch (e) {
      if (!(e instanceof AuthError)) showError('Batches of job ' + id + ': ' + e.message);
    } finally {
      state.batchesBusy = false;
    }
    if (state.detail && state.detail.id === id) renderRate(state.detail);
  }

  // --- Messages ---

  function showError(message) {
    const b = $('error-banner');
    b.textContent = message;
    b.hidden = false;
  }
  function clearError() {
    $('error-banner').hidden = true;
    $('error-banner').textContent = '';
  }

  // --- The API ---

  // `body`: an object sent as JSON, or a string sent as it is (a lexicon document).
  async function api(method, path, body) {
    const headers = { Authorization: 'Bearer ' + state.token };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = typeof body === 'string' ? body : JSON.stringify(body);
    }
    const res = await fetch(path, init);
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (e) { data = null; }
    }
    if (res.status === 401) {
      onUnauthorized();
      throw new AuthError('unauthorized');
    }
    if (!res.ok) {
      const err = new Error((data && data.error) || 'HTTP ' + res.status);
      err.status = res.status;
      throw err;
    }
    return data;
  }

  // --- Token ---

  function showTokenForm(message) {
    $('app').hidden = true;
    $('token-clear').hidden = true;
    $('token-panel').hidden = false;
    $('auth-message').textContent = message || '';
    $('token-input').value = '';
    $('token-input').focus();
  }

  function onUnauthorized() {
    stopRefresh();
    closeStream();
    state.token = '';
    sessionStorage.removeItem(TOKEN_KEY);
    showTokenForm('The server refused the token (401 Unauthorized). Enter the admin token again.');
  }

  function start() {
    $('token-panel').hidden = true;
    $('app').hidden = false;
    $('token-clear').hidden = false;
    refresh();
    stopRefresh();
    state.timer = setInterval(refresh, REFRESH_MS);
  }

  function stopRefresh() {
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
  }

  // --- Jobs list and live panel ---

  async function refresh() {
    try {
      // The list first: a refused token stops there, before the other calls are sent.
      const list = await api('GET', '/admin/backfill');
      const [live, history] = await Promise.all([
        api('GET', '/admin/jetstream/status'),
        api('GET', '/admin/jetstream/history'),
      ]);
      // 409: this process runs no live consumer, so it has no collections to change.
      const collections = live && live.configured
        ? await api('GET', '/admin/collections').catch((e) => {
          if (e instanceof AuthError) throw e;
          return null;
        })
        : null;
      renderCollections(collections);
      // Unsupported (409) where the process keeps no lexicon catalog.
      renderLexicons(await api('GET', '/admin/lexicons').catch((e) => {
        if (e instanceof AuthError) throw e;
        return null;
      }));
      state.lag = (history && history.samples) || [];
      state.jobs = list.jobs || [];
      if (state.detail) {
        const listed = state.jobs.find((j) => j.id === state.detail.id);
        // Without a stream the list is the freshest view of the selected job.
        if (listed && !state.stream) Object.assign(state.detail, listed);
      }
      renderJobs();
      renderLive(live);
      renderLabels(live && live.labels);
      if (state.detail) {
        renderDetail();
        loadBatches(state.detail.id);
      }
      $('last-refresh').textContent = 'updated ' + new Date().toLocaleTimeString();
      clearError();
      // A selected job that moves again (resumed) is followed again.
      const sel = state.jobs.find((j) => j.id === state.selected);
      if (sel && !state.stream && !ENDS_STREAM.has(sel.status)) openStream(sel.id);
    } catch (e) {
      if (!(e instanceof AuthError)) showError('Refreshing failed: ' + e.message);
    }
  }

  function jobRow(j) {
    const p = j.progress || {};
    const bar = el('progress', { max: '100' });
    if (p.percent != null) bar.value = p.percent;
    const tr = el('tr', { 'data-testid': 'job-row-' + j.id, 'data-job-id': String(j.id) }, [
      el('td', { text: String(j.id), 'data-testid': 'job-id-' + j.id }),
      el('td', { text: j.kind }),
      el('td', { text: j.status, class: 'status-' + j.status, 'data-testid': 'job-status-' + j.id }),
      el('td', { text: j.stage, 'data-testid': 'job-stage-' + j.id }),
      el('td', {}, [bar, el('span', { text: ' ' + fmtPercent(p.percent),
        'data-testid': 'job-progress-' + j.id })]),
      el('td', { class: 'num', text: fmtCount(j.counters.records_written),
        'data-testid': 'job-records-' + j.id }),
      el('td', { class: 'num', text: fmtRate(p.records_per_s), 'data-testid': 'job-rate-' + j.id }),
      el('td', { class: 'num', text: fmtDuration(p.eta_s), 'data-testid': 'job-eta-' + j.id }),
    ]);
    if (j.id === state.selected) tr.classList.add('selected');
    tr.addEventListener('click', () => selectJob(j.id));
    return tr;
  }

  function renderJobs() {
    $('jobs-body').replaceChildren(...state.jobs.map(jobRow));
    $('jobs-empty').hidden = state.jobs.length > 0;
  }

  // Applies fields of the selected job's stream to its row too.
  function updateListed(id, fields) {
    const j = state.jobs.find((x) => x.id === id);
    if (!j) return;
    Object.assign(j, fields);
    const old = document.querySelector('[data-testid="job-row-' + id + '"]');
    if (old) old.replaceWith(jobRow(j));
  }

  function renderLive(live) {
    const configured = live && live.configured;
    $('live-not-configured').hidden = !!configured;
    $('live-fields').hidden = !configured;
    $('lag-box').hidden = !configured;
    if (!configured) return;
    renderLag();
    $('live-status').textContent = live.status;
    $('live-host').textContent = live.host;
    $('live-protocol').textContent = live.protocol;
    $('live-cursor').textContent = String(live.cursor);
    $('live-witnessed').textContent = live.witnessed_at;
    $('live-lag').textContent = live.lag_s == null ? '-' : live.lag_s.toFixed(1) + ' s';
    $('live-rates').textContent =
        fmtRate(live.events_per_s) + ' events, ' + fmtRate(live.records_per_s) + ' records';
    $('live-error').textContent = live.error || '-';
  }

  // The label subscriptions, from the same answer as the live consumer (live.labels).
  function renderLabels(l) {
    const configured = l && l.configured;
    $('labels-not-configured').hidden = !!configured;
    $('labels-fields').hidden = !configured;
    if (!configured) return;
    $('labels-status').textContent =
        l.status + (l.job_id == null ? '' : ' (job ' + l.job_id + ')');
    $('labels-cursors').textContent =
        l.labelers.map((c) => c.did + ' at seq ' + c.cursor).join(', ') || '-';
    $('labels-rate').textContent = fmtRate(l.labels_per_s) + ' labels';
    $('labels-applied').textContent = fmtCount(l.frames) + ' frames, ' + fmtCount(l.labels) +
        ' labels: ' + fmtCount(l.stored) + ' stored, ' + fmtCount(l.negated) +
        ' negations, ' + fmtCount(l.stale) + ' older than the stored one';
    const kinds = Object.entries(l.refused_by || {})
      .map(([kind, n]) => fmtCount(n) + ' ' + kind).join(', ');
    $('labels-refused').textContent = fmtCount(l.refused) + (kinds ? ': ' + kinds : '') +
        '; ' + fmtCount(l.bad_frames) + ' bad frames';
    $('labels-connection').textContent =
        fmtCount(l.connection_errors) + ' failed or dropped attempt(s)';
    $('labels-error').textContent = l.error || '-';
  }

  function renderCollections(c) {
    $('collections-box').hidden = !c;
    if (!c) return;
    $('collections-list').replaceChildren(...c.collections.map((name) => {
      const remove = el('button', { type: 'button', text: 'Remove',
        'data-testid': 'collection-remove-' + name });
      remove.addEventListener('click', () => changeCollections({ remove: [name] }));
      return el('li', { 'data-testid': 'collection-' + name }, [el('code', { text: name }),
        document.createTextNode(' '),
        remove]);
    }));
  }

  async function changeCollections(body) {
    const msg = $('collections-message');
    try {
      const r = await api('POST', '/admin/collections', body);
      let text = 'Collections now: ' + r.collections.join(', ') + '.';
      if (r.backfill_job != null) text += ' Backfill job ' + r.backfill_job + ' started.';
      msg.textContent = text;
      renderCollections(r);
      await refresh();
      if (r.backfill_job != null) await selectJob(r.backfill_job);
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = 'Not changed: ' + e.message;
    }
  }

  async function onAddCollections(ev) {
    ev.preventDefault();
    const add = splitList($('collections-add').value);
    if (!add.length) {
      $('collections-message').textContent = 'Give at least one collection.';
      return;
    }
    await changeCollections({ add, backfill: $('collections-backfill').checked });
  }

  function renderLexicons(l) {
    $('lexicons-panel').hidden = !l;
    if (!l) return;
    $('lexicons-list').replaceChildren(...l.lexicons.map((x) => {
      const about = ' (' + (x.record ? 'record, ' : '') + 'from ' +
          (x.source === 'network' ? x.published_by : x.source) + ') ';
      const children = [el('code', { text: x.nsid }), document.createTextNode(about)];
      if (x.source === 'api') {
        const remove = el('button', { type: 'button', text: 'Remove',
          'data-testid': 'lexicon-remove-' + x.nsid });
        remove.addEventListener('click', () => removeLexicon(x.nsid));
        children.push(remove);
      }
      return el('li', { 'data-testid': 'lexicon-' + x.nsid }, children);
    }));
  }

  async function onAddLexicon(ev) {
    ev.preventDefault();
    const msg = $('lexicon-message');
    const text = $('lexicon-document').value.trim();
    if (!text) {
      msg.textContent = 'Paste a lexicon document.';
      return;
    }
    try {
      const backfill = $('lexicon-backfill').checked;
      const r = await api('POST', '/admin/lexicons?backfill=' + backfill, text);
      let said = 'Lexicon ' + r.nsid + (r.replaced ? ' replaced' : ' added') + '.';
      if (r.collection_added) said += ' Collections now: ' + r.collections.join(', ') + '.';
      if (r.backfill_job != null) said += ' Backfill job ' + r.backfill_job + ' started.';
      msg.textContent = said;
      $('lexicon-document').value = '';
      await refresh();
      if (r.backfill_job != null) await selectJob(r.backfill_job);
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = 'Not added: ' + e.message;
    }
  }

  async function removeLexicon(nsid) {
    const msg = $('lexicon-message');
    try {
      const r = await api('DELETE', '/admin/lexicons/' + encodeURIComponent(nsid));
      msg.textContent = 'Lexicon ' + r.nsid + ' removed.' +
          (r.collection_removed ? ' Collections now: ' + r.collections.join(', ') + '.' : '');
      await refresh();
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = 'Not removed: ' + e.message;
    }
  }

  // --- The selected job ---

  async function selectJob(id) {
    if (state.selected !== id) {
      state.samples = [];
      state.recentPage = 0;
      state.hostsAll = false;
      state.batches = null;
    }
    state.selected = id;
    for (const tr of $('jobs-body').children) {
      tr.classList.toggle('selected', tr.dataset.jobId === String(id));
    }
    await loadDetail(id);
    const j = state.detail;
    if (j && j.id === id && !ENDS_STREAM.has(j.status)) openStream(id);
    else closeStream();
  }

  async function loadDetail(id) {
    try {
      const d = await api('GET', '/admin/backfill/' + id);
      if (state.selected !== id) return;
      state.detail = d;
      renderDetail();
      loadBatches(id);
    } catch (e) {
      if (!(e instanceof AuthError)) showError('Job ' + id + ': ' + e.message);
    }
  }

  function setAction(id, action, testid, enabled) {
    const b = $(id);
    b.setAttribute('data-testid', testid);
    b.disabled = !enabled;
    b.dataset.job = String(state.detail.id);
  }

  function renderDetail() {
    const d = state.detail;
    const panel = $('job-detail');
    if (!d) {
      panel.hidden = true;
      return;
    }
    panel.hidden = false;
    panel.setAttribute('data-job-id', String(d.id));
    const p = d.progress || {};
    $('detail-title').textContent = 'Job ' + d.id + ' (' + d.kind + ')';
    $('detail-status').textContent = d.status;
    $('detail-status').className = 'status-' + d.status;
    $('detail-stage').textContent = d.stage;
    $('detail-progress').textContent = fmtPercent(p.percent);
    const bar = $('detail-progress-bar');
    if (p.percent != null) bar.value = p.percent;
    else bar.removeAttribute('value');
    $('detail-records').textContent = fmtCount(d.counters.records_written);
    $('detail-rates').textContent =
        fmtRate(p.records_per_s) + ' records, ' + fmtRate(p.events_per_s) + ' events';
    $('detail-eta').textContent = fmtDuration(p.eta_s);
    $('detail-queued').textContent = fmtCount(d.queued_units);
    $('detail-failed-blocks').textContent = fmtCount(d.failed_blocks);
    // A sink that refuses writes (a full disk, a database restart): what the job waits for.
    $('detail-waiting').textContent =
        d.waiting ? d.waiting.sentence + ' (since ' + d.waiting.since + ')' : '-';
    $('detail-waiting').className = d.waiting ? 'waiting' : '';
    $('detail-stop-reason').textContent =
        d.stop_reason ? d.stop_reason.code + ': ' + d.stop_reason.sentence : '-';
    $('detail-times').textContent = 'created ' + d.created_at + '\nstarted ' + d.started_at +
        '\nupdated ' + d.updated_at + '\nfinished ' + d.finished_at;
    fillFields($('detail-counters'), d.counters);
    fillFields($('detail-errors'), d.errors_by_kind);
    fillFields($('detail-params'), paramsText(d.params));

    $('stage-log').replaceChildren(...(d.stage_changes || []).map((c) =>
      el('li', { text: c.to + ' ' + c.at.slice(11, 19), title: c.from + ' → ' + c.to + ' at ' + c.at,
        'data-testid': 'stage-change-' + c.index })));
    const now = Date.now();
    const written = d.counters.records_written || 0;
    const lastSample = state.samples[state.samples.length - 1];
    if (!lastSample || now - lastSample.t >= 500) {
      state.samples.push({ t: now, records: written });
      if (state.samples.length > 2000) state.samples.shift();
    }
    renderRate(d);
    renderUnits(d);
    renderHosts(d);
    renderRecent(d);

    const terminal = TERMINAL.has(d.status);
    const failedSomething = d.status === 'failed' || (d.failed_blocks || 0) > 0 ||
        (d.counters.failed_records || 0) > 0 || Object.keys(d.errors_by_kind || {}).length > 0;
    setAction('job-pause', 'pause', 'job-pause-' + d.id, d.status === 'running');
    setAction('job-resume', 'resume', 'job-resume-' + d.id,
        d.status === 'paused' || d.status === 'failed');
    setAction('job-cancel', 'cancel', 'job-cancel-' + d.id,
        ['running', 'pausing', 'paused', 'failed'].includes(d.status));
    setAction('job-retry-failed', 'retry-failed', 'job-retry-failed-' + d.id,
        terminal && failedSomething);
    setAction('job-clear-details', 'clear-details', 'job-clear-details-' + d.id, terminal);
  }

  // A list parameter (an array) shown one item a line.
  function paramsText(params) {
    const out = {};
    for (const [k, v] of Object.entries(params || {})) out[k] = Array.isArray(v) ? v.join('\n') : v;
    return out;
  }

  function setStreamState(text) {
    $('stream-state').textContent = text;
  }

  // --- The event stream (text/event-stream over fetch) ---

  function closeStream() {
    if (state.stream) state.stream.abort();
    state.stream = null;
    state.streamJob = null;
  }

  async function openStream(id) {
    closeStream();
    const ctrl = new AbortController();
    state.stream = ctrl;
    state.streamJob = id;
    setStreamState('connecting');
    let ended = false;
    try {
      const res = await fetch('/admin/backfill/' + id + '/events', {
        headers: { Authorization: 'Bearer ' + state.token, Accept: 'text/event-stream' },
        signal: ctrl.signal,
        cache: 'no-store',
      });
      if (res.status === 401) {
        onUnauthorized();
        return;
      }
      if (!res.ok) {
        let message = 'HTTP ' + res.status;
        try { message = (await res.json()).error || message; } catch (e) { /* keep it */ }
        showError('Event stream of job ' + id + ': ' + message);
        return;
      }
      setStreamState('live');
      const reader = res.body.getReader();
      const decoder = new TextDecoder();
      let buf = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true }).replace(/\r/g, '');
        let cut;
        while ((cut = buf.indexOf('\n\n')) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          if (onEventBlock(id, block)) ended = true;
        }
      }
    } catch (e) {
      if (e.name === 'AbortError') return;
      showError('Event stream of job ' + id + ': ' + e.message);
    } finally {
      if (state.stream === ctrl) {
        state.stream = null;
        state.streamJob = null;
        setStreamState(ended ? 'ended' : 'disconnected');
      }
    }
  }

  // One event block; answers true for `end`.
  function onEventBlock(id, block) {
    let name = 'message';
    const data = [];
    for (const line of block.split('\n')) {
      if (line.startsWith(':')) continue;  // a keep-alive comment
      const colon = line.indexOf(':');
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? '' : line.slice(colon + 1);
      if (value.startsWith(' ')) value = value.slice(1);
      if (field === 'event') name = value;
      else if (field === 'data') data.push(value);
    }
    if (data.length === 0) return false;
    let payload;
    try { payload = JSON.parse(data.join('\n')); } catch (e) { return false; }
    if (state.selected !== id) return false;
    const d = state.detail;
    switch (name) {
      case 'snapshot':
        state.detail = payload;
        updateListed(id, payload);
        break;
      case 'counters':
        if (d) {
          Object.assign(d, payload);
          updateListed(id, { counters: payload.counters, progress: payload.progress });
        }
        break;
      case 'stage':
        if (d) {
          d.stage = payload.to;
          (d.stage_changes = d.stage_changes || []).push(payload);
          updateListed(id, { stage: payload.to });
        }
        break;
      case 'hosts':
        if (d) {
          d.hosts = payload.hosts;
          d.recent = payload.recent;
        }
        break;
      case 'status':
        if (d) {
          d.status = payload.to;
          d.stage = payload.stage;
          d.stop_reason = payload.stop_reason;
          d.finished_at = payload.finished_at;
          updateListed(id, { status: payload.to, stage: payload.stage });
        }
        break;
      case 'error':
        showError('Job ' + id + ': ' + payload.error);
        break;
      case 'end':
        setStreamState(payload.reason === 'final' ? 'ended' : 'ended (' + payload.reason + ')');
        renderDetail();
        return true;
      default:
        return false;
    }
    renderDetail();
    return false;
  }

  // --- Actions ---

  async function onAction(ev) {
    const b = ev.currentTarget;
    const id = Number(b.dataset.job);
    const action = b.dataset.action;
    const msg = $('action-message');
    try {
      if (action === 'clear-details') {
        await api('DELETE', '/admin/backfill/' + id + '/details');
        msg.textContent = 'Cleared the details of job ' + id + '.';
        await loadDetail(id);
      } else if (action === 'retry-failed') {
        const r = await api('POST', '/admin/backfill/' + id + '/retry-failed');
        msg.textContent = 'Job ' + r.id + ' retries what job ' + id + ' could not do.';
        await refresh();
        await selectJob(r.id);
      } else {
        const job = await api('POST', '/admin/backfill/' + id + '/' + action);
        msg.textContent = 'Job ' + id + ' is ' + job.status + '.';
        if (state.detail && state.detail.id === id) Object.assign(state.detail, job);
        updateListed(id, job);
        renderDetail();
        if (!state.stream && !ENDS_STREAM.has(job.status)) openStream(id);
      }
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = action + ' of job ' + id + ': ' + e.message;
    }
  }

  async function onClearAll() {
    const msg = $('action-message');
    try {
      const r = await api('DELETE', '/admin/backfill/details');
      msg.textContent = 'Cleared the details of ' + r.cleared + ' finished job(s).';
      if (state.selected != null) await loadDetail(state.selected);
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = 'Clearing details: ' + e.message;
    }
  }

  const splitList = (text) => text.split(/[\s,]+/).filter((s) => s.length > 0);

  async function onStartBackfill(ev) {
    ev.preventDefault();
    const body = {};
    const collections = splitList($('backfill-collections').value);
    const dids = splitList($('backfill-dids').value);
    if (collections.length) body.collections = collections;
    if (dids.length) body.dids = dids;
    if ($('backfill-source').value) body.source = $('backfill-source').value;
    if ($('backfill-mode').value) body.mode = $('backfill-mode').value;
    const msg = $('backfill-message');
    if (!collections.length && !dids.length) {
      msg.textContent = 'Give at least one collection or DID.';
      return;
    }
    try {
      const r = await api('POST', '/admin/backfill', body);
      msg.textContent = 'Started job ' + r.id + '.';
      await refresh();
      await selectJob(r.id);
    } catch (e) {
      if (!(e instanceof AuthError)) msg.textContent = 'Not started: ' + e.message;
    }
  }

  // --- Wiring ---

  document.addEventListener('DOMContentLoaded', () => {
    $('token-form').addEventListener('submit', (ev) => {
      ev.preventDefault();
      state.token = $('token-input').value.trim();
      if (!state.token) return;
      sessionStorage.setItem(TOKEN_KEY, state.token);
      $('auth-message').textContent = '';
      start();
    });
    $('token-clear').addEventListener('click', () => {
      stopRefresh();
      closeStream();
      state.token = '';
      sessionStorage.removeItem(TOKEN_KEY);
      showTokenForm('');
    });
    for (const id of ['job-pause', 'job-resume', 'job-cancel', 'job-retry-failed',
      'job-clear-details']) {
      $(id).addEventListener('click', onAction);
    }
    $('clear-all-details').addEventListener('click', onClearAll);
    $('recent-prev').addEventListener('click', () => {
      state.recentPage = Math.max(0, state.recentPage - 1);
      if (state.detail) renderRecent(state.detail);
    });
    $('recent-next').addEventListener('click', () => {
      state.recentPage += 1;
      if (state.detail) renderRecent(state.detail);
    });
    $('hosts-toggle').addEventListener('click', () => {
      state.hostsAll = !state.hostsAll;
      if (state.detail) renderHosts(state.detail);
    });
    $('start-backfill').addEventListener('submit', onStartBackfill);
    $('add-collections').addEventListener('submit', onAddCollections);
    $('add-lexicon').addEventListener('submit', onAddLexicon);
    if (state.token) start();
    else showTokenForm('');
  });
})();
