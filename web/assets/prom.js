'use strict';
// prom.js: pure functions over the Prometheus text format, used by app.js to
// turn /metrics scrapes into rates and latency quantiles. No DOM here.
(function (global) {
  // parse reads the text exposition format into samples
  // {name, labels, value}. Comments, blank lines and lines it cannot read
  // are skipped: a scrape is advisory, never fatal to the page.
  function parse(text) {
    const out = [];
    for (const raw of text.split('\n')) {
      const line = raw.trim();
      if (line === '' || line[0] === '#') continue;
      const s = parseLine(line);
      if (s) out.push(s);
    }
    return out;
  }

  function parseLine(line) {
    let i = 0;
    while (i < line.length && line[i] !== '{' && line[i] !== ' ' && line[i] !== '\t') i++;
    const name = line.slice(0, i);
    if (name === '') return null;
    const labels = {};
    if (line[i] === '{') {
      i++;
      for (;;) {
        while (line[i] === ' ' || line[i] === ',') i++;
        if (line[i] === '}') { i++; break; }
        const eq = line.indexOf('=', i);
        if (eq < 0 || line[eq + 1] !== '"') return null;
        const key = line.slice(i, eq).trim();
        let j = eq + 2;
        let val = '';
        while (j < line.length && line[j] !== '"') {
          if (line[j] === '\\' && j + 1 < line.length) {
            const c = line[j + 1];
            val += c === 'n' ? '\n' : c;
            j += 2;
          } else {
            val += line[j++];
          }
        }
        if (j >= line.length) return null;
        labels[key] = val;
        i = j + 1;
      }
    }
    const rest = line.slice(i).trim().split(/\s+/);
    const value = parseValue(rest[0]);
    if (value === null) return null;
    return { name, labels, value };
  }

  function parseValue(s) {
    switch (s) {
      case undefined: case '': return null;
      case '+Inf': case 'Inf': return Infinity;
      case '-Inf': return -Infinity;
      case 'NaN': return NaN;
    }
    const v = Number(s);
    return Number.isNaN(v) ? null : v;
  }

  // Outcomes of pdplane_router_requests_total that count as errors: the
  // fleet failed the request. Refusals of bad client input and clients that
  // left are not the fleet's fault and are not counted.
  const ERROR_OUTCOMES = new Set(['no_route', 'overloaded', 'upstream_error', 'timeout', 'stream_error', 'internal_error']);

  // routerTotals sums the router's counters over all their labels at one
  // scrape. present says whether any pdplane_router_ series exists at all;
  // traffic whether the request counter has a sample yet.
  function routerTotals(samples) {
    const t = { present: false, traffic: false, requests: 0, errors: 0, retries: 0, inflight: null, ttft: [] };
    const buckets = new Map();
    for (const s of samples) {
      if (!s.name.startsWith('pdplane_router_')) continue;
      t.present = true;
      switch (s.name) {
        case 'pdplane_router_requests_total':
          t.traffic = true;
          t.requests += s.value;
          if (ERROR_OUTCOMES.has(s.labels.outcome)) t.errors += s.value;
          break;
        case 'pdplane_router_retries_total':
          t.retries += s.value;
          break;
        case 'pdplane_router_inflight_requests':
          t.inflight = (t.inflight || 0) + s.value;
          break;
        case 'pdplane_router_ttft_seconds_bucket': {
          const le = parseValue(s.labels.le);
          if (le !== null && !Number.isNaN(le)) buckets.set(le, (buckets.get(le) || 0) + s.value);
          break;
        }
      }
    }
    t.ttft = [...buckets].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le);
    return t;
  }

  // counterDelta is how much a counter grew between two scrapes; a smaller
  // value means the process restarted and counts from zero again.
  function counterDelta(prev, cur) {
    return cur >= prev ? cur - prev : cur;
  }

  // bucketDelta differences two cumulative histograms bucket by bucket.
  function bucketDelta(prev, cur) {
    const before = new Map(prev.map((b) => [b.le, b.count]));
    const reset = cur.some((b) => before.has(b.le) && b.count < before.get(b.le));
    return cur.map((b) => ({ le: b.le, count: reset ? b.count : b.count - (before.get(b.le) || 0) }));
  }

  // quantile estimates the q-quantile of cumulative buckets sorted by le,
  // the way Prometheus's histogram_quantile does: linear interpolation
  // inside the bucket that holds the rank, the lowest bucket starting at 0,
  // and the highest finite bound when the rank falls in +Inf. NaN when the
  // histogram is empty.
  function quantile(q, buckets) {
    if (buckets.length < 2 || buckets[buckets.length - 1].le !== Infinity) return NaN;
    const total = buckets[buckets.length - 1].count;
    if (!(total > 0)) return NaN;
    const rank = q * total;
    let i = buckets.findIndex((b) => b.count >= rank);
    if (i < 0) i = buckets.length - 1;
    if (i === buckets.length - 1) return buckets[buckets.length - 2].le;
    const lower = i === 0 ? 0 : buckets[i - 1].le;
    const below = i === 0 ? 0 : buckets[i - 1].count;
    const inBucket = buckets[i].count - below;
    if (i === 0 && buckets[0].le <= 0) return buckets[0].le;
    if (inBucket <= 0) return buckets[i].le;
    return lower + (buckets[i].le - lower) * ((rank - below) / inBucket);
  }

  // rates turns two scrapes' routerTotals, taken at t0 and t1 (ms), into one
  // chart point: per-second rates and TTFT quantiles over the interval.
  function rates(prev, cur, t0, t1) {
    const dt = (t1 - t0) / 1000;
    if (!(dt > 0)) return null;
    const ttft = bucketDelta(prev.ttft, cur.ttft);
    return {
      t: t1,
      rps: counterDelta(prev.requests, cur.requests) / dt,
      eps: counterDelta(prev.errors, cur.errors) / dt,
      retries: counterDelta(prev.retries, cur.retries) / dt,
      p50: quantile(0.5, ttft),
      p99: quantile(0.99, ttft),
    };
  }

  global.pdplaneProm = Object.freeze({ parse, routerTotals, counterDelta, bucketDelta, quantile, rates, ERROR_OUTCOMES });
})(window);
