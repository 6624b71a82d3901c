// The viewer's side of docs/metrics.md: a scope's submission is the launch call of the first
// operation of its subtree (by GPU start) where the file has operations with their launch calls
// (CUPTI), as gputrace/figures.py defines it. Files gputrace writes already say so; an older file
// took the scope's entry, which counts the CPU work before the first launch (a compile, say) as
// queued time. This makes such a file's queued slices and numbers what gputrace computes today.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var OP_CATS = { kernel: true, gpu_memcpy: true, gpu_memset: true };
  // not CPU work: GPU categories, Kineto's GPU spans of ranges and its session slice ("Trace")
  var NOT_CPU = { kernel: true, gpu_memcpy: true, gpu_memset: true, gpu: true, gpu_user_annotation: true, Trace: true };

  // Self (exclusive) CPU time of every slice on a CPU lane, as gputrace/figures.py's self_cpu_ns
  // counts it: the slice's duration less its direct children's (the slices nested in it on its
  // lane: the same thread). NaN off CPU lanes. Computed once per model (m.selfCpu), after the
  // lanes are laid out (each lane's slices in start order, longest first).
  var EPS_US = 0.0015; // the file rounds ts and dur apart to 3 decimals: a child may end 1 ns late
  GT.selfCpu = function (m) {
    if (m.selfCpu) return m.selfCpu;
    var S = m.slices, self = new Float64Array(S.n).fill(NaN);
    // a gputrace file: scopes only (its launch calls are not child scopes); another tool's: all
    var only = m.nScopes > 0 ? GT.KIND.cpu : -1;
    m.lanes.forEach(function (l) {
      if (l.kind !== 'cpu') return;
      var stack = [];
      l.slices.forEach(function (id) {
        if (only >= 0 && S.kind[id] !== only) return;
        var ev = m.events[S.ev[id]];
        if (ev && NOT_CPU[ev.cat]) return; // another tool's GPU work drawn on a plain pid
        var st = S.start[id], en = st + S.dur[id];
        while (stack.length && S.start[stack[stack.length - 1]] + S.dur[stack[stack.length - 1]] <= st + EPS_US / 2) stack.pop();
        self[id] = S.dur[id];
        var top = stack.length ? stack[stack.length - 1] : -1;
        if (top >= 0 && en <= S.start[top] + S.dur[top] + EPS_US) self[top] -= S.dur[id];
        stack.push(id);
      });
    });
    if (only < 0) chargeOverhead(m, self);
    for (var i = 0; i < S.n; i++) if (!isNaN(self[i])) self[i] = Math.max(0, Math.round(self[i] * 1000) / 1000);
    m.selfCpu = self;
    return self;
  };

  // Kineto writes the profiler's own overhead (CUPTI asking for a buffer inside an op) on a
  // process of its own (pid -1), without the thread it stalled; key_averages, and gputrace's
  // reader (gputrace/foreign.py), count it as a child of the innermost slice enclosing it on the
  // one thread whose slices enclose it.
  function chargeOverhead(m, self) {
    var S = m.slices, cpuLanes = m.lanes.filter(function (l) { return l.kind === 'cpu' && l.pid !== -1; });
    m.lanes.forEach(function (l) {
      if (l.kind !== 'cpu' || l.pid !== -1) return;
      l.slices.forEach(function (id) {
        var ev = m.events[S.ev[id]];
        if (!ev || ev.cat !== 'overhead') return;
        var st = S.start[id], en = st + S.dur[id], found = [];
        cpuLanes.forEach(function (cl) {
          var best = -1;
          cl.slices.forEach(function (o) {
            if (isNaN(self[o]) || S.start[o] > st || S.start[o] + S.dur[o] < en) return;
            if (best < 0 || S.start[o] >= S.start[best]) best = o; // start order: the innermost
          });
          if (best >= 0) found.push(best);
        });
        if (found.length === 1) self[found[0]] -= S.dur[id];
      });
    });
  }

  // m: { events, cpuOfScope, gpuOfScope, queuedOfScope, start, dur, lane, ev } (plain arrays and
  // maps, before the model freezes them); changes the GPU slices' args and the queued slices.
  GT.refineSubmissions = function (m) {
    var first = new Map(); // scope -> { ts, call } of its own first operation
    m.events.forEach(function (e) {
      if (!e || e.ph !== 'X' || !OP_CATS[e.cat] || !e.args) return;
      var sc = e.args.scope, call = e.args.call_ts;
      if (typeof sc !== 'number' || typeof call !== 'number' || typeof e.ts !== 'number') return;
      var f = first.get(sc);
      if (!f || e.ts < f.ts) first.set(sc, { ts: e.ts, call: call });
    });
    if (!first.size) return;
    // parents by nesting on each CPU lane (scopes come in start order, as the file numbers them)
    var n = m.cpuOfScope.length, parent = new Int32Array(n).fill(-1), stacks = new Map();
    for (var sc = 0; sc < n; sc++) {
      var c = m.cpuOfScope[sc], l = m.lane[c], st = stacks.get(l);
      if (!st) { st = []; stacks.set(l, st); }
      while (st.length && m.start[st[st.length - 1][1]] + m.dur[st[st.length - 1][1]] <= m.start[c]) st.pop();
      if (st.length) parent[sc] = st[st.length - 1][0];
      st.push([sc, c]);
    }
    for (var s = n - 1; s >= 0; s--) { // children come after their parents
      var f = first.get(s), p = parent[s];
      if (!f || p < 0) continue;
      var fp = first.get(p);
      if (!fp || f.ts < fp.ts) first.set(p, f);
    }
    first.forEach(function (f, scope) {
      var g = m.gpuOfScope.get(scope);
      if (g === undefined) return;
      var e = m.events[m.ev[g]], a = e.args || (e.args = {});
      a.submit_ts = f.call;
      a.submit_to_start_us = Math.round((m.start[g] - f.call) * 1000) / 1000;
      var q = m.queuedOfScope.get(scope);
      if (q !== undefined && m.start[g] >= f.call) {
        m.start[q] = f.call;
        m.dur[q] = m.start[g] - f.call;
      }
    });
  };
})();
