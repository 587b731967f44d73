// The atfill admin dashboard (docs/admin.md "Dashboard"). Plain JavaScript, no framework: it
// asks for the admin token once (kept in sessionStorage), lists the jobs every few seconds, and
// follows the selected job through its event stream, read with fetch() because EventSource
// cannot send the Authorization header. Everything shown is set with textContent, never HTML.
'use strict';

(() => {
  const TOKEN_KEY = 'atfill-admin-token';
  const REFRESH_MS = 2000;
  const TERMINAL = new Set(['completed', 'failed', 'cancelled']);
  // A stream ends at these statuses (docs/admin.md): nothing moves the job until someone acts.
  const ENDS_STREAM = new Set(['completed', 'failed', 'cancelled', 'paused']);

  const state = {
    token: sessionStorage.getItem(TOKEN_KEY) || '',
    jobs: [],           // as listed by GET /admin/backfill
    selected: null,     // the selected job's id
    detail: null,       // the selected job's details (snapshot, then events applied)
    stream: null,       // AbortController of the open event stream
    streamJob: null,    // the job id it follows
    timer: null,
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
    for (const [k, v] of Object.entries(obj || {})) {
      dl.appendChild(el('dt', { text: k }));
      dl.appendChild(el('dd', { text: typeof v === 'number' ? fmtCount(v) : String(v),
        'data-testid': dl.id + '-' + k }));
    }
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

  async function api(method, path, body) {
    const headers = { Authorization: 'Bearer ' + state.token };
    const init = { method, headers, cache: 'no-store' };
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
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
      const [list, live] = await Promise.all([
        api('GET', '/admin/backfill'),
        api('GET', '/admin/jetstream/status'),
      ]);
      state.jobs = list.jobs || [];
      if (state.detail) {
        const listed = state.jobs.find((j) => j.id === state.detail.id);
        // Without a stream the list is the freshest view of the selected job.
        if (listed && !state.stream) Object.assign(state.detail, listed);
      }
      renderJobs();
      renderLive(live);
      if (state.detail) renderDetail();
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
    if (!configured) return;
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

  // --- The selected job ---

  async function selectJob(id) {
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
    $('detail-stop-reason').textContent =
        d.stop_reason ? d.stop_reason.code + ': ' + d.stop_reason.sentence : '-';
    $('detail-times').textContent = 'created ' + d.created_at + ', started ' + d.started_at +
        ', updated ' + d.updated_at + ', finished ' + d.finished_at;
    fillFields($('detail-counters'), d.counters);
    fillFields($('detail-errors'), d.errors_by_kind);
    fillFields($('detail-params'), d.params);

    $('stage-log').replaceChildren(...(d.stage_changes || []).map((c) =>
      el('li', { text: c.from + ' → ' + c.to + ' at ' + c.at,
        'data-testid': 'stage-change-' + c.index })));
    $('hosts-body').replaceChildren(...(d.hosts || []).map((h, i) =>
      el('tr', { 'data-testid': 'host-row-' + i, 'data-host': h.host }, [
        el('td', { text: h.host }), el('td', { class: 'num', text: fmtCount(h.units) }),
        el('td', { class: 'num', text: fmtCount(h.done) }),
        el('td', { class: 'num', text: fmtCount(h.errors) }),
        el('td', { class: 'num', text: fmtCount(h.records) }),
      ])));
    $('recent-body').replaceChildren(...(d.recent || []).map((r) =>
      el('tr', { 'data-testid': 'recent-row-' + r.seq, 'data-did': r.did }, [
        el('td', { text: r.did }), el('td', { text: r.host }), el('td', { text: r.rev || '-' }),
        el('td', { class: 'num', text: fmtCount(r.records) }), el('td', { text: r.outcome }),
        el('td', { text: r.fetched_at }),
      ])));

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
    $('start-backfill').addEventListener('submit', onStartBackfill);
    if (state.token) start();
    else showTokenForm('');
  });
})();
