// Sluice console: the bench from the page (console.js holds what the views share).
'use strict';

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
