// Sluice console: the dashboard, the model try-out, the chat playground and the bench.
//
// Everything shown comes from the server's own APIs (KServe v2, its repository extension, the
// OpenAI routes) and /console/events. Text from the server or a model is only ever placed with
// textContent or as attribute values, never parsed as HTML: markdown is rendered by walking
// marked's tokens into DOM nodes, and highlight.js colours a code element from its text.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY_STORAGE = 'sluice.apiKey';
const CONVERSATIONS_STORAGE = 'sluice.conversations';
const HISTORY_POINTS = 300;

let apiKey = sessionStorage.getItem(KEY_STORAGE) || '';
let latestSample = null;
let initialised = false;
const modelMeta = new Map();  // name -> v2 metadata, for tensor models that are ready.
let modelIndex = [];          // The repository index, last read.

function el(tag, props = {}, children = []) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === 'text') node.textContent = value;
    else if (key === 'class') node.className = value;
    else if (key.startsWith('on')) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function authHeaders(extra = {}) {
  return apiKey ? {...extra, Authorization: 'Bearer ' + apiKey} : extra;
}

class Unauthorized extends Error {}

async function api(path, options = {}) {
  const response = await fetch(path, {...options, headers: authHeaders(options.headers || {})});
  if (response.status === 401) {
    showKeyPrompt('The key was refused.');
    throw new Unauthorized('401');
  }
  return response;
}

async function apiJson(path, options = {}) {
  const response = await api(path, options);
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (e) { body = {error: text}; }
  if (!response.ok) {
    const message = body && body.error ? (body.error.message || body.error) : response.statusText;
    const error = new Error(`${response.status}: ${message}`);
    error.status = response.status;
    throw error;
  }
  return body;
}

// Server-sent events from a fetch response (EventSource cannot send the API key).
async function readEvents(response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const {value, done} = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, {stream: true}).replace(/\r\n/g, '\n');
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let event = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) event = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (data.length) onEvent(event, data.join('\n'));
    }
  }
}

// --- the key prompt and the views --------------------------------------------------------------

function showKeyPrompt(message) {
  $('app').hidden = true;
  $('tabs').hidden = true;
  $('key-prompt').hidden = false;
  $('key-error').textContent = message || '';
  $('key-input').focus();
}

async function start() {
  let response;
  try {
    response = await fetch('/v2', {headers: authHeaders()});
  } catch (e) {
    $('server-info').textContent = 'the server cannot be reached';
    return;
  }
  if (response.status === 401) {
    showKeyPrompt(apiKey ? 'The key was refused.' : '');
    return;
  }
  const server = await response.json();
  $('server-info').textContent = `${server.name} ${server.version} · ${location.host}`;
  $('key-prompt').hidden = true;
  $('app').hidden = false;
  $('tabs').hidden = false;
  if (initialised) return;
  initialised = true;
  initDashboard();
  initTry();
  initChat();
  initBench();
  showView(location.hash.slice(1) || 'dashboard');
}

function showView(name) {
  if (!$('view-' + name)) name = 'dashboard';
  for (const button of document.querySelectorAll('#tabs button')) {
    button.classList.toggle('active', button.dataset.view === name);
  }
  for (const view of document.querySelectorAll('.view')) view.hidden = view.id !== 'view-' + name;
  if (location.hash.slice(1) !== name) history.replaceState(null, '', '#' + name);
}

// --- dashboard -----------------------------------------------------------------------------

const charts = {};
const chartLabels = [];

function lineChart(id, axes = {}) {
  const chart = new Chart($(id), {
    type: 'line',
    data: {labels: chartLabels, datasets: []},
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, normalized: true,
      spanGaps: true, elements: {point: {radius: 0}, line: {borderWidth: 1.5}},
      interaction: {mode: 'index', intersect: false},
      plugins: {legend: {labels: {boxWidth: 10, font: {size: 11}}}},
      scales: {x: {ticks: {maxTicksLimit: 6, font: {size: 10}}},
               y: {beginAtZero: true, ticks: {font: {size: 10}}}, ...axes},
    },
  });
  charts[id] = chart;
  return chart;
}

const PALETTE = ['#2f6fdd', '#d9822b', '#1f8a4c', '#c23b3b', '#7a3bbd', '#0f8b8d', '#8a6d1f',
                 '#5d6778'];

// Appends one point to each series `values` names (label -> value); series first seen now are
// filled with gaps before it, series absent now get a gap.
function pushPoint(chart, values, axisOf = () => 'y') {
  const datasets = chart.data.datasets;
  for (const [label, value] of Object.entries(values)) {
    let dataset = datasets.find((d) => d.label === label);
    if (!dataset) {
      const color = PALETTE[datasets.length % PALETTE.length];
      dataset = {label, data: new Array(chartLabels.length - 1).fill(null), borderColor: color,
                 backgroundColor: color, yAxisID: axisOf(label)};
      datasets.push(dataset);
    }
    dataset.data.push(value);
  }
  for (const dataset of datasets) {
    if (!(dataset.label in values)) dataset.data.push(null);
    while (dataset.data.length > chartLabels.length) dataset.data.shift();
  }
}

function addSample(sample, redraw) {
  latestSample = sample;
  chartLabels.push(new Date(sample.t).toLocaleTimeString());
  if (chartLabels.length > HISTORY_POINTS) chartLabels.shift();
  const s = sample.server;
  const perModel = (key) => Object.fromEntries(sample.models.map((m) => [m.name, m[key]]));
  const perLlm = (f) => Object.fromEntries(sample.language_models.flatMap(f));
  pushPoint(charts['chart-rps'], {all: s.requests_per_second, ...perModel('requests_per_second')});
  pushPoint(charts['chart-latency'], {p50: s.p50_ms, p99: s.p99_ms});
  pushPoint(charts['chart-queue'], perModel('queued'));
  pushPoint(charts['chart-batch'], perModel('batch_size_mean'));
  pushPoint(charts['chart-rejections'], {'503': s.rejections_per_second['503'],
                                         '504': s.rejections_per_second['504'],
                                         '499': s.rejections_per_second['499']});
  pushPoint(charts['chart-cpu'], {'CPU %': s.cpu_percent, 'memory MiB': s.resident_bytes / 2 ** 20},
            (label) => (label === 'CPU %' ? 'y' : 'y1'));
  pushPoint(charts['chart-tokens'], perLlm((m) => [[m.name, m.tokens_per_second]]));
  pushPoint(charts['chart-ttft'], perLlm((m) => [[m.name + ' TTFT', m.ttft_p50_ms],
                                                 [m.name + ' ITL', m.itl_p50_ms]]));
  pushPoint(charts['chart-kv'], perLlm((m) => [[m.name + ' KV', 100 * m.kv_cache_use],
                                               [m.name + ' prefix hits', 100 * m.prefix_cache_hit_ratio]]));
  for (const figure of document.querySelectorAll('figure.llm')) {
    figure.hidden = sample.language_models.length === 0;
  }
  if (redraw) {
    for (const chart of Object.values(charts)) chart.update('none');
    showTiles(sample);
  }
}

const fmt = (value, digits = 1) => (Number.isFinite(value) ? value.toFixed(digits) : '–');

function showTiles(sample) {
  const s = sample.server;
  $('stat-responses').textContent = String(s.responses);
  $('stat-rps').textContent = fmt(s.requests_per_second);
  $('stat-latency').textContent = s.requests_per_second > 0
      ? `${fmt(s.p50_ms, 2)} / ${fmt(s.p99_ms, 2)}` : '–';
  const r = s.rejections_per_second;
  $('stat-rejections').textContent = `${fmt(r['503'])} · ${fmt(r['504'])} · ${fmt(r['499'])}`;
  $('stat-cpu').textContent = fmt(s.cpu_percent) + ' %';
  $('stat-memory').textContent = fmt(s.resident_bytes / 2 ** 20, 0) + ' MiB';
  $('stat-connections').textContent = String(s.open_connections);
}

async function watchEvents() {
  for (;;) {
    try {
      const response = await api('/console/events');
      if (!response.ok) throw new Error('events: ' + response.status);
      await readEvents(response, (event, data) => {
        if (event === 'history') {
          chartLabels.length = 0;
          for (const chart of Object.values(charts)) chart.data.datasets.length = 0;
          const samples = JSON.parse(data);
          samples.forEach((sample, i) => addSample(sample, i === samples.length - 1));
          if (samples.length) refreshModels();
        } else if (event === 'sample') {
          const first = latestSample === null;
          addSample(JSON.parse(data), true);
          if (first) refreshModels();
          else renderModels();
        }
      });
    } catch (e) {
      if (e instanceof Unauthorized) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

async function refreshModels() {
  try {
    modelIndex = await apiJson('/v2/repository/index', {method: 'POST', body: '{}'});
  } catch (e) {
    if (e instanceof Unauthorized) return;
    $('model-action-error').textContent = 'repository index: ' + e.message;
    return;
  }
  // Tensor models' metadata, once each is in the event stream's samples (language models have
  // none under /v2/models).
  const tensorModels = new Set((latestSample ? latestSample.models : []).map((m) => m.name));
  for (const model of modelIndex) {
    if (model.state !== 'READY') { modelMeta.delete(model.name); continue; }
    if (modelMeta.has(model.name) || !tensorModels.has(model.name)) continue;
    try {
      modelMeta.set(model.name, await apiJson('/v2/models/' + encodeURIComponent(model.name)));
    } catch (e) { /* a language model or one unloaded since */ }
  }
  renderModels();
  fillModelSelects();
}

// Rows are updated in place (the buttons stay the same elements between samples).
function renderModels() {
  const body = $('models-table').querySelector('tbody');
  const sample = latestSample || {models: [], language_models: []};
  const seen = new Set();
  for (const model of modelIndex) {
    seen.add(model.name);
    const live = sample.models.find((m) => m.name === model.name);
    const llm = sample.language_models.find((m) => m.name === model.name);
    const meta = modelMeta.get(model.name);
    const p = (meta && meta.parameters) || {};
    let kind = '', instances = '', precision = '', kernels = '', load = '';
    if (llm) {
      kind = 'language model';
      instances = `${llm.slots_busy}/${llm.slots} slots`;
      precision = llm.weights;
      kernels = llm.kernels;
      load = `${fmt(llm.tokens_per_second)} tok/s`;
    } else if (meta) {
      kind = p.image_input ? 'image classifier' : 'tensors';
      instances = String(live ? live.instances : p.instances);
      precision = p.precision || '';
      kernels = [p.backend, p.device, p.model_file].filter(Boolean).join(' · ');
      load = live ? `${fmt(live.requests_per_second)} req/s, queue ${live.queued}` : '';
    }
    let row = [...body.rows].find((r) => r.dataset.model === model.name);
    if (!row) {
      row = el('tr', {'data-model': model.name}, [
        el('td', {text: model.name}),
        el('td', {}, [el('span'), el('div', {class: 'reason'})]),
        el('td'), el('td'), el('td', {class: 'num'}), el('td'), el('td'), el('td', {class: 'num'}),
        el('td', {}, [
          el('button', {type: 'button', 'data-action': 'load', 'data-model': model.name}), ' ',
          el('button', {type: 'button', text: 'Unload', 'data-action': 'unload',
                        'data-model': model.name})]),
      ]);
      body.append(row);
    }
    const cells = row.cells;
    const state = cells[1].firstChild;
    state.textContent = model.state;
    state.className = 'state-' + model.state;
    cells[1].lastChild.textContent = model.reason || '';
    cells[2].textContent = model.version || '';
    cells[3].textContent = kind;
    cells[4].textContent = instances;
    cells[5].textContent = precision;
    cells[5].title = p.precision_chosen_by || '';
    cells[6].textContent = kernels;
    cells[7].textContent = load;
    const ready = model.state === 'READY';
    const busy = model.state === 'LOADING' || model.state === 'UNLOADING' || row.dataset.busy;
    const [loadButton, unloadButton] = cells[8].querySelectorAll('button');
    loadButton.textContent = ready ? 'Reload' : 'Load';
    loadButton.disabled = Boolean(busy);
    unloadButton.disabled = Boolean(busy) || !ready;
  }
  for (const row of [...body.rows]) if (!seen.has(row.dataset.model)) row.remove();
}

async function modelAction(action, name) {
  $('model-action-error').textContent = '';
  const row = document.querySelector(`#models-table tr[data-model="${CSS.escape(name)}"]`);
  if (row) row.dataset.busy = '1';
  renderModels();
  const pending = refreshModels();  // Shows LOADING / UNLOADING while it runs.
  try {
    await apiJson(`/v2/repository/models/${encodeURIComponent(name)}/${action}`,
                  {method: 'POST', body: '{}'});
  } catch (e) {
    if (!(e instanceof Unauthorized)) {
      $('model-action-error').textContent = `${action} ${name}: ${e.message}`;
    }
  }
  await pending;
  if (row) delete row.dataset.busy;
  modelMeta.delete(name);
  await refreshModels();
}

function initDashboard() {
  lineChart('chart-rps');
  lineChart('chart-latency');
  lineChart('chart-queue');
  lineChart('chart-batch');
  lineChart('chart-rejections');
  lineChart('chart-cpu', {y1: {position: 'right', beginAtZero: true, grid: {drawOnChartArea: false},
                               ticks: {font: {size: 10}}}});
  lineChart('chart-tokens');
  lineChart('chart-ttft');
  lineChart('chart-kv', {y: {beginAtZero: true, max: 100, ticks: {font: {size: 10}}}});
  $('models-table').addEventListener('click', (event) => {
    const button = event.target.closest('button[data-action]');
    if (button) modelAction(button.dataset.action, button.dataset.model);
  });
  watchEvents();
  refreshModels();
  setInterval(refreshModels, 3000);
}

// --- try a model ---------------------------------------------------------------------------

function tensorModels() {
  return modelIndex.filter((m) => m.state === 'READY' && modelMeta.has(m.name)).map((m) => m.name);
}

function languageModelNames() {
  return (latestSample ? latestSample.language_models : []).map((m) => m.name);
}

function fillSelect(select, names) {
  const current = select.value;
  const same = select.options.length === names.length &&
               names.every((name, i) => select.options[i].value === name);
  if (same) return false;
  select.replaceChildren(...names.map((name) => el('option', {value: name, text: name})));
  if (names.includes(current)) select.value = current;
  return select.value !== current;
}

function fillModelSelects() {
  if (fillSelect($('try-model'), tensorModels())) selectTryModel();
  fillSelect($('chat-model'), languageModelNames());
  fillSelect($('bench-model'), [...tensorModels(), ...languageModelNames()]);
}

const ZERO_LIMIT = 1 << 20;

function v2Example(meta) {
  const inputs = meta.inputs.map((input) => {
    const shape = [1, ...input.shape.slice(1).map((d) => (d < 0 ? 1 : d))];
    // Inputs are given without their batch dimension in the config: metadata adds -1 first.
    const dims = input.shape[0] === -1 ? shape : [1, ...input.shape.map((d) => (d < 0 ? 1 : d))];
    const count = dims.reduce((a, b) => a * b, 1);
    const zero = input.datatype === 'BOOL' ? false : input.datatype === 'BYTES' ? '' : 0;
    return {name: input.name, shape: dims, datatype: input.datatype,
            data: new Array(Math.min(count, ZERO_LIMIT)).fill(zero)};
  });
  return {inputs};
}

// One input per line, its data on that line: an editor's worth of text, not one number a line.
function formatV2(request) {
  const inputs = request.inputs.map((input) => '  ' + JSON.stringify(input));
  return '{"inputs": [\n' + inputs.join(',\n') + '\n]}';
}

function shellQuote(text) {
  return "'" + text.replace(/'/g, "'\\''") + "'";
}

function curlFor(path, body, contentType) {
  const lines = [`curl -s ${location.origin}${path}`, `  -H 'Content-Type: ${contentType}'`];
  if (apiKey) lines.push('  -H "Authorization: Bearer $SLUICE_API_KEY"');
  lines.push(`  --data-binary ${body}`);
  return lines.join(' \\\n');
}

function updateCurl() {
  const name = $('try-model').value;
  if (!name) return;
  let compact = $('v2-request').value;
  try { compact = JSON.stringify(JSON.parse(compact)); } catch (e) { /* sent as typed */ }
  $('curl-command').textContent = curlFor(`/v2/models/${encodeURIComponent(name)}/infer`,
                                          shellQuote(compact), 'application/json');
}

async function selectTryModel() {
  const name = $('try-model').value;
  const meta = modelMeta.get(name);
  $('try-image').hidden = !(meta && meta.parameters && meta.parameters.image_input);
  $('top5').querySelector('tbody').replaceChildren();
  $('server-timing').querySelector('tbody').replaceChildren();
  $('image-preview').removeAttribute('src');
  $('v2-response').textContent = '';
  $('v2-status').textContent = '';
  if (!meta) return;
  $('v2-request').value = formatV2(v2Example(meta));
  updateCurl();
}

function parseServerTiming(header) {
  if (!header) return [];
  return header.split(',').map((part) => {
    const [name, ...params] = part.trim().split(';');
    const dur = params.map((p) => p.trim()).find((p) => p.startsWith('dur='));
    const desc = params.map((p) => p.trim()).find((p) => p.startsWith('desc='));
    return {name, ms: dur ? Number(dur.slice(4)) : NaN,
            desc: desc ? desc.slice(5).replace(/^"|"$/g, '') : ''};
  });
}

async function classify(file) {
  const name = $('try-model').value;
  const preview = $('image-preview');
  preview.onload = () => preview.classList.toggle('pixelated', preview.naturalWidth < 112);
  preview.src = URL.createObjectURL(file);
  const top5 = $('top5').querySelector('tbody');
  const timing = $('server-timing').querySelector('tbody');
  top5.replaceChildren(el('tr', {}, [el('td', {colspan: '2', text: 'classifying…'})]));
  timing.replaceChildren();
  const path = `/predictions/${encodeURIComponent(name)}`;
  try {
    const response = await api(path, {method: 'POST', body: file,
                                      headers: {'Content-Type': file.type || 'application/octet-stream'}});
    const body = await response.json();
    if (!response.ok) throw new Error(`${response.status}: ${body.error || ''}`);
    const scores = Object.entries(body).sort((a, b) => b[1] - a[1]).slice(0, 5);
    top5.replaceChildren(...scores.map(([label, score]) =>
      el('tr', {}, [el('td', {class: 'class-name', text: label}), el('td', {class: 'num', text: score.toFixed(4)})])));
    timing.replaceChildren(...parseServerTiming(response.headers.get('Server-Timing')).map((t) =>
      el('tr', {title: t.desc}, [el('td', {text: t.name}), el('td', {class: 'num', text: fmt(t.ms, 3)})])));
    $('curl-command').textContent = curlFor(path, shellQuote(file.name || 'image'),
                                            file.type || 'application/octet-stream')
        .replace(/--data-binary '(.*)'$/, "--data-binary @'$1'");
  } catch (e) {
    if (!(e instanceof Unauthorized)) {
      top5.replaceChildren(el('tr', {}, [el('td', {colspan: '2', class: 'error', text: e.message})]));
    }
  }
}

async function sendV2() {
  const name = $('try-model').value;
  $('v2-status').textContent = 'sending…';
  const started = performance.now();
  try {
    const response = await api(`/v2/models/${encodeURIComponent(name)}/infer`, {
      method: 'POST', body: $('v2-request').value, headers: {'Content-Type': 'application/json'}});
    const text = await response.text();
    const took = performance.now() - started;
    let shown = text;
    try { shown = JSON.stringify(JSON.parse(text), null, 1); } catch (e) { /* as sent */ }
    $('v2-response').textContent = shown;
    const timing = parseServerTiming(response.headers.get('Server-Timing'))
        .map((t) => `${t.name} ${fmt(t.ms, 3)}`).join(', ');
    $('v2-status').textContent = `${response.status} in ${took.toFixed(1)} ms` +
                                 (timing ? ` (server: ${timing} ms)` : '');
  } catch (e) {
    if (!(e instanceof Unauthorized)) $('v2-status').textContent = e.message;
  }
}

function initTry() {
  $('try-model').addEventListener('change', selectTryModel);
  $('v2-request').addEventListener('input', updateCurl);
  $('v2-send').addEventListener('click', sendV2);
  $('curl-copy').addEventListener('click', () => {
    navigator.clipboard.writeText($('curl-command').textContent).catch(() => {});
  });
  const zone = $('drop-zone');
  zone.addEventListener('dragover', (event) => { event.preventDefault(); zone.classList.add('over'); });
  zone.addEventListener('dragleave', () => zone.classList.remove('over'));
  zone.addEventListener('drop', (event) => {
    event.preventDefault();
    zone.classList.remove('over');
    const file = event.dataTransfer.files[0];
    if (file) classify(file);
  });
  $('image-file').addEventListener('change', (event) => {
    if (event.target.files[0]) classify(event.target.files[0]);
  });
}

// --- markdown, rendered without HTML -------------------------------------------------------

// marked escapes the text of some tokens for its own HTML output; the DOM wants it plain.
function unescapeMarked(text) {
  return text.replace(/&(lt|gt|quot|#39|amp);/g, (_, name) =>
    ({lt: '<', gt: '>', quot: '"', '#39': "'", amp: '&'})[name]);
}

function renderInline(tokens, parent) {
  for (const token of tokens || []) {
    switch (token.type) {
      case 'strong': case 'em': case 'del': {
        const node = el(token.type === 'del' ? 'del' : token.type);
        renderInline(token.tokens, node);
        parent.append(node);
        break;
      }
      case 'codespan': parent.append(el('code', {text: unescapeMarked(token.text)})); break;
      case 'br': parent.append(el('br')); break;
      case 'link': {
        if (/^https?:\/\//i.test(token.href)) {
          const node = el('a', {href: token.href, target: '_blank', rel: 'noopener noreferrer'});
          renderInline(token.tokens, node);
          parent.append(node);
        } else {
          parent.append(document.createTextNode(token.raw));
        }
        break;
      }
      case 'text': case 'escape':
        if (token.tokens) renderInline(token.tokens, parent);
        else parent.append(document.createTextNode(unescapeMarked(token.text)));
        break;
      default:  // html, image and anything else: its source, as text.
        parent.append(document.createTextNode(token.raw));
    }
  }
}

function renderBlocks(tokens, parent) {
  for (const token of tokens || []) {
    switch (token.type) {
      case 'space': break;
      case 'heading': {
        const node = el('h' + Math.min(6, token.depth + 2));
        renderInline(token.tokens, node);
        parent.append(node);
        break;
      }
      case 'paragraph': {
        const node = el('p');
        renderInline(token.tokens, node);
        parent.append(node);
        break;
      }
      case 'text': {
        const node = el('p');
        if (token.tokens) renderInline(token.tokens, node);
        else node.textContent = unescapeMarked(token.text);
        parent.append(node);
        break;
      }
      case 'code': {
        const code = el('code', {text: token.text});
        const language = (token.lang || '').split(/\s/)[0];
        if (language && window.hljs && hljs.getLanguage(language)) {
          code.className = 'language-' + language;
          // highlight.js reads the element's text and writes back that text, escaped, in spans.
          (hljs.highlightElement || hljs.highlightBlock).call(hljs, code);
        }
        parent.append(el('pre', {}, [code]));
        break;
      }
      case 'blockquote': {
        const node = el('blockquote');
        renderBlocks(token.tokens, node);
        parent.append(node);
        break;
      }
      case 'list': {
        const node = el(token.ordered ? 'ol' : 'ul');
        if (token.ordered && token.start !== '' && token.start !== 1) node.setAttribute('start', String(token.start));
        for (const item of token.items) {
          const li = el('li');
          renderBlocks(item.tokens, li);
          node.append(li);
        }
        parent.append(node);
        break;
      }
      case 'table': {
        const head = el('tr', {}, token.header.map((cell) => {
          const th = el('th');
          renderInline(cell.tokens, th);
          return th;
        }));
        const rows = token.rows.map((row) => el('tr', {}, row.map((cell) => {
          const td = el('td');
          renderInline(cell.tokens, td);
          return td;
        })));
        parent.append(el('table', {}, [el('thead', {}, [head]), el('tbody', {}, rows)]));
        break;
      }
      case 'hr': parent.append(el('hr')); break;
      default:  // html blocks and anything else: the source, as text.
        parent.append(el('p', {text: token.raw}));
    }
  }
}

function renderMarkdown(text, parent) {
  parent.replaceChildren();
  if (!window.marked) {
    parent.textContent = text;
    return;
  }
  renderBlocks(marked.lexer(text), parent);
}

// --- chat ----------------------------------------------------------------------------------

let conversations = [];
let activeConversation = null;
let chatController = null;

function loadConversations() {
  try { conversations = JSON.parse(localStorage.getItem(CONVERSATIONS_STORAGE) || '[]'); }
  catch (e) { conversations = []; }
  if (!Array.isArray(conversations)) conversations = [];
}

function saveConversations() {
  localStorage.setItem(CONVERSATIONS_STORAGE, JSON.stringify(conversations.slice(0, 50)));
}

function newConversation() {
  const conversation = {id: Date.now().toString(36) + Math.random().toString(36).slice(2, 6),
                        title: 'New conversation', messages: []};
  conversations.unshift(conversation);
  activeConversation = conversation;
  saveConversations();
  renderConversations();
  renderMessages();
}

function renderConversations() {
  $('conversations').replaceChildren(...conversations.map((c) => el('li', {
    class: c === activeConversation ? 'active' : '', 'data-id': c.id,
    onclick: (event) => {
      if (event.target.closest('button')) return;
      activeConversation = c;
      renderConversations();
      renderMessages();
    },
  }, [el('span', {text: c.title}), el('button', {type: 'button', text: '×', title: 'delete',
    onclick: () => {
      conversations = conversations.filter((other) => other !== c);
      if (activeConversation === c) activeConversation = conversations[0] || null;
      saveConversations();
      if (!activeConversation) newConversation();
      renderConversations();
      renderMessages();
    }})])));
}

function tokenSpans(parent, logprobs) {
  for (const entry of logprobs) {
    const alternatives = (entry.top_logprobs || [])
        .map((t) => `${JSON.stringify(t.token)}  ${(100 * Math.exp(t.logprob)).toFixed(1)}%`)
        .join('\n');
    parent.append(el('span', {class: 'token', text: entry.token,
      title: `${(100 * Math.exp(entry.logprob)).toFixed(1)}% (logprob ${entry.logprob.toFixed(3)})` +
             (alternatives ? '\n' + alternatives : '')}));
  }
}

// A message's DOM: the user's as text, the assistant's choices as markdown (or, with logprobs,
// as token spans whose titles give each token's probability).
function messageNode(message) {
  const node = el('div', {class: 'message ' + message.role},
                  [el('div', {class: 'role', text: message.role})]);
  if (message.role === 'user') {
    node.append(document.createTextNode(message.content));
    return node;
  }
  const choices = el('div', {class: 'choices'});
  (message.choices || [message.content]).forEach((text, i) => {
    const choice = el('div', {class: 'choice'});
    const logprobs = message.logprobs && message.logprobs[i];
    if (logprobs && logprobs.length) tokenSpans(choice, logprobs);
    else renderMarkdown(text, choice);
    if (message.finish && message.finish[i]) {
      choice.append(el('div', {class: 'role', text: `finish: ${message.finish[i]}`}));
    }
    choices.append(choice);
  });
  node.append(choices);
  return node;
}

function renderMessages() {
  const messages = activeConversation ? activeConversation.messages : [];
  $('messages').replaceChildren(...messages.map(messageNode));
  $('messages').scrollTop = $('messages').scrollHeight;
}

function chatBody(conversation) {
  const messages = [];
  const system = $('chat-system').value.trim();
  if (system) messages.push({role: 'system', content: system});
  for (const m of conversation.messages) messages.push({role: m.role, content: m.content});
  const body = {model: $('chat-model').value, messages, stream: true,
                stream_options: {include_usage: true},
                temperature: Number($('chat-temperature').value),
                top_p: Number($('chat-top-p').value),
                max_tokens: Number($('chat-max-tokens').value),
                n: Number($('chat-n').value) || 1};
  if ($('chat-seed').value !== '') body.seed = Number($('chat-seed').value);
  if ($('chat-logprobs').checked) { body.logprobs = true; body.top_logprobs = 5; }
  const schema = $('chat-schema').value.trim();
  if (schema) {
    body.response_format = {type: 'json_schema',
                            json_schema: {name: 'answer', schema: JSON.parse(schema), strict: true}};
  }
  return body;
}

async function sendChat(text) {
  if (!activeConversation) newConversation();
  const conversation = activeConversation;
  $('chat-error').textContent = '';
  let body;
  conversation.messages.push({role: 'user', content: text});
  if (conversation.title === 'New conversation') conversation.title = text.slice(0, 40);
  try {
    body = chatBody(conversation);
  } catch (e) {
    conversation.messages.pop();
    $('chat-error').textContent = 'JSON schema: ' + e.message;
    return;
  }
  const n = body.n;
  const reply = {role: 'assistant', content: '', choices: new Array(n).fill(''),
                 logprobs: body.logprobs ? Array.from({length: n}, () => []) : null,
                 finish: new Array(n).fill(null)};
  saveConversations();
  renderConversations();
  renderMessages();
  const node = el('div', {class: 'message assistant'}, [el('div', {class: 'role', text: 'assistant'})]);
  const choiceNodes = Array.from({length: n}, () => el('div', {class: 'choice streaming'}));
  node.append(el('div', {class: 'choices'}, choiceNodes));
  $('messages').append(node);
  chatController = new AbortController();
  $('chat-send').disabled = true;
  $('chat-stop').disabled = false;
  const started = performance.now();
  let first = null, tokens = 0, usage = null, stopped = false;
  const showStats = () => {
    const now = performance.now();
    const ttft = first === null ? '–' : (first - started).toFixed(0);
    const rate = first !== null && now > first && tokens > 1 ? ((tokens - 1) / ((now - first) / 1000)).toFixed(1) : '–';
    $('chat-stats').textContent = `TTFT ${ttft} ms · ${tokens} tokens · ${rate} tokens/s` +
                                  (stopped ? ' · stopped' : '');
  };
  try {
    const response = await api('/v1/chat/completions', {
      method: 'POST', body: JSON.stringify(body), signal: chatController.signal,
      headers: {'Content-Type': 'application/json'}});
    if (!response.ok) {
      const error = await response.json().catch(() => ({}));
      throw new Error(`${response.status}: ${error.error ? (error.error.message || error.error) : ''}`);
    }
    await readEvents(response, (event, data) => {
      if (data === '[DONE]') return;
      const chunk = JSON.parse(data);
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const i = choice.index || 0;
        const delta = choice.delta || {};
        if (delta.content) {
          if (first === null) first = performance.now();
          reply.choices[i] += delta.content;
          if (choice.logprobs && choice.logprobs.content) {
            reply.logprobs[i].push(...choice.logprobs.content);
            tokenSpans(choiceNodes[i], choice.logprobs.content);
          } else {
            choiceNodes[i].append(document.createTextNode(delta.content));
          }
          tokens += 1;
        }
        if (choice.finish_reason) reply.finish[i] = choice.finish_reason;
      }
      showStats();
      $('messages').scrollTop = $('messages').scrollHeight;
    });
  } catch (e) {
    if (e.name === 'AbortError') stopped = true;
    else if (!(e instanceof Unauthorized)) $('chat-error').textContent = e.message;
  } finally {
    chatController = null;
    $('chat-send').disabled = false;
    $('chat-stop').disabled = true;
  }
  if (usage && usage.completion_tokens) tokens = usage.completion_tokens;
  showStats();
  if (stopped) reply.finish = reply.finish.map((f) => f || 'stopped');
  reply.content = reply.choices[0];
  if (reply.choices.some((c) => c.length > 0) || stopped) conversation.messages.push(reply);
  else conversation.messages.pop();
  saveConversations();
  if (conversation === activeConversation) renderMessages();
}

function initChat() {
  loadConversations();
  activeConversation = conversations[0] || null;
  if (!activeConversation) newConversation();
  renderConversations();
  renderMessages();
  $('chat-new').addEventListener('click', newConversation);
  $('chat-stop').addEventListener('click', () => { if (chatController) chatController.abort(); });
  $('chat-form').addEventListener('submit', (event) => {
    event.preventDefault();
    const text = $('chat-input').value.trim();
    if (!text || chatController || !$('chat-model').value) return;
    $('chat-input').value = '';
    sendChat(text);
  });
  $('chat-input').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault();
      $('chat-form').requestSubmit();
    }
  });
}

// --- bench ---------------------------------------------------------------------------------

function percentile(sorted, p) {
  if (!sorted.length) return NaN;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));  // Nearest rank.
  return sorted[rank - 1];
}

function benchRequest(name) {
  if (languageModelNames().includes(name)) {
    return {path: '/v1/chat/completions', body: JSON.stringify({
      model: name, max_tokens: 16, temperature: 0,
      messages: [{role: 'user', content: 'Say hello.'}]})};
  }
  return {path: `/v2/models/${encodeURIComponent(name)}/infer`,
          body: JSON.stringify(v2Example(modelMeta.get(name)))};
}

let benchCharts = null;

async function runBench() {
  const name = $('bench-model').value;
  const levels = $('bench-concurrency').value.split(',').map((v) => parseInt(v, 10))
      .filter((v) => v > 0 && v <= 256);
  const seconds = Math.max(1, Math.min(60, Number($('bench-seconds').value) || 3));
  if (!name || !levels.length) return;
  $('bench-run').disabled = true;
  const request = benchRequest(name);
  const results = [];
  const table = $('bench-table').querySelector('tbody');
  table.replaceChildren();
  try {
    for (const concurrency of levels) {
      $('bench-status').textContent = `concurrency ${concurrency}…`;
      const latencies = [];
      let errors = 0;
      const deadline = performance.now() + seconds * 1000;
      const worker = async () => {
        while (performance.now() < deadline) {
          const begin = performance.now();
          try {
            const response = await fetch(request.path, {method: 'POST', body: request.body,
              headers: authHeaders({'Content-Type': 'application/json'})});
            await response.arrayBuffer();
            if (response.ok) latencies.push(performance.now() - begin);
            else errors += 1;
          } catch (e) { errors += 1; }
        }
      };
      const begun = performance.now();
      await Promise.all(Array.from({length: concurrency}, worker));
      const elapsed = (performance.now() - begun) / 1000;
      latencies.sort((a, b) => a - b);
      const row = {concurrency, requests: latencies.length, errors,
                   throughput: latencies.length / elapsed, p50: percentile(latencies, 50),
                   p90: percentile(latencies, 90), p99: percentile(latencies, 99)};
      results.push(row);
      table.append(el('tr', {}, [row.concurrency, row.requests, row.errors, fmt(row.throughput),
                                 fmt(row.p50, 2), fmt(row.p90, 2), fmt(row.p99, 2)]
          .map((v) => el('td', {class: 'num', text: String(v)}))));
      drawBench(results);
    }
    $('bench-status').textContent = `done: ${name}, ${seconds} s per step`;
  } finally {
    $('bench-run').disabled = false;
  }
}

function drawBench(results) {
  const labels = results.map((r) => String(r.concurrency));
  if (!benchCharts) {
    const options = {animation: false, responsive: true, maintainAspectRatio: false,
                     scales: {x: {title: {display: true, text: 'concurrency'}}, y: {beginAtZero: true}}};
    benchCharts = {
      throughput: new Chart($('bench-throughput'), {type: 'line', data: {labels: [], datasets: [
        {label: 'requests/s', data: [], borderColor: PALETTE[0], backgroundColor: PALETTE[0]}]}, options}),
      latency: new Chart($('bench-latency'), {type: 'line', data: {labels: [], datasets: [
        {label: 'p50', data: [], borderColor: PALETTE[0], backgroundColor: PALETTE[0]},
        {label: 'p90', data: [], borderColor: PALETTE[1], backgroundColor: PALETTE[1]},
        {label: 'p99', data: [], borderColor: PALETTE[3], backgroundColor: PALETTE[3]}]}, options}),
    };
  }
  benchCharts.throughput.data.labels = labels;
  benchCharts.throughput.data.datasets[0].data = results.map((r) => r.throughput);
  benchCharts.latency.data.labels = labels;
  ['p50', 'p90', 'p99'].forEach((key, i) => {
    benchCharts.latency.data.datasets[i].data = results.map((r) => r[key]);
  });
  benchCharts.throughput.update('none');
  benchCharts.latency.update('none');
}

function initBench() {
  $('bench-run').addEventListener('click', runBench);
}

// --- start ---------------------------------------------------------------------------------

document.addEventListener('DOMContentLoaded', () => {
  $('key-form').addEventListener('submit', (event) => {
    event.preventDefault();
    apiKey = $('key-input').value;
    sessionStorage.setItem(KEY_STORAGE, apiKey);
    start();
  });
  for (const button of document.querySelectorAll('#tabs button')) {
    button.addEventListener('click', () => showView(button.dataset.view));
  }
  start();
});
