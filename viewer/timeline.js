// The timeline: lanes drawn on one canvas, zoom/pan/scroll, hit testing.
//
// Only what intersects the view is visited: per row a binary search finds the first slice that
// ends after the view's start, and the walk stops at the first slice starting after its end.
// Slices narrower than a pixel collapse into one pixel column per row, so a zoomed-out trace of
// 100k scopes costs at most (rows × width) rectangles.
'use strict';
var GT = window.GT || (window.GT = {});

(function () {
  var RULER_H = 26, LABEL_W = 200, GROUP_H = 22, PAD = 3;
  var ROW_H = 18, QROW_H = 12, COUNTER_H = 30;
  var MAX_ARROWS = 1500;
  var FONT = '11px system-ui, -apple-system, "Segoe UI", sans-serif';
  var KIND = GT.KIND;

  function Timeline(canvas) {
    this.canvas = canvas;
    this.ctx = canvas.getContext('2d');
    this.model = null;
    this.viewStart = 0; this.viewEnd = 1; this.scrollY = 0;
    this.width = 0; this.height = 0;
    this.hover = null; this.selected = -1; this.selectedInstant = null;
    this.highlight = null; // Uint8Array over name ids, or null
    this.showArrows = true;
    this.mouse = null;
    this.lastDraw = { slicesVisited: 0, rects: 0, arrows: 0, arrowsHidden: false, ms: 0 };
    this.onHover = function () {};
    this.onSelect = function () {};
    this.onView = function () {};
    this._pending = false;
    this._colors = [];
    this._bind();
  }

  var P = Timeline.prototype;

  P.setModel = function (m) {
    this.model = m;
    this.selected = -1; this.hover = null; this.highlight = null; this.scrollY = 0;
    this._colors = [[], [], [], [], []];
    this.layout();
    this.fit();
  };

  P.layout = function () {
    var m = this.model;
    if (!m) return;
    var y = 0, group = null;
    this.groups = [];
    for (var i = 0; i < m.lanes.length; i++) {
      var l = m.lanes[i];
      if (l.group !== group) {
        group = l.group;
        this.groups.push({ title: group, y: y });
        y += GROUP_H;
      }
      l.rowH = l.kind === 'queued' ? QROW_H : ROW_H;
      l.y = y;
      l.height = l.kind === 'counter' ? COUNTER_H : PAD * 2 + l.rows * l.rowH;
      y += l.height;
    }
    this.contentH = y;
  };

  // view ------------------------------------------------------------------------------------
  P.plotW = function () { return Math.max(1, this.width - LABEL_W); };
  P.usPerPx = function () { return (this.viewEnd - this.viewStart) / this.plotW(); };
  P.xOf = function (t) { return LABEL_W + (t - this.viewStart) / this.usPerPx(); };
  P.timeAt = function (x) { return this.viewStart + (x - LABEL_W) * this.usPerPx(); };

  P.setView = function (start, end) {
    var m = this.model;
    if (!m) return;
    var span = m.t1 - m.t0;
    var minSpan = 0.01; // 10 ns across the whole plot
    var maxSpan = span * 1.5 + 1;
    var w = Math.min(Math.max(end - start, minSpan), maxSpan);
    var mid = (start + end) / 2;
    start = mid - w / 2;
    var lo = m.t0 - span * 0.25 - w * 0.5, hi = m.t1 + span * 0.25 + w * 0.5;
    if (start < lo) start = lo;
    if (start + w > hi) start = hi - w;
    this.viewStart = start; this.viewEnd = start + w;
    this.onView();
    this.requestDraw();
  };

  P.fit = function () {
    var m = this.model;
    if (!m) return;
    var pad = (m.t1 - m.t0) * 0.02;
    this.setView(m.t0 - pad, m.t1 + pad);
  };

  // Zoom by `factor` (< 1 zooms in) keeping time `anchor` under the same pixel.
  P.zoom = function (factor, anchor) {
    if (anchor === undefined) anchor = (this.viewStart + this.viewEnd) / 2;
    this.setView(anchor - (anchor - this.viewStart) * factor, anchor + (this.viewEnd - anchor) * factor);
  };

  P.pan = function (dus) { this.setView(this.viewStart + dus, this.viewEnd + dus); };

  P.scrollBy = function (dy) {
    var max = Math.max(0, this.contentH - (this.height - RULER_H));
    this.scrollY = Math.min(max, Math.max(0, this.scrollY + dy));
    this.requestDraw();
  };

  P.zoomToSlice = function (id) {
    var S = this.model.slices;
    var pad = Math.max(S.dur[id] * 0.6, 0.05);
    this.setView(S.start[id] - pad, S.start[id] + S.dur[id] + pad);
    this.revealLane(S.lane[id]);
  };

  P.revealLane = function (li) {
    var l = this.model.lanes[li], viewH = this.height - RULER_H;
    if (l.y < this.scrollY || l.y + l.height > this.scrollY + viewH) {
      this.scrollY = 0;
      this.scrollBy(l.y - viewH / 3);
    }
  };

  // Centre of the visible part of slice `id`, in client (page) coordinates.
  P.slicePoint = function (id) {
    var S = this.model.slices, l = this.model.lanes[S.lane[id]];
    var x0 = Math.max(this.xOf(S.start[id]), LABEL_W), x1 = Math.min(this.xOf(S.start[id] + S.dur[id]), this.width);
    var y = RULER_H - this.scrollY + l.y + PAD + S.row[id] * l.rowH + l.rowH / 2;
    var r = this.canvas.getBoundingClientRect();
    return { x: r.left + (x0 + x1) / 2, y: r.top + y, visible: x1 >= x0 && y > RULER_H && y < this.height };
  };

  // hit testing -------------------------------------------------------------------------------
  P.hitTest = function (x, y) {
    var m = this.model;
    if (!m || y < RULER_H) return null;
    var cy = y - RULER_H + this.scrollY;
    var lane = null;
    for (var i = 0; i < m.lanes.length; i++) {
      var l = m.lanes[i];
      if (cy >= l.y && cy < l.y + l.height) { lane = l; break; }
    }
    if (!lane) return null;
    if (x < LABEL_W) return { lane: lane, label: true };
    var t = this.timeAt(x), tol = 3 * this.usPerPx();
    if (lane.kind === 'counter') return { lane: lane, counter: counterAt(lane, t), t: t };
    var row = Math.floor((cy - lane.y - PAD) / lane.rowH);
    if (row >= 0 && row < lane.rowIds.length) {
      var id = this._sliceAt(lane, row, t, tol);
      if (id >= 0) return { lane: lane, slice: id };
    }
    var best = null, bestD = 5 * this.usPerPx();
    for (var k = 0; k < lane.instants.length; k++) {
      var d = Math.abs(lane.instants[k].ts - t);
      if (d <= bestD) { best = lane.instants[k]; bestD = d; }
    }
    if (best) return { lane: lane, instant: best };
    return { lane: lane, t: t };
  };

  P._sliceAt = function (lane, row, t, tol) {
    var S = this.model.slices, ids = lane.rowIds[row], starts = lane.rowStart[row];
    var i = GT.firstEndingAfter(lane.rowMaxEnd[row], t - tol);
    var best = -1, bestD = Infinity;
    for (var n = 0; i < ids.length && starts[i] <= t + tol && n < 5000; i++, n++) {
      var id = ids[i], s = S.start[id], e = s + S.dur[id];
      var d = t < s ? s - t : t > e ? t - e : 0;
      if (d <= tol && (d < bestD || (d === bestD && S.dur[id] < S.dur[best]))) { best = id; bestD = d; }
    }
    return best;
  };

  function counterAt(lane, t) {
    var p = lane.points, lo = 0, hi = p.length / 2;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (p[2 * mid] <= t) lo = mid + 1; else hi = mid; }
    return lo > 0 ? { ts: p[2 * (lo - 1)], value: p[2 * (lo - 1) + 1] } : null;
  }

  // The slices of one scope (CPU enqueue, queued wait, GPU execution), for outlining.
  P.scopeSlices = function (id) {
    var m = this.model, sc = m.slices.scope[id];
    if (sc < 0 || sc >= m.nScopes) return [id];
    return [m.scopeCpu[sc], m.scopeQueued[sc], m.scopeGpu[sc]].filter(function (x) { return x >= 0; });
  };

  // drawing -----------------------------------------------------------------------------------
  P.resize = function (w, h) {
    var dpr = window.devicePixelRatio || 1;
    this.width = w; this.height = h; this.dpr = dpr;
    this.canvas.width = Math.max(1, Math.round(w * dpr));
    this.canvas.height = Math.max(1, Math.round(h * dpr));
    this.canvas.style.width = w + 'px';
    this.canvas.style.height = h + 'px';
    this.scrollBy(0);
    this.draw();
  };

  P.requestDraw = function () {
    if (this._pending) return;
    this._pending = true;
    var self = this;
    requestAnimationFrame(function () { self._pending = false; self.draw(); });
  };

  P._color = function (kind, nameId) {
    var c = this._colors[kind][nameId];
    if (!c) {
      var h = GT.hue(this.model.names[nameId]);
      c = kind === KIND.gpu ? 'hsl(' + h + ',62%,52%)'
        : kind === KIND.pass ? 'hsl(' + h + ',55%,70%)'
        : kind === KIND.queued ? 'hsl(' + h + ',45%,80%)'
        : kind === KIND.other ? 'hsl(' + h + ',20%,68%)'
        : 'hsl(' + h + ',55%,68%)';
      this._colors[kind][nameId] = c;
    }
    return c;
  };

  P.draw = function () {
    var t0 = performance.now();
    var ctx = this.ctx, W = this.width, H = this.height, m = this.model;
    ctx.setTransform(this.dpr || 1, 0, 0, this.dpr || 1, 0, 0);
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, W, H);
    if (!m) return;
    ctx.font = FONT;
    ctx.textBaseline = 'middle';
    if (!this._charW) this._charW = ctx.measureText('abcdefghijklmnopqrstuvwxyz0123456789').width / 36;
    var stats = { slicesVisited: 0, rects: 0, arrows: 0, arrowsHidden: false, ms: 0 };
    var tick = this._ticks();

    ctx.save();
    ctx.beginPath(); ctx.rect(0, RULER_H, W, H - RULER_H); ctx.clip();
    var top = RULER_H - this.scrollY;
    // grid
    ctx.strokeStyle = '#eef0f3'; ctx.lineWidth = 1;
    ctx.beginPath();
    for (var g = 0; g < tick.major.length; g++) {
      var gx = Math.round(this.xOf(tick.major[g])) + 0.5;
      ctx.moveTo(gx, RULER_H); ctx.lineTo(gx, H);
    }
    ctx.stroke();
    for (var li = 0; li < m.lanes.length; li++) {
      var l = m.lanes[li], ly = top + l.y;
      if (ly > H || ly + l.height < RULER_H) continue;
      if (li % 2) { ctx.fillStyle = '#fafbfc'; ctx.fillRect(LABEL_W, ly, W - LABEL_W, l.height); }
      if (l.kind === 'counter') this._drawCounter(l, ly);
      else this._drawLane(l, ly, stats);
      this._drawInstants(l, ly);
    }
    if (this.showArrows || this.selected >= 0 || this.hover) this._drawFlows(top, stats);
    this._drawSelection(top);
    // label column with group headers
    ctx.fillStyle = '#f3f4f6';
    ctx.fillRect(0, RULER_H, LABEL_W, H - RULER_H);
    ctx.strokeStyle = '#d5d8de';
    ctx.beginPath(); ctx.moveTo(LABEL_W - 0.5, RULER_H); ctx.lineTo(LABEL_W - 0.5, H); ctx.stroke();
    for (var gi = 0; gi < this.groups.length; gi++) {
      var gr = this.groups[gi], gy = top + gr.y;
      if (gy > H || gy + GROUP_H < RULER_H) continue;
      ctx.fillStyle = '#e3e6eb';
      ctx.fillRect(0, gy, W, GROUP_H);
      ctx.fillStyle = '#1f2430';
      ctx.font = 'bold ' + FONT;
      ctx.fillText(this._fit(gr.title, W - 16), 8, gy + GROUP_H / 2);
      ctx.font = FONT;
    }
    for (var lj = 0; lj < m.lanes.length; lj++) {
      var ln = m.lanes[lj], lyy = top + ln.y;
      if (lyy > H || lyy + ln.height < RULER_H) continue;
      ctx.fillStyle = ln.kind === 'queued' ? '#6b7280' : '#1f2430';
      ctx.fillText(this._fit(ln.title, LABEL_W - 24), 16, lyy + Math.min(ln.height / 2, PAD + ROW_H / 2));
      ctx.fillStyle = '#e5e7eb';
      ctx.fillRect(0, lyy + ln.height - 1, W, 1);
    }
    var viewH = H - RULER_H;
    if (this.contentH > viewH) { // where the visible lanes sit in all of them
      var thumbH = Math.max(24, viewH * viewH / this.contentH);
      var thumbY = RULER_H + (viewH - thumbH) * this.scrollY / (this.contentH - viewH);
      ctx.fillStyle = 'rgba(31,36,48,0.28)';
      ctx.fillRect(W - 6, thumbY, 4, thumbH);
    }
    ctx.restore();
    this._drawRuler(tick);
    if (this.mouse && this.mouse.x > LABEL_W && this.mouse.y > RULER_H) {
      ctx.fillStyle = 'rgba(31,36,48,0.35)';
      ctx.fillRect(Math.round(this.mouse.x), RULER_H, 1, H - RULER_H);
    }
    stats.ms = performance.now() - t0;
    this.lastDraw = stats;
  };

  P._fit = function (text, px) {
    var max = Math.floor(px / this._charW);
    if (text.length <= max) return text;
    return max > 1 ? text.slice(0, max - 1) + '…' : '';
  };

  P._drawLane = function (l, ly, stats) {
    var ctx = this.ctx, S = this.model.slices, W = this.width;
    var vs = this.viewStart, ve = this.viewEnd, k = 1 / this.usPerPx(), hl = this.highlight;
    for (var r = 0; r < l.rowIds.length; r++) {
      var ry = ly + PAD + r * l.rowH;
      if (ry > this.height || ry + l.rowH < RULER_H) continue;
      var ids = l.rowIds[r], starts = l.rowStart[r];
      var i = GT.firstEndingAfter(l.rowMaxEnd[r], vs);
      var coveredTo = LABEL_W; // pixels of this row already painted (rows only overlap when crowded)
      var h = l.rowH - 1, textY = ry + h / 2;
      for (; i < ids.length && starts[i] <= ve; i++) {
        var id = ids[i];
        stats.slicesVisited++;
        var x0 = LABEL_W + (S.start[id] - vs) * k, x1 = x0 + S.dur[id] * k;
        if (x1 < coveredTo) continue; // sub-pixel or hidden behind what is drawn: one rect per pixel
        if (x0 < coveredTo) x0 = coveredTo;
        if (x1 - x0 < 1) { x0 = Math.floor(x0); x1 = x0 + 1; }
        if (x1 > W) x1 = W;
        var w = x1 - x0;
        coveredTo = x1;
        var kind = S.kind[id], nm = S.name[id];
        ctx.globalAlpha = hl && !hl[nm] ? 0.15 : 1;
        ctx.fillStyle = this._color(kind, nm);
        ctx.fillRect(x0, ry, w, h);
        stats.rects++;
        if (S.flags[id] & GT.ANOMALY) {
          ctx.strokeStyle = '#d62828'; ctx.lineWidth = 1.5;
          ctx.strokeRect(x0 + 0.75, ry + 0.75, Math.max(w - 1.5, 0.5), h - 1.5);
        }
        if (w > 28 && kind !== KIND.queued) {
          ctx.fillStyle = '#111827';
          ctx.fillText(this._fit(this.model.names[nm], w - 6), x0 + 3, textY);
        }
      }
    }
    ctx.globalAlpha = 1;
  };

  P._drawInstants = function (l, ly) {
    var ctx = this.ctx, vs = this.viewStart, ve = this.viewEnd;
    for (var i = 0; i < l.instants.length; i++) {
      var p = l.instants[i];
      if (p.ts < vs || p.ts > ve) continue;
      var x = this.xOf(p.ts);
      ctx.fillStyle = p.cat === 'anomaly' ? '#d62828' : p.cat === 'sync' ? '#2563eb' : '#111827';
      ctx.beginPath();
      ctx.moveTo(x - 4, ly); ctx.lineTo(x + 4, ly); ctx.lineTo(x, ly + 6); ctx.closePath();
      ctx.fill();
    }
  };

  P._drawCounter = function (l, ly) {
    var ctx = this.ctx, p = l.points, n = p.length / 2, max = l.maxValue || 1;
    if (!n) return;
    var base = ly + l.height - 3, hgt = l.height - 8;
    var lo = 0, hi = n;
    while (lo < hi) { var mid = (lo + hi) >> 1; if (p[2 * mid] < this.viewStart) lo = mid + 1; else hi = mid; }
    var i = Math.max(0, lo - 1);
    var x = Math.max(LABEL_W, this.xOf(p[2 * i])), y = base - (p[2 * i + 1] / max) * hgt;
    ctx.fillStyle = 'rgba(37,99,235,0.35)';
    ctx.beginPath();
    ctx.moveTo(x, base); ctx.lineTo(x, y);
    for (i++; i < n; i++) {
      var xi = Math.max(LABEL_W, this.xOf(p[2 * i]));
      if (xi > this.width) break;
      var yi = base - (p[2 * i + 1] / max) * hgt;
      ctx.lineTo(xi, y); ctx.lineTo(xi, yi);
      y = yi;
    }
    ctx.lineTo(this.width, y); ctx.lineTo(this.width, base); ctx.closePath();
    ctx.fill();
  };

  P._rowCenter = function (li, row, top) {
    var l = this.model.lanes[li];
    return top + l.y + PAD + row * l.rowH + l.rowH / 2;
  };

  P._drawFlows = function (top, stats) {
    var m = this.model, flows = m.flows, ctx = this.ctx, vs = this.viewStart, ve = this.viewEnd;
    var focus = {};
    var self = this;
    [this.selected, this.hover && this.hover.slice >= 0 ? this.hover.slice : -1].forEach(function (id) {
      if (id >= 0 && m.slices.scope[id] >= 0) focus[m.slices.scope[id]] = true;
    });
    var visible = [];
    for (var i = 0; i < flows.length; i++) {
      var f = flows[i];
      if (Math.min(f.fromTs, f.toTs) > ve) break;
      if (Math.max(f.fromTs, f.toTs) < vs) continue;
      visible.push(f);
    }
    var all = this.showArrows && visible.length <= MAX_ARROWS;
    stats.arrowsHidden = this.showArrows && !all;
    visible.forEach(function (f) {
      var strong = focus[f.scope];
      if (!all && !strong) return;
      var x0 = self.xOf(f.fromTs), y0 = self._rowCenter(f.fromLane, f.fromRow, top);
      var x1 = self.xOf(f.toTs), y1 = self._rowCenter(f.toLane, f.toRow, top);
      ctx.strokeStyle = strong ? '#111827' : 'rgba(55,65,81,0.45)';
      ctx.fillStyle = ctx.strokeStyle;
      ctx.lineWidth = strong ? 1.6 : 1;
      var dy = (y1 - y0) / 2;
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.bezierCurveTo(x0, y0 + dy, x1, y1 - dy, x1, y1 - 5);
      ctx.stroke();
      ctx.beginPath();
      var dir = y1 >= y0 ? 1 : -1;
      ctx.moveTo(x1, y1 - dir); ctx.lineTo(x1 - 3.5, y1 - 6 * dir); ctx.lineTo(x1 + 3.5, y1 - 6 * dir);
      ctx.closePath(); ctx.fill();
      stats.arrows++;
    });
  };

  P._outline = function (id, top, color, width) {
    var S = this.model.slices, l = this.model.lanes[S.lane[id]], ctx = this.ctx;
    var x0 = this.xOf(S.start[id]), x1 = this.xOf(S.start[id] + S.dur[id]);
    var y = top + l.y + PAD + S.row[id] * l.rowH;
    ctx.strokeStyle = color; ctx.lineWidth = width;
    ctx.strokeRect(Math.max(x0, LABEL_W - 2) - 1, y - 1, Math.max(x1 - x0, 1) + 2, l.rowH + 1);
  };

  P._drawSelection = function (top) {
    var self = this;
    if (this.hover && this.hover.slice >= 0) {
      this.scopeSlices(this.hover.slice).forEach(function (id) { self._outline(id, top, '#6b7280', 1); });
    }
    if (this.selected >= 0) {
      this.scopeSlices(this.selected).forEach(function (id) { self._outline(id, top, '#111827', 2); });
    }
  };

  P._ticks = function () {
    var upp = this.usPerPx(), step = GT.niceStep(upp * 100), major = [];
    var first = Math.ceil(this.viewStart / step) * step;
    for (var t = first; t <= this.viewEnd && major.length < 200; t += step) major.push(t);
    return { step: step, major: major };
  };

  P._drawRuler = function (tick) {
    var ctx = this.ctx, W = this.width;
    ctx.fillStyle = '#fff';
    ctx.fillRect(0, 0, W, RULER_H);
    ctx.fillStyle = '#f3f4f6';
    ctx.fillRect(0, 0, LABEL_W, RULER_H);
    ctx.fillStyle = '#374151';
    ctx.fillText('step ' + GT.fmtDur(tick.step), 8, RULER_H / 2);
    ctx.strokeStyle = '#9ca3af'; ctx.lineWidth = 1;
    ctx.beginPath();
    var minor = tick.step / 5;
    var t = Math.ceil(this.viewStart / minor) * minor;
    for (var n = 0; t <= this.viewEnd && n < 1000; t += minor, n++) {
      var x = Math.round(this.xOf(t)) + 0.5;
      if (x < LABEL_W) continue;
      ctx.moveTo(x, RULER_H - 4); ctx.lineTo(x, RULER_H);
    }
    for (var i = 0; i < tick.major.length; i++) {
      var mx = Math.round(this.xOf(tick.major[i])) + 0.5;
      if (mx < LABEL_W) continue;
      ctx.moveTo(mx, RULER_H - 10); ctx.lineTo(mx, RULER_H);
      ctx.fillText(GT.fmtTick(tick.major[i], tick.step), mx + 3, 9);
    }
    ctx.stroke();
    ctx.fillStyle = '#d5d8de';
    ctx.fillRect(0, RULER_H - 1, W, 1);
    if (this.mouse && this.mouse.x > LABEL_W) {
      var label = GT.fmtTs(this.timeAt(this.mouse.x));
      var w = ctx.measureText(label).width + 8, x0 = Math.min(this.mouse.x + 4, W - w);
      ctx.fillStyle = '#1f2430'; ctx.fillRect(x0, RULER_H - 15, w, 14);
      ctx.fillStyle = '#fff'; ctx.fillText(label, x0 + 4, RULER_H - 8);
    }
  };

  // input -------------------------------------------------------------------------------------
  P._bind = function () {
    var self = this, c = this.canvas, drag = null;
    function local(ev) {
      var r = c.getBoundingClientRect();
      return { x: ev.clientX - r.left, y: ev.clientY - r.top };
    }
    c.addEventListener('mousedown', function (ev) {
      if (ev.button !== 0 || !self.model) return;
      var p = local(ev);
      drag = { x: p.x, y: p.y, start: self.viewStart, end: self.viewEnd, scroll: self.scrollY, moved: false };
      c.focus();
      ev.preventDefault();
    });
    window.addEventListener('mousemove', function (ev) {
      if (!self.model) return;
      var p = local(ev);
      if (drag) {
        var dx = p.x - drag.x, dy = p.y - drag.y;
        if (!drag.moved && Math.abs(dx) + Math.abs(dy) > 3) drag.moved = true;
        if (drag.moved) {
          var dus = dx * (drag.end - drag.start) / self.plotW();
          self.setView(drag.start - dus, drag.end - dus);
          self.scrollY = drag.scroll; self.scrollBy(-dy);
          self._setHover(null, ev);
          return;
        }
      }
      if (ev.target !== c) return;
      self.mouse = p;
      self._setHover(self.hitTest(p.x, p.y), ev);
      self.requestDraw();
    });
    window.addEventListener('mouseup', function (ev) {
      if (!drag) return;
      var moved = drag.moved;
      drag = null;
      if (moved) return;
      var p = local(ev), hit = self.hitTest(p.x, p.y);
      self.selected = hit && hit.slice >= 0 ? hit.slice : -1;
      self.selectedInstant = hit && hit.instant ? hit.instant : null;
      self.onSelect(self.selected, self.selectedInstant);
      self.requestDraw();
    });
    c.addEventListener('mouseleave', function () {
      self.mouse = null;
      self._setHover(null);
      self.requestDraw();
    });
    c.addEventListener('dblclick', function (ev) {
      var p = local(ev), hit = self.hitTest(p.x, p.y);
      if (hit && hit.slice >= 0) self.zoomToSlice(hit.slice);
    });
    c.addEventListener('wheel', function (ev) {
      if (!self.model) return;
      ev.preventDefault();
      var scale = ev.deltaMode === 1 ? 16 : ev.deltaMode === 2 ? self.height : 1;
      var dx = ev.deltaX * scale, dy = ev.deltaY * scale;
      var p = local(ev);
      if (ev.shiftKey) self.scrollBy(dy || dx);
      else if (Math.abs(dx) > Math.abs(dy)) self.pan(dx * self.usPerPx());
      else {
        var anchor = p.x > LABEL_W ? self.timeAt(p.x) : undefined;
        self.zoom(Math.exp(Math.max(-200, Math.min(200, dy)) * 0.002), anchor);
      }
      self.mouse = p;
      self._setHover(self.hitTest(p.x, p.y), ev);
    }, { passive: false });
  };

  P._setHover = function (hit, ev) {
    var prev = this.hover;
    this.hover = hit;
    if (!hit && !prev) return;
    this.onHover(hit, ev);
    this.requestDraw();
  };

  P.key = function (ev) {
    if (!this.model) return false;
    var anchor = this.mouse && this.mouse.x > LABEL_W ? this.timeAt(this.mouse.x) : undefined;
    var w = this.viewEnd - this.viewStart;
    switch (ev.key) {
      case 'w': case 'W': case '+': case '=': this.zoom(0.8, anchor); return true;
      case 's': case 'S': case '-': case '_': this.zoom(1.25, anchor); return true;
      case 'a': case 'A': case 'ArrowLeft': this.pan(-0.2 * w); return true;
      case 'd': case 'D': case 'ArrowRight': this.pan(0.2 * w); return true;
      case 'ArrowUp': this.scrollBy(-40); return true;
      case 'ArrowDown': this.scrollBy(40); return true;
      case '0': case 'Home': this.fit(); return true;
      case 'f': case 'F':
        if (this.selected >= 0) this.zoomToSlice(this.selected);
        return true;
      default: return false;
    }
  };

  GT.Timeline = Timeline;
  GT.layoutConst = { RULER_H: RULER_H, LABEL_W: LABEL_W };
})();
