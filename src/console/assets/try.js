// Sluice console: trying a model (console.js holds what the views share).
'use strict';

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
