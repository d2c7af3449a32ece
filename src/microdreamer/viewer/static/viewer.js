// microdreamer viewer: meshes (three.js loaders), 3DGS splats (Spark) and 3D Tiles tilesets
// (3d-tiles-renderer, streamed) from the page's manifest.
//
// A classic script (no ES modules, so the page also opens from file://) on the global MDV that
// vendor/mdv-vendor.min.js defines. What the page loaded is published as JSON in #md-stats; its
// data-state is "loading", then "ready" (every view loaded and drawn) or "error".
//
// Colours: the canvas shows stored colour values as they are (no sRGB decode of textures, no
// encode of the output), as `microdreamer render` does; meshes are unlit by default (baked
// textures already hold the light), with a "lit" toggle.
(function () {
  "use strict";

  const stats = { state: "loading", views: [], errors: [] };
  const statsEl = document.getElementById("md-stats");
  const messageEl = document.getElementById("md-message");

  function publish() {
    const text = JSON.stringify(stats, null, 1);
    if (text === statsEl.textContent) return;
    statsEl.textContent = text;
    statsEl.dataset.state = stats.state;
  }

  function fail(where, err) {
    const text = `${where}: ${err && err.message ? err.message : err}`;
    stats.errors.push(text);
    stats.state = "error";
    console.error(text);
    showMessage(hint ? `${text}. ${hint}` : text);
    publish();
  }

  let hint = ""; // how to open the page when file:// is refused

  function showMessage(text) {
    messageEl.hidden = false;
    messageEl.textContent = text;
  }

  window.addEventListener("error", (e) => fail("page", e.error || e.message));
  window.addEventListener("unhandledrejection", (e) => fail("page", e.reason));

  if (!window.MDV) {
    fail("vendor", "vendor/mdv-vendor.min.js did not load; rebuild the viewer");
    return;
  }
  const { THREE, GLTFLoader, OBJLoader, MTLLoader, OrbitControls, SparkRenderer, SplatMesh, TilesRenderer } =
    window.MDV;
  const manifest = JSON.parse(document.getElementById("md-manifest").textContent);
  const fromFile = location.protocol === "file:";
  // ?size=N: every 3D view N x N CSS pixels (tests and screenshots)
  const fixedSize = Number(new URLSearchParams(location.search).get("size")) || 0;

  // ------------------------------------------------------------------ assets (served or embedded)
  const blobs = new Map(); // asset url -> blob: url (embedded assets, file:// only)

  function resolve(url) {
    const key = url.replace(/^\.\//, "");
    return blobs.get(key) || url;
  }

  function loadScript(src) {
    return new Promise((ok, bad) => {
      const s = document.createElement("script");
      s.src = src;
      s.onload = ok;
      s.onerror = () => bad(new Error(`${src} did not load`));
      document.head.appendChild(s);
    });
  }

  async function loadEmbedded() {
    if (!fromFile) return;
    if (!manifest.embedded) {
      hint =
        "This viewer was opened from a file and its assets were too large to embed; browsers refuse to " +
        "read them from file://. Serve it instead: microdreamer view <this folder> " +
        "(or python -m http.server --bind 127.0.0.1 --directory <this folder>).";
      showMessage(hint);
      return;
    }
    await loadScript("data.js");
    for (const [url, item] of Object.entries(window.MD_EMBED || {})) {
      const raw = atob(item.b64);
      const bytes = new Uint8Array(raw.length);
      for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
      blobs.set(url, URL.createObjectURL(new Blob([bytes], { type: item.mime })));
    }
    window.MD_EMBED = undefined;
  }

  // a loading manager per view that maps asset URLs to embedded blobs and can be awaited until every
  // file its loaders started (an OBJ's textures load after the OBJ itself) has arrived
  function makeManager() {
    const manager = new THREE.LoadingManager();
    manager.setURLModifier(resolve);
    let pending = 0;
    let waiters = [];
    const failed = [];
    const [start, end, error] = [manager.itemStart, manager.itemEnd, manager.itemError].map((f) => f.bind(manager));
    manager.itemStart = (url) => {
      pending++;
      start(url);
    };
    manager.itemEnd = (url) => {
      end(url);
      if (--pending === 0) for (const ok of waiters.splice(0)) ok();
    };
    manager.itemError = (url) => { // three's loaders call itemEnd after it
      failed.push(url);
      error(url);
    };
    manager.idle = async () => {
      if (pending > 0) await new Promise((ok) => waiters.push(ok));
      if (failed.length) throw new Error(`did not load: ${failed.join(", ")}`);
    };
    return manager;
  }

  // ------------------------------------------------------------------ one 3D view
  const fmt = (x) => (typeof x === "number" && !Number.isInteger(x) ? x.toPrecision(4) : String(x));

  class View {
    constructor(spec, element) {
      this.spec = spec;
      this.record = { kind: spec.kind, name: spec.name, url: spec.url, loaded: false, frames: 0 };
      stats.views.push(this.record);
      this.canvas = element.querySelector("canvas");
      this.infoEl = element.querySelector(".info");
      this.renderer = new THREE.WebGLRenderer({ canvas: this.canvas, antialias: spec.kind !== "splat" });
      // meshes: no encode (textures are not decoded either); Spark decodes the splats' sRGB colours to
      // linear itself, so its views encode back
      this.renderer.outputColorSpace = spec.kind === "splat" ? THREE.SRGBColorSpace : THREE.LinearSRGBColorSpace;
      this.renderer.setPixelRatio(Math.min(window.devicePixelRatio || 1, 2));
      this.scene = new THREE.Scene();
      this.scene.background = new THREE.Color(1, 1, 1);
      const c = spec.camera;
      this.camera = new THREE.PerspectiveCamera(c.fovy_deg, 1, c.near, c.far);
      this.peers = [];
      this.controls = new OrbitControls(this.camera, this.canvas);
      this.controls.addEventListener("change", () => this.changed());
      this.reset();
      new ResizeObserver(() => this.resize()).observe(this.canvas);
      this.resize();
    }

    reset() {
      const c = this.spec.camera;
      this.camera.up.set(0, 1, 0);
      this.camera.position.fromArray(c.position);
      this.controls.target.fromArray(c.target);
      this.camera.lookAt(this.controls.target);
      this.controls.update();
      this.dirty = true;
    }

    resize() {
      const w = Math.max(1, this.canvas.clientWidth);
      const h = Math.max(1, this.canvas.clientHeight);
      this.renderer.setSize(w, h, false);
      this.camera.aspect = w / h;
      this.camera.updateProjectionMatrix();
      this.dirty = true;
    }

    // the orbit of this view, relative to its opening camera: (direction, zoom factor)
    orbit() {
      const offset = this.camera.position.clone().sub(this.controls.target);
      const d0 = new THREE.Vector3().fromArray(this.spec.camera.position)
        .sub(new THREE.Vector3().fromArray(this.spec.camera.target)).length();
      return { dir: offset.clone().normalize(), zoom: offset.length() / d0 };
    }

    follow(orbit) {
      const c = this.spec.camera;
      const d0 = new THREE.Vector3().fromArray(c.position).sub(new THREE.Vector3().fromArray(c.target)).length();
      this.controls.target.fromArray(c.target);
      this.camera.position.copy(this.controls.target).addScaledVector(orbit.dir, d0 * orbit.zoom);
      this.camera.lookAt(this.controls.target);
      this.dirty = true;
    }

    changed() {
      this.dirty = true;
      if (this.following) return;
      const orbit = this.orbit();
      for (const peer of this.peers) {
        if (!peer.linked()) continue;
        peer.following = true;
        peer.follow(orbit);
        peer.controls.update();
        peer.following = false;
      }
    }

    showInfo(rows) {
      this.infoEl.replaceChildren();
      for (const [k, v] of rows) {
        const dt = document.createElement("dt");
        dt.textContent = k;
        const dd = document.createElement("dd");
        dd.textContent = fmt(v);
        this.infoEl.append(dt, dd);
      }
    }

    draw() {
      if (!this.dirty) return;
      this.renderer.render(this.scene, this.camera);
      this.dirty = false;
      if (this.record.loaded) this.record.frames++;
    }

    // loaded and drawn since
    settled() {
      return this.record.loaded && this.record.frames >= 1;
    }
  }

  // the meshes under root with two materials each: as loaded ("lit", textures taken as stored values)
  // and unlit (MeshBasicMaterial, what `microdreamer render` shows); their vertex and triangle counts
  function prepareMeshes(root) {
    let vertices = 0;
    let triangles = 0;
    let coloured = false;
    const meshes = [];
    root.traverse((o) => {
      if (!o.isMesh) return;
      const g = o.geometry;
      vertices += g.attributes.position.count;
      triangles += (g.index ? g.index.count : g.attributes.position.count) / 3;
      if (!g.attributes.normal) g.computeVertexNormals();
      const lit = [].concat(o.material).map((m) => {
        if (m.map) {
          m.map.colorSpace = THREE.NoColorSpace; // stored values as they are (set before upload)
          coloured = true;
        }
        if (g.attributes.color) coloured = true;
        m.side = THREE.DoubleSide;
        return m;
      });
      const unlit = lit.map((m) => new THREE.MeshBasicMaterial({
        map: m.map || null,
        color: m.map || g.attributes.color ? 0xffffff : 0xb3b3b3,
        vertexColors: !!g.attributes.color,
        side: THREE.DoubleSide,
      }));
      meshes.push({ mesh: o, lit: Array.isArray(o.material) ? lit : lit[0],
        unlit: Array.isArray(o.material) ? unlit : unlit[0] });
    });
    return { meshes, vertices, triangles, coloured };
  }

  class MeshView extends View {
    addLights() {
      const light = new THREE.HemisphereLight(0xffffff, 0x666666, 1.2);
      const sun = new THREE.DirectionalLight(0xffffff, 1.6);
      sun.position.set(1, 2, 3);
      this.camera.add(sun);
      this.scene.add(light, this.camera);
    }

    async load() {
      const t0 = performance.now();
      const s = this.spec;
      const manager = makeManager();
      let root;
      if (s.format === "glb") {
        root = (await new GLTFLoader(manager).loadAsync(s.url)).scene;
      } else {
        const obj = new OBJLoader(manager);
        if (s.mtl) {
          const dir = s.mtl.slice(0, s.mtl.lastIndexOf("/") + 1);
          const materials = await new MTLLoader(manager).setPath(dir).loadAsync(s.mtl.slice(dir.length));
          materials.preload();
          obj.setMaterials(materials);
        }
        root = await obj.loadAsync(s.url);
      }
      await manager.idle();
      const { meshes, vertices, triangles, coloured } = prepareMeshes(root);
      this.meshes = meshes;
      this.scene.add(root);
      this.addLights();
      this.setLit(!coloured); // colour as stored; plain geometry lit so its shape shows
      Object.assign(this.record, {
        loaded: true, vertices, triangles, textured: coloured, load_ms: Math.round(performance.now() - t0),
      });
      this.showInfo([
        ["vertices", vertices], ["triangles", triangles],
        ["file vertices / faces", `${s.stats.vertices} / ${s.stats.faces}`],
        ["size", `${(s.stats.bytes / 1e6).toFixed(2)} MB`], ["load", `${this.record.load_ms} ms`],
      ]);
      this.dirty = true;
    }

    setLit(lit) {
      this.lit = lit;
      for (const m of this.meshes) m.mesh.material = lit ? m.lit : m.unlit;
      this.record.lit = lit;
      this.dirty = true;
    }
  }

  class SplatView extends View {
    async load() {
      const t0 = performance.now();
      const s = this.spec;
      const response = await fetch(resolve(s.url));
      if (!response.ok) throw new Error(`${s.url}: HTTP ${response.status}`);
      const bytes = new Uint8Array(await response.arrayBuffer());
      this.spark = new SparkRenderer({ renderer: this.renderer, onDirty: () => { this.dirty = true; } });
      this.scene.add(this.spark);
      const splat = new SplatMesh({ fileBytes: bytes, fileName: s.name });
      this.scene.add(splat);
      await splat.initialized;
      this.splat = splat;
      const n = splat.packedSplats ? splat.packedSplats.numSplats : splat.splats.getNumSplats();
      Object.assign(this.record, {
        loaded: true, splats: n, sh_degree_file: s.stats.sh_degree, load_ms: Math.round(performance.now() - t0),
      });
      this.showInfo([
        ["splats", n], ["file Gaussians", s.stats.gaussians], ["SH degree", s.stats.sh_degree],
        ["size", `${(s.stats.bytes / 1e6).toFixed(2)} MB`], ["load", `${this.record.load_ms} ms`],
      ]);
    }

    // Spark sorts in a worker and shows the new order on a later frame: keep drawing until it has
    // every splat in, no sort pending, and three frames drawn since
    draw() {
      const sp = this.spark;
      if (!sp || !this.record.loaded) return super.draw();
      const clean = !sp.sorting && !sp.sortDirty && sp.activeSplats === this.record.splats;
      this.cleanFrames = clean ? this.cleanFrames || 0 : 0;
      if (this.cleanFrames < 3) this.dirty = true;
      const drawn = this.dirty;
      super.draw();
      if (drawn && clean) this.cleanFrames++;
      this.record.active_splats = sp.activeSplats;
    }

    settled() {
      return super.settled() && this.cleanFrames >= 3;
    }
  }

  // A 3D Tiles tileset streamed by 3d-tiles-renderer: each frame its update() picks the tiles this camera
  // needs (a coarse root, replaced by its leaves once they are worth their screen-space error) and loads
  // them. The tileset is z-up; the group turns it back to the page's y-up. Embedded (file://), every
  // file it asks for is handed over from data.js instead of fetched.
  class TilesView extends MeshView {
    async load() {
      const t0 = performance.now();
      const tiles = new TilesRenderer(this.spec.url);
      const page = new URL(".", location.href).href;
      tiles.registerPlugin({
        name: "MDV_EMBEDDED",
        fetchData: (url, options) => {
          const href = new URL(url, location.href).href;
          const blob = href.startsWith(page) && blobs.get(decodeURIComponent(href.slice(page.length)));
          return blob ? fetch(blob, options) : null; // null: the renderer fetches it itself
        },
      });
      tiles.group.rotation.x = -Math.PI / 2;
      tiles.group.updateMatrixWorld(true);
      tiles.setCamera(this.camera);
      this.meshes = [];
      this.lit = false;
      const models = new Map(); // a tile's scene -> its meshes
      tiles.addEventListener("load-model", ({ scene }) => {
        const prepared = prepareMeshes(scene);
        models.set(scene, prepared.meshes);
        this.meshes.push(...prepared.meshes);
        for (const m of prepared.meshes) m.mesh.material = this.lit ? m.lit : m.unlit;
        this.dirty = true;
      });
      tiles.addEventListener("dispose-model", ({ scene }) => {
        const gone = new Set(models.get(scene) || []);
        models.delete(scene);
        this.meshes = this.meshes.filter((m) => !gone.has(m));
      });
      for (const type of ["needs-update", "tile-visibility-change", "load-tileset"]) {
        tiles.addEventListener(type, () => { this.dirty = true; });
      }
      const loaded = new Promise((ok, bad) => {
        tiles.addEventListener("tiles-load-end", ok);
        tiles.addEventListener("load-error", ({ error, url }) => {
          const err = new Error(`${url}: ${error && error.message ? error.message : error}`);
          if (this.record.loaded) fail(`tiles ${this.spec.url}`, err);
          else bad(err);
        });
      });
      this.scene.add(tiles.group);
      this.addLights();
      this.tiles = tiles;
      this.dirty = true;
      await loaded;
      this.record.loaded = true;
      this.record.load_ms = Math.round(performance.now() - t0);
      this.dirty = true;
    }

    // the renderer's choice of tiles follows the camera, so it runs every frame (cheap when nothing
    // changed); a frame is drawn when the camera moved or a tile came or went
    draw() {
      const tiles = this.tiles;
      if (tiles) {
        this.camera.updateMatrixWorld();
        tiles.setResolutionFromRenderer(this.camera, this.renderer);
        tiles.update();
        this.report();
      }
      super.draw();
    }

    report() {
      const tiles = this.tiles;
      const visible = [...tiles.visibleTiles].map((t) => t.content && t.content.uri).filter(Boolean).sort();
      let vertices = 0;
      let triangles = 0;
      tiles.group.traverse((o) => {
        if (!o.isMesh || !o.visible) return;
        const g = o.geometry;
        vertices += g.attributes.position.count;
        triangles += (g.index ? g.index.count : g.attributes.position.count) / 3;
      });
      const st = tiles.stats;
      Object.assign(this.record, {
        visible_tiles: visible, tiles_loaded: st.loaded, tiles_failed: st.failed,
        loading: tiles.isLoading, vertices, triangles,
      });
      const rows = [
        ["tiles shown", visible.length], ["tiles loaded / in file", `${st.loaded} / ${this.spec.stats.tiles}`],
        ["triangles shown", triangles], ["size", `${(this.spec.stats.bytes / 1e6).toFixed(2)} MB`],
      ];
      if (this.record.load_ms !== undefined) rows.push(["first load", `${this.record.load_ms} ms`]);
      const key = JSON.stringify(rows);
      if (key !== this.infoKey) {
        this.infoKey = key;
        this.showInfo(rows);
      }
    }

    // loaded, drawn, and nothing more to load for this camera
    settled() {
      return super.settled() && !!this.tiles && !this.tiles.isLoading;
    }
  }

  // ------------------------------------------------------------------ page
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function secondsChart(title, seconds) {
    const box = el("div", "seconds");
    const total = Object.values(seconds).reduce((a, b) => a + b, 0) || 1;
    const max = Math.max(...Object.values(seconds), 1e-12);
    box.append(el("h3", null, `${title} (total ${total.toFixed(3)} s)`));
    for (const [name, s] of Object.entries(seconds)) {
      const row = el("div", "bar-row");
      const bar = el("span", "bar");
      bar.style.width = `${(100 * s) / max}%`;
      const track = el("span", "track");
      track.append(bar);
      row.append(el("span", "label", name), track,
        el("span", "value", `${s.toFixed(3)} s (${((100 * s) / total).toFixed(1)}%)`));
      box.append(row);
    }
    return box;
  }

  function scalarTable(title, values) {
    const box = el("details", "scalars");
    box.append(el("summary", null, title));
    const dl = el("dl", "info");
    for (const [k, v] of Object.entries(values)) dl.append(el("dt", null, k), el("dd", null, fmt(v)));
    box.append(dl);
    return box;
  }

  function buildGroup(group, parent) {
    const section = el("section", "group");
    const head = el("div", "group-head");
    head.append(el("h2", null, group.name), el("span", "source", group.source));
    section.append(head);
    const row = el("div", "views");
    section.append(row);
    const views = [];
    let link = null;
    if (group.views.length > 1) {
      const label = el("label", "link");
      link = el("input");
      link.type = "checkbox";
      link.checked = true;
      label.append(link, document.createTextNode(" link cameras"));
      head.append(label);
    }
    for (const spec of group.views) {
      const box = el("figure", `view view-${spec.kind}`);
      const canvas = el("canvas");
      if (fixedSize) Object.assign(canvas.style, { width: `${fixedSize}px`, height: `${fixedSize}px` });
      canvas.setAttribute("aria-label", `${spec.kind} ${spec.name}`);
      canvas.dataset.kind = spec.kind;
      const bar = el("figcaption");
      bar.append(el("strong", null, `${spec.kind}: ${spec.name}`));
      const reset = el("button", null, "reset view");
      bar.append(reset);
      box.append(canvas, bar, el("dl", "info"));
      row.append(box);
      const Kind = { splat: SplatView, tiles: TilesView }[spec.kind] || MeshView;
      const view = new Kind(spec, box);
      view.linked = () => !!(link && link.checked);
      reset.addEventListener("click", () => {
        view.reset();
        view.changed();
      });
      if (spec.kind === "mesh" || spec.kind === "tiles") {
        const lit = el("button", null, "lit / unlit");
        lit.addEventListener("click", () => view.setLit(!view.lit));
        bar.append(lit);
      }
      views.push(view);
    }
    for (const v of views) v.peers = views.filter((p) => p !== v);
    for (const [file, seconds] of Object.entries(group.seconds || {})) section.append(secondsChart(file, seconds));
    for (const [file, values] of Object.entries(group.scalars || {})) section.append(scalarTable(file, values));
    for (const image of group.images || []) {
      const fig = el("figure", "image");
      const img = el("img");
      img.alt = image.name;
      img.src = resolve(image.url);
      fig.append(img, el("figcaption", null, image.name));
      section.append(fig);
    }
    parent.append(section);
    return views;
  }

  async function main() {
    await loadEmbedded();
    const parent = document.getElementById("md-groups");
    const views = manifest.groups.flatMap((g) => buildGroup(g, parent));
    publish();
    const loop = () => {
      for (const v of views) {
        v.draw();
        v.record.idle = v.settled() && !v.dirty; // loaded, and nothing left to draw
      }
      if (stats.state === "loading" && views.every((v) => v.settled())) {
        stats.state = "ready";
      }
      publish();
      requestAnimationFrame(loop);
    };
    requestAnimationFrame(loop);
    await Promise.all(views.map((v) => v.load().catch((e) => fail(`${v.spec.kind} ${v.spec.url}`, e))));
  }

  main().catch((e) => fail("viewer", e));
})();
