// Everything around the timeline that shows trace data as text: tooltip, selection details,
// the per-name summary table, anomalies and trace facts. All of it is built with textContent
// (GT.el), so a scope named "<img src=x onerror=...>" is shown as those characters.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var el = GT.el, fmtDur = GT.fmtDur, fmtTs = GT.fmtTs;
  var KIND = GT.KIND;

  function argsOf(m, id) {
    var e = m.events[m.slices.ev[id]];
    return (e && e.args) || {};
  }

  function flagsOf(m, ids) {
    var seen = {};
    ids.forEach(function (id) {
      var f = argsOf(m, id).flags;
      if (Array.isArray(f)) f.forEach(function (x) { seen[String(x)] = true; });
    });
    return Object.keys(seen);
  }

  // What a person wants to know about slice `id`: title, subtitle, [label, value] rows, flags, args.
  GT.sliceFacts = function (m, id) {
    var S = m.slices, kind = S.kind[id], sc = S.scope[id];
    var lane = m.lanes[S.lane[id]];
    var facts = { title: m.names[S.name[id]], rows: [], flags: [], args: null };
    if (sc >= 0 && sc < m.nScopes && kind !== KIND.pass) {
      var c = m.scopeCpu[sc], g = m.scopeGpu[sc], q = m.scopeQueued[sc];
      facts.title = m.names[S.name[c]];
      facts.subtitle = (kind === KIND.gpu ? 'GPU execution' : kind === KIND.queued ? 'queued on the GPU' : 'CPU enqueue') +
        ' · ' + lane.title;
      facts.rows.push(['CPU enqueue', fmtDur(S.dur[c]), fmtTs(S.start[c])]);
      var own = GT.selfCpu(m)[c];
      if (!isNaN(own)) facts.rows.push(['CPU self (not in child scopes)', fmtDur(own), '']);
      if (g >= 0) {
        var a = argsOf(m, g);
        if (typeof a.submit_ts === 'number') facts.rows.push(['submitted', fmtTs(a.submit_ts), '']);
        if (typeof a.submit_to_start_us === 'number') {
          facts.rows.push(['queued (submit → start)', fmtDur(a.submit_to_start_us), '']);
        }
        facts.rows.push(['GPU', fmtDur(typeof a.gpu_us === 'number' ? a.gpu_us : S.dur[g]), fmtTs(S.start[g])]);
        // the figures of docs/metrics.md, as the trace args carry them (gputrace.figures)
        if (typeof a.gpu_busy_us === 'number') facts.rows.push(['GPU busy (operations running)', fmtDur(a.gpu_busy_us), '']);
        if (typeof a.gpu_self_us === 'number') facts.rows.push(['GPU self (not in child scopes)', fmtDur(a.gpu_self_us), '']);
        if (typeof a.if_launches_free_us === 'number') {
          facts.rows.push(['if launches were free', fmtDur(a.if_launches_free_us),
            'estimate: busy + one calibrated launch (CUDA graph / submit), work back to back']);
        }
        if (typeof a.uncertainty_us === 'number') facts.rows.push(['alignment uncertainty', '± ' + fmtDur(a.uncertainty_us), '']);
        facts.rows.push(['GPU lane', m.lanes[S.lane[g]].title, '']);
      } else {
        facts.rows.push(['GPU', 'not timed', '']);
      }
      facts.rows.push(['CPU thread', m.lanes[S.lane[c]].title, '']);
      facts.rows.push(['scope', '#' + sc, '']);
      facts.flags = flagsOf(m, g >= 0 ? [c, g] : [c]);
      var user = {};
      var ca = argsOf(m, c);
      Object.keys(ca).forEach(function (k) { if (k !== 'flags') user[k] = ca[k]; });
      facts.args = Object.keys(user).length ? user : null;
    } else {
      facts.subtitle = (kind === KIND.pass ? 'GPU pass' : 'slice') + ' · ' + lane.title;
      facts.rows.push(['duration', fmtDur(S.dur[id]), fmtTs(S.start[id])]);
      var mine = GT.selfCpu(m)[id];
      if (!isNaN(mine)) facts.rows.push(['self (not in nested slices)', fmtDur(mine), '']);
      var oa = argsOf(m, id), rest = {};
      if (kind === KIND.pass && typeof oa.scope === 'number' && oa.scope < m.nScopes) {
        facts.rows.push(['scope', '#' + oa.scope + ' ' + m.names[S.name[m.scopeCpu[oa.scope]]], '']);
      }
      Object.keys(oa).forEach(function (k) { if (k !== 'flags' && k !== 'scope') rest[k] = oa[k]; });
      facts.flags = flagsOf(m, [id]);
      facts.args = Object.keys(rest).length ? rest : null;
    }
    return facts;
  };

  function factsOfHit(m, hit) {
    if (hit.slice >= 0) return GT.sliceFacts(m, hit.slice);
    if (hit.instant) {
      var e = m.events[hit.instant.ev] || {};
      return { title: hit.instant.name, subtitle: hit.instant.cat + ' · ' + hit.lane.title,
               rows: [['at', fmtTs(hit.instant.ts), '']], flags: [], args: e.args || null };
    }
    if (hit.counter !== undefined) {
      return { title: hit.lane.title, subtitle: 'counter',
               rows: hit.counter ? [['value', String(hit.counter.value), fmtTs(hit.counter.ts)]] : [],
               flags: [], args: null };
    }
    if (hit.label) {
      return { title: hit.lane.title, subtitle: hit.lane.group,
               rows: [['slices', String(hit.lane.count || 0), '']], flags: [], args: null };
    }
    return null;
  }

  function renderFacts(box, f) {
    GT.clear(box);
    box.appendChild(el('div', 'tt-title', f.title));
    if (f.subtitle) box.appendChild(el('div', 'tt-sub', f.subtitle));
    var table = el('table', 'facts');
    f.rows.forEach(function (r) {
      var tr = el('tr');
      tr.appendChild(el('th', null, r[0]));
      tr.appendChild(el('td', 'num', r[1]));
      tr.appendChild(el('td', 'muted', r[2]));
      table.appendChild(tr);
    });
    box.appendChild(table);
    if (f.flags.length) {
      var fl = el('div', 'flags');
      f.flags.forEach(function (name) { fl.appendChild(el('span', 'flag flag-' + name.replace(/[^a-z_]/g, ''), name)); });
      box.appendChild(fl);
    }
    if (f.args) {
      var at = el('table', 'facts args');
      Object.keys(f.args).forEach(function (k) {
        var tr = el('tr');
        tr.appendChild(el('th', null, k));
        tr.appendChild(el('td', null, GT.argText(f.args[k])));
        at.appendChild(tr);
      });
      box.appendChild(at);
    }
  }

  GT.showTooltip = function (tip, m, hit, ev) {
    var f = hit && ev ? factsOfHit(m, hit) : null;
    if (!f) { tip.hidden = true; return; }
    renderFacts(tip, f);
    tip.hidden = false;
    var w = tip.offsetWidth, h = tip.offsetHeight;
    var x = ev.clientX + 14, y = ev.clientY + 14;
    if (x + w > window.innerWidth - 4) x = Math.max(4, ev.clientX - w - 14);
    if (y + h > window.innerHeight - 4) y = Math.max(4, ev.clientY - h - 14);
    tip.style.left = x + 'px';
    tip.style.top = y + 'px';
  };

  GT.showDetails = function (box, m, id, instant, onZoom) {
    GT.clear(box);
    if (id < 0 && !instant) {
      box.appendChild(el('p', 'muted', 'Click a slice to see all its numbers.'));
      return;
    }
    var f = id >= 0 ? GT.sliceFacts(m, id) : factsOfHit(m, { instant: instant, lane: instant.lane });
    renderFacts(box, f);
    if (id >= 0) {
      var b = el('button', null, 'Zoom to it (F)');
      b.type = 'button';
      b.addEventListener('click', function () { onZoom(id); });
      box.appendChild(b);
    }
  };

  // summary table -------------------------------------------------------------------------------
  var COLUMNS = [
    { key: 'name', label: 'Name', text: true },
    { key: 'calls', label: 'Calls' },
    { key: 'cold', label: 'Cold' },
    { key: 'gpuTotal', label: 'GPU total', dur: true, title: 'GPU time of all calls' },
    { key: 'gpuMedian', label: 'GPU median', dur: true, title: 'warm calls (cold calls pay compilation)' },
    { key: 'gpuMax', label: 'GPU max', dur: true, title: 'warm calls' },
    { key: 'cpuMedian', label: 'CPU enqueue median', dur: true, title: 'warm calls' },
    { key: 'selfCpuTotal', label: 'CPU self', dur: true, title: 'CPU time not in child scopes (same thread), all calls' },
    { key: 'busyMedian', label: 'Busy median', dur: true, title: 'time its GPU operations ran (union), warm calls' },
    { key: 'selfTotal', label: 'GPU self', dur: true, title: 'busy time not in child scopes, all calls' },
    { key: 'queuedMedian', label: 'Queued median', dur: true, title: 'submission (the first launch call where seen) → GPU start, warm calls' },
    { key: 'freeMedian', label: 'If launches free', dur: true,
      title: 'an estimate: busy + one calibrated launch (CUDA graph launch / WebGPU submit), for calls whose GPU waited on the host' },
    { key: 'anomalies', label: 'Anomalies' },
  ];
  var MAX_ROWS = 2000;

  GT.SummaryTable = function (table, note, onRow) {
    this.table = table; this.note = note; this.onRow = onRow;
    this.rows = []; this.sortKey = 'gpuTotal'; this.desc = true; this.active = -1;
  };

  // foreign: another tool's trace (PyTorch's), ordered by self CPU time as key_averages and
  // `gputrace summarize` order it
  GT.SummaryTable.prototype.setRows = function (rows, foreign) {
    this.rows = rows;
    if (foreign && rows.some(function (r) { return r.selfCpuTotal !== null; })) this.sortKey = 'selfCpuTotal';
    else if (!rows.some(function (r) { return r.gpuTotal !== null; })) this.sortKey = 'calls';
    this.render();
  };

  GT.SummaryTable.prototype.sorted = function () {
    var key = this.sortKey, sign = this.desc ? -1 : 1;
    return this.rows.slice().sort(function (a, b) {
      var x = a[key], y = b[key];
      if (x === null && y === null) return a.name < b.name ? -1 : 1;
      if (x === null) return 1;
      if (y === null) return -1;
      if (x < y) return -sign;
      if (x > y) return sign;
      return a.name < b.name ? -1 : a.name > b.name ? 1 : 0;
    });
  };

  GT.SummaryTable.prototype.render = function () {
    var self = this, thead = this.table.tHead, tbody = this.table.tBodies[0];
    GT.clear(thead); GT.clear(tbody);
    var hr = el('tr');
    COLUMNS.forEach(function (c) {
      var th = el('th', c.text ? 'text' : 'num', c.label + (self.sortKey === c.key ? (self.desc ? ' ▼' : ' ▲') : ''));
      th.dataset.key = c.key;
      if (c.title) th.title = c.title;
      th.addEventListener('click', function () {
        if (self.sortKey === c.key) self.desc = !self.desc;
        else { self.sortKey = c.key; self.desc = !c.text; }
        self.render();
      });
      hr.appendChild(th);
    });
    thead.appendChild(hr);
    var rows = this.sorted();
    rows.slice(0, MAX_ROWS).forEach(function (r) {
      var tr = el('tr');
      tr.dataset.nameId = String(r.nameId);
      if (r.nameId === self.active) tr.className = 'active';
      COLUMNS.forEach(function (c) {
        var v = r[c.key];
        var text = c.dur ? fmtDur(v) : v === null ? '—' : String(v);
        if (c.dur && r.coldOnly && v !== null && c.key !== 'gpuTotal') text += ' (cold)';
        tr.appendChild(el('td', c.text ? 'text' : 'num', text));
      });
      tr.addEventListener('click', function () { self.onRow(r.nameId); });
      tbody.appendChild(tr);
    });
    this.note.textContent = rows.length > MAX_ROWS ? 'showing ' + MAX_ROWS + ' of ' + rows.length + ' names' : '';
  };

  GT.SummaryTable.prototype.setActive = function (nameId) {
    this.active = nameId;
    var trs = this.table.tBodies[0].rows;
    for (var i = 0; i < trs.length; i++) {
      trs[i].className = Number(trs[i].dataset.nameId) === nameId ? 'active' : '';
    }
  };

  // anomalies ---------------------------------------------------------------------------------
  GT.showAnomalies = function (countsBox, list, badge, m, onPick) {
    GT.clear(countsBox); GT.clear(list);
    var rep = m.header && m.header.anomalies;
    var counts = rep && rep.counts ? rep.counts : {};
    var items = rep && Array.isArray(rep.items) ? rep.items : [];
    if (!rep) { // not a gputrace header: list flagged slices
      for (var s = 0; s < m.slices.n && items.length < 200; s++) {
        if (m.slices.flags[s] & GT.ANOMALY) items.push({ slice: s, name: m.names[m.slices.name[s]], kinds: [] });
      }
    }
    Object.keys(counts).forEach(function (k) {
      countsBox.appendChild(el('span', 'flag flag-' + k.replace(/[^a-z_]/g, ''), k + ' ' + counts[k]));
    });
    var total = items.length + (rep && rep.truncated ? rep.truncated : 0);
    badge.textContent = total ? '(' + total + ')' : '';
    if (!items.length) list.appendChild(el('li', 'muted', 'No anomalies: no empty spans, impossible times, overlaps or outliers.'));
    items.forEach(function (it) {
      var li = el('li');
      li.appendChild(el('b', null, it.name));
      if (Array.isArray(it.kinds) && it.kinds.length) li.appendChild(el('span', 'flag', it.kinds.join(', ')));
      var nums = [];
      if (typeof it.gpu_ns === 'number') nums.push('GPU ' + fmtDur(it.gpu_ns / 1000));
      if (typeof it.cpu_ns === 'number') nums.push('CPU ' + fmtDur(it.cpu_ns / 1000));
      if (typeof it.queue_gap_ns === 'number') nums.push('queued ' + fmtDur(it.queue_gap_ns / 1000));
      if (nums.length) li.appendChild(el('span', 'muted', ' ' + nums.join(' · ')));
      if (Array.isArray(it.explain)) it.explain.forEach(function (x) { li.appendChild(el('div', 'explain', x)); });
      li.addEventListener('click', function () {
        var id = typeof it.slice === 'number' ? it.slice : -1;
        if (id < 0 && typeof it.scope === 'number' && it.scope < m.nScopes) {
          id = m.scopeGpu[it.scope] >= 0 ? m.scopeGpu[it.scope] : m.scopeCpu[it.scope];
        }
        if (id >= 0) onPick(id);
      });
      list.appendChild(li);
    });
    if (rep && rep.truncated) list.appendChild(el('li', 'muted', rep.truncated + ' more not listed in the trace header'));
  };

  // trace facts -------------------------------------------------------------------------------
  GT.showInfo = function (dl, m, fileName) {
    GT.clear(dl);
    function add(k, v) { dl.appendChild(el('dt', null, k)); dl.appendChild(el('dd', null, v)); }
    var h = m.header || {};
    add('file', fileName || '—');
    add('span', fmtDur(m.t1 - m.t0));
    add('scopes', String(m.nScopes || m.slices.n));
    if (h.version) add('gputrace', h.version + ' (format ' + h.format_version + ')');
    if (h.backend) add('backend', String(h.backend));
    if (Array.isArray(h.devices)) {
      h.devices.forEach(function (d) { add('device ' + d.index, d.name + ' · ' + d.backend); });
    }
    if (Array.isArray(h.clock)) {
      h.clock.forEach(function (c) {
        add('clock fit, device ' + c.device, c.method + ': offset ' + fmtDur(c.offset_ns / 1000) + ', drift ' +
            Number(c.drift_ppm).toFixed(3) + ' ppm, uncertainty ± ' + fmtDur(c.uncertainty_ns / 1000) +
            ' (' + c.samples + ' samples)' + (c.note ? '. Weak fit: ' + c.note : ''));
      });
    }
    if (h.host) {
      add('host', h.host.name + ' · ' + h.host.cpu_count + ' CPUs');
      if (h.host.loadavg_start) add('load average', h.host.loadavg_start.join(' ') + ' → ' + (h.host.loadavg_end || []).join(' '));
    }
    if (Array.isArray(h.argv)) add('command', h.argv.join(' '));
    if (h.metadata && Object.keys(h.metadata).length) add('metadata', GT.argText(h.metadata));
    if (m.skipped) add('skipped events', String(m.skipped));
  };
})();
