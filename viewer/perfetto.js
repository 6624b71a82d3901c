// Hand one trace to the Perfetto UI (ui.perfetto.dev) through its postMessage protocol:
// open the UI in a new tab, send 'PING' until it answers 'PONG', then post
// {perfetto: {buffer, title, fileName}}. Only this page touches the network, and only because
// the user ran `gputrace view --perfetto`.
'use strict';
(function () {
  var ORIGIN = 'https://ui.perfetto.dev';
  var params = new URLSearchParams(location.search);
  var name = params.get('name') || 'trace.json';
  var stateBox = document.getElementById('state');
  document.getElementById('name').textContent = name;
  var traceBuffer = null;

  function state(text) { stateBox.textContent = text; }

  async function fetchTrace() {
    var url = new URL(params.get('trace') || 'trace.json', location.href);
    if (url.origin !== location.origin) throw new Error('refusing a trace from another origin');
    var resp = await fetch(url.href, { cache: 'no-store' });
    if (!resp.ok) throw new Error('the server answered ' + resp.status);
    var bytes = new Uint8Array(await resp.arrayBuffer());
    if (bytes.length >= 2 && bytes[0] === 0x1f && bytes[1] === 0x8b) {
      var stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream('gzip'));
      return await new Response(stream).arrayBuffer();
    }
    return bytes.buffer;
  }

  function open() {
    if (!traceBuffer) return false;
    var win = window.open(ORIGIN);
    if (!win) {
      state('The browser blocked the new tab: press the button.');
      return false;
    }
    state('Waiting for the Perfetto UI to answer…');
    var timer = setInterval(function () { win.postMessage('PING', ORIGIN); }, 50);
    function onMessage(ev) {
      if (ev.source !== win || ev.data !== 'PONG') return;
      clearInterval(timer);
      window.removeEventListener('message', onMessage);
      win.postMessage({ perfetto: { buffer: traceBuffer, title: name, fileName: name.replace(/\.gz$/, '') } }, ORIGIN);
      state('Sent ' + name + ' to the Perfetto UI.');
      window.gputracePerfetto.sent = true;
    }
    window.addEventListener('message', onMessage);
    return true;
  }

  window.gputracePerfetto = { ready: false, sent: false, open: open };
  document.getElementById('open').addEventListener('click', open);
  fetchTrace().then(function (buf) {
    traceBuffer = buf;
    window.gputracePerfetto.ready = true;
    state('Trace read (' + buf.byteLength + ' bytes).');
    if (params.get('auto') !== '0') open();
  }, function (e) { state('Could not read the trace: ' + e.message); });
})();
