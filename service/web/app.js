// The msaflow dashboard: the service's API (docs/service.md) from the browser. The token is
// kept in this tab's sessionStorage only; every request carries it as a bearer token, and the
// event streams are read with fetch so that they carry it too (EventSource cannot).
"use strict";

const $ = (id) => document.getElementById(id);
let token = sessionStorage.getItem("msaflow-token") || "";
let streams = [];  // AbortControllers of the open event streams

function api(method, path, body) {
  const opt = { method, headers: { Authorization: "Bearer " + token } };
  if (body !== undefined) { opt.body = body; opt.headers["Content-Type"] = "application/json"; }
  return fetch(path, opt).then(async (r) => {
    const text = await r.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch (e) { data = { raw: text }; }
    return { status: r.status, data };
  });
}

// Reads an SSE stream with fetch; calls onEvent(type, data, id) per event; reconnects with
// Last-Event-ID until the stream says `end` or is aborted.
function stream(path, onEvent) {
  const ctl = new AbortController();
  streams.push(ctl);
  let lastId = "";
  const run = async () => {
    for (;;) {
      const headers = { Authorization: "Bearer " + token };
      if (lastId) headers["Last-Event-ID"] = lastId;
      let ended = false;
      try {
        const r = await fetch(path, { headers, signal: ctl.signal });
        if (r.status !== 200) return;
        const reader = r.body.getReader();
        const dec = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += dec.decode(value, { stream: true });
          let at;
          while ((at = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, at);
            buf = buf.slice(at + 2);
            let type = "message", data = "", id = null;
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) type = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
              else if (line.startsWith("id: ")) id = line.slice(4);
            }
            if (id !== null) lastId = id;
            if (!data) continue;
            if (type === "end") ended = true;
            onEvent(type, JSON.parse(data), id);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      if (ended || ctl.signal.aborted) return;
      await new Promise((res) => setTimeout(res, 1000));
    }
  };
  run();
  return ctl;
}

function closeStreams() { streams.forEach((c) => c.abort()); streams = []; }

function cell(tr, text, cls) {
  const td = document.createElement("td");
  td.textContent = text === undefined || text === null ? "" : String(text);
  if (cls) td.className = cls;
  tr.appendChild(td);
  return td;
}

function fmtAcc(a) { return typeof a === "number" ? a.toFixed(4) : ""; }

function showRuns(runs) {
  const body = $("runs").querySelector("tbody");
  body.replaceChildren();
  for (const r of runs) {
    const tr = document.createElement("tr");
    tr.className = "clickable";
    tr.dataset.id = r.id;
    cell(tr, r.id);
    cell(tr, r.state + (r.position ? " (" + r.position + ")" : ""), "state state-" + r.state);
    cell(tr, (r.created || "").replace("T", " ").slice(0, 19));
    cell(tr, r.champion ? r.champion.candidate + " " + fmtAcc(r.champion.accuracy) : "");
    tr.addEventListener("click", () => { location.hash = "#run/" + encodeURIComponent(r.id); });
    body.appendChild(tr);
  }
}

function showHome() {
  closeStreams();
  $("home").hidden = false; $("run").hidden = true; $("signin").hidden = true;
  api("GET", "/v1/runs?limit=100").then((r) => { if (r.status === 200) showRuns(r.data.runs); });
  if (!$('nr-train').options.length) loadCatalog();
  stream("/v1/events", (type, data) => { if (type === "runs") showRuns(data); });
}

function showRunView(v) {
  $("run-title").textContent = v.id;
  $("run-state").textContent = v.state;
  $("run-state").className = "state-" + v.state;
  $("run-line").textContent = v.line || "";
  $("cancel").disabled = !(v.state === "running" || v.state === "queued");
  $("resume").disabled = !(v.state === "interrupted" || v.state === "failed" || v.state === "cancelled");
  const tasks = $("tasks").querySelector("tbody");
  tasks.replaceChildren();
  for (const t of v.tasks || []) {
    const tr = document.createElement("tr");
    cell(tr, t.task); cell(tr, t.module); cell(tr, t.ranks); cell(tr, t.state, "task-" + t.state);
    cell(tr, t.retries); cell(tr, t.seconds === undefined ? "" : t.seconds.toFixed(1));
    tasks.appendChild(tr);
  }
  drawChart(v.rounds || []);
  const rounds = $("rounds").querySelector("tbody");
  rounds.replaceChildren();
  for (const r of v.rounds || []) {
    const tr = document.createElement("tr");
    cell(tr, r.round); cell(tr, r.champion); cell(tr, fmtAcc(r.accuracy));
    rounds.appendChild(tr);
  }
}

// The champion's validation accuracy after each round, as a line that grows with the run.
function drawChart(rounds) {
  const svg = $('chart'), NS = 'http://www.w3.org/2000/svg';
  const W = 520, H = 220, L = 48, R = 14, T = 14, B = 30;
  const el = (name, attrs, text) => {
    const e = document.createElementNS(NS, name);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, String(v));
    if (text !== undefined) e.textContent = text;
    svg.appendChild(e);
    return e;
  };
  svg.replaceChildren();
  svg.dataset.points = String(rounds.length);
  el('line', {x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis'});
  el('line', {x1: L, y1: T, x2: L, y2: H - B, class: 'axis'});
  if (!rounds.length) {
    el('text', {x: L + 10, y: H / 2}, 'no round has ended yet');
    return;
  }
  const acc = rounds.map((r) => r.accuracy);
  const lo = Math.max(0, Math.floor((Math.min(...acc) - 0.01) * 50) / 50);
  const hi = Math.min(1, Math.max(lo + 0.02, Math.ceil((Math.max(...acc) + 0.005) * 50) / 50));
  const last = Math.max(2, rounds[rounds.length - 1].round);
  const x = (round) => L + (W - L - R) * (round - 1) / (last - 1);
  const y = (a) => H - B - (H - T - B) * (a - lo) / (hi - lo);
  for (const a of [lo, (lo + hi) / 2, hi]) el('text', {x: 4, y: y(a) + 4}, a.toFixed(3));
  for (let r = 1; r <= last; ++r) el('text', {x: x(r) - 3, y: H - B + 16}, String(r));
  el('text', {x: W - R - 40, y: H - 4}, 'round');
  el('polyline', {class: 'line', points: rounds.map((r) => x(r.round) + ',' + y(r.accuracy)).join(' ')});
  for (const r of rounds) {
    const c = el('circle', {cx: x(r.round), cy: y(r.accuracy), r: 4});
    const t = document.createElementNS(NS, 'title');
    t.textContent = 'round ' + r.round + ': ' + r.champion + ' ' + fmtAcc(r.accuracy);
    c.appendChild(t);
  }
}

function showRun(id) {
  closeStreams();
  $("home").hidden = true; $("run").hidden = false; $("signin").hidden = true;
  $("report").hidden = true;
  const path = "/v1/runs/" + encodeURIComponent(id);
  let pending = false;
  const refresh = () => {
    if (pending) return;
    pending = true;
    setTimeout(() => {
      pending = false;
      api("GET", path).then((r) => { if (r.status === 200) showRunView(r.data); });
    }, 150);
  };
  api("GET", path).then((r) => {
    if (r.status !== 200) { $("run-title").textContent = id + ": " + (r.data && r.data.error ? r.data.error.message : r.status); return; }
    showRunView(r.data);
    stream(path + "/events", () => refresh());
  });
  $("cancel").onclick = () => api("DELETE", path).then(refresh);
  $("resume").onclick = () => api("POST", path + "/resume").then(() => showRun(id));
  $("show-report").onclick = () => fetch(path + "/report", { headers: { Authorization: "Bearer " + token } })
    .then((r) => r.text()).then((html) => { $("report").srcdoc = html; $("report").hidden = false; });
}

// The new-run form: what the user's folders hold (GET /v1/catalog) and each checked model's
// layers (GET /v1/catalog/layers), composed into the pipeline text below it. A change of the
// form writes the text; a model's layers arriving write it only while the text is still the
// form's (or empty), so an edit by hand is not lost to a late answer. Every change of the text
// is checked by POST /v1/validate, which starts nothing, and its answer is shown under it.
const layersOf = {};  // a model's path -> the promise of its layers
let composedText = '';
let validateTimer = null, validateSeq = 0;

function addOption(sel, value, text) {
  const o = document.createElement('option');
  o.value = value;
  o.textContent = text;
  sel.appendChild(o);
  return o;
}

function numberIn(id) {
  const v = Number($(id).value);
  return Number.isFinite(v) ? v : 0;
}

function modelRow(m) {
  const tr = document.createElement('tr');
  tr.dataset.path = m.path;
  const on = document.createElement('input');
  on.type = 'checkbox';
  on.className = 'nr-use';
  cell(tr, '').appendChild(on);
  cell(tr, m.path.split('/').pop() + ' (' + (m.bytes / 1048576).toFixed(1) + ' MB)').title = m.path;
  const cut = document.createElement('select');
  cut.className = 'nr-cut';
  cut.disabled = true;
  cell(tr, '').appendChild(cut);
  const size = cell(tr, '');
  for (const k of ['h', 'w']) {
    const i = document.createElement('input');
    i.type = 'number';
    i.min = '8';
    i.max = '1024';
    i.value = '96';
    i.className = 'nr-' + k;
    size.appendChild(i);
  }
  const norm = cell(tr, '');
  for (const [k, v] of [['mean', '0'], ['std', '1']]) {
    const i = document.createElement('input');
    i.type = 'number';
    i.step = '0.01';
    i.value = v;
    i.className = 'nr-' + k;
    norm.appendChild(i);
  }
  const ft = document.createElement('select');
  ft.className = 'nr-ft';
  ft.disabled = true;
  addOption(ft, '', 'no (frozen)');
  cell(tr, '').appendChild(ft);
  on.addEventListener('change', () => {
    if (on.checked)
      loadLayers(tr);
    else
      compose(true);
  });
  return tr;
}

// Fills a model's row from its layers: every layer to cut at (the suggested one chosen), the
// input size the model fixes, and the layers before the cut to fine-tune from.
function loadLayers(tr) {
  const path = tr.dataset.path;
  if (!layersOf[path]) layersOf[path] = api('GET', '/v1/catalog/layers?onnx=' + encodeURIComponent(path));
  compose(true);
  layersOf[path].then((r) => {
    const cut = tr.querySelector('.nr-cut');
    if (r.status !== 200) {
      tr.querySelector('.nr-use').checked = false;
      tr.title = r.data && r.data.error ? r.data.error.message : 'HTTP ' + r.status;
      tr.classList.add('error');
      compose(true);
      return;
    }
    if (!cut.options.length) {
      for (const l of r.data.layers)
        addOption(cut, l.name, l.name + ' (' + l.op + ')').selected = l.name === r.data.suggested;
      if (r.data.input.height) tr.querySelector('.nr-h').value = r.data.input.height;
      if (r.data.input.width) tr.querySelector('.nr-w').value = r.data.input.width;
      tr.dataset.channels = r.data.input.channels || 3;
      cut.addEventListener('change', () => {
        fillFinetune(tr, r.data.layers);
        compose(true);
      });
      fillFinetune(tr, r.data.layers);
    }
    cut.disabled = false;
    tr.querySelector('.nr-ft').disabled = false;
    compose(false);
  });
}

function fillFinetune(tr, layers) {
  const ft = tr.querySelector('.nr-ft'), was = ft.value;
  const at = layers.findIndex((l) => l.name === tr.querySelector('.nr-cut').value);
  while (ft.options.length > 1) ft.remove(1);
  // Training starts at a layer with weights: a convolution or a dense layer before the cut.
  for (const l of layers.slice(0, Math.max(0, at)))
    if (l.op === 'Conv' || l.op === 'Gemm' || l.op === 'MatMul')
      addOption(ft, l.node, l.node).selected = l.node === was;
}

function loadCatalog() {
  api('GET', '/v1/catalog').then((r) => {
    if (r.status !== 200) return;
    const sets = [];
    for (const f of r.data.image_folders)
      sets.push({text: f.path + ' (' + f.classes + ' classes)', split: {format: 'folder', root: f.path}});
    for (const x of r.data.idx) sets.push({text: x.images, split: {format: 'idx', images: x.images, labels: x.labels}});
    for (const x of r.data.npy)
      sets.push(
          {text: x.images + ' (' + x.count + ' images)', split: {format: 'npy', images: x.images, labels: x.labels}});
    $('nr-empty').hidden = sets.length > 0;
    for (const id of ['nr-train', 'nr-test']) {
      $(id).replaceChildren();
      for (const d of sets) addOption($(id), JSON.stringify(d.split), d.text);
    }
    // A folder named for the split, else the first and the second data set.
    const pick = (re, not) => sets.findIndex((d, k) => k !== not && re.test(d.text));
    let train = pick(/train/i, -1);
    if (train < 0) train = 0;
    let test = pick(/(test|t10k)/i, train);
    if (test < 0) test = sets.length > 1 ? (train === 0 ? 1 : 0) : 0;
    $('nr-train').selectedIndex = train;
    $('nr-test').selectedIndex = test;
    const body = $('nr-models').querySelector('tbody');
    body.replaceChildren();
    for (const m of r.data.models) body.appendChild(modelRow(m));
    compose(false);
  });
}

function safeName(path, taken) {
  let n = path.split('/')
              .pop()
              .replace(/\.onnx$/i, '')
              .toLowerCase()
              .replace(/[^a-z0-9_]+/g, '_')
              .replace(/^_+|_+$/g, '') ||
      'model';
  if (/^[0-9]/.test(n)) n = 'm' + n;
  let k = 2, name = n;
  while (taken.has(name)) name = n + '_' + k++;
  taken.add(name);
  return name;
}

function composedPipeline() {
  const limit = numberIn('nr-limit');
  const split = (id) => {
    if (!$(id).value) return null;
    const s = JSON.parse($(id).value);
    if (limit > 0) s.limit = limit;
    return s;
  };
  const folder = (split('nr-train') || {}).format === 'folder';
  const taken = new Set(['pixels']);
  const backbones = [];
  let finetune = false;
  for (const tr of $('nr-models').querySelectorAll('tbody tr')) {
    if (!tr.querySelector('.nr-use').checked || !tr.querySelector('.nr-cut').value) continue;
    const ch = Number(tr.dataset.channels) || 3;
    const bb = {
      name: safeName(tr.dataset.path, taken),
      onnx: tr.dataset.path,
      feature_layer: tr.querySelector('.nr-cut').value,
      input: {
        height: Number(tr.querySelector('.nr-h').value),
        width: Number(tr.querySelector('.nr-w').value),
        channels: ch,
        mean: Array(ch).fill(Number(tr.querySelector('.nr-mean').value)),
        std: Array(ch).fill(Number(tr.querySelector('.nr-std').value))
      },
    };
    if (tr.querySelector('.nr-ft').value) {
      bb.train_from = tr.querySelector('.nr-ft').value;
      finetune = true;
    }
    backbones.push(bb);
  }
  // Raw pixels: an image folder's images may differ in size, so they are resized to 32 x 32.
  if ($('nr-pixels').checked)
    backbones.push(
        folder ? {name: 'pixels', kind: 'pixels', input: {height: 32, width: 32, channels: 3}} :
                 {name: 'pixels', kind: 'pixels'});
  $('nr-ft-round-label').hidden = !finetune;
  const candidates = numberIn('nr-candidates');
  const doc = {
    format: 'msaflow.pipeline/1',
    name: $('nr-name').value,
    datasets: {
      train: split('nr-train'),
      test: split('nr-test'),
      validation: {from: 'train', fraction: numberIn('nr-val'), seed: 1}
    },
    backbones,
    head: {
      type: $('nr-mlp').checked ? ['softmax', 'mlp'] : 'softmax',
      hidden: [128],
      optimizer: 'adam',
      lr: [0.001, 0.003],
      l2: [0.0001, 0.001],
      epochs: [numberIn('nr-epochs')],
      batch: 64
    },
    rounds: {
      max: numberIn('nr-rounds'),
      candidates,
      top_k: Math.max(1, Math.min(2, candidates)),
      strategy: $('nr-strategy').value,
      seed: 1
    },
    metric: 'accuracy',
  };
  if (finetune) doc.rounds.finetune_from_round = numberIn('nr-ft-round');
  return doc;
}

// Writes the form's pipeline into the text: always when the form changed (`force`), else only
// while the text is what the form wrote last, or empty.
function compose(force) {
  const text = $('pipeline').value;
  if (!force && text && text !== composedText) return;
  composedText = JSON.stringify(composedPipeline(), null, 1);
  $('pipeline').value = composedText;
  checkSoon();
}

function checkSoon() {
  clearTimeout(validateTimer);
  validateTimer = setTimeout(checkPipeline, 300);
}

function checkPipeline() {
  const seq = ++validateSeq, text = $('pipeline').value;
  if (!text.trim()) {
    $('validate-state').textContent = '';
    $('validate-text').textContent = '';
    return;
  }
  $('validate-state').textContent = 'checking…';
  $('validate-state').className = 'hint';
  api('POST', '/v1/validate', text).then((r) => {
    if (seq !== validateSeq) return;  // an answer to an older text
    const ok = r.status === 200;
    $('validate-answer').dataset.state = ok ? 'valid' : 'invalid';
    $('validate-state').className = ok ? 'ok' : 'error';
    if (ok) {
      $('validate-state').textContent = 'valid:';
      $('validate-text').textContent = r.data.validation.join(' · ');
      return;
    }
    const e = r.data && r.data.error ? r.data.error : {message: 'HTTP ' + r.status};
    $('validate-state').textContent = 'invalid' + (e.pointer ? ' at ' + e.pointer : '') + ':';
    $('validate-text').textContent = e.message + (e.hint ? ' (' + e.hint + ')' : '');
  });
}

// Marks the validation error at its JSON pointer: the message beside the form, and the
// pointer's last key selected in the text.
function showSubmitError(err) {
  $("submit-error").hidden = false;
  $("error-pointer").textContent = err.pointer || "/";
  $("error-message").textContent = err.message || "";
  $("error-hint").textContent = err.hint || "";
  const text = $("pipeline").value;
  const key = (err.pointer || "").split("/").filter((s) => s && !/^\d+$/.test(s)).pop();
  if (key) {
    const at = text.indexOf('"' + key + '"');
    if (at >= 0) { $("pipeline").focus(); $("pipeline").setSelectionRange(at, at + key.length + 2); }
  }
}

function route() {
  if (!token) { closeStreams(); $("signin").hidden = false; $("home").hidden = true; $("run").hidden = true; return; }
  const m = location.hash.match(/^#run\/(.+)$/);
  if (m) showRun(decodeURIComponent(m[1])); else showHome();
}

function signIn(t) {
  token = t;
  return api("GET", "/v1/whoami").then((r) => {
    if (r.status !== 200) { token = ""; $("signin-error").textContent = "that token is not valid"; return; }
    sessionStorage.setItem("msaflow-token", t);
    $("who").textContent = "signed in as " + r.data.user;
    $("signout").hidden = false;
    $("signin-error").textContent = "";
    route();
  });
}

window.addEventListener("DOMContentLoaded", () => {
  $("signin-form").addEventListener("submit", (e) => { e.preventDefault(); signIn($("token").value.trim()); });
  $("signout").addEventListener("click", () => { sessionStorage.removeItem("msaflow-token"); token = ""; location.hash = ""; route(); });
  $("back").addEventListener("click", (e) => { e.preventDefault(); location.hash = ""; });
  $("pipeline-file").addEventListener("change", () => {
    const f = $("pipeline-file").files[0];
    if (f)
      f.text().then((t) => {
        $('pipeline').value = t;
        checkSoon();
      });
  });
  $('pipeline').addEventListener('input', checkSoon);
  for (const ev of ['change', 'input'])
    $('new-form').addEventListener(ev, (e) => {
      if (!e.target.classList.contains('nr-use')) compose(true);
    });
  $("submit-form").addEventListener("submit", (e) => {
    e.preventDefault();
    $("submit-error").hidden = true;
    $("submit-ok").textContent = "";
    api("POST", "/v1/runs", $("pipeline").value).then((r) => {
      if (r.status === 202) { $("submit-ok").textContent = "submitted as " + r.data.id; return; }
      showSubmitError(r.data && r.data.error ? r.data.error : { message: "HTTP " + r.status });
    });
  });
  window.addEventListener("hashchange", route);
  if (token) signIn(token); else route();
});
