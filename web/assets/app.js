'use strict';
// app.js: pdplane's status page. It reads the control plane's REST API, its
// event stream and /metrics, all relative to the page so that the page works
// behind a proxy that mounts pdplane under a prefix.
//
// Everything that comes from the server is rendered as text: elements are
// built with createElement and filled with text nodes, attributes are set
// one by one, and nothing is ever parsed as HTML. A peer named
// "<img src=x onerror=alert(1)>" shows exactly those characters.
(() => {
  const Prom = window.pdplaneProm;

  const API = 'api/v1/';
  const TOKEN_KEY = 'pdplane.adminToken';
  const ROLES = ['prefill', 'decode', 'both'];
  const STATES = ['pending', 'ready', 'unhealthy', 'stale', 'draining', 'failed'];
  // Heartbeats change load and leases without events, so the peer list is
  // polled: every 5 s, or every 3 ms per peer for large fleets (30 s at
  // 10,000 peers, whose list is about 7 MB even without rank regions);
  // heartbeat ages and leases are counted down here between polls.
  const POLL_PEERS_MS = 5000;
  const POLL_PEERS_MS_PER_PEER = 3;
  const POLL_FLEET_MS = 5000;
  // A burst of events about at most this many peers is applied by reading
  // those peers alone; a larger one reloads the list.
  const PATCH_MAX = 20;
  const POLL_PAIRS_MS = 15000;
  const REFRESH_DEBOUNCE_MS = 150;
  const SNAPSHOT_FOLLOW_UP_MS = [1000, 3000];
  const BACKOFF_MIN_MS = 1000;
  const BACKOFF_MAX_MS = 30000;
  const EVENTS_PAGE = 50;
  const MAX_EVENTS = 400;
  const MAX_ROWS = 200; // per role group; narrow with the filters to see more
  const MATRIX_MAX = 40;
  const CHART_WINDOW_MS = 10 * 60 * 1000;
  // ?interval=N (seconds, 1–60) sets how often /metrics is scraped.
  const METRICS_MS = (() => {
    const n = Number(new URLSearchParams(location.search).get('interval'));
    return Number.isFinite(n) && n >= 1 && n <= 60 ? n * 1000 : 5000;
  })();

  const EVENT_WORDS = {
    registered: 'registered',
    ready: 'ready',
    unhealthy: 'engine unhealthy',
    stale: 'stale',
    reregister_requested: 're-register requested',
    reregistered: 're-registered',
    expired: 'expired',
    drained: 'drained',
    removed: 'removed',
    quarantined: 'quarantined',
    heal_started: 'heal started',
    heal_draining: 'heal: draining',
    heal_acting: 'heal: restart',
    healed: 'healed',
    heal_failed: 'heal failed',
    quarantine_trial: 'quarantine on trial',
    quarantine_lifted: 'quarantine lifted',
  };

  // healLine says where a stale peer's heal plan is.
  function healLine(h) {
    if (!h) return null;
    const words = {
      quarantined: 'the failing pairs are quarantined; other prefills keep using this decode until it drains',
      draining: 'draining (requests in flight finish), then the agent restarts the engine',
    }[h.phase] || 'the agent was told to restart the engine; waiting for a new instance';
    return el('p', { class: 'callout heal', 'data-heal-phase': h.phase },
      el('strong', null, 'Heal: '), words + ' · deadline ', el('time', { datetime: h.deadline, title: stamp(h.deadline) }, stamp(h.deadline)),
      ' · from generation ' + h.from_generation);
  }

  const state = {
    peers: [],
    peersById: new Map(),
    peersLoaded: false,
    pairs: [],
    pairsTotal: 0,
    pairsLoaded: false,
    fleet: null, // GET fleet: counts, replica, store, version
    groups: [], // GET pairs/groups
    groupsTotal: 0,
    drill: null, // the pair group whose matrix is shown: {pc, dc}
    changed: new Set(), // peers named by events since the last refresh
    fullReload: false,
    events: [], // newest first
    eventIds: new Set(),
    eventsLoaded: false,
    nextCursor: null,
    lastEventId: 0,
    filters: { role: '', state: '', model: '', name: '' },
    token: readToken(),
    pairNotice: null, // the outcome of the last quarantine lift: { key, ok, text }
    skewMs: 0, // server clock minus ours, when they differ noticeably
    pinnedPair: null, // "prefillID decodeID"
    openPeerId: null,
    peerEvents: [],
    peerNotice: null, // {ok, text} after an action in the detail view
    detailError: null,
    loadErrors: new Map(),
    metrics: { last: null, lastAt: 0, points: [], error: null, present: false, traffic: false, inflight: null },
  };

  const $ = (id) => document.getElementById(id);

  // ---------------------------------------------------------------- DOM

  // el builds an element. Attributes are set one by one and children that
  // are not nodes become text nodes, so data never meets the HTML parser.
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    setAttrs(e, attrs);
    appendAll(e, children);
    return e;
  }

  const SVG_NS = 'http://www.w3.org/2000/svg';
  function svg(tag, attrs, ...children) {
    const e = document.createElementNS(SVG_NS, tag);
    setAttrs(e, attrs);
    appendAll(e, children);
    return e;
  }

  function setAttrs(e, attrs) {
    if (!attrs) return;
    for (const [k, v] of Object.entries(attrs)) {
      if (v === undefined || v === null || v === false) continue;
      if (/^on/i.test(k) || k === 'style') throw new Error('el: ' + k + ' is not set through attributes');
      if (k === 'class') e.setAttribute('class', v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
  }

  function appendAll(parent, children) {
    for (const c of children.flat(Infinity)) {
      if (c === undefined || c === null || c === false) continue;
      parent.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
  }

  function replace(parent, ...children) {
    parent.replaceChildren();
    appendAll(parent, children);
  }

  // --------------------------------------------------------- formatting

  const now = () => Date.now() + state.skewMs;

  function ago(iso) {
    if (!iso) return 'never';
    const ms = now() - Date.parse(iso);
    if (Number.isNaN(ms)) return '—';
    return duration(Math.max(0, ms)) + ' ago';
  }

  function leaseLeft(iso) {
    if (!iso) return { text: '—', cls: '' };
    const ms = Date.parse(iso) - now();
    if (Number.isNaN(ms)) return { text: '—', cls: '' };
    if (ms <= 0) return { text: 'expired ' + duration(-ms) + ' ago', cls: 'lease-out' };
    return { text: duration(ms), cls: ms < 3000 ? 'lease-low' : '' };
  }

  function duration(ms) {
    const s = Math.floor(ms / 1000);
    if (s < 60) return s + 's';
    const m = Math.floor(s / 60);
    if (m < 60) return m + 'm ' + String(s % 60).padStart(2, '0') + 's';
    const h = Math.floor(m / 60);
    if (h < 48) return h + 'h ' + String(m % 60).padStart(2, '0') + 'm';
    return Math.floor(h / 24) + 'd';
  }

  function clock(iso) {
    const d = new Date(iso);
    if (Number.isNaN(d.getTime())) return '—';
    return d.toLocaleTimeString([], { hour: '2-digit', minute: '2-digit', second: '2-digit', hour12: false });
  }

  function stamp(iso) {
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? '' : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC');
  }

  function bytes(n) {
    if (typeof n !== 'number' || !Number.isFinite(n)) return '—';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
    return (i === 0 || n >= 100 ? Math.round(n) : n.toFixed(1).replace(/\.0$/, '')) + ' ' + units[i];
  }

  function pct(x) {
    return typeof x === 'number' && Number.isFinite(x) ? Math.round(x * 100) + '%' : '—';
  }

  function rate(x) {
    if (!Number.isFinite(x)) return '—';
    if (x === 0) return '0';
    if (x < 0.1) return x.toFixed(2);
    if (x < 10) return x.toFixed(1);
    return Math.round(x).toLocaleString();
  }

  function seconds(x) {
    if (!Number.isFinite(x)) return '—';
    if (x < 0.001) return (x * 1000).toFixed(2) + ' ms';
    if (x < 0.01) return (x * 1000).toFixed(1) + ' ms';
    if (x < 1) return Math.round(x * 1000) + ' ms';
    if (Number.isInteger(x)) return x + ' s';
    return x.toFixed(x < 10 ? 2 : 1) + ' s';
  }

  // shortModel drops the organisation from a hub-style model name; the full
  // name is in the tooltip and the model filter.
  function shortModel(m) {
    const i = (m || '').lastIndexOf('/');
    return i >= 0 && i < m.length - 1 ? m.slice(i + 1) : m || '';
  }

  // tail keeps the end of an identifier, where generated ids differ.
  function tail(s, n) {
    return s && s.length > n + 1 ? '…' + s.slice(-n) : s || '';
  }

  const roleWord = (r) => ({ prefill: 'Prefill', decode: 'Decode', both: 'Prefill + decode' })[r] || r;
  const prefills = (p) => p.role === 'prefill' || p.role === 'both';
  const decodes = (p) => p.role === 'decode' || p.role === 'both';

  function stateBadge(st, reason) {
    const known = STATES.includes(st) ? st : 'unknown';
    return el('span', { class: 'state state-' + known, title: reason || null },
      el('span', { class: 'dot', 'aria-hidden': 'true' }),
      el('span', { class: 'state-word' }, st || 'unknown'));
  }

  // ---------------------------------------------------------------- API

  class ApiError extends Error {
    constructor(status, detail, field, title) {
      super(detail);
      this.status = status;
      this.field = field;
      this.title = title;
    }
  }

  async function api(path, opts = {}) {
    const headers = { Accept: 'application/json' };
    if (opts.body !== undefined) headers['Content-Type'] = 'application/json';
    if (opts.auth && state.token) headers.Authorization = 'Bearer ' + state.token;
    let res;
    try {
      res = await fetch(path, {
        method: opts.method || 'GET', headers, cache: 'no-store',
        body: opts.body === undefined ? undefined : JSON.stringify(opts.body),
      });
    } catch (err) {
      throw new ApiError(0, 'cannot reach the control plane (' + err.message + ')');
    }
    noteClock(res);
    if (!res.ok) throw await problem(res);
    if (res.status === 204) return null;
    return res.json();
  }

  // problem reads an RFC 9457 problem+json answer, or whatever came instead.
  async function problem(res) {
    const type = res.headers.get('Content-Type') || '';
    let detail = res.status + ' ' + res.statusText;
    let field, title;
    try {
      if (type.includes('json')) {
        const p = await res.json();
        title = p.title;
        field = p.field;
        detail = p.detail || p.title || detail;
      } else {
        const text = (await res.text()).trim();
        if (text) detail = text.slice(0, 300);
      }
    } catch { /* keep the status line */ }
    return new ApiError(res.status, detail, field, title);
  }

  // noteClock corrects countdowns for a server clock that differs from
  // ours. The Date header has one-second resolution, so small differences
  // are noise and ignored.
  function noteClock(res) {
    const d = Date.parse(res.headers.get('Date') || '');
    if (Number.isNaN(d)) return;
    const skew = d + 500 - Date.now();
    state.skewMs = Math.abs(skew) > 2000 ? skew : 0;
  }

  function loadFailed(what, err) {
    state.loadErrors.set(what, err.message);
    renderLoadErrors();
  }

  function loadOK(what) {
    if (state.loadErrors.delete(what)) renderLoadErrors();
  }

  function renderLoadErrors() {
    const box = $('load-error');
    const msgs = [...state.loadErrors].map(([what, msg]) => 'Cannot load ' + what + ': ' + msg);
    box.hidden = msgs.length === 0;
    box.textContent = msgs.join(' · ');
  }

  // Loads can overlap (a poll and an event-triggered refresh); only the
  // newest answer of each kind is applied.
  const seq = { peers: 0, pairs: 0, detail: 0, fleet: 0 };

  async function loadFleet() {
    const n = ++seq.fleet;
    try {
      const data = await api(API + 'fleet');
      if (n !== seq.fleet) return;
      state.fleet = data;
      loadOK('fleet');
    } catch (err) {
      if (n === seq.fleet) loadFailed('fleet', err);
      return;
    }
    renderOrigin();
    renderSummary();
    renderModels();
  }

  function renderOrigin() {
    const f = state.fleet;
    $('origin-replica').textContent = f.replica;
    $('origin-store').textContent = f.store;
    $('origin-version').textContent = f.version;
  }

  const byPeerName = (a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0);

  // patchPeers applies changes to a few peers by reading those peers alone,
  // so that one peer's event does not reload a fleet-wide list.
  // A full load that was sent before a patch came back keeps the patched
  // peers (patchedAt: performance.now() of the patch, by peer ID).
  const patchedAt = new Map();

  async function patchPeers(ids) {
    const got = await Promise.all(ids.map((id) => api(API + 'peers/' + encodeURIComponent(id))
      .then((p) => [id, p], (err) => [id, err.status === 404 ? null : undefined])));
    let added = false;
    for (const [id, p] of got) {
      if (p === undefined) { state.fullReload = true; continue; } // retried by the next refresh
      const i = state.peers.findIndex((x) => x.id === id);
      if (p === null) {
        if (i >= 0) state.peers.splice(i, 1);
        state.peersById.delete(id);
        continue;
      }
      delete p.ranks; // the list holds summaries; the detail view reads its own
      patchedAt.set(id, performance.now());
      if (i >= 0) state.peers[i] = p;
      else { state.peers.push(p); added = true; }
      if (id !== state.openPeerId) state.peersById.set(id, p);
    }
    if (added) state.peers.sort(byPeerName);
    renderPeers();
    renderPairs();
  }

  async function loadPeers() {
    const n = ++seq.peers;
    const sent = performance.now();
    try {
      const data = await api(API + 'peers?view=summary');
      if (n !== seq.peers) return;
      const kept = new Map(state.peers.filter((p) => patchedAt.get(p.id) > sent).map((p) => [p.id, p]));
      for (const [id, at] of patchedAt) if (at <= sent) patchedAt.delete(id);
      state.peers = (data.peers || []).map((p) => kept.get(p.id) || p);
      state.peersById = new Map(state.peers.map((p) => [p.id, p]));
      state.peersLoaded = true;
      loadOK('peers');
    } catch (err) {
      if (n === seq.peers) loadFailed('peers', err);
      return;
    }
    renderModels();
    renderPeers();
    renderPairs();
  }

  // loadPairs reads the pair groups (cheap at any size) and the pairs the
  // matrix shows: every pair when there are at most MATRIX_MAX² of them,
  // else those of the group drilled into, else none.
  async function loadPairs() {
    const n = ++seq.pairs;
    const limit = String(MATRIX_MAX * MATRIX_MAX);
    try {
      const groups = await api(API + 'pairs/groups');
      if (n !== seq.pairs) return;
      let list = { pairs: [], total: 0 };
      if (state.drill) {
        list = await api(API + 'pairs?' + new URLSearchParams({ prefill_class: state.drill.pc, decode_class: state.drill.dc, limit }));
      } else if (groups.pairs <= MATRIX_MAX * MATRIX_MAX) {
        list = await api(API + 'pairs?' + new URLSearchParams({ limit }));
      }
      if (n !== seq.pairs) return;
      state.groups = groups.groups || [];
      state.groupsTotal = groups.pairs;
      state.pairs = list.pairs || [];
      state.pairsTotal = list.total ?? state.pairs.length;
      state.pairsLoaded = true;
      loadOK('pairs');
    } catch (err) {
      if (n === seq.pairs) loadFailed('pairs', err);
      return;
    }
    renderGroups();
    renderPairs();
  }

  async function loadEvents(older) {
    const q = new URLSearchParams({ limit: String(EVENTS_PAGE) });
    if (older && state.nextCursor) q.set('before', String(state.nextCursor));
    try {
      const data = await api(API + 'events?' + q);
      for (const ev of data.events || []) addEvent(ev, false);
      state.nextCursor = data.next_cursor ?? null;
      state.eventsLoaded = true;
      loadOK('events');
    } catch (err) {
      loadFailed('events', err);
    }
    $('events-older').hidden = !state.nextCursor;
    if (state.events.length === 0) renderEventsEmpty();
  }

  let refreshTimer = 0;
  let followUpTimers = [];
  // scheduleRefresh reloads soon, once for a burst of events. Events name
  // their peer (peerID): a burst about a few peers reads those peers alone;
  // a refresh without one, or about many peers, reloads the list.
  function scheduleRefresh(peerID) {
    if (peerID) state.changed.add(peerID);
    else state.fullReload = true;
    if (refreshTimer) return;
    refreshTimer = setTimeout(() => {
      refreshTimer = 0;
      const ids = [...state.changed];
      state.changed.clear();
      const full = state.fullReload || !state.peersLoaded || ids.length > PATCH_MAX;
      state.fullReload = false;
      if (full) loadPeers();
      else patchPeers(ids);
      loadFleet();
      loadPairs();
      // Counts and pairs come from the replica's routing snapshot, which
      // may take in a change a little after its event arrived here: read
      // them again a moment later, and once more after that.
      followUpTimers.forEach(clearTimeout);
      followUpTimers = SNAPSHOT_FOLLOW_UP_MS.map((ms) => setTimeout(() => { loadFleet(); loadPairs(); }, ms));
    }, REFRESH_DEBOUNCE_MS);
  }

  // -------------------------------------------------------- live stream

  const conn = { es: null, backoff: BACKOFF_MIN_MS, timer: 0, retryAt: 0, status: 'connecting' };

  // connect opens the event stream. On any error the stream is closed and
  // opened again after a growing, jittered delay, resuming after the last
  // event seen, so a restarting server is not stampeded and nothing is
  // missed.
  function connect() {
    clearTimeout(conn.timer);
    conn.timer = 0;
    if (conn.es) conn.es.close();
    const url = API + 'events/stream' + (state.eventsLoaded ? '?after=' + state.lastEventId : '');
    const es = new EventSource(url);
    conn.es = es;
    setConn(conn.status === 'down' ? 'down' : 'connecting');
    es.addEventListener('open', () => {
      if (conn.es !== es) return;
      conn.backoff = BACKOFF_MIN_MS;
      setConn('live');
      scheduleRefresh(); // catch up on what changed while we were away
      if (state.openPeerId) loadPeerDetail(state.openPeerId);
    });
    es.addEventListener('peer-event', (m) => {
      if (conn.es !== es) return;
      let ev;
      try { ev = JSON.parse(m.data); } catch { return; }
      state.eventsLoaded = true;
      addEvent(ev, true);
      scheduleRefresh(ev.peer_id || '');
    });
    es.addEventListener('error', () => {
      if (conn.es !== es) return;
      es.close();
      conn.es = null;
      const delay = Math.round(conn.backoff * (1 + Math.random() * 0.2));
      conn.backoff = Math.min(conn.backoff * 2, BACKOFF_MAX_MS);
      conn.retryAt = Date.now() + delay;
      conn.timer = setTimeout(connect, delay);
      setConn('down');
    });
  }

  function setConn(status) {
    conn.status = status;
    const badge = $('conn');
    badge.className = 'conn conn-' + status;
    const words = { connecting: 'connecting…', live: 'live', down: 'disconnected' };
    $('conn-text').textContent = words[status];
    $('banner').hidden = status !== 'down';
    document.body.classList.toggle('is-disconnected', status === 'down');
    tickBanner();
  }

  function tickBanner() {
    if (conn.status !== 'down') return;
    const left = Math.max(0, Math.ceil((conn.retryAt - Date.now()) / 1000));
    $('banner-text').textContent = conn.timer
      ? 'Figures may be out of date. Reconnecting in ' + left + 's…'
      : 'Figures may be out of date. Reconnecting…';
  }

  // ------------------------------------------------------------- peers

  function filtered() {
    const f = state.filters;
    const name = f.name.trim().toLowerCase();
    return state.peers.filter((p) =>
      (!f.state || p.state === f.state) &&
      (!f.model || p.model === f.model) &&
      (!name || p.name.toLowerCase().includes(name)));
  }

  function renderModels() {
    const sel = $('f-model');
    const models = state.fleet ? state.fleet.models.map((m) => m.model) : [...new Set(state.peers.map((p) => p.model))].sort();
    const cur = sel.value;
    const have = [...sel.options].slice(1).map((o) => o.value);
    if (have.join('\n') === models.join('\n')) return;
    replace(sel, el('option', { value: '' }, 'all'), models.map((m) => el('option', { value: m }, m)));
    sel.value = models.includes(cur) ? cur : '';
    state.filters.model = sel.value;
  }

  function renderPeers() {
    const box = $('peer-groups');
    const focusKey = document.activeElement && box.contains(document.activeElement)
      ? document.activeElement.dataset.focusKey : null;
    if (!state.peersLoaded) return;
    if (state.peers.length === 0) {
      replace(box, el('p', { class: 'empty' }, 'No peers registered yet. Engines appear here once their agent registers them.'));
      return;
    }
    const shown = filtered();
    const groups = ROLES.filter((r) => !state.filters.role || r === state.filters.role)
      .map((role) => ({ role, peers: shown.filter((p) => p.role === role), all: state.peers.filter((p) => p.role === role).length }))
      .filter((g) => g.peers.length > 0 || (g.role !== 'both' && g.all > 0) || (g.role === state.filters.role));
    const parts = groups.map(peerGroup);
    if (shown.length === 0) parts.push(el('p', { class: 'empty' }, 'No peer matches the filters.'));
    replace(box, parts);
    if (focusKey) {
      const again = box.querySelector('[data-focus-key="' + CSS.escape(focusKey) + '"]');
      if (again) again.focus();
    }
  }

  function peerGroup(g) {
    const rows = g.peers.slice(0, MAX_ROWS).map(peerRow);
    const counts = STATES.map((s) => [s, g.peers.filter((p) => p.state === s).length]).filter(([, n]) => n > 0);
    return el('section', { class: 'group', 'aria-label': roleWord(g.role) + ' peers' },
      el('h3', null, roleWord(g.role), ' ',
        el('span', { class: 'count' }, g.peers.length === g.all ? String(g.all) : g.peers.length + ' of ' + g.all),
        counts.map(([s, n]) => el('span', { class: 'mini state-' + s }, n + ' ' + s))),
      g.peers.length === 0
        ? el('p', { class: 'empty' }, 'No ' + g.role + ' peer matches the filters.')
        : el('table', { class: 'peers' },
          el('thead', null, el('tr', null,
            [['Name'], ['Engine'], ['Model'], ['State', 'the registry\'s state; unhealthy and failed are red, with the last probe or heal error'],
              ['Breaker', BREAKER_LEGEND], ['Gen', 'generation: bumped at every re-registration'], ['Instance', 'instance id: changes when the engine process restarts'],
              ['Lease left', 'time until the lease runs out without a heartbeat, counted down here every second from the lease expiry'],
              ['Load', 'running / queued requests as the engine last reported them, and KV cache usage'],
              ['Last heartbeat', 'time since the agent\'s last heartbeat, counted here every second; amber after two heartbeat intervals, red after the lease'],
              ['Transfer group']]
              .map(([h, title]) => el('th', { scope: 'col', title }, h)))),
          el('tbody', null, rows)),
      g.peers.length > MAX_ROWS ? el('p', { class: 'note' }, 'Showing ' + MAX_ROWS + ' of ' + g.peers.length + '; narrow the list with the filters.') : null);
  }

  const BREAKER_LEGEND = 'this replica\'s router circuit breaker for the peer: closed (requests flow), open (refused until the cool-down ends), ' +
    'half-open (one probe request let through); its own observation, not the registry\'s';

  function breakerBadge(b) {
    if (!b) return el('span', { class: 'brk brk-none muted', title: 'this replica\'s router does not track this peer' }, '—');
    const word = { closed: 'closed', open: 'open', half_open: 'half-open' }[b.state] || b.state;
    return el('span', { class: 'brk brk-' + b.state, title: BREAKER_LEGEND + (b.since ? '; opened ' + stamp(b.since) : '') }, word);
  }

  // heartbeatClass says how late the last heartbeat is: amber after two
  // heartbeat intervals, red once the lease would have run out.
  function heartbeatClass(iso, intervalS, ttlS) {
    if (!iso || !intervalS) return '';
    const age = now() - Date.parse(iso);
    if (ttlS && age > ttlS * 1000) return 'hb-lost';
    return age > 2 * intervalS * 1000 ? 'hb-late' : '';
  }

  function peerRow(p) {
    const lease = leaseLeft(p.lease_expiry);
    const load = p.load || {};
    return el('tr', { 'data-peer-id': p.id, class: 'row-' + p.state },
      el('td', { class: 'name' }, el('button', { type: 'button', class: 'peer-link', 'data-open-peer': p.id, 'data-focus-key': 'peer:' + p.id, title: p.url }, p.name)),
      el('td', null, p.engine),
      el('td', { class: 'model' }, el('span', { class: 'trunc', title: p.model }, shortModel(p.model))),
      el('td', { class: 'state-cell' }, stateBadge(p.state, p.state_reason),
        p.state_reason && p.state !== 'ready' ? el('span', { class: 'reason', title: p.state_reason }, p.state_reason) : null),
      el('td', { class: 'brk-cell' }, breakerBadge(p.breaker)),
      el('td', { class: 'num gen', title: 'generation ' + p.generation + ': bumped at every re-registration' }, String(p.generation)),
      el('td', { class: 'mono' }, el('span', { class: 'trunc', title: p.instance_id }, tail(p.instance_id, 10))),
      el('td', { class: 'num lease ' + lease.cls, 'data-lease': p.lease_expiry || '', title: 'lease left; expires ' + stamp(p.lease_expiry) }, lease.text),
      el('td', null, el('span', { class: 'load' },
        el('span', { class: 'load-q', title: (load.running ?? 0) + ' requests running / ' + (load.queued ?? 0) + ' queued on the engine' }, (load.running ?? 0) + ' / ' + (load.queued ?? 0)),
        el('meter', { min: 0, max: 1, low: 0.7, high: 0.9, optimum: 0, value: load.kv_usage ?? 0, title: 'KV cache usage ' + pct(load.kv_usage), 'aria-label': 'KV usage' }),
        el('span', { class: 'kv', title: 'KV cache usage' }, pct(load.kv_usage)))),
      el('td', {
        class: 'num hb ' + heartbeatClass(p.last_heartbeat, p.heartbeat_interval_seconds, p.lease_ttl_seconds),
        'data-ago': p.last_heartbeat || '', 'data-hb-interval': p.heartbeat_interval_seconds, 'data-hb-ttl': p.lease_ttl_seconds,
        title: p.last_heartbeat ? 'last heartbeat ' + stamp(p.last_heartbeat) + '; every ' + p.heartbeat_interval_seconds + ' s expected' : 'no heartbeat yet',
      }, ago(p.last_heartbeat)),
      el('td', null, p.transfer_group || el('span', { class: 'muted' }, '—')));
  }

  // renderSummary draws the fleet's counts from GET fleet, which the
  // server computes over its snapshot without reading any rank.
  function renderSummary() {
    const f = state.fleet;
    if (!f) return;
    const items = [];
    const roles = ROLES.filter((r) => f.by_role[r]).map((r) => f.by_role[r] + ' ' + r).join(' · ');
    items.push(el('li', { 'data-count': 'peers', title: 'peers registered, in every state' + (roles ? ': ' + roles : '') },
      el('strong', null, f.peers.toLocaleString()), ' peers'));
    if (roles) items.push(el('li', { 'data-count': 'roles', title: 'peers by role' }, roles));
    for (const st of STATES) {
      const n = f.by_state[st] || 0;
      if (n > 0 || st === 'ready') {
        items.push(el('li', { class: 'chip state-' + st, 'data-count': 'state-' + st, title: 'peers in state ' + st },
          el('span', { class: 'dot', 'aria-hidden': 'true' }), el('strong', null, n.toLocaleString()), ' ' + st));
      }
    }
    if (f.models.length > 1) {
      items.push(el('li', { 'data-count': 'models', title: f.models.map((m) => m.model + ': ' + m.ready + ' of ' + m.peers + ' ready').join('\n') },
        el('strong', null, String(f.models.length)), ' models'));
    }
    const p = f.pairs;
    items.push(el('li', { class: p.routable === 0 && p.total > 0 ? 'chip bad' : null, 'data-count': 'pairs',
      title: 'pairs routable now (compatible, both ready, not quarantined) of every prefill × decode pair' },
    el('strong', null, p.routable.toLocaleString()), ' of ' + p.total.toLocaleString() + ' pairs routable'));
    if (p.quarantined) {
      items.push(el('li', { class: 'chip bad', 'data-count': 'quarantined', title: 'pairs under an active quarantine' },
        el('strong', null, String(p.quarantined)), ' quarantined'));
    }
    if (f.breakers && (f.breakers.peers_open || f.breakers.pairs_open)) {
      items.push(el('li', { class: 'chip bad', 'data-count': 'breakers', title: 'this replica\'s router breakers open or half-open: peers, pairs' },
        el('strong', null, String(f.breakers.peers_open + f.breakers.pairs_open)), ' breakers open'));
    }
    replace($('summary'), items);
  }

  // -------------------------------------------------------------- pairs

  const SYMBOLS = { routable: '✓', idle: '○', refused: '✕', quarantined: '⚠', preflight: '✕', none: '' };

  // verdict classifies a pair: routable; compatible but not routable (a
  // peer is not ready); refused by the pairing rules; quarantined after
  // failing again right after a re-registration; or kept out because its
  // transfer path failed the agents' preflight.
  function verdict(p) {
    let key = 'refused';
    if (!p) key = 'none';
    else if (p.quarantined) key = 'quarantined';
    else if (preflightBlocks(p)) key = 'preflight';
    else if (p.routable) key = 'routable';
    else if (p.compatible) key = 'idle';
    const word = { routable: 'routable', idle: 'not routable', refused: 'refused', quarantined: 'quarantined',
      preflight: 'preflight failed', none: 'no pair' }[key];
    return { key, word, sym: SYMBOLS[key] };
  }

  // preflightBlocks: the pair's preflight of both peers' current
  // registrations failed, which keeps it out of routing.
  function preflightBlocks(p) {
    return !!(p.preflight && p.preflight.state === 'failed' && p.preflight.current);
  }

  // preflightBlock describes a pair's last preflight: what the agents
  // measured over the transfer path, or why it failed.
  function preflightBlock(pf) {
    const how = pf.backend + ', ' + pf.mem_kind;
    const when = ' · checked ' + clock(pf.checked_at) + (pf.current ? '' : ' (before a re-registration: re-checked soon)');
    const text = pf.state === 'passed'
      ? 'preflight passed (' + how + '): ' + pf.gbps.toFixed(2) + ' GB/s, ' + Math.round(pf.latency_us) + ' µs'
      : 'preflight failed (' + how + '): ' + (pf.error || 'no reason given');
    return el('span', { class: 'preflight pf-' + pf.state, title: PREFLIGHT_LEGEND + '; checked ' + stamp(pf.checked_at) },
      el('br'), text, when);
  }

  const PREFLIGHT_LEGEND = 'the prefill\'s agent wrote a pattern into the decode agent\'s probe region over the transfer backend, ' +
    'read it back and compared it; GB/s at the largest size, µs for the smallest write';

  function renderPairs() {
    const box = $('pair-matrix');
    if (!state.pairsLoaded || !state.peersLoaded) return;
    // The whole fleet's matrix when it is small; else the group drilled
    // into, whose rows and columns are the peers of its pairs.
    const whole = !state.drill && state.groupsTotal <= MATRIX_MAX * MATRIX_MAX;
    const names = new Map(state.peers.map((p) => [p.id, p.name]));
    const cells = new Map();
    const rowIds = new Set(whole ? state.peers.filter(prefills).map((p) => p.id) : []);
    const colIds = new Set(whole ? state.peers.filter(decodes).map((p) => p.id) : []);
    for (const pr of state.pairs) {
      cells.set(pr.prefill.id + ' ' + pr.decode.id, pr);
      rowIds.add(pr.prefill.id);
      colIds.add(pr.decode.id);
      if (!names.has(pr.prefill.id)) names.set(pr.prefill.id, pr.prefill.name);
      if (!names.has(pr.decode.id)) names.set(pr.decode.id, pr.decode.name);
    }
    const byName = (a, b) => names.get(a).localeCompare(names.get(b));
    const rows = [...rowIds].sort(byName);
    const cols = [...colIds].sort(byName);

    const tally = whole ? pairTally(state.pairs) : groupTally(state.groups);
    const counts = $('pair-counts');
    const legends = { routable: 'compatible, both peers ready, not quarantined', idle: 'compatible, but a peer is not ready',
      refused: 'the pairing rules refuse the two geometries', quarantined: 'failed again right after a re-registration; kept out of routing',
      preflight: 'the transfer path failed the agents\' preflight; kept out of routing until a preflight passes' };
    replace(counts,
      [['routable', 'routable'], ['idle', 'not routable'], ['refused', 'refused'], ['quarantined', 'quarantined'], ['preflight', 'preflight failed']]
        .filter(([k]) => k !== 'preflight' || tally[k] > 0)
        .map(([k, w]) => el('span', { class: 'legend v-' + k, 'data-tally': k, title: tally[k] + ' pairs ' + w + ': ' + legends[k] },
          el('span', { class: 'sym', 'aria-hidden': 'true' }, SYMBOLS[k]), ' ' + tally[k].toLocaleString() + ' ' + w)),
      whole && state.pairsTotal > state.pairs.length ? el('span', { class: 'muted' }, ' (first ' + state.pairs.length + ' of ' + state.pairsTotal + ')') : null);

    if (!whole && !state.drill) {
      replace(box, el('p', { class: 'empty' }, state.groupsTotal.toLocaleString() + ' pairs: too many for one matrix. Choose a group above to see its pairs.'));
      return;
    }
    if (rows.length === 0 || cols.length === 0) {
      replace(box, el('p', { class: 'empty' }, 'No pairs yet: a pair needs a prefill and a decode peer.'));
      return;
    }
    const shownRows = rows.slice(0, MATRIX_MAX);
    const shownCols = cols.slice(0, MATRIX_MAX);
    const peerState = (id) => state.peersById.get(id)?.state;
    const head = el('tr', null, el('th', { scope: 'col', class: 'corner' }, el('span', null, 'prefill ↓ · decode →')),
      shownCols.map((id) => el('th', { scope: 'col', class: 'col-h' },
        el('button', { type: 'button', class: 'peer-link', 'data-open-peer': state.peersById.has(id) ? id : null, title: names.get(id) },
          el('span', { class: 'dot state-' + (peerState(id) || 'unknown'), 'aria-hidden': 'true' }), names.get(id)))));
    const body = shownRows.map((rid) => el('tr', null,
      el('th', { scope: 'row', class: 'row-h' },
        el('button', { type: 'button', class: 'peer-link', 'data-open-peer': state.peersById.has(rid) ? rid : null, title: names.get(rid) },
          el('span', { class: 'dot state-' + (peerState(rid) || 'unknown'), 'aria-hidden': 'true' }), names.get(rid))),
      shownCols.map((cid) => {
        const key = rid + ' ' + cid;
        const pr = cells.get(key);
        const v = verdict(pr);
        if (!pr) return el('td', { class: 'v v-none' }, el('span', { class: 'muted', title: 'no pair' }, '·'));
        const brk = pr.breaker && pr.breaker.state !== 'closed' ? ' brk-open' : '';
        return el('td', { class: 'v v-' + v.key + brk },
          el('button', {
            type: 'button', 'data-pair': key, 'data-focus-key': 'pair:' + key,
            'aria-pressed': state.pinnedPair === key ? 'true' : 'false',
            title: pairText(pr),
            'aria-label': names.get(rid) + ' to ' + names.get(cid) + ': ' + v.word,
          }, el('span', { class: 'sym', 'aria-hidden': 'true' }, v.sym), ' ', v.word));
      })));
    const focusKey = document.activeElement && box.contains(document.activeElement) ? document.activeElement.dataset.focusKey : null;
    replace(box, el('table', { class: 'matrix' }, el('caption', { class: 'sr-only' }, 'Pair verdicts, prefill peers by row, decode peers by column'),
      el('thead', null, head), el('tbody', null, body)),
    rows.length > MATRIX_MAX || cols.length > MATRIX_MAX
      ? el('p', { class: 'note' }, 'Showing ' + shownRows.length + ' of ' + rows.length + ' prefills and ' + shownCols.length + ' of ' + cols.length + ' decodes; the full list is at ', el('code', null, '/api/v1/pairs'), '.')
      : null);
    if (focusKey) box.querySelector('[data-focus-key="' + CSS.escape(focusKey) + '"]')?.focus();
    const pinned = state.pinnedPair && cells.get(state.pinnedPair);
    if (pinned) showPair(pinned);
    else if (state.pinnedPair) { state.pinnedPair = null; showPair(null); }
  }

  function pairText(pr) {
    const v = verdict(pr);
    return pr.prefill.name + ' → ' + pr.decode.name + ': ' + v.word +
      (pr.path ? '; path ' + pr.path : '') + (pr.reason ? '; ' + pr.reason : '') +
      (pr.unverified && pr.unverified.length ? '; not verified: ' + pr.unverified.join(', ') : '') +
      (pr.breaker && pr.breaker.state !== 'closed' ? '; this replica\'s pair breaker is ' + pr.breaker.state.replace('_', '-') : '') +
      (pr.preflight && pr.preflight.state === 'passed' ? '; preflight ' + pr.preflight.gbps.toFixed(2) + ' GB/s' : '');
  }

  function pairTally(pairs) {
    const t = { routable: 0, idle: 0, refused: 0, quarantined: 0, preflight: 0 };
    for (const pr of pairs) if (pr) t[verdict(pr).key]++;
    return t;
  }

  // groupTally adds up the groups' counts: what the tally is when the
  // pairs are not all loaded (the groups count a failed preflight among
  // the pairs not routable).
  function groupTally(groups) {
    const t = { routable: 0, idle: 0, refused: 0, quarantined: 0, preflight: 0 };
    for (const g of groups) {
      t.quarantined += g.quarantined;
      if (!g.compatible) { t.refused += g.pairs; continue; }
      t.routable += g.routable;
      t.idle += Math.max(0, g.pairs - g.routable - g.quarantined);
    }
    return t;
  }

  // renderGroups lists the pairs grouped by model and geometry class, each
  // with its counts and a button that shows its matrix.
  function renderGroups() {
    const box = $('pair-groups');
    const gs = state.groups;
    if (gs.length === 0) { replace(box); return; }
    const key = (g) => g.prefill_class.id + ' ' + g.decode_class.id;
    const sel = state.drill ? state.drill.pc + ' ' + state.drill.dc : null;
    const th = (h, title, cls) => el('th', { scope: 'col', title, class: cls }, h);
    replace(box, el('table', { class: 'groups' },
      el('caption', { class: 'sr-only' }, 'Pairs grouped by model and geometry class'),
      el('thead', null, el('tr', null,
        th('Model'), th('Prefill class', 'peers that can prefill, sharing every field a pairing rule reads'),
        th('Decode class', 'peers that can decode, sharing every field a pairing rule reads'),
        th('Pairs', 'prefills × decodes in the group (a peer never pairs with itself)', 'num'),
        th('Routable', 'compatible, both ready, not quarantined', 'num'), th('Quarantined', 'under an active quarantine', 'num'),
        th('Verdict', 'the pairing rules\' verdict for the two classes'), th(''))),
      el('tbody', null, gs.map((g) => el('tr', { class: key(g) === sel ? 'sel' : null, 'data-group-row': key(g) },
        el('td', { class: 'model' }, el('span', { class: 'trunc', title: g.prefill_class.model }, shortModel(g.prefill_class.model))),
        el('td', null, el('span', { title: 'class ' + g.prefill_class.id + ': ' + g.prefills + ' prefill-capable peers' }, g.prefills.toLocaleString() + ' × '),
          el('span', { class: 'shape' }, g.prefill_class.shape)),
        el('td', null, el('span', { title: 'class ' + g.decode_class.id + ': ' + g.decodes + ' decode-capable peers' }, g.decodes.toLocaleString() + ' × '),
          el('span', { class: 'shape' }, g.decode_class.shape)),
        el('td', { class: 'num', title: g.pairs + ' pairs in the group' }, g.pairs.toLocaleString()),
        el('td', { class: 'num', title: g.routable + ' pairs routable now' }, g.routable.toLocaleString()),
        el('td', { class: 'num', title: g.quarantined + ' pairs quarantined' }, String(g.quarantined)),
        el('td', null, g.compatible ? el('span', { class: 'v-routable' }, 'compatible' + (g.path ? ' · ' + g.path : ''))
          : el('span', { class: 'v-refused', title: g.reason || null }, 'refused: ' + (g.reason || ''))),
        el('td', null, el('button', { type: 'button', class: 'link', 'data-group': key(g), 'aria-pressed': String(key(g) === sel) },
          key(g) === sel ? 'Hide matrix' : 'Matrix')))))));
  }

  function pairByKey(key) {
    const [pid, did] = key.split(' ');
    return state.pairs.find((p) => p.prefill.id === pid && p.decode.id === did);
  }

  function showPair(pr) {
    const box = $('pair-detail');
    if (!pr) {
      replace(box, 'Hover or select a cell for the reason and transfer path.');
      box.className = 'pair-detail';
      return;
    }
    const v = verdict(pr);
    box.className = 'pair-detail v-' + v.key;
    replace(box,
      el('strong', null, pr.prefill.name), ' → ', el('strong', null, pr.decode.name), ': ',
      el('span', { class: 'verdict' }, v.sym + ' ' + v.word),
      pr.path ? [' · path ', el('code', null, pr.path)] : null,
      pr.reason ? [' · ', el('span', { class: 'why' }, pr.reason)] : null,
      pr.unverified && pr.unverified.length ? [' · not verified: ', pr.unverified.map((f, i) => [i ? ', ' : '', el('code', null, f)])] : null,
      pr.breaker && pr.breaker.state !== 'closed' ? [' · ', breakerBadge(pr.breaker), ' pair breaker'] : null,
      pr.last_exchange_at ? [' · last KV exchange ', el('span', { class: 'exchanged', title: stamp(pr.last_exchange_at) }, ago(pr.last_exchange_at))] : null,
      pr.preflight ? preflightBlock(pr.preflight) : null,
      pr.quarantine ? quarantineBlock(pr) : null);
  }

  // partners lists the peers a peer last exchanged KV with, newest first,
  // from the pairs' last exchanges: after a restart, the partners it
  // touched (whose pairs preflight again with its new generation).
  function partners(p) {
    const mine = (state.pairs || [])
      .filter((pr) => pr.last_exchange_at && (pr.prefill.id === p.id || pr.decode.id === p.id))
      .sort((a, b) => Date.parse(b.last_exchange_at) - Date.parse(a.last_exchange_at));
    if (!mine.length) return '—';
    return el('span', { class: 'partners' }, mine.map((pr, i) => {
      const other = pr.prefill.id === p.id ? pr.decode : pr.prefill;
      return [i ? ', ' : '', el('span', { 'data-partner': other.name, title: stamp(pr.last_exchange_at) }, other.name + ' (' + ago(pr.last_exchange_at) + ')')];
    }));
  }

  // quarantineBlock describes a pair's quarantine and offers to lift it;
  // like the peer actions, the button needs the admin token set at the top
  // of the page, and the server decides.
  function quarantineBlock(pr) {
    const q = pr.quarantine;
    const key = pr.prefill.id + ' ' + pr.decode.id;
    const when = q.trial
      ? 'quarantined since ' + clock(q.at) + '; expired, on trial: its next transfer lifts the quarantine or renews it'
      : 'quarantined since ' + clock(q.at) + (q.expires_at ? '; re-tested after ' + clock(q.expires_at) : '; until an operator lifts it');
    const notice = state.pairNotice && state.pairNotice.key === key
      ? el('span', { class: state.pairNotice.ok ? 'notice ok' : 'notice problem', role: 'alert' }, state.pairNotice.text)
      : null;
    return el('span', { class: 'quarantine' }, el('br'),
      el('span', { class: 'q-when', title: stamp(q.at) }, when), ' ',
      state.token
        ? el('button', { type: 'button', class: 'warn', 'data-lift-pair': key }, 'Lift quarantine')
        : el('span', { class: 'muted' }, 'Set the admin token at the top of the page to lift this quarantine.'),
      notice ? [' ', notice] : null);
  }

  async function liftQuarantine(key) {
    const [pid, did] = key.split(' ');
    try {
      await api(API + 'pairs/' + encodeURIComponent(pid) + '/' + encodeURIComponent(did) + '/quarantine', { method: 'DELETE', auth: true });
      state.pairNotice = { key, ok: true, text: 'Quarantine lifted.' };
      scheduleRefresh();
    } catch (err) {
      state.pairNotice = { key, ok: false, text: (err.title ? err.title + ': ' : '') + err.message };
    }
    showPair(pairByKey(key));
  }

  // ------------------------------------------------------------- events

  function eventItem(ev, fresh) {
    const kind = EVENT_WORDS[ev.kind] ? ev.kind : 'other';
    return el('li', { class: 'event ev-' + kind + (fresh ? ' fresh' : ''), 'data-event-id': String(ev.id) },
      el('div', { class: 'ev-line' },
        el('time', { datetime: ev.at, title: stamp(ev.at) }, clock(ev.at)),
        el('span', { class: 'kind kind-' + kind }, EVENT_WORDS[ev.kind] || ev.kind),
        el('button', { type: 'button', class: 'peer-link', 'data-open-peer': ev.peer_id }, ev.peer_name || ev.peer_id),
        el('span', { class: 'gen' }, 'gen ' + ev.generation)),
      ev.message ? el('p', { class: 'msg' }, ev.message) : null,
      ev.error ? el('pre', { class: 'err' }, ev.error) : null);
  }

  // addEvent puts an event in the timeline, newest first, once.
  function addEvent(ev, fresh) {
    if (typeof ev.id !== 'number' || state.eventIds.has(ev.id)) return;
    state.eventIds.add(ev.id);
    state.lastEventId = Math.max(state.lastEventId, ev.id);
    let i = state.events.findIndex((e) => e.id < ev.id);
    if (i < 0) i = state.events.length;
    state.events.splice(i, 0, ev);
    const list = $('event-list');
    list.querySelector('.empty')?.remove();
    const item = eventItem(ev, fresh);
    list.insertBefore(item, list.children[i] || null);
    while (state.events.length > MAX_EVENTS) {
      const gone = state.events.pop();
      state.eventIds.delete(gone.id);
      list.lastElementChild?.remove();
      state.nextCursor = state.events[state.events.length - 1].id;
      $('events-older').hidden = false;
    }
    if (fresh && state.openPeerId && ev.peer_id === state.openPeerId) loadPeerDetail(state.openPeerId);
  }

  function renderEventsEmpty() {
    replace($('event-list'), el('li', { class: 'empty' }, 'No events yet.'));
  }

  // ------------------------------------------------------------ metrics

  async function pollMetrics() {
    const m = state.metrics;
    let totals;
    const at = Date.now();
    try {
      const res = await fetch('metrics', { cache: 'no-store', headers: { Accept: 'text/plain' } });
      if (!res.ok) throw new Error(res.status + ' ' + res.statusText);
      totals = Prom.routerTotals(Prom.parse(await res.text()));
      m.error = null;
    } catch (err) {
      m.error = err.message;
      m.last = null; // the next good scrape starts a new interval
      renderCharts();
      return;
    }
    m.present = totals.present;
    m.traffic = m.traffic || totals.traffic;
    m.inflight = totals.inflight;
    if (m.last && totals.traffic && m.last.traffic) {
      const pt = Prom.rates(m.last, totals, m.lastAt, at);
      if (pt) m.points.push(pt);
    }
    m.last = totals;
    m.lastAt = at;
    while (m.points.length && m.points[0].t < at - CHART_WINDOW_MS) m.points.shift();
    renderCharts();
  }

  const CHARTS = [
    { id: 'rps', title: 'Requests', unit: ' /s', series: [{ key: 'rps', cls: 's-main', label: 'req/s' }], fmt: rate },
    { id: 'ttft', title: 'Time to first token', unit: '', series: [{ key: 'p50', cls: 's-main', label: 'p50' }, { key: 'p99', cls: 's-alt', label: 'p99' }], fmt: seconds },
    { id: 'errors', title: 'Errors', unit: ' /s', series: [{ key: 'eps', cls: 's-bad', label: 'errors/s' }], fmt: rate,
      help: 'Requests that ended in no_route, overloaded, upstream_error, timeout, stream_error or internal_error' },
    { id: 'retries', title: 'Retries', unit: ' /s', series: [{ key: 'retries', cls: 's-warn', label: 'retries/s' }], fmt: rate },
  ];

  function renderCharts() {
    const m = state.metrics;
    const span = m.points.length ? m.points[m.points.length - 1].t - m.points[0].t : 0;
    $('router-note').textContent = (m.points.length > 1 ? 'last ' + duration(span + METRICS_MS) : 'live') +
      ' · /metrics every ' + METRICS_MS / 1000 + ' s' + (m.inflight !== null ? ' · ' + m.inflight + ' in flight' : '');
    replace($('charts'), CHARTS.map((c) => chartCard(c, m)));
  }

  function chartCard(c, m) {
    const last = m.points[m.points.length - 1];
    let body;
    if (m.error && !m.points.length) body = el('p', { class: 'chart-empty' }, 'metrics unavailable: ' + m.error);
    else if (!m.traffic) body = el('p', { class: 'chart-empty' }, 'no traffic yet');
    else if (m.points.length < 2) body = el('p', { class: 'chart-empty' }, 'collecting…');
    else body = chart(c, m.points);
    const figures = c.series.map((s) => el('span', { class: 'fig ' + (last ? s.cls : 'none') },
      c.series.length > 1 ? el('span', { class: 'fig-label' }, s.label + ' ') : null,
      last ? c.fmt(last[s.key]) : '–'));
    return el('figure', { class: 'chart', 'data-chart': c.id, title: c.help || null },
      el('figcaption', null, el('span', { class: 'chart-title' }, c.title + c.unit), el('span', { class: 'figs' }, figures)),
      body);
  }

  // chart draws the series as an inline SVG line chart scaled to its data.
  function chart(c, points) {
    const W = 300, H = 64, PAD_T = 4, PAD_B = 2;
    const t0 = points[0].t, t1 = points[points.length - 1].t;
    const vals = points.flatMap((p) => c.series.map((s) => p[s.key])).filter(Number.isFinite);
    const max = niceMax(vals.length ? Math.max(...vals) : 0);
    const x = (t) => (t1 === t0 ? W : ((t - t0) / (t1 - t0)) * W);
    const y = (v) => PAD_T + (H - PAD_T - PAD_B) * (1 - v / max);
    const g = svg('svg', { viewBox: '0 0 ' + W + ' ' + H, preserveAspectRatio: 'none', class: 'spark', role: 'img',
      'aria-label': c.title + ' over the last ' + duration(t1 - t0) });
    g.append(svg('line', { x1: 0, x2: W, y1: y(max), y2: y(max), class: 'grid' }));
    g.append(svg('line', { x1: 0, x2: W, y1: y(max / 2), y2: y(max / 2), class: 'grid' }));
    g.append(svg('line', { x1: 0, x2: W, y1: y(0), y2: y(0), class: 'axis' }));
    c.series.forEach((s, i) => {
      // Gaps (no requests, so no latency) break the line.
      const runs = [];
      let run = [];
      for (const p of points) {
        if (Number.isFinite(p[s.key])) run.push([x(p.t), y(p[s.key])]);
        else if (run.length) { runs.push(run); run = []; }
      }
      if (run.length) runs.push(run);
      for (const r of runs) {
        const d = r.map(([px, py], j) => (j ? 'L' : 'M') + px.toFixed(1) + ' ' + py.toFixed(1)).join(' ');
        if (i === 0) g.append(svg('path', { d: d + ' L' + r[r.length - 1][0].toFixed(1) + ' ' + y(0) + ' L' + r[0][0].toFixed(1) + ' ' + y(0) + ' Z', class: 'area ' + s.cls }));
        g.append(svg('path', { d, class: 'line ' + s.cls }));
      }
    });
    return el('div', { class: 'plot' },
      g,
      el('span', { class: 'ymax' }, c.fmt(max)),
      el('span', { class: 'xmin' }, '−' + duration(t1 - t0)),
      el('span', { class: 'xmax' }, 'now'));
  }

  function niceMax(v) {
    if (!(v > 0)) return 1;
    const p = Math.pow(10, Math.floor(Math.log10(v)));
    for (const m of [1, 2, 2.5, 5, 10]) if (v <= m * p) return m * p;
    return 10 * p;
  }

  // --------------------------------------------------------- peer detail

  function openPeer(id) {
    const dlg = $('peer-dialog');
    state.openPeerId = id;
    state.peerEvents = [];
    state.peerNotice = null;
    renderPeerDetail();
    if (!dlg.open) dlg.showModal();
    if (location.hash !== '#peer=' + encodeURIComponent(id)) history.replaceState(null, '', '#peer=' + encodeURIComponent(id));
    loadPeerDetail(id);
  }

  async function loadPeerDetail(id) {
    const n = ++seq.detail;
    try {
      const [peer, evs] = await Promise.all([
        api(API + 'peers/' + encodeURIComponent(id)),
        api(API + 'events?' + new URLSearchParams({ peer_id: id, limit: '100' })),
      ]);
      if (n !== seq.detail || state.openPeerId !== id) return;
      state.peersById.set(id, peer);
      state.peerEvents = evs.events || [];
      state.detailError = null;
    } catch (err) {
      if (n !== seq.detail || state.openPeerId !== id) return;
      state.detailError = err.status === 404 ? 'This peer is no longer registered.' : err.message;
    }
    renderPeerDetail();
  }

  function renderPeerDetail() {
    const id = state.openPeerId;
    if (!id) return;
    const p = state.peersById.get(id);
    const body = $('pd-body');
    const title = $('pd-title');
    if (!p) {
      replace(title, 'Peer ', el('code', null, id));
      replace(body, el('p', { class: state.detailError ? 'problem' : 'empty' }, state.detailError || 'Loading…'));
      return;
    }
    replace(title, p.name, ' ', stateBadge(p.state, p.state_reason));
    const lease = leaseLeft(p.lease_expiry);
    const par = p.parallelism || {};
    const kv = p.kv || {};
    const labels = Object.entries(p.labels || {}).sort(([a], [b]) => a.localeCompare(b));
    const kept = keepDetailState(body);
    replace(body,
      state.detailError ? el('p', { class: 'problem', role: 'alert' }, state.detailError) : null,
      el('p', { class: 'pd-sub' }, roleWord(p.role) + ' · ' + p.engine + ' · ', el('code', null, p.id)),
      p.state_reason ? el('p', { class: 'callout state-' + p.state }, el('strong', null, 'Reason: '), p.state_reason) : null,
      healLine(p.heal),
      actions(p),
      el('dl', { class: 'facts' },
        fact('URL', el('code', null, p.url)),
        p.bootstrap_host || p.bootstrap_port ? fact('Bootstrap', el('code', null, (p.bootstrap_host || '') + ':' + (p.bootstrap_port || ''))) : null,
        fact('Model', p.model),
        fact('Instance', el('code', null, p.instance_id)),
        fact('Generation', String(p.generation)),
        fact('Breaker', breakerBadge(p.breaker)),
        fact('Transfer group', p.transfer_group || '—'),
        fact('KV exchanged with', partners(p)),
        fact('KV events', p.kv_events
          ? el('span', null, el('code', null, p.kv_events.endpoint), p.kv_events.topic ? el('span', null, ' topic ', el('code', null, p.kv_events.topic)) : null,
            el('span', { class: 'muted' }, ' · the precise policy routes by the blocks it holds'))
          : el('span', { class: 'muted' }, 'none published · the precise policy routes it by the prompt-hash ring')),
        fact('Lease left', el('span', { 'data-lease': p.lease_expiry || '', class: lease.cls }, lease.text)),
        fact('Last heartbeat', el('span', { 'data-ago': p.last_heartbeat || '', title: p.last_heartbeat ? stamp(p.last_heartbeat) : null }, ago(p.last_heartbeat))),
        fact('Heartbeat / lease', p.heartbeat_interval_seconds + ' s / ' + p.lease_ttl_seconds + ' s'),
        fact('Load', (p.load?.running ?? 0) + ' running · ' + (p.load?.queued ?? 0) + ' queued · KV ' + pct(p.load?.kv_usage)),
        fact('Parallelism', 'TP ' + par.tp_size + ' · attn TP ' + (par.attn_tp_size ?? par.tp_size) + ' · DP ' + (par.dp_size ?? 1) +
          ' · PP ' + (par.pp_size ?? 1) + ' (rank ' + (par.pp_rank ?? 0) + ') · DCP ' + (par.dcp_size ?? 1) + ' (rank ' + (par.dcp_rank ?? 0) + ')'),
        fact('KV geometry', 'page ' + kv.page_size + ' · ' + kv.dtype + ' · ' + (kv.num_layers ?? '?') + ' layers · ' + (kv.num_kv_heads ?? '?') +
          ' KV heads · head dim ' + (kv.head_dim ?? '?') + (kv.is_mla ? ' · MLA' : '')),
        fact('Observed', (p.observed || []).join(', ') || '—'),
        fact('Unknown', (p.unknown || []).join(', ') || '—'),
        fact('Labels', labels.length ? el('span', { class: 'labels' }, labels.map(([k, v]) => el('span', { class: 'label' }, k + '=' + v))) : '—'),
        fact('Registered', stamp(p.created_at)),
        fact('Updated', stamp(p.updated_at))),
      el('h3', null, 'Ranks ', el('span', { class: 'count' }, p.ranks ? String(p.ranks.length) : 'unknown')),
      (p.ranks || []).map(rankBlock),
      el('h3', null, 'Generation history'),
      historyTable());
    kept.restore();
  }

  // keepDetailState notes what the operator has opened or typed in the
  // detail view, so that a live re-render does not throw it away.
  function keepDetailState(body) {
    const dlg = $('peer-dialog');
    const scroll = dlg.scrollTop;
    const details = [...body.querySelectorAll('details')].map((d) => d.open);
    const form = body.querySelector('[data-action-form]:not([hidden])');
    const which = form ? form.dataset.actionForm : null;
    const values = form ? [...form.querySelectorAll('input')].map((i) => [i.name, i.value]) : [];
    const focused = document.activeElement && body.contains(document.activeElement) ? document.activeElement.name : null;
    return {
      restore() {
        body.querySelectorAll('details').forEach((d, i) => { d.open = !!details[i]; });
        if (which) {
          const again = body.querySelector('[data-action-form=' + which + ']');
          if (again) {
            again.hidden = false;
            for (const [name, v] of values) if (again.elements?.[name]) again.elements[name].value = v;
            if (focused && again.elements?.[focused]) again.elements[focused].focus();
          }
        }
        dlg.scrollTop = scroll;
      },
    };
  }

  function fact(k, v) {
    return [el('dt', null, k), el('dd', null, v)];
  }

  // rankBlock draws a rank from the open summary: region sizes and memory
  // kinds, never KV pointers or agent metadata (those are only in the
  // authenticated full registration).
  function rankBlock(r) {
    const kinds = r.kv_mem_kinds || [];
    const lens = r.kv_data_lens || [];
    const n = r.regions ?? lens.length;
    const kindCounts = {};
    for (const k of kinds) kindCounts[k] = (kindCounts[k] || 0) + 1;
    const total = r.kv_bytes ?? lens.reduce((a, b) => a + b, 0);
    const meta = r.agent_metadata_bytes || 0;
    const aux = r.aux_regions || 0;
    const regions = el('table', { class: 'regions' },
      el('thead', null, el('tr', null, ['#', 'Length', 'Memory kind'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', null, Array.from({ length: Math.max(n, kinds.length) }, (_, i) => el('tr', null,
        el('td', { class: 'num' }, String(i)),
        el('td', { class: 'num' }, bytes(lens[i])),
        el('td', null, kinds[i] ? el('span', { class: 'memkind mk-' + kinds[i] }, kinds[i]) : el('span', { class: 'problem' }, 'missing'))))));
    return el('section', { class: 'rank' },
      el('h4', null, 'Rank ' + r.rank + ' · GPU ' + (r.gpu_id === -1 || r.gpu_id === undefined ? 'none' : r.gpu_id) + ' · agent ', el('code', null, r.agent_name)),
      el('p', { class: 'rank-sum' },
        n + ' KV region' + (n === 1 ? '' : 's') + ', ' + bytes(total) + ' · ',
        Object.entries(kindCounts).map(([k, c]) => el('span', { class: 'memkind mk-' + k }, c + '× ' + k)),
        aux ? ' · ' + aux + ' aux region' + (aux === 1 ? '' : 's') : '',
        meta ? ' · agent metadata ' + bytes(meta) : ''),
      n > 8 ? el('details', null, el('summary', null, 'Show all ' + n + ' regions'), regions) : regions);
  }

  function historyTable() {
    const evs = state.peerEvents;
    if (!evs.length) return el('p', { class: 'empty' }, 'No events for this peer.');
    return el('table', { class: 'history' },
      el('thead', null, el('tr', null, ['Time', 'Gen', 'Event', 'Detail'].map((h) => el('th', { scope: 'col' }, h)))),
      el('tbody', null, evs.map((ev, i) => {
        const bumped = i + 1 < evs.length && evs[i + 1].generation !== ev.generation;
        return el('tr', { class: bumped ? 'gen-bump' : null },
          el('td', { class: 'num', title: stamp(ev.at) }, clock(ev.at)),
          el('td', { class: 'num' }, String(ev.generation)),
          el('td', null, el('span', { class: 'kind kind-' + (EVENT_WORDS[ev.kind] ? ev.kind : 'other') }, EVENT_WORDS[ev.kind] || ev.kind)),
          el('td', null, ev.message || '', ev.error ? el('pre', { class: 'err' }, ev.error) : null));
      })));
  }

  // actions are offered once an admin token is set; the server decides.
  function actions(p) {
    const notice = state.peerNotice
      ? el('p', { class: state.peerNotice.ok ? 'notice ok' : 'notice problem', role: 'alert' }, state.peerNotice.text)
      : null;
    if (!state.token) {
      return el('div', { class: 'actions' }, notice,
        el('p', { class: 'muted' }, 'Set the admin token at the top of the page to drain, mark stale or remove this peer.'));
    }
    const stale = el('form', { class: 'stale-form', hidden: true, 'data-action-form': 'stale' },
      el('label', null, 'Reason ', el('input', { name: 'reason', required: true, value: 'operator: marked stale from the status page', size: 36 })),
      el('label', null, 'Error text ', el('input', { name: 'error', placeholder: 'optional', size: 36 })),
      el('button', { type: 'submit', class: 'warn' }, 'Mark stale'),
      el('button', { type: 'button', 'data-action': 'cancel' }, 'Cancel'));
    const remove = el('div', { class: 'confirm', hidden: true, 'data-action-form': 'remove' },
      'Remove ', el('strong', null, p.name), ' from the registry? Its agent will register it again on its next heartbeat if it is still running. ',
      el('button', { type: 'button', class: 'danger', 'data-action': 'remove-confirm' }, 'Remove'),
      el('button', { type: 'button', 'data-action': 'cancel' }, 'Cancel'));
    return el('div', { class: 'actions', 'data-peer-id': p.id }, notice,
      el('div', { class: 'buttons' },
        el('button', { type: 'button', 'data-action': 'drain', disabled: p.state === 'draining' }, 'Drain'),
        el('button', { type: 'button', 'data-action': 'stale' }, 'Mark stale…'),
        el('button', { type: 'button', class: 'danger-outline', 'data-action': 'remove' }, 'Remove…')),
      stale, remove);
  }

  async function runAction(id, what, body) {
    const paths = { drain: ['POST', '/drain'], stale: ['POST', '/stale'], remove: ['DELETE', ''] };
    const [method, suffix] = paths[what];
    const name = state.peersById.get(id)?.name || id;
    try {
      await api(API + 'peers/' + encodeURIComponent(id) + suffix, { method, body, auth: true });
      state.peerNotice = { ok: true, text: { drain: 'Draining ' + name + '.', stale: name + ' marked stale.', remove: name + ' removed.' }[what] };
      if (what === 'remove') {
        $('peer-dialog').close();
      }
      scheduleRefresh();
    } catch (err) {
      state.peerNotice = { ok: false, text: (err.title ? err.title + ': ' : '') + err.message + (err.field ? ' (' + err.field + ')' : '') };
    }
    if (state.openPeerId === id) renderPeerDetail();
  }

  // ------------------------------------------------------------ wiring

  function readToken() {
    try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch { return ''; }
  }

  function setToken(t) {
    state.token = t;
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch { /* storage disabled: keep it for this page only */ }
    $('token').value = '';
    $('token').placeholder = t ? 'set for this tab' : 'not set';
    $('token-clear').hidden = !t;
    document.body.classList.toggle('has-token', !!t);
    renderPeerDetail();
    // The pinned pair's detail offers the lift only with a token.
    if (state.pinnedPair) showPair(pairByKey(state.pinnedPair));
  }

  function tick() {
    for (const e of document.querySelectorAll('[data-lease]')) {
      const l = leaseLeft(e.dataset.lease);
      if (e.textContent !== l.text) e.textContent = l.text;
      e.classList.toggle('lease-low', l.cls === 'lease-low');
      e.classList.toggle('lease-out', l.cls === 'lease-out');
    }
    for (const e of document.querySelectorAll('[data-ago]')) {
      const t = ago(e.dataset.ago);
      if (e.textContent !== t) e.textContent = t;
      if (e.dataset.hbInterval) {
        const c = heartbeatClass(e.dataset.ago, Number(e.dataset.hbInterval), Number(e.dataset.hbTtl));
        e.classList.toggle('hb-late', c === 'hb-late');
        e.classList.toggle('hb-lost', c === 'hb-lost');
      }
    }
    tickBanner();
  }

  function wire() {
    const f = state.filters;
    for (const [id, key] of [['f-role', 'role'], ['f-state', 'state'], ['f-model', 'model'], ['f-name', 'name']]) {
      $(id).addEventListener('input', (e) => { f[key] = e.target.value; renderPeers(); });
    }
    $('filters').addEventListener('submit', (e) => e.preventDefault());

    $('token-form').addEventListener('submit', (e) => {
      e.preventDefault();
      const t = $('token').value.trim();
      if (t) setToken(t);
    });
    $('token-clear').addEventListener('click', () => setToken(''));
    $('reconnect-now').addEventListener('click', () => { conn.backoff = BACKOFF_MIN_MS; connect(); });
    $('events-older').addEventListener('click', () => loadEvents(true));

    // One delegated listener opens peers from anywhere on the page.
    document.addEventListener('click', (e) => {
      const opener = e.target.closest('[data-open-peer]');
      if (opener && opener.dataset.openPeer) { openPeer(opener.dataset.openPeer); return; }
      const group = e.target.closest('[data-group]');
      if (group) {
        const [pc, dc] = group.dataset.group.split(' ');
        state.drill = state.drill && state.drill.pc === pc && state.drill.dc === dc ? null : { pc, dc };
        state.pinnedPair = null;
        showPair(null);
        renderGroups();
        loadPairs();
        return;
      }
      const lift = e.target.closest('[data-lift-pair]');
      if (lift) { lift.disabled = true; liftQuarantine(lift.dataset.liftPair); return; }
      const cell = e.target.closest('[data-pair]');
      if (cell) {
        const key = cell.dataset.pair;
        state.pinnedPair = state.pinnedPair === key ? null : key;
        for (const b of $('pair-matrix').querySelectorAll('[data-pair]')) b.setAttribute('aria-pressed', String(b.dataset.pair === state.pinnedPair));
        showPair(state.pinnedPair ? pairByKey(state.pinnedPair) : pairByKey(key));
      }
    });
    const matrix = $('pair-matrix');
    const preview = (e) => {
      const cell = e.target.closest('[data-pair]');
      if (cell) showPair(pairByKey(cell.dataset.pair));
    };
    matrix.addEventListener('mouseover', preview);
    matrix.addEventListener('focusin', preview);
    matrix.addEventListener('mouseleave', () => showPair(state.pinnedPair ? pairByKey(state.pinnedPair) : null));

    const dlg = $('peer-dialog');
    dlg.addEventListener('close', () => {
      state.openPeerId = null;
      state.detailError = null;
      if (location.hash.startsWith('#peer=')) history.replaceState(null, '', location.pathname + location.search);
    });
    dlg.addEventListener('click', (e) => {
      if (e.target === dlg) { dlg.close(); return; } // the backdrop
      const b = e.target.closest('[data-action]');
      if (!b) return;
      const box = b.closest('.actions');
      const id = box?.dataset.peerId;
      if (!id) return;
      const forms = box.querySelectorAll('[data-action-form]');
      const show = (which) => forms.forEach((fm) => { fm.hidden = fm.dataset.actionForm !== which; });
      switch (b.dataset.action) {
        case 'drain': runAction(id, 'drain'); break;
        case 'stale': show('stale'); box.querySelector('[name=reason]').focus(); break;
        case 'remove': show('remove'); break;
        case 'remove-confirm': runAction(id, 'remove'); break;
        case 'cancel': show(''); break;
      }
    });
    dlg.addEventListener('submit', (e) => {
      const fm = e.target.closest('[data-action-form=stale]');
      if (!fm) return;
      e.preventDefault();
      const id = fm.closest('.actions').dataset.peerId;
      const body = { reason: fm.elements.reason.value.trim() };
      const errText = fm.elements.error.value.trim();
      if (errText) body.error = errText;
      runAction(id, 'stale', body);
    });
    window.addEventListener('hashchange', openFromHash);
  }

  function openFromHash() {
    const m = /^#peer=(.+)$/.exec(location.hash);
    if (m) openPeer(decodeURIComponent(m[1]));
  }

  async function start() {
    wire();
    setToken(state.token);
    renderCharts();
    await Promise.all([loadEvents(false), loadFleet(), loadPeers(), loadPairs()]);
    connect();
    openFromHash();
    pollMetrics();
    setInterval(tick, 1000);
    // Polls stop while the tab is hidden: even as a summary (no pointers or
    // NIXL metadata), the peer list grows with the fleet.
    const visible = (fn) => () => { if (!document.hidden) fn(); };
    const pollPeers = () => setTimeout(async () => {
      if (!document.hidden) await loadPeers();
      pollPeers();
    }, Math.max(POLL_PEERS_MS, state.peers.length * POLL_PEERS_MS_PER_PEER));
    pollPeers();
    setInterval(visible(loadFleet), POLL_FLEET_MS);
    setInterval(visible(loadPairs), POLL_PAIRS_MS);
    setInterval(visible(pollMetrics), METRICS_MS);
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden) { scheduleRefresh(); pollMetrics(); }
    });
  }

  start();
})();
