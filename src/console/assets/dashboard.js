// Sluice console: the dashboard (console.js holds what the views share).
'use strict';

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
  // Every response's p50 and p99 (language models' whole generations among them), and each
  // tensor model's own p99.
  pushPoint(charts['chart-latency'], {
    'all p50': s.requests_per_second > 0 ? s.p50_ms : null,
    'all p99': s.requests_per_second > 0 ? s.p99_ms : null,
    ...Object.fromEntries(sample.models.map((m) =>
      [m.name + ' p99', m.requests_per_second > 0 ? m.p99_ms : null]))});
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
          // Models load and unload by themselves too (a request loads a language model, an
          // idle one unloads after its keep_alive): the index is read again every 2 s.
          if (first || Date.now() - indexReadAt >= 2000) refreshModels();
          else renderModels();
        }
      });
    } catch (e) {
      if (e instanceof Unauthorized) return;
    }
    await new Promise((resolve) => setTimeout(resolve, 2000));
  }
}

let indexReadAt = 0;
let indexReading = null;

// One read of the index at a time; a call while one runs waits for it.
function refreshModels() {
  if (!indexReading) indexReading = readModels().finally(() => { indexReading = null; });
  return indexReading;
}

async function readModels() {
  indexReadAt = Date.now();
  try {
    modelIndex = await apiJson('/v2/repository/index', {method: 'POST', body: '{}'});
  } catch (e) {
    if (e instanceof Unauthorized) return;
    $('model-action-error').textContent = 'repository index: ' + e.message;
    return;
  }
  try {
    const listed = await apiJson('/v1/models');
    languageStates = new Map(listed.data.map((m) => [m.id, m.status ? m.status.value : 'loaded']));
  } catch (e) { /* no language models served */ }
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
    } else if (languageStates.has(model.name)) {
      kind = 'language model';  // Not loaded: its first request loads it.
      load = languageStates.get(model.name);
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
