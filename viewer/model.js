// The trace file (what gputrace/exporters/chrome.py writes) turned into lanes and slices.
//
// Lanes, top to bottom: per process (its sort index, then pid), CPU thread lanes; per GPU, for
// each stream its "queued" lane (submission -> GPU start, async b/e events; the e unnamed) and then its
// execution lane; counters last. Slices live in typed arrays (columns) so 100k scopes stay cheap;
// each lane keeps, per row, its slice ids in start order plus a running max of their ends, which
// lets the timeline find the first visible slice of a row by binary search.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var KIND = { cpu: 0, gpu: 1, pass: 2, queued: 3, other: 4 };
  var KIND_NAMES = ['cpu', 'gpu', 'pass', 'queued', 'other'];
  var GPU_PID_BASE = 1073741824; // 2**30, see exporters/chrome.py
  var OVERLAP_TID_STEP = 16777216; // 2**24
  var MAX_QUEUED_ROWS = 12; // deeper waits share the last row
  // Flag bits as in gputrace/model.py; ANOMALY as model.ANOMALY_FLAGS.
  var FLAG_BITS = {
    cold: 1, empty_gpu_span: 2, gpu_exceeds_wall: 4, start_before_submit: 8, overlap: 16,
    outlier: 32, exception: 64, degraded: 128, untimed: 256,
  };
  var ANOMALY = 2 | 4 | 8 | 16 | 32 | 128;
  // What each anomaly kind means, as gputrace/flags.py EXPLAIN says it (a file's examples may
  // leave it out: it follows from the kinds).
  var EXPLAIN = {
    empty_gpu_span: 'no GPU work ran inside this scope: nothing was launched, or it was never flushed/submitted',
    gpu_exceeds_wall: 'the GPU duration is longer than the wall time from submission to completion: clock skew or a bad timestamp',
    start_before_submit: 'the GPU started before the CPU submitted the work, beyond the alignment uncertainty: clock skew',
    overlap: 'two spans on one in-order queue partially overlap: timestamps from overlapping passes or a clock glitch',
    outlier: 'far from the other calls of this name: contention, a clock change, or different work',
    degraded: "gputrace failed while recording this scope; its times may be partial",
  };

  function flagBits(list) {
    var f = 0;
    if (Array.isArray(list)) for (var i = 0; i < list.length; i++) f |= FLAG_BITS[list[i]] || 0;
    return f;
  }

  function num(v) {
    return typeof v === 'number' && isFinite(v) ? v : null;
  }

  function build(doc) {
    if (Array.isArray(doc)) doc = { traceEvents: doc };
    if (!doc || typeof doc !== 'object' || !Array.isArray(doc.traceEvents)) {
      throw new Error('not a Chrome trace: the file has no traceEvents list');
    }
    var header = doc.gputrace && typeof doc.gputrace === 'object' ? doc.gputrace : null;
    var events = doc.traceEvents;
    var procName = new Map(), procSort = new Map(), threadName = new Map();
    var names = [], nameId = new Map();
    function intern(s) {
      s = typeof s === 'string' ? s : String(s);
      var id = nameId.get(s);
      if (id === undefined) { id = names.length; names.push(s); nameId.set(s, id); }
      return id;
    }
    var threadOrder = new Map();
    var listed = !!(header && Array.isArray(header.threads));
    if (listed) {
      header.threads.forEach(function (t, i) { threadOrder.set(Number(t.tid), i); });
    }

    var lanes = [], laneByKey = new Map();
    function lane(kind, pid, tid, key) {
      var k = kind + '|' + pid + '|' + (key === undefined ? tid : key);
      var l = laneByKey.get(k);
      if (!l) {
        l = { index: -1, kind: kind, pid: pid, tid: tid, key: k, title: '', slices: [], rows: 1,
              rowIds: [], rowStart: [], rowMaxEnd: [], instants: [], points: null, y: 0, height: 0 };
        laneByKey.set(k, l);
        lanes.push(l);
      }
      return l;
    }

    // slice columns, grown as plain arrays, frozen to typed arrays below
    var sStart = [], sDur = [], sLane = [], sName = [], sKind = [], sScope = [], sEv = [], sFlags = [];
    function addSlice(l, start, dur, name, kind, scope, ev, flags) {
      var id = sStart.length;
      sStart.push(start); sDur.push(dur); sLane.push(l); sName.push(intern(name));
      sKind.push(kind); sScope.push(scope); sEv.push(ev); sFlags.push(flags);
      l.slices.push(id);
      return id;
    }

    var cpuOfScope = [], gpuOfScope = new Map(), queuedOfScope = new Map();
    var flowSrc = new Map(), flowDst = new Map();
    var asyncOpen = new Map();
    var counterLanes = [];
    var instants = [];
    var cpuScope = 0;
    var unknown = 0;

    for (var i = 0; i < events.length; i++) {
      var e = events[i];
      if (!e || typeof e !== 'object') continue;
      var ph = e.ph, pid = Number(e.pid) || 0, tid = Number(e.tid) || 0;
      var ts = num(e.ts);
      if (ph === 'M') {
        var a = e.args || {};
        if (e.name === 'process_name') procName.set(pid, String(a.name));
        else if (e.name === 'process_sort_index') procSort.set(pid, Number(a.sort_index) || 0);
        else if (e.name === 'thread_name') {
          threadName.set(pid + '|' + tid, String(a.name));
          // a header that does not list the threads leaves their order to the name events
          if (!listed && pid < GPU_PID_BASE && !threadOrder.has(tid)) threadOrder.set(tid, threadOrder.size);
        }
        continue;
      }
      if (ts === null) { unknown++; continue; }
      if (ph === 'X') {
        var dur = num(e.dur);
        if (dur === null || dur < 0) { unknown++; continue; }
        var cat = e.cat;
        var args = e.args || null;
        if (typeof e.bind_id === 'number' && (e.flow_out || e.flow_in)) {
          // flow v2: bound to this slice at both ends; for gputrace traces the id is the scope
          (e.flow_out ? flowSrc : flowDst).set('bind|' + e.bind_id, { ts: e.flow_out ? ts + dur : ts, pid: pid, tid: tid, id: e.bind_id });
        }
        var flags = args ? flagBits(args.flags) : 0;
        if (cat === 'cpu') {
          var scope = header ? cpuScope++ : -1;
          var id = addSlice(lane('cpu', pid, tid), ts, dur, e.name, KIND.cpu, scope, i, flags);
          if (scope >= 0) cpuOfScope.push(id);
        } else if (cat === 'gpu' || cat === 'gpu.pass') {
          var sc = args && typeof args.scope === 'number' ? args.scope
            : cat === 'gpu' && typeof e.bind_id === 'number' ? e.bind_id : -1;
          var kind = cat === 'gpu' ? KIND.gpu : KIND.pass;
          var gid = addSlice(lane('gpu', pid, tid), ts, dur, e.name, kind, sc, i, flags);
          if (kind === KIND.gpu && sc >= 0) gpuOfScope.set(sc, gid);
        } else {
          addSlice(lane(pid >= GPU_PID_BASE ? 'gpu' : 'cpu', pid, tid), ts, dur, e.name, KIND.other, -1, i, flags);
        }
      } else if (ph === 'b' || ph === 'e') {
        // paired as Perfetto pairs them: by process, category and id; an end with no name
        // (gputrace writes its waits' ends so) closes the latest open begin, a named one the
        // latest begin of that name
        var aid = e.id2 && typeof e.id2 === 'object' && e.id2.local !== undefined ? e.id2.local : e.id;
        var akey = pid + '|' + e.cat + '|' + aid;
        var opened = asyncOpen.get(akey);
        if (ph === 'b') {
          if (opened) opened.push(i); else asyncOpen.set(akey, [i]);
        } else {
          var oi = opened ? opened.length - 1 : -1;
          if (e.name !== undefined && e.name !== null && e.name !== '') {
            while (oi >= 0 && events[opened[oi]].name !== e.name) oi--;
          }
          if (oi < 0) continue;
          var bi = opened.splice(oi, 1)[0];
          if (!opened.length) asyncOpen.delete(akey);
          var b = events[bi];
          var bargs = b.args || {};
          var bid = b.id2 && typeof b.id2 === 'object' ? b.id2.local : undefined;
          var qsc = typeof bargs.scope === 'number' ? bargs.scope : header && typeof bid === 'number' ? bid : -1;
          var label = typeof bargs.name === 'string' ? bargs.name
            : qsc >= 0 && qsc < cpuOfScope.length ? names[sName[cpuOfScope[qsc]]] : String(b.name);
          var gq = qsc >= 0 ? gpuOfScope.get(qsc) : undefined;
          var qtid = b.tid !== undefined ? Number(b.tid) || 0 : gq !== undefined ? sLane[gq].tid % 16777216 : 0;
          var ql = lane('queued', pid, qtid);
          if (!ql.title) ql.title = String(b.name);
          var qid = addSlice(ql, b.ts, Math.max(0, ts - b.ts), label, KIND.queued, qsc, bi, 0);
          if (qsc >= 0) queuedOfScope.set(qsc, qid);
        }
      } else if (ph === 's' || ph === 'f') {
        var fkey = e.cat + '|' + e.id;
        (ph === 's' ? flowSrc : flowDst).set(fkey, { ts: ts, pid: pid, tid: tid, id: e.id });
      } else if (ph === 'C') {
        var cargs = e.args || {};
        for (var k in cargs) {
          var v = num(cargs[k]);
          if (v === null) continue;
          var cl = lane('counter', pid, 0, e.name + '|' + k);
          if (!cl.points) {
            cl.points = [];
            cl.title = k === 'depth' || k === 'value' ? String(e.name) : e.name + ' · ' + k;
            counterLanes.push(cl);
          }
          cl.points.push(ts, v);
        }
      } else if (ph === 'i' || ph === 'I') {
        var il = lane(pid >= GPU_PID_BASE ? 'gpu' : 'cpu', pid, tid);
        var inst = { ts: ts, name: String(e.name), cat: String(e.cat || ''), lane: il, ev: i };
        il.instants.push(inst);
        instants.push(inst);
      } else {
        unknown++;
      }
    }

    // submissions from the first launch call where the file has operations (viewer/figures.js)
    if (header && GT.refineSubmissions) {
      GT.refineSubmissions({ events: events, cpuOfScope: cpuOfScope, gpuOfScope: gpuOfScope,
        queuedOfScope: queuedOfScope, start: sStart, dur: sDur, lane: sLane, ev: sEv });
    }

    var n = sStart.length;
    var slices = {
      n: n,
      start: Float64Array.from(sStart), dur: Float64Array.from(sDur),
      lane: new Int32Array(n), row: new Int32Array(n), name: Int32Array.from(sName),
      kind: Uint8Array.from(sKind), scope: Int32Array.from(sScope), ev: Int32Array.from(sEv),
      flags: Uint16Array.from(sFlags),
    };

    // lane order: process (sort index, pid), then stream/thread, queued before execution
    lanes.forEach(function (l) {
      var base = l.tid % OVERLAP_TID_STEP, overlap = Math.floor(l.tid / OVERLAP_TID_STEP);
      l.base = base;
      l.sortKey = [
        procSort.has(l.pid) ? procSort.get(l.pid) : (l.pid >= GPU_PID_BASE ? 1 + l.pid - GPU_PID_BASE : 0),
        l.pid,
        l.kind === 'counter' ? 1 : 0,
        threadOrder.has(base) && l.kind === 'cpu' ? threadOrder.get(base) : base,
        l.kind === 'queued' ? 0 : 1,
        overlap,
        l.key,
      ];
      l.group = procName.get(l.pid) || (l.pid >= GPU_PID_BASE ? 'GPU ' + (l.pid - GPU_PID_BASE) : 'process ' + l.pid);
      if (!l.title) {
        var tn = threadName.get(l.pid + '|' + l.tid);
        l.title = tn || (l.kind === 'gpu' ? 'stream ' + l.tid : 'thread ' + l.tid);
      }
    });
    lanes.sort(function (x, y) {
      for (var j = 0; j < x.sortKey.length; j++) {
        if (x.sortKey[j] < y.sortKey[j]) return -1;
        if (x.sortKey[j] > y.sortKey[j]) return 1;
      }
      return 0;
    });
    lanes.forEach(function (l, li) { l.index = li; });
    for (var s = 0; s < n; s++) slices.lane[s] = sLane[s].index;

    var t0 = Infinity, t1 = -Infinity;
    lanes.forEach(function (l) {
      layoutRows(l, slices);
      for (var j = 0; j < l.slices.length; j++) {
        var sid = l.slices[j];
        if (slices.start[sid] < t0) t0 = slices.start[sid];
        if (slices.start[sid] + slices.dur[sid] > t1) t1 = slices.start[sid] + slices.dur[sid];
      }
      if (l.points) {
        sortPoints(l);
        if (l.points.length) {
          t0 = Math.min(t0, l.points[0]);
          t1 = Math.max(t1, l.points[l.points.length - 2]);
        }
      }
      l.instants.sort(function (p, q) { return p.ts - q.ts; });
      l.instants.forEach(function (p) { t0 = Math.min(t0, p.ts); t1 = Math.max(t1, p.ts); });
    });
    if (!isFinite(t0)) { t0 = 0; t1 = 1; }
    if (t1 <= t0) t1 = t0 + 1;

    // flows: pairs of s/f; for gputrace traces the id is the scope, which names both slices
    var flows = [];
    flowSrc.forEach(function (src, key) {
      var dst = flowDst.get(key);
      if (!dst) return;
      var sc = typeof src.id === 'number' ? src.id : -1;
      var from = sc >= 0 && sc < cpuOfScope.length ? cpuOfScope[sc] : -1;
      var to = gpuOfScope.has(sc) ? gpuOfScope.get(sc) : -1;
      flows.push({
        fromTs: src.ts, toTs: dst.ts, scope: sc,
        fromLane: from >= 0 ? slices.lane[from] : laneIndexOf(laneByKey, 'cpu', src.pid, src.tid),
        toLane: to >= 0 ? slices.lane[to] : laneIndexOf(laneByKey, 'gpu', dst.pid, dst.tid),
        fromRow: from >= 0 ? slices.row[from] : 0,
        toRow: to >= 0 ? slices.row[to] : 0,
      });
    });
    flows = flows.filter(function (f) { return f.fromLane >= 0 && f.toLane >= 0; });
    flows.sort(function (p, q) { return Math.min(p.fromTs, p.toTs) - Math.min(q.fromTs, q.toTs); });

    var nScopes = cpuOfScope.length;
    var scopeGpu = new Int32Array(nScopes).fill(-1), scopeQueued = new Int32Array(nScopes).fill(-1);
    gpuOfScope.forEach(function (v, k) { if (k < nScopes) scopeGpu[k] = v; });
    queuedOfScope.forEach(function (v, k) { if (k < nScopes) scopeQueued[k] = v; });

    return {
      header: header, events: events, names: names, lanes: lanes, slices: slices, flows: flows,
      instants: instants, counters: counterLanes, t0: t0, t1: t1, skipped: unknown,
      scopeCpu: Int32Array.from(cpuOfScope), scopeGpu: scopeGpu, scopeQueued: scopeQueued,
      nScopes: nScopes,
    };
  }

  function laneIndexOf(map, kind, pid, tid) {
    var l = map.get(kind + '|' + pid + '|' + tid);
    return l ? l.index : -1;
  }

  function sortPoints(l) {
    var pts = [];
    for (var j = 0; j < l.points.length; j += 2) pts.push([l.points[j], l.points[j + 1]]);
    pts.sort(function (p, q) { return p[0] - q[0]; });
    var flat = new Float64Array(pts.length * 2), max = 0;
    pts.forEach(function (p, j) { flat[2 * j] = p[0]; flat[2 * j + 1] = p[1]; max = Math.max(max, p[1]); });
    l.points = flat;
    l.maxValue = max;
  }

  // Rows inside a lane: nesting depth for slices (a stack walk), greedy packing for queued waits.
  function layoutRows(l, S) {
    var ids = l.slices;
    ids.sort(function (p, q) { return S.start[p] - S.start[q] || S.dur[q] - S.dur[p] || p - q; });
    var rows = [];
    if (l.kind === 'queued') {
      var rowEnd = [];
      for (var j = 0; j < ids.length; j++) {
        var st = S.start[ids[j]], r = 0;
        while (r < rowEnd.length && rowEnd[r] > st) r++;
        if (r >= MAX_QUEUED_ROWS) r = MAX_QUEUED_ROWS - 1;
        rowEnd[r] = Math.max(rowEnd[r] || -Infinity, st + S.dur[ids[j]]);
        S.row[ids[j]] = r;
        (rows[r] || (rows[r] = [])).push(ids[j]);
      }
    } else {
      var stack = [];
      for (var k = 0; k < ids.length; k++) {
        var id = ids[k], s0 = S.start[id];
        while (stack.length && S.start[stack[stack.length - 1]] + S.dur[stack[stack.length - 1]] <= s0) stack.pop();
        var depth = stack.length;
        S.row[id] = depth;
        (rows[depth] || (rows[depth] = [])).push(id);
        stack.push(id);
      }
    }
    l.rows = Math.max(1, rows.length);
    l.rowIds = []; l.rowStart = []; l.rowMaxEnd = [];
    for (var rr = 0; rr < rows.length; rr++) {
      var list = rows[rr] || [];
      var idArr = Int32Array.from(list), starts = new Float64Array(list.length), maxEnd = new Float64Array(list.length);
      var m = -Infinity;
      for (var q = 0; q < list.length; q++) {
        starts[q] = S.start[list[q]];
        m = Math.max(m, S.start[list[q]] + S.dur[list[q]]);
        maxEnd[q] = m;
      }
      l.rowIds.push(idArr); l.rowStart.push(starts); l.rowMaxEnd.push(maxEnd);
    }
    l.count = ids.length;
  }

  // First index in a row whose running max end reaches t (all earlier slices end before t).
  function firstEndingAfter(maxEnd, t) {
    var lo = 0, hi = maxEnd.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (maxEnd[mid] < t) lo = mid + 1; else hi = mid;
    }
    return lo;
  }

  // Per-name table over the scopes (the numbers `gputrace summarize` prints), warm calls only
  // for the timing columns: a cold call pays compilation/autotuning and is counted apart.
  function summarize(m) {
    var S = m.slices, byName = new Map();
    function row(nameIdx) {
      var r = byName.get(nameIdx);
      if (!r) {
        r = { name: m.names[nameIdx], nameId: nameIdx, calls: 0, cold: 0, anomalies: 0,
              gpuTotal: 0, gpuTimed: 0, cpu: [], gpu: [], queued: [], cpuAll: [], gpuAll: [], queuedAll: [],
              busy: [], selfTotal: null, free: [], selfCpuTotal: null };
        byName.set(nameIdx, r);
      }
      return r;
    }
    var selfCpu = GT.selfCpu ? GT.selfCpu(m) : null; // viewer/figures.js
    function addSelf(r, id) { if (selfCpu && !isNaN(selfCpu[id])) r.selfCpuTotal = (r.selfCpuTotal || 0) + selfCpu[id]; }
    if (m.nScopes > 0) {
      for (var sc = 0; sc < m.nScopes; sc++) {
        var c = m.scopeCpu[sc], g = m.scopeGpu[sc];
        var r = row(S.name[c]);
        var flags = S.flags[c] | (g >= 0 ? S.flags[g] : 0);
        var cold = (flags & 1) !== 0;
        r.calls++;
        if (cold) r.cold++;
        if (flags & ANOMALY) r.anomalies++;
        r.cpuAll.push(S.dur[c]);
        if (!cold) r.cpu.push(S.dur[c]);
        addSelf(r, c);
        if (g >= 0) {
          var a = m.events[S.ev[g]].args || {};
          var gus = num(a.gpu_us) !== null ? a.gpu_us : S.dur[g];
          r.gpuTotal += gus; r.gpuTimed++;
          r.gpuAll.push(gus);
          if (!cold) r.gpu.push(gus);
          // busy, self and the launch-free estimate: as the trace args carry them (gputrace.figures)
          if (!cold && num(a.gpu_busy_us) !== null) r.busy.push(a.gpu_busy_us);
          if (num(a.gpu_self_us) !== null) r.selfTotal = (r.selfTotal || 0) + a.gpu_self_us;
          if (!cold && num(a.if_launches_free_us) !== null) r.free.push(a.if_launches_free_us);
          if (num(a.submit_to_start_us) !== null) {
            r.queuedAll.push(a.submit_to_start_us);
            if (!cold) r.queued.push(a.submit_to_start_us);
          }
        }
      }
    } else {
      for (var s = 0; s < S.n; s++) {
        if (S.kind[s] === KIND.queued) continue;
        var rr = row(S.name[s]);
        rr.calls++;
        rr.cpuAll.push(S.dur[s]); rr.cpu.push(S.dur[s]);
        addSelf(rr, s);
      }
    }
    var out = [];
    byName.forEach(function (r) {
      var warm = r.calls - r.cold > 0;
      var gpu = warm ? r.gpu : r.gpuAll, cpu = warm ? r.cpu : r.cpuAll, q = warm ? r.queued : r.queuedAll;
      out.push({
        name: r.name, nameId: r.nameId, calls: r.calls, cold: r.cold, anomalies: r.anomalies,
        coldOnly: !warm,
        gpuTotal: r.gpuTimed ? r.gpuTotal : null,
        gpuMedian: median(gpu), gpuMax: gpu.length ? Math.max.apply(null, gpu) : null,
        cpuMedian: median(cpu), queuedMedian: median(q),
        busyMedian: median(r.busy), selfTotal: r.selfTotal, freeMedian: median(r.free),
        selfCpuTotal: r.selfCpuTotal === null ? null : Math.round(r.selfCpuTotal * 1000) / 1000,
      });
    });
    return out;
  }

  function median(xs) {
    if (!xs.length) return null;
    var a = Float64Array.from(xs).sort();
    var h = a.length >> 1;
    return a.length % 2 ? a[h] : (a[h - 1] + a[h]) / 2;
  }

  GT.KIND = KIND;
  GT.KIND_NAMES = KIND_NAMES;
  GT.FLAG_BITS = FLAG_BITS;
  GT.ANOMALY = ANOMALY;
  GT.EXPLAIN = EXPLAIN;
  GT.buildModel = build;
  GT.summarize = summarize;
  GT.firstEndingAfter = firstEndingAfter;
})();
