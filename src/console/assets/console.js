// Sluice console: what its views share (the API key, requests, server-sent events, the views);
// dashboard.js, try.js, chat.js and bench.js hold the views.
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
// Language models by name (loaded or not), from /v1/models: name -> its status there (loaded,
// loading, unloaded, error).
let languageStates = new Map();

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
