// The memrl-mcp inspector. Plain DOM, no framework, nothing loaded from elsewhere.
//
// Every text shown here may come from an agent or an LLM: it reaches the page through textContent (el() below)
// and attribute values set one by one, never through innerHTML or a string of markup. Links are built from this
// server's own ids only. The bearer token lives in sessionStorage (gone with the tab) and travels in the
// Authorization header; changes are JSON PATCH / DELETE requests, which no other site's form can send.
"use strict";

const API = "/ui/api";
const TOKEN_KEY = "memrl-inspector-token";
const PAGE_SIZE = 25;
const ANSWER_MS = 30000;  // a request still unanswered after this is shown as an error, not as a blank page
// [field, heading, sortable (the fields the store orders by), numeric]
const COLUMNS = [
  ["task", "task", false, false],
  ["outcome", "outcome", false, false],
  ["q", "Q", true, true],
  ["visits", "visits", true, true],
  ["last_reward", "last reward", false, true],
  ["merges", "merges", false, true],
  ["updated_at", "updated", true, false],
];

const state = {
  session: null,
  namespace: "",
  // cursors: the cursor of each page shown so far (the first page has none), for "Previous".
  list: { outcome: "", q_min: "", q_max: "", text: "", sort: "updated_at", descending: true, cursors: [null] },
  preview: { task: "", k1: "", k2: "", q_weight: null, delta: "" },
  runs: null,
};

// -- building blocks ------------------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  setProps(node, props);
  for (const child of children.flat(Infinity)) {
    if (child !== null && child !== undefined && child !== false) node.append(child);  // strings become text
  }
  return node;
}

function setProps(node, props) {
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "value") node.value = value;
    else if (key === "checked") node.checked = Boolean(value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
}

function memoryLink(id, text) {
  return el("a", { href: "#/memory/" + encodeURIComponent(id), class: "memory-link" }, text);
}

function fmt(value, digits = 3) {
  return value === null || value === undefined ? "–" : Number(value).toFixed(digits);
}

function when(time) {  // an ISO 8601 time, as the API gives it
  return time ? new Date(time).toLocaleString() : "–";
}

function outcomeBadge(outcome) {
  return el("span", { class: "badge " + (outcome === "success" ? "success" : "failure") }, outcome);
}

function status(text, isError = false) {
  const box = document.getElementById("status");
  box.textContent = text || "";
  box.className = "message" + (isError ? " error" : "");
}

// -- the API --------------------------------------------------------------------------------------

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const headers = { Accept: "application/json" };
  const token = sessionStorage.getItem(TOKEN_KEY);
  if (token) headers.Authorization = "Bearer " + token;
  let body;
  if (options.body !== undefined) {
    headers["Content-Type"] = "application/json";
    body = JSON.stringify(options.body);
  }
  let response;
  try {
    response = await fetch(API + path, {
      method: options.method || "GET", headers, body, credentials: "omit", cache: "no-store",
      signal: AbortSignal.timeout(ANSWER_MS),
    });
  } catch (error) {
    throw new Error(error.name === "TimeoutError"
      ? `The server did not answer within ${ANSWER_MS / 1000} s (${path.split("?")[0]}).` : error.message);
  }
  const data = await response.json().catch(() => ({}));
  if (response.status === 401) {
    showLogin(token ? "That token was refused." : "This server needs a bearer token.");
    throw new Unauthorized(data.error_description || "a bearer token is required");
  }
  if (!response.ok) throw new Error(data.error_description || response.status + " " + response.statusText);
  return data;
}

function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== "" && value !== null && value !== undefined) search.set(key, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
}

// -- session and token ----------------------------------------------------------------------------

function showLogin(message) {
  const form = document.getElementById("login");
  form.hidden = false;
  document.getElementById("login-message").textContent = message;
  document.getElementById("view").replaceChildren();
  document.getElementById("token").focus();
}

function useToken(event) {
  event.preventDefault();
  const input = document.getElementById("token");
  sessionStorage.setItem(TOKEN_KEY, input.value.trim());
  input.value = "";
  start();
}

async function start() {
  try {
    state.session = await api("/session");
  } catch (error) {
    if (!(error instanceof Unauthorized)) status(error.message, true);
    return;
  }
  document.getElementById("login").hidden = true;
  const who = document.getElementById("who");
  const names = state.session.namespaces;
  who.replaceChildren(el("span", { id: "who-namespaces" },
    state.session.every_namespace ? "every namespace" : "namespaces: " + names.join(", ")));
  if (sessionStorage.getItem(TOKEN_KEY)) {
    who.append(el("button", {
      class: "secondary", type: "button",
      onclick: () => { sessionStorage.removeItem(TOKEN_KEY); state.session = null; showLogin("Token forgotten."); },
    }, "Forget token"));
  }
  state.namespace = state.namespace || state.session.open_namespace;
  window.onhashchange = render;
  render();
}

function namespacePicker(onChange) {
  const select = el("select", { id: "namespace", "aria-label": "namespace" },
    state.session.namespaces.map((name) => el("option", { value: name }, name)));
  select.value = state.namespace;
  select.addEventListener("change", () => { state.namespace = select.value; onChange(); });
  return el("label", {}, "namespace", select);
}

// -- routing --------------------------------------------------------------------------------------

// Every view takes a ticket when it starts; one whose data arrives after a newer view started is dropped. Without
// it a slow answer (the list reloading for a namespace just picked) replaced the memory page opened meanwhile.
let viewTicket = 0;
function takeTicket() {
  const ticket = ++viewTicket;
  return () => ticket === viewTicket;
}

async function render() {
  const hash = location.hash || "#/memories";
  const [, view, arg] = hash.split("/");
  for (const tab of document.querySelectorAll("#tabs a")) {
    tab.classList.toggle("active", tab.dataset.view === (view === "memory" ? "memories" : view));
  }
  const main = document.getElementById("view");
  status("");
  try {
    if (view === "memory") await memoryView(main, decodeURIComponent(arg || ""));
    else if (view === "preview") previewView(main);
    else if (view === "curves") await curvesView(main);
    else await memoriesView(main);
  } catch (error) {
    if (!(error instanceof Unauthorized)) status(error.message, true);
  }
}

// -- memories -------------------------------------------------------------------------------------

async function memoriesView(main) {
  const current = takeTicket();
  const list = state.list;
  const pageIndex = list.cursors.length - 1;
  const [stats, page] = await Promise.all([
    api("/stats" + query({ namespace: state.namespace })),
    api("/memories" + query({
      namespace: state.namespace, outcome: list.outcome, q_min: list.q_min, q_max: list.q_max, text: list.text,
      sort: list.sort, descending: list.descending, cursor: list.cursors[pageIndex], limit: PAGE_SIZE,
    })),
  ]);
  if (!current()) return;
  const reload = () => memoriesView(main).catch((error) => status(error.message, true));

  const filters = el("form", { class: "toolbar", id: "filters" });
  const outcome = el("select", { name: "outcome", "aria-label": "outcome" },
    ["", "success", "failure"].map((value) => el("option", { value }, value || "any")));
  outcome.value = list.outcome;
  const qMin = el("input", { name: "q_min", type: "number", step: "any", value: list.q_min, "aria-label": "Q min" });
  const qMax = el("input", { name: "q_max", type: "number", step: "any", value: list.q_max, "aria-label": "Q max" });
  const text = el("input", { name: "text", type: "search", value: list.text, placeholder: "words in task or experience",
    size: 28, "aria-label": "text" });
  filters.append(
    namespacePicker(() => { list.cursors = [null]; reload(); }),
    el("label", {}, "outcome", outcome), el("label", {}, "Q from", qMin), el("label", {}, "Q to", qMax),
    el("label", {}, "text", text), el("button", { type: "submit" }, "Filter"),
  );
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    Object.assign(list, { outcome: outcome.value, q_min: qMin.value, q_max: qMax.value, text: text.value });
    list.cursors = [null];
    reload();
  });

  const head = el("tr", {}, COLUMNS.map(([key, label, sortable, numeric]) => {
    const classes = [sortable ? "sortable" : "", numeric ? "num" : ""].join(" ").trim() || null;
    if (!sortable) return el("th", { class: classes }, label);
    const arrow = list.sort === key ? (list.descending ? " ▼" : " ▲") : "";
    return el("th", {
      class: classes, "data-sort": key, title: "sort by " + label,
      onclick: () => {
        list.descending = list.sort === key ? !list.descending : true;
        list.sort = key;
        list.cursors = [null];
        reload();
      },
    }, label + arrow);
  }));
  const rows = page.memories.map((m) => el("tr", { "data-id": m.id },
    el("td", { class: "task" }, memoryLink(m.id, m.task)),
    el("td", {}, outcomeBadge(m.outcome)),
    el("td", { class: "num" }, fmt(m.q)),
    el("td", { class: "num" }, String(m.visits)),
    el("td", { class: "num" }, fmt(m.last_reward, 2)),
    el("td", { class: "num" }, String(m.merges)),
    el("td", {}, when(m.updated_at)),
  ));
  const first = page.memories.length ? pageIndex * PAGE_SIZE + 1 : 0;
  const last = pageIndex * PAGE_SIZE + page.memories.length;
  const pager = el("div", { class: "pager" },
    el("button", { type: "button", class: "secondary", id: "previous-page", disabled: pageIndex === 0,
      onclick: () => { list.cursors.pop(); reload(); } }, "‹ Previous"),
    el("span", { id: "page-range" }, `${first}-${last} of ${page.total}`),
    el("button", { type: "button", class: "secondary", id: "next-page", disabled: !page.next_cursor,
      onclick: () => { list.cursors.push(page.next_cursor); reload(); } }, "Next ›"),
  );
  main.replaceChildren(
    el("h2", {}, "Memories in ", el("code", {}, page.namespace)),
    el("div", { class: "row" }, statCards(stats), qBoxPlot(stats, state.session.settings)),
    filters,
    el("table", { id: "memories" }, el("thead", {}, head), el("tbody", {}, rows)),
    page.total ? pager : el("p", { class: "note" }, "No memory matches."),
  );
}

function statCards(stats) {
  const card = (value, label, id) =>
    el("div", { class: "card", id }, el("b", {}, String(value)), el("span", {}, label));
  return el("div", { class: "cards", id: "stats" },
    card(stats.memories, "memories", "stat-memories"),
    card(stats.successes, "successes", "stat-successes"),
    card(stats.failures, "failures", "stat-failures"),
    card(stats.visits, "rewards folded in", "stat-visits"),
    card(stats.recalls_pending, "recalls pending", "stat-pending"),
    card(stats.recalls_reported, "recalls reported", "stat-reported"),
  );
}

// -- one memory -----------------------------------------------------------------------------------

async function memoryView(main, id) {
  const current = takeTicket();
  const m = await api("/memories/" + encodeURIComponent(id));
  if (!current()) return;
  const history = m.history;
  const fields = el("dl", { class: "fields" },
    [["namespace", m.namespace], ["outcome", outcomeBadge(m.outcome)], ["Q", fmt(m.q)], ["visits", String(m.visits)],
      ["last reward", fmt(m.last_reward, 2)], ["merges", String(m.merges)], ["created", when(m.created_at)],
      ["updated", when(m.updated_at)],
      ["experience by", el("span", { id: "memory-source" }, WRITERS[m.experience_source ?? ""])],
      ["from the agent", el("span", { id: "memory-client" }, m.client ?? "not named by its client")],
      ["id", el("code", {}, m.id)]]
      .map(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  const children = [
    el("p", {}, el("a", { href: "#/memories" }, "‹ all memories")),
    el("h2", { id: "memory-task" }, m.task),
    fields,
    el("h3", {}, "Experience"),
    el("pre", { id: "memory-experience" }, m.experience),
    el("h3", {}, "Metadata"),
    el("pre", { id: "memory-metadata" }, JSON.stringify(m.metadata, null, 2)),
    el("h3", {}, "History of Q"),
    qHistory(history, m),
  ];
  if (!state.session.read_only) children.push(editForm(m), forgetButton(m));
  main.replaceChildren(...children);
}

// Who wrote an experience, and who gave a reward (the server keeps it with each; older ones did not).
const WRITERS = {
  agent: "the agent", client_model: "the client's model", endpoint: "the server's endpoint (distill_base_url)",
  operator: "an operator (this page)", "": "not recorded",
};
const GIVERS = {
  agent: "the agent's word", user: "the user", tests: "the tests", build: "the build", typecheck: "the type check",
  lint: "the linter", check: "the project's check", "": "",
};

// What decided a reward, and the agent's claim when the evidence or the user overruled it (a contradiction).
function rewardGiver(h) {
  const who = GIVERS[h.source ?? ""] ?? h.source;
  const said = h.note ? `${who}: “${h.note}”` : who;
  if (h.claimed === null || h.claimed === undefined) return said;
  return el("span", {}, said, " ", el("span", { class: "contradicted" }, `(the agent claimed ${fmt(h.claimed, 2)})`));
}

function qHistory(history, memory) {
  if (!history.length) return el("p", { class: "note", id: "q-history" }, "No reward folded in yet.");
  const settings = state.session.settings;
  const points = history.map((h, i) => ({ x: i + 1, y: h.q_after }));
  const chart = lineChart({
    title: "Q after each change", xLabel: "change #", integerX: true,
    yMin: settings.reward_min, yMax: settings.reward_max,
    series: [{ label: "Q", points: [{ x: 0, y: history[0].q_before }, ...points] }],
  });
  const table = el("table", { id: "q-history" },
    el("thead", {}, el("tr", {}, ["#", "when", "change", "Q before", "Q after", "from"].map((h) => el("th", {}, h)))),
    el("tbody", {}, history.map((h, i) => el("tr", {},
      el("td", {}, String(i + 1)), el("td", {}, when(h.at)),
      el("td", {}, h.event === "reset" ? "reset" : `${h.event === "correction" ? "corrected to" : "reward"} ${fmt(h.reward, 2)}`),
      el("td", { class: "num" }, fmt(h.q_before)), el("td", { class: "num" }, fmt(h.q_after)),
      el("td", { class: "giver" }, rewardGiver(h)))).reverse()));
  const note = el("p", { class: "note" }, `Newest first; the last ${state.session.q_history_size} ` +
    `changes are kept (${memory.visits} rewards folded in so far).`);
  return el("div", { class: "row" }, chart, el("div", {}, table, note));
}

function editForm(m) {
  const experience = el("textarea", { id: "edit-experience", rows: 6, value: m.experience });
  const metadata = el("textarea", { id: "edit-metadata", rows: 4, value: JSON.stringify(m.metadata, null, 2) });
  const reset = el("input", { type: "checkbox", id: "edit-reset-q" });
  const message = el("span", { class: "message", id: "edit-message" });
  const form = el("form", { id: "edit" },
    el("h3", {}, "Correct this memory"),
    el("label", { for: "edit-experience" }, "Experience"), experience,
    el("label", { for: "edit-metadata" }, "Metadata (a JSON object)"), metadata,
    el("p", {}, el("label", {}, reset, " reset Q to its initial value (forget what was learned)")),
    el("button", { type: "submit", id: "save" }, "Save"), message,
  );
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    let meta;
    try {
      meta = JSON.parse(metadata.value || "{}");
    } catch (error) {
      message.textContent = "metadata: not JSON (" + error.message + ")";
      message.className = "message error";
      return;
    }
    const body = { reset_q: reset.checked };
    if (experience.value !== m.experience) body.experience = experience.value;
    if (JSON.stringify(meta) !== JSON.stringify(m.metadata)) body.metadata = meta;
    try {
      await api("/memories/" + encodeURIComponent(m.id), { method: "PATCH", body });
      await render();
      status("Saved.");
    } catch (error) {
      if (error instanceof Unauthorized) return;
      message.textContent = error.message;
      message.className = "message error";
    }
  });
  return form;
}

function forgetButton(m) {
  let armed = false;
  const button = el("button", { type: "button", class: "danger", id: "forget" }, "Forget this memory");
  button.addEventListener("click", async () => {
    if (!armed) {  // two clicks, in the page: no dialog box
      armed = true;
      button.textContent = "Click again to forget it for good";
      return;
    }
    try {
      await api("/memories/" + encodeURIComponent(m.id), { method: "DELETE", body: {} });
      location.hash = "#/memories";
      setTimeout(() => status("Forgotten: " + m.task), 0);
    } catch (error) {
      if (!(error instanceof Unauthorized)) status(error.message, true);
    }
  });
  return el("p", {}, button);
}

// -- why this memory? -----------------------------------------------------------------------------

function previewView(main) {
  takeTicket();
  const settings = state.session.settings;
  const p = state.preview;
  if (p.q_weight === null) p.q_weight = settings.q_weight;
  const task = el("textarea", { id: "preview-task", rows: 3, placeholder: "A task, as an agent would ask it",
    value: p.task });
  const k1 = el("input", { id: "preview-k1", type: "number", min: 1, max: 100, placeholder: String(settings.k1),
    value: p.k1 });
  const k2 = el("input", { id: "preview-k2", type: "number", min: 1, max: 100, placeholder: String(settings.k2),
    value: p.k2 });
  const delta = el("input", { id: "preview-delta", type: "number", step: "any", min: -1, max: 1,
    placeholder: fmt(settings.delta, 2), value: p.delta });
  const lambda = el("input", { id: "preview-lambda", type: "range", min: 0, max: 1, step: 0.05, value: p.q_weight });
  const shown = el("output", { id: "preview-lambda-value" }, fmt(p.q_weight, 2));
  const result = el("div", { id: "preview-result" });
  const form = el("form", { id: "preview" },
    el("label", { for: "preview-task" }, "Task"), task,
    el("div", { class: "toolbar" },
      namespacePicker(() => run()),
      el("label", {}, "k1 (Phase A)", k1), el("label", {}, "k2 (Phase B)", k2), el("label", {}, "delta", delta),
      el("label", {}, "lambda (weight of Q)", el("span", {}, lambda, " ", shown)),
      el("button", { type: "submit", id: "preview-run" }, "Preview"),
    ),
    el("p", { class: "note" }, "A preview runs Phase A and B exactly as a recall would, but logs no recall: no Q " +
      "will move, and nothing is there to report."),
  );
  let timer = null;
  async function run() {
    Object.assign(p, { task: task.value, k1: k1.value, k2: k2.value, delta: delta.value });
    p.q_weight = Number(lambda.value);
    if (!p.task.trim()) return;
    const body = { task: p.task, namespace: state.namespace || null, q_weight: p.q_weight };
    if (p.k1 !== "") body.k1 = Number(p.k1);
    if (p.k2 !== "") body.k2 = Number(p.k2);
    if (p.delta !== "") body.delta = Number(p.delta);
    try {
      result.replaceChildren(previewTable(await api("/preview", { method: "POST", body })));
    } catch (error) {
      if (!(error instanceof Unauthorized)) result.replaceChildren(el("p", { class: "error" }, error.message));
    }
  }
  form.addEventListener("submit", (event) => { event.preventDefault(); run(); });
  lambda.addEventListener("input", () => {
    shown.textContent = fmt(lambda.value, 2);
    clearTimeout(timer);
    timer = setTimeout(run, 150);
  });
  main.replaceChildren(el("h2", {}, "Why this memory?"), form, result);
  if (p.task.trim()) run();
}

function previewTable(preview) {
  const summary = el("p", { id: "preview-summary" },
    `Phase A: ${preview.candidates.length} candidate(s) of namespace ${preview.namespace} with similarity ≥ ` +
    `${fmt(preview.delta)} (top k1 = ${preview.k1}). Phase B: score = (1 − λ)·z(sim) + λ·z(Q) with λ = ` +
    `${fmt(preview.q_weight, 2)}; the top k2 = ${preview.k2} are chosen. z(sim) uses the ` +
    (preview.sim_normalization === "corpus"
      ? `embedder's corpus statistics (mean ${fmt(preview.sim_mean)}, std ${fmt(preview.sim_std)})`
      : "pool's own mean and spread") + "; z(Q) the pool's, clipped to ±3.");
  const notes = [summary];
  if (preview.epsilon > 0) {
    notes.push(el("p", { class: "note" }, `A real recall explores with probability ε = ${preview.epsilon}: ` +
      "then it hands out k2 candidates drawn at random instead."));
  }
  if (!preview.candidates.length) {
    return el("div", {}, ...notes, el("p", { class: "note" }, "No memory is similar enough."));
  }
  const header = ["#sim", "task", "outcome", "Q", "similarity", "z(sim)", "z(Q)", "score", "#score", "chosen", "why"];
  const numeric = new Set(["Q", "similarity", "z(sim)", "z(Q)", "score", "#score", "#sim"]);
  const table = el("table", { id: "preview-candidates" },
    el("thead", {}, el("tr", {}, header.map((h) => el("th", { class: numeric.has(h) ? "num" : null }, h)))),
    el("tbody", {}, preview.candidates.map((c) => el("tr", { class: c.chosen ? "chosen" : null, "data-id": c.id },
      el("td", { class: "num" }, String(c.similarity_rank)),
      el("td", { class: "task" }, memoryLink(c.id, c.task)),
      el("td", {}, outcomeBadge(c.outcome)),
      el("td", { class: "num" }, fmt(c.q)),
      el("td", { class: "num" }, fmt(c.similarity)),
      el("td", { class: "num" }, fmt(c.z_similarity, 2)),
      el("td", { class: "num" }, fmt(c.z_q, 2)),
      el("td", { class: "num" }, fmt(c.score, 3)),
      el("td", { class: "num" }, String(c.score_rank)),
      el("td", { class: "chosen-mark" }, c.chosen ? "✓ chosen" : ""),
      el("td", { class: "why" }, c.reason),
    ))));
  return el("div", {}, ...notes, table);
}

// -- learning curves ------------------------------------------------------------------------------

async function curvesView(main) {
  const selected = state.runs;
  const runs = selected ? "?" + selected.map((name) => "run=" + encodeURIComponent(name)).join("&") : "";
  const current = takeTicket();
  const data = await api("/curves" + runs);
  if (!current()) return;
  if (!data.available.length) {
    main.replaceChildren(el("h2", {}, "Learning curves"), el("p", { class: "note", id: "no-runs" },
      "No harness run folder is configured. Start the server with ui_runs set to run folders (or folders of " +
      "them), e.g. MEMRL_UI_RUNS='[\"runs/demo\"]'."));
    return;
  }
  const chosen = new Set(selected || data.available);
  const boxes = el("div", { class: "toolbar", id: "runs" }, data.available.map((name) => {
    const box = el("input", { type: "checkbox", value: name, checked: chosen.has(name) });
    box.addEventListener("change", () => {
      state.runs = [...document.querySelectorAll("#runs input:checked")].map((input) => input.value);
      if (!state.runs.length) state.runs = null;
      curvesView(main).catch((error) => status(error.message, true));
    });
    return el("label", { class: "run" }, el("span", {}, box, " ", name));
  }));
  const sections = data.benchmarks.map((b) => el("section", { class: "benchmark", "data-benchmark": b.benchmark },
    el("h3", {}, b.benchmark),
    el("div", { class: "charts" },
      ["success_rate", "csr"].map((metric) => lineChart({
        title: `${b.benchmark}: ${metric === "csr" ? "CSR" : "success rate"} per epoch`,
        xLabel: "epoch", yMin: 0, yMax: 1, integerX: true,
        series: b.curves.map((c) => ({
          label: c.seeds > 1 ? `${c.label} (mean of ${c.seeds} seeds)` : c.label,
          points: c[metric].map((p) => ({ x: p.epoch, y: p.value, std: p.std, partial: p.partial })),
        })),
      }))),
  ));
  const problems = data.problems.map((text) => el("p", { class: "error" }, text));
  main.replaceChildren(el("h2", {}, "Learning curves"), boxes,
    el("p", { class: "note" }, "Success rate per epoch, and CSR (tasks solved at least once so far), per mode, as " +
      "memrl-harness report draws them; a hollow point is an unfinished epoch, a band ±1 std over seeds."),
    ...problems, ...sections);
}

// A link with its token in the fragment (`memrl-mcp local ui` prints one): the fragment never reaches a server or a
// log; the token goes to sessionStorage like a typed one, and leaves the address bar and the history at once.
function tokenFromLink() {
  if (!location.hash.startsWith("#token=")) return;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(location.hash.slice("#token=".length)));
  history.replaceState(null, "", location.pathname + location.search + "#/memories");
}

document.getElementById("login").addEventListener("submit", useToken);
tokenFromLink();
start();
