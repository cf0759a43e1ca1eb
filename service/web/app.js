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
  const rounds = $("rounds").querySelector("tbody");
  rounds.replaceChildren();
  for (const r of v.rounds || []) {
    const tr = document.createElement("tr");
    cell(tr, r.round); cell(tr, r.champion); cell(tr, fmtAcc(r.accuracy));
    rounds.appendChild(tr);
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
    if (f) f.text().then((t) => { $("pipeline").value = t; });
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
