// Number formatting and small DOM helpers shared by the viewer's scripts.
// Trace times are microseconds (floats with at most 3 decimals, i.e. whole nanoseconds).
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  function trimZeros(s) {
    return s.indexOf('.') >= 0 ? s.replace(/\.?0+$/, '') : s;
  }

  function fixed(x, decimals) {  // toFixed rounds the exact value, ties away from zero
    var s = x.toFixed(decimals);
    return s.charAt(0) === '-' && Number(s) === 0 ? s.slice(1) : s;
  }

  // A duration in ns, with the same rules and text as gputrace/durations.py fmt_ns (the cases
  // both are tested against: tests/data/durations.json): three significant digits in the largest
  // unit that keeps the number at least 1; "850 ns", "12.3 µs", "1.00 ms", "2.5 ns".
  GT.fmtNs = function (ns) {
    if (typeof ns !== 'number' || !isFinite(ns)) return '—';
    var a = Math.abs(ns);
    if (Math.abs(Number(fixed(a, 0))) < 1000) return trimZeros(fixed(ns, a < 10 ? 2 : a < 100 ? 1 : 0)) + ' ns';
    var units = [['µs', 1e3], ['ms', 1e6], ['s', 1e9]];
    for (var i = 0; i < units.length; i++) {
      var v = ns / units[i][1];
      for (var d = 2; d >= 0; d--) {
        var s = fixed(v, d);
        if (Math.abs(Number(s)) < Math.pow(10, 3 - d)) return s + ' ' + units[i][0];
      }
    }
    return fixed(ns / 1e9, 0) + ' s';
  };

  // A duration in µs (the trace file's unit).
  GT.fmtDur = function (us) {
    return typeof us === 'number' ? GT.fmtNs(us * 1000) : '—';
  };

  // A time on the trace's axis (µs since the trace's base), to the nanosecond: "t = 20.021 µs".
  GT.fmtTs = function (us) {
    if (typeof us !== 'number' || !isFinite(us)) return 't = —';
    var a = Math.abs(us);
    if (a === 0) return 't = 0 µs';
    if (a < 1) return 't = ' + (us * 1000).toFixed(0) + ' ns';
    if (a < 1000) return 't = ' + trimZeros(us.toFixed(3)) + ' µs';
    if (a < 1e6) return 't = ' + trimZeros((us / 1000).toFixed(3)) + ' ms';
    return 't = ' + trimZeros((us / 1e6).toFixed(3)) + ' s';
  };

  // A ruler label for time `us` when ticks are `step` µs apart: the unit follows the step.
  GT.fmtTick = function (us, step) {
    var unit = 'µs', scale = 1;
    if (step >= 1e5) { unit = 's'; scale = 1e6; }
    else if (step >= 100) { unit = 'ms'; scale = 1e3; }
    else if (step < 0.1) { unit = 'ns'; scale = 1e-3; }
    var s = step / scale;
    var decimals = Math.max(0, Math.min(6, Math.ceil(-Math.log10(s) - 1e-9)));
    return (us / scale).toFixed(decimals) + ' ' + unit;
  };

  // 1, 2, 5 × 10^k: the smallest such step >= raw.
  GT.niceStep = function (raw) {
    var p = Math.pow(10, Math.floor(Math.log10(raw)));
    var m = raw / p;
    return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
  };

  // Trace data (names, args) only ever reaches the page as text nodes.
  GT.el = function (tag, cls, text) {
    var e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  };

  GT.clear = function (node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  };

  GT.argText = function (v) {
    if (typeof v === 'string') return v;
    try { return JSON.stringify(v); } catch (e) { return String(v); }
  };

  // Stable colour per name: same name, same hue on CPU and GPU lanes.
  GT.hue = function (name) {
    var h = 2166136261;
    for (var i = 0; i < name.length; i++) {
      h ^= name.charCodeAt(i);
      h = Math.imul(h, 16777619);
    }
    return ((h >>> 0) % 360);
  };
})();
