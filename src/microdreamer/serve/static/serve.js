// microdreamer serve: the page. Submits a job (POST /api/jobs), follows it by its event stream
// (/api/jobs/{id}/events), then shows the result in the project's viewer (/api/jobs/{id}/viewer/), its
// downloads and timings; lists the recent jobs. No network beyond this server.
(function () {
  "use strict";

  const $ = (id) => document.getElementById(id);
  let file = null;
  let source = null; // the EventSource of the job shown
  let shown = null; // its id

  // ------------------------------------------------------------------ the token (when the server wants one)
  function token() {
    return localStorage.getItem("microdreamer_token") || "";
  }

  function askToken() {
    const t = window.prompt("This server needs its token (microdreamer serve --token):", token());
    if (t === null) return false;
    localStorage.setItem("microdreamer_token", t);
    document.cookie = `microdreamer_token=${encodeURIComponent(t)}; path=/; SameSite=Strict`;
    return true;
  }

  async function api(path, init = {}, retry = true) {
    const headers = Object.assign({}, init.headers || {});
    if (token()) headers.Authorization = `Bearer ${token()}`;
    const response = await fetch(path, Object.assign({}, init, { headers }));
    if (response.status === 401 && retry && askToken()) return api(path, init, false);
    let body = null;
    try {
      body = await response.json();
    } catch (e) {
      body = {};
    }
    if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
    return body;
  }

  // ------------------------------------------------------------------ the form
  function choose(f) {
    file = f || null;
    const splat = file && /\.(ply|spz|sog|splat|ksplat|glb|gltf)$/i.test(file.name);
    $("chosen").textContent = file
      ? `${file.name} (${(file.size / 1e6).toFixed(2)} MB): ${splat ? "splat → mesh" : "image → 3D"}`
      : "";
    $("mesh-options").hidden = !splat;
    $("generate-options").hidden = !!splat;
  }

  function options() {
    const out = {};
    const text = $("options").value.trim();
    if (text) Object.assign(out, JSON.parse(text));
    const put = (key, value, number) => {
      if (value === "" || value === undefined) return;
      out[key] = number ? Number(value) : value;
    };
    if (!$("mesh-options").hidden) {
      put("resolution", $("resolution").value === "auto" ? "" : $("resolution").value, true);
      put("texture", $("texture").value === "bake" ? "" : $("texture").value);
      put("max-faces", $("max-faces").value, true);
      put("format", $("format").value === "glb" ? "" : $("format").value);
    } else {
      put("iters", $("iters").value, true);
      put("seed", $("seed").value, true);
      put("elevation", $("elevation").value, true);
    }
    return out;
  }

  async function submit() {
    $("submit-error").textContent = "";
    const form = new FormData();
    const prompt = $("prompt").value.trim();
    let opts;
    try {
      opts = options();
    } catch (e) {
      $("submit-error").textContent = `settings: not valid JSON (${e.message})`;
      return;
    }
    if (!file && !prompt) {
      $("submit-error").textContent = "drop an image or a splat, or type a prompt";
      return;
    }
    if (file) form.append("file", file, file.name);
    form.append("kind", file && /\.(ply|spz|sog|splat|ksplat|glb|gltf)$/i.test(file.name) ? "mesh" : "generate");
    if (prompt) form.append("prompt", prompt);
    if (Object.keys(opts).length) form.append("options", JSON.stringify(opts));
    $("go").disabled = true;
    try {
      const job = await api("/api/jobs", { method: "POST", body: form });
      show(job.id);
      refreshRecent();
    } catch (e) {
      $("submit-error").textContent = e.message;
    } finally {
      $("go").disabled = false;
    }
  }

  // ------------------------------------------------------------------ one job
  function show(id) {
    if (source) source.close();
    shown = id;
    $("job").hidden = false;
    $("result").hidden = true;
    $("viewer").removeAttribute("src");
    $("job-error").textContent = "";
    source = new EventSource(`/api/jobs/${id}/events`);
    source.onmessage = (e) => render(JSON.parse(e.data));
    source.onerror = () => {
      // the stream ends when the job does; a broken stream is picked up by one plain request
      source.close();
      api(`/api/jobs/${id}`).then(render).catch((err) => ($("job-error").textContent = err.message));
    };
  }

  function render(job) {
    if (job.id !== shown) return;
    const box = $("job");
    box.dataset.status = job.status;
    box.dataset.progress = job.progress;
    $("job-title").textContent = `${job.kind} job ${job.id}: ${job.input || JSON.stringify(job.prompt)}`;
    $("job-status").textContent = job.status;
    $("job-position").textContent = job.status === "queued" && job.position ? `position ${job.position} in the queue` : "";
    $("job-bar").style.width = `${Math.round(100 * (job.status === "done" ? 1 : job.progress))}%`;
    $("job-stage").textContent = job.status === "running" ? job.stage : "";
    $("job-error").textContent = job.error || "";
    $("cancel").hidden = !(job.status === "queued" || job.status === "running");
    if (job.status === "done" && $("result").hidden) {
      $("result").hidden = false;
      $("viewer").src = `/api/jobs/${job.id}/viewer/index.html`;
      const links = $("downloads");
      links.replaceChildren(document.createTextNode("download: "));
      for (const name of job.files) {
        const a = document.createElement("a");
        a.href = `/api/jobs/${job.id}/files/${encodeURIComponent(name)}`;
        a.download = name;
        a.textContent = name;
        links.append(a);
      }
      const rows = Object.entries(job.seconds || {});
      $("timings").replaceChildren(...rows.map(([k, v]) => {
        const tr = document.createElement("tr");
        const a = document.createElement("td");
        const b = document.createElement("td");
        a.textContent = k;
        b.className = "num";
        b.textContent = `${Number(v).toFixed(3)} s`;
        tr.append(a, b);
        return tr;
      }));
    }
    if (["done", "failed", "cancelled"].includes(job.status)) refreshRecent();
  }

  async function cancel() {
    if (!shown) return;
    try {
      await api(`/api/jobs/${shown}`, { method: "DELETE" });
    } catch (e) {
      $("job-error").textContent = e.message;
    }
  }

  // ------------------------------------------------------------------ the lists
  async function refreshRecent() {
    let jobs;
    try {
      jobs = (await api("/api/jobs?limit=20")).jobs;
    } catch (e) {
      return;
    }
    const body = $("recent").tBodies[0];
    body.replaceChildren(...jobs.map((job) => {
      const tr = document.createElement("tr");
      tr.className = "clickable";
      const cells = [job.id, job.kind, job.input || JSON.stringify(job.prompt), job.status,
        job.seconds && job.seconds.wall ? job.seconds.wall.toFixed(2) : ""];
      for (const c of cells) {
        const td = document.createElement("td");
        td.textContent = c;
        tr.append(td);
      }
      tr.addEventListener("click", () => show(job.id));
      return tr;
    }));
  }

  async function health() {
    try {
      const h = await api("/api/health");
      const ready = h.ready ? "ready" : "starting";
      $("health").textContent = `${ready} · device ${h.device} · model ${h.model || "none"} · ${h.workers.length} worker(s)` +
        (h.model_error ? ` · ${h.model_error}` : "");
      if (!h.ready) setTimeout(health, 2000);
    } catch (e) {
      $("health").textContent = `not reachable: ${e.message}`;
      setTimeout(health, 5000);
    }
  }

  // ------------------------------------------------------------------ wiring
  const drop = $("drop");
  drop.addEventListener("dragover", (e) => {
    e.preventDefault();
    drop.classList.add("over");
  });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    if (e.dataTransfer.files.length) choose(e.dataTransfer.files[0]);
  });
  $("file").addEventListener("change", (e) => choose(e.target.files[0]));
  $("go").addEventListener("click", submit);
  $("cancel").addEventListener("click", cancel);
  choose(null);
  $("mesh-options").hidden = true;
  $("generate-options").hidden = false;
  health();
  refreshRecent();
  const first = new URLSearchParams(location.search).get("job");
  if (first && /^[0-9a-f]{16}$/.test(first)) show(first);
})();
