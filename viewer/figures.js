// The viewer's side of docs/metrics.md: a scope's submission is the launch call of the first
// operation of its subtree (by GPU start) where the file has operations with their launch calls
// (CUPTI), as gputrace/figures.py defines it. Files gputrace writes already say so; an older file
// took the scope's entry, which counts the CPU work before the first launch (a compile, say) as
// queued time. This makes such a file's queued slices and numbers what gputrace computes today.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var OP_CATS = { kernel: true, gpu_memcpy: true, gpu_memset: true };

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
