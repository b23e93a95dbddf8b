// Sluice console: the chat playground, and markdown rendered without HTML (console.js holds what the views share).
'use strict';

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
  if (activeConversation && activeConversation.messages.length === 0) return;  // Already new.
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
