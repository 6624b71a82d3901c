// Wiring: load a trace (from the server that serves this page, a file picker, or a dropped file),
// hand it to the timeline and panels, and expose `window.gputraceViewer` for scripts and tests.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var $ = function (id) { return document.getElementById(id); };
  var canvas = $('canvas'), tip = $('tooltip'), search = $('search');
  var timeline = new GT.Timeline(canvas);
  var model = null, fileName = '', summaryRows = [];
  var highlightNameId = -1;
  var searchMatches = [], searchPos = -1;
  var summary = new GT.SummaryTable($('summary'), $('summary-note'), toggleHighlight);

  function status(text) {
    $('status').textContent = text;
    $('empty').hidden = false;
  }

  // loading -----------------------------------------------------------------------------------
  async function decode(buf) {
    var bytes = new Uint8Array(buf);
    if (bytes.length >= 2 && bytes[0] === 0x1f && bytes[1] === 0x8b) {
      var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
      return await new Response(stream).text();
    }
    return new TextDecoder().decode(bytes);
  }

  async function openBuffer(buf, name) {
    status('Reading ' + name + '…');
    var text;
    try { text = await decode(buf); } catch (e) { throw new Error(name + ': the gzip data is truncated or corrupt'); }
    var doc;
    try { doc = JSON.parse(text); } catch (e) { throw new Error(name + ': not valid JSON (' + e.message + ')'); }
    text = null;
    show(GT.buildModel(doc), name);
  }

  async function loadUrl(url, name) {
    var resp = await fetch(url, { cache: 'no-store' });
    if (!resp.ok) throw new Error(name + ': the server answered ' + resp.status);
    await openBuffer(await resp.arrayBuffer(), name);
  }

  async function loadFile(file) {
    await openBuffer(await file.arrayBuffer(), file.name);
  }

  function guard(p) {
    return p.catch(function (e) {
      status(e && e.message ? e.message : String(e));
      throw e;
    });
  }

  function show(m, name) {
    model = m; fileName = name;
    $('empty').hidden = true;
    $('trace-title').textContent = name;
    document.title = name + ' · gputrace';
    highlightNameId = -1; searchMatches = []; searchPos = -1;
    search.value = '';
    $('search-count').textContent = '';
    $('highlight-chip').hidden = true;
    timeline.setModel(m);
    summaryRows = GT.summarize(m);
    summary.active = -1;
    summary.setRows(summaryRows, !m.header);
    GT.showAnomalies($('anomaly-counts'), $('anomaly-list'), $('anomaly-count'), m, pick);
    GT.showInfo($('info'), m, name);
    GT.showDetails($('details-body'), m, -1, null, zoomTo);
    resize();
  }

  // selection, highlight, search ------------------------------------------------------------------
  function select(id, instant) {
    timeline.selected = id;
    timeline.selectedInstant = instant || null;
    GT.showDetails($('details-body'), model, id, instant || null, zoomTo);
    timeline.requestDraw();
  }

  function zoomTo(id) { timeline.zoomToSlice(id); }

  function pick(id) {
    select(id);
    zoomTo(id);
  }

  function setHighlight(pred, label) {
    if (!pred) {
      timeline.highlight = null;
    } else {
      var hl = new Uint8Array(model.names.length);
      for (var i = 0; i < model.names.length; i++) hl[i] = pred(model.names[i], i) ? 1 : 0;
      timeline.highlight = hl;
    }
    $('highlight-chip').hidden = !label;
    $('highlight-name').textContent = label || '';
    timeline.requestDraw();
  }

  function toggleHighlight(nameId) {
    if (!model) return;
    highlightNameId = highlightNameId === nameId ? -1 : nameId;
    summary.setActive(highlightNameId);
    if (highlightNameId < 0) { setHighlight(null); return; }
    search.value = '';
    $('search-count').textContent = '';
    setHighlight(function (n, i) { return i === highlightNameId; }, model.names[nameId]);
  }

  function runSearch() {
    if (!model) return;
    var q = search.value.trim().toLowerCase();
    highlightNameId = -1;
    summary.setActive(-1);
    searchMatches = []; searchPos = -1;
    if (!q) { setHighlight(null); $('search-count').textContent = ''; return; }
    setHighlight(function (n) { return n.toLowerCase().indexOf(q) >= 0; });
    var S = model.slices, hl = timeline.highlight;
    // one match per scope (its CPU slice), or per slice in traces without scopes
    for (var s = 0; s < S.n; s++) {
      if (hl[S.name[s]] && (model.nScopes ? S.kind[s] === GT.KIND.cpu : S.kind[s] !== GT.KIND.queued)) searchMatches.push(s);
    }
    searchMatches.sort(function (a, b) { return S.start[a] - S.start[b]; });
    $('search-count').textContent = searchMatches.length + (searchMatches.length === 1 ? ' match' : ' matches');
  }

  function nextMatch(back) {
    if (!searchMatches.length) return;
    searchPos = (searchPos + (back ? -1 : 1) + searchMatches.length) % searchMatches.length;
    pick(searchMatches[searchPos]);
    $('search-count').textContent = (searchPos + 1) + ' / ' + searchMatches.length;
  }

  // events ------------------------------------------------------------------------------------
  timeline.onHover = function (hit, ev) { GT.showTooltip(tip, model, hit, ev); };
  timeline.onSelect = function (id, instant) { select(id, instant); };
  timeline.onView = function () {
    $('range').textContent = model ? GT.fmtDur(timeline.viewEnd - timeline.viewStart) + ' visible' : '';
  };

  search.addEventListener('input', runSearch);
  search.addEventListener('keydown', function (ev) {
    if (ev.key === 'Enter') { nextMatch(ev.shiftKey); ev.preventDefault(); }
    if (ev.key === 'Escape') { search.value = ''; runSearch(); canvas.focus(); }
  });
  $('highlight-clear').addEventListener('click', function () {
    if (highlightNameId >= 0) toggleHighlight(highlightNameId);
    else { search.value = ''; runSearch(); }
  });
  $('zoom-in').addEventListener('click', function () { timeline.zoom(0.5); });
  $('zoom-out').addEventListener('click', function () { timeline.zoom(2); });
  $('zoom-fit').addEventListener('click', function () { timeline.fit(); });
  $('arrows-toggle').addEventListener('click', function () {
    timeline.showArrows = !timeline.showArrows;
    this.setAttribute('aria-pressed', String(timeline.showArrows));
    timeline.requestDraw();
  });
  $('file-input').addEventListener('change', function () {
    if (this.files && this.files[0]) guard(loadFile(this.files[0])).catch(function () {});
    this.value = '';
  });
  document.querySelectorAll('#tabs button').forEach(function (b) {
    b.addEventListener('click', function () {
      document.querySelectorAll('#tabs button').forEach(function (x) { x.classList.toggle('active', x === b); });
      document.querySelectorAll('.tab').forEach(function (t) { t.hidden = t.id !== 'tab-' + b.dataset.tab; });
    });
  });

  window.addEventListener('keydown', function (ev) {
    var t = ev.target;
    if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.tagName === 'SELECT')) return;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (ev.key === '/') { search.focus(); ev.preventDefault(); return; }
    if (ev.key === 'Escape') { select(-1); search.value = ''; runSearch(); if (highlightNameId >= 0) toggleHighlight(highlightNameId); return; }
    if (timeline.key(ev)) ev.preventDefault();
  });

  // drag and drop of a file onto the page
  var dragDepth = 0;
  window.addEventListener('dragenter', function (ev) {
    if (!ev.dataTransfer || Array.prototype.indexOf.call(ev.dataTransfer.types, 'Files') < 0) return;
    dragDepth++; $('drop').hidden = false; ev.preventDefault();
  });
  window.addEventListener('dragover', function (ev) { ev.preventDefault(); });
  window.addEventListener('dragleave', function () { if (--dragDepth <= 0) { dragDepth = 0; $('drop').hidden = true; } });
  window.addEventListener('drop', function (ev) {
    ev.preventDefault();
    dragDepth = 0; $('drop').hidden = true;
    var f = ev.dataTransfer && ev.dataTransfer.files && ev.dataTransfer.files[0];
    if (f) guard(loadFile(f)).catch(function () {});
  });

  function resize() {
    var box = $('timeline');
    timeline.resize(box.clientWidth, box.clientHeight);
  }
  new ResizeObserver(resize).observe($('timeline'));

  // the API for scripts and tests -------------------------------------------------------------
  function laneStats(l) {
    return { title: l.title, kind: l.kind, group: l.group, pid: l.pid, tid: l.tid, rows: l.rows,
             slices: l.count || 0, instants: l.instants.length, points: l.points ? l.points.length / 2 : 0 };
  }

  function countHighlighted() {
    var S = model.slices, hl = timeline.highlight, n = 0;
    for (var s = 0; s < S.n; s++) n += hl[S.name[s]];
    return n;
  }

  window.gputraceViewer = {
    load: function (url, name) { return guard(loadUrl(url, name || String(url))); },
    loadBuffer: function (buf, name) { return guard(openBuffer(buf, name || 'trace')); },
    stats: function () {
      if (!model) return { loaded: false };
      var S = model.slices, byKind = { cpu: 0, gpu: 0, pass: 0, queued: 0, other: 0 };
      for (var s = 0; s < S.n; s++) byKind[GT.KIND_NAMES[S.kind[s]]]++;
      return {
        loaded: true, file: fileName, scopes: model.nScopes, slices: byKind, total: S.n,
        lanes: model.lanes.map(laneStats), flows: model.flows.length, instants: model.instants.length,
        view: { start: timeline.viewStart, end: timeline.viewEnd }, extent: { start: model.t0, end: model.t1 },
        selected: timeline.selected, lastDraw: timeline.lastDraw,
        highlighted: timeline.highlight ? countHighlighted() : null,
      };
    },
    view: function () { return { start: timeline.viewStart, end: timeline.viewEnd }; },
    setView: function (start, end) { timeline.setView(start, end); timeline.draw(); },
    // the slice id of `kind` ("cpu", "gpu", "queued") of scope `scope`, or -1
    sliceOf: function (kind, scope) {
      if (!model || scope < 0 || scope >= model.nScopes) return -1;
      return (kind === 'gpu' ? model.scopeGpu : kind === 'queued' ? model.scopeQueued : model.scopeCpu)[scope];
    },
    zoomToSlice: function (id) { timeline.zoomToSlice(id); timeline.draw(); },
    slicePoint: function (id) { timeline.draw(); return timeline.slicePoint(id); },
    summary: function () { return summary.sorted(); },
    select: function (id) { select(id); },
    draw: function () { timeline.draw(); return timeline.lastDraw; },
  };

  // served by `gputrace view`: ?trace=<path on this server>&name=<file name>
  var params = new URLSearchParams(location.search);
  var traceParam = params.get('trace');
  if (traceParam && /^https?:$/.test(location.protocol)) {
    var url = new URL(traceParam, location.href);
    if (url.origin !== location.origin) status('Refusing to load a trace from another origin: ' + url.origin);
    else guard(loadUrl(url.href, params.get('name') || traceParam)).catch(function () {});
  }
})();
