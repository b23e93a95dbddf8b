"""The browser console (GET /), driven in Debian's headless Chromium through Selenium.

Starts the real server on loopback ports with identity, fashion_mnist (a briefly trained Fashion-MNIST
classifier), tiny_llm and SmolLM2-135M (Q4_1 GGUF), then, in the browser:
- page_loads_clean: the dashboard, the try-out, the chat and the bench load with no console
  error (a script error, a refused Content-Security-Policy, a failed request) and list the models;
- dashboard_counter_moves: after a burst of requests from outside, the dashboard's response counter
  and its request rate rise (the event stream is live, not a page drawn once);
- image_classified: a Fashion-MNIST test picture dropped on fashion_mnist shows its true class first
  among the top 5, with the request's Server-Timing stages;
- v2_editor: the request prefilled from the model's metadata runs, and the curl shown for it
  answers the same outside the browser;
- chat_streams_and_stop_cancels: a reply streams in (TTFT and tokens/s shown); Stop ends it and the
  server counts the cancelled request (a 499) and stops generating for it;
- chat_settings_reach_the_server: n=2 shows two replies side by side, logprobs put each token's
  probability on hover, a JSON schema gives a reply that is JSON of it;
- model_output_is_text: a reply holding <img src=x onerror=...> and <script> (as the model's
  stream, and again from the conversation kept in the browser) shows as text: no element made,
  no handler run;
- model_control: Unload and Load from the dashboard change the model's state on the server;
- bench_runs: a short bench from the page fills its table and both plots;
- api_key_prompt_only: with --api-key, the page shows only the key prompt (no model, no
  counter, every API answers 401) until the key is given; then the dashboard loads.
With --screenshots DIR, saves the dashboard under load, the image try-out and a streamed chat
(from a server of --screenshot-models REPOSITORY: fashion_mnist, resnet18 and smollm2).

Usage: console_test.py SLUICE TEST_MODELS [--screenshots DIR [--screenshot-models REPOSITORY]]
"""
import argparse
import base64
import gzip
import http.client
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np
from PIL import Image
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait

FASHION_DIR = "/usr/share/datasets/fashion-mnist"
FASHION_LABELS = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                  "Sneaker", "Bag", "Ankle boot"]
API_KEY = "console-test-key"


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, sluice, repository, extra=()):
        self.port = free_port()
        self.process = subprocess.Popen(
            [sluice, "serve", "--model-repository", repository, "--host", "127.0.0.1",
             "--port", str(self.port), "--model-control", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.output = []
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                self.output.append(line)
                if line.startswith("console: "):
                    ready.set()
        threading.Thread(target=read, daemon=True).start()
        deadline = time.time() + 120
        while not ready.wait(0.2):
            if self.process.poll() is not None or time.time() > deadline:
                raise AssertionError("the server did not start:\n" + "".join(self.output))
        self.url = f"http://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        conn.close()
        return response.status, data

    def metric(self, name, labels=""):
        _, body = self.request("GET", "/metrics", headers={"X-API-Key": API_KEY})
        total = 0.0
        for line in body.decode().splitlines():
            if line.startswith(name + "{" if labels else name) and labels in line:
                total += float(line.rsplit(" ", 1)[1])
        return total

    def stop(self):
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def browser():
    options = webdriver.ChromeOptions()
    options.binary_location = "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     "--window-size=1440,1000", "--no-first-run", "--disable-extensions",
                     "--disable-background-networking", "--disable-sync", "--lang=en-US"):
        options.add_argument(argument)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)


def console_errors(driver):
    return [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def wait(driver, condition, message, timeout=40):
    """Polls `condition` until it holds; an element the page replaced meanwhile (a select refilled
    from the server's model list) makes that poll false, not the test."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.1,
                             ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda d: condition(d))
    except TimeoutException:
        raise AssertionError(f"{message} (after {timeout} s)") from None


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def choose(driver, select_id, value):
    """Selects `value` in a select the page fills from the server, once it is there."""
    def selected(d):
        select = Select(d.find_element(By.ID, select_id))
        if value not in [o.get_attribute("value") for o in select.options]:
            return False
        select.select_by_value(value)
        return d.find_element(By.ID, select_id).get_attribute("value") == value

    wait(driver, selected, f"{value} offered and chosen in #{select_id}")


def show(driver, view):
    driver.find_element(By.CSS_SELECTOR, f'#tabs button[data-view="{view}"]').click()
    wait(driver, lambda d: d.find_element(By.ID, "view-" + view).is_displayed(), f"{view} shown")


def model_row(driver, name):
    """The text of each cell of `name`'s row of the dashboard's models, or None."""
    return driver.execute_script(
        "const row = [...document.querySelectorAll('#models-table tbody tr')]"
        "  .find(r => r.dataset.model === arguments[0]);"
        "return row ? [...row.cells].map(c => c.innerText) : null;", name)


def model_state(driver, name):
    row = model_row(driver, name)
    return row[1].split("\n")[0] if row else None


# --- the tests -----------------------------------------------------------------------------------

def page_loads_clean(driver, server):
    driver.get(server.url + "/")
    wait(driver, lambda d: all(model_state(d, m) == "READY" for m in
                               ("identity", "fashion_mnist", "tiny_llm", "smollm2")),
         "the dashboard lists the four models READY")
    wait(driver, lambda d: int(text(d, "stat-responses") or 0) >= 0 and
         d.execute_script("return document.querySelectorAll('#chart-rps').length") == 1, "charts")
    # Kind, precision and kernels: from the model's metadata and the event stream.
    wait(driver, lambda d: model_row(d, "fashion_mnist")[3] == "image classifier",
         "fashion_mnist's kind")
    row = " | ".join(model_row(driver, "fashion_mnist"))
    check("torchscript" in row and "fp32" in row, f"fashion_mnist's row: {row!r}")
    wait(driver, lambda d: model_row(d, "smollm2")[3] == "language model", "smollm2's kind")
    llm_row = " | ".join(model_row(driver, "smollm2"))
    check("Q4_1" in llm_row and "slots" in llm_row, f"smollm2's row: {llm_row!r}")
    for view in ("try", "chat", "bench", "dashboard"):
        show(driver, view)
    errors = console_errors(driver)
    check(not errors, f"console errors: {errors}")


def dashboard_counter_moves(driver, server):
    show(driver, "dashboard")
    before = int(text(driver, "stat-responses"))
    body = json.dumps({"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                   "data": list(range(16))}]})
    for _ in range(200):
        status, _ = server.request("POST", "/v2/models/identity/infer", body)
        check(status == 200, f"identity: {status}")
    wait(driver, lambda d: int(text(d, "stat-responses")) >= before + 200,
         f"the dashboard's response counter moved from {before} by 200", timeout=30)
    rows = driver.execute_script(
        "return Chart.getChart('chart-rps').data.datasets.find(d => d.label === 'identity')"
        ".data.filter(v => v > 0).length")
    check(rows >= 1, "the identity series of requests/s shows the burst")


def fashion_image(server):
    """A Fashion-MNIST test picture the model classifies right, as PNG bytes, and its label."""
    with gzip.open(os.path.join(FASHION_DIR, "t10k-images-idx3-ubyte.gz")) as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 28, 28)
    with gzip.open(os.path.join(FASHION_DIR, "t10k-labels-idx1-ubyte.gz")) as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    for i in range(50):
        png = io.BytesIO()
        Image.fromarray(images[i]).save(png, format="PNG")
        status, body = server.request("POST", "/predictions/fashion_mnist", png.getvalue(),
                                      {"Content-Type": "image/png"})
        check(status == 200, f"/predictions: {status} {body[:200]}")
        scores = json.loads(body)
        if max(scores, key=scores.get) == FASHION_LABELS[labels[i]]:
            return png.getvalue(), FASHION_LABELS[labels[i]]
    raise AssertionError("fashion_mnist got none of the first 50 test pictures right")


def image_classified(driver, server):
    png, label = fashion_image(server)
    show(driver, "try")
    choose(driver, "try-model", "fashion_mnist")
    wait(driver, lambda d: d.find_element(By.ID, "drop-zone").is_displayed(), "the drop zone")
    # A drop, as the page gets one: a DataTransfer holding the file, on the drop zone.
    driver.execute_script("""
        const bytes = Uint8Array.from(atob(arguments[0]), c => c.charCodeAt(0));
        const transfer = new DataTransfer();
        transfer.items.add(new File([bytes], 'fashion.png', {type: 'image/png'}));
        document.getElementById('drop-zone').dispatchEvent(
            new DragEvent('drop', {dataTransfer: transfer, bubbles: true, cancelable: true}));
    """, base64.b64encode(png).decode())
    wait(driver, lambda d: d.find_elements(By.CSS_SELECTOR, "#top5 td.class-name"), "the top 5")
    classes = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#top5 td.class-name")]
    check(classes[0] == label, f"top class {classes[0]!r}, the picture is a {label!r}")
    check(len(classes) == 5, f"{len(classes)} classes shown")
    stages = [e.text for e in driver.find_elements(By.CSS_SELECTOR, "#server-timing td:first-child")]
    check("decode" in stages and "infer" in stages, f"Server-Timing stages shown: {stages}")


def v2_editor(driver, server):
    show(driver, "try")
    choose(driver, "try-model", "identity")
    request = json.loads(driver.find_element(By.ID, "v2-request").get_attribute("value"))
    check(request["inputs"][0]["shape"] == [1, 16] and request["inputs"][0]["datatype"] == "FP32",
          f"prefilled from the metadata: {request}")
    driver.find_element(By.ID, "v2-send").click()
    wait(driver, lambda d: text(d, "v2-status").startswith("200"), "the v2 answer")
    answer = json.loads(text(driver, "v2-response"))
    check(answer["outputs"][0]["data"] == [0] * 16, f"identity's answer: {answer}")
    curl = text(driver, "curl-command")
    result = subprocess.run(["bash", "-c", curl], capture_output=True, text=True, timeout=30)
    check(json.loads(result.stdout)["outputs"][0]["data"] == [0] * 16,
          f"the curl shown answers the same: {curl!r} -> {result.stdout!r} {result.stderr!r}")


def chat_streams_and_stop_cancels(driver, server):
    show(driver, "chat")
    driver.find_element(By.ID, "chat-new").click()
    choose(driver, "chat-model", "smollm2")
    tokens = driver.find_element(By.ID, "chat-max-tokens")
    tokens.clear()
    tokens.send_keys("1500")
    cancelled_before = server.metric("sluice_http_responses_total", 'code="499"')
    generated_before = server.metric("sluice_llm_generated_tokens_total", 'model="smollm2"')
    box = driver.find_element(By.ID, "chat-input")
    box.send_keys("Write a very long story about a lighthouse keeper, in many chapters.")
    driver.find_element(By.ID, "chat-send").click()
    wait(driver, lambda d: len(d.execute_script(
        "return document.querySelector('#messages .streaming')?.textContent || ''")) > 40,
         "a reply streams in")
    stats = text(driver, "chat-stats")
    check("TTFT" in stats and "tokens/s" in stats, f"chat stats: {stats!r}")
    driver.find_element(By.ID, "chat-stop").click()
    wait(driver, lambda d: "stopped" in text(d, "chat-stats"), "the page says stopped")
    deadline = time.time() + 10
    while (server.metric("sluice_http_responses_total", 'code="499"') <= cancelled_before and
           time.time() < deadline):
        time.sleep(0.1)
    check(server.metric("sluice_http_responses_total", 'code="499"') > cancelled_before,
          "the server counted no cancelled request (499)")
    while server.metric("sluice_llm_slots_busy", 'model="smollm2"') > 0 and time.time() < deadline:
        time.sleep(0.1)
    generated = server.metric("sluice_llm_generated_tokens_total", 'model="smollm2"')
    time.sleep(0.5)
    later = server.metric("sluice_llm_generated_tokens_total", 'model="smollm2"')
    check(later == generated and generated - generated_before < 1500,
          f"generation went on after Stop: {generated - generated_before} then "
          f"{later - generated_before} tokens")
    # The partial reply is kept in the conversation, marked stopped.
    stored = driver.execute_script("return JSON.parse(localStorage.getItem('sluice.conversations'))")
    check(stored[0]["messages"][-1]["finish"][0] == "stopped", f"stored: {stored[0]['messages'][-1]}")


def chat_settings_reach_the_server(driver, server):
    """n, logprobs and a JSON schema from the settings: n replies side by side, each token's
    probability on hover, and a reply that is JSON of the schema."""
    show(driver, "chat")
    driver.find_element(By.ID, "chat-new").click()
    choose(driver, "chat-model", "tiny_llm")
    settings = {"chat-max-tokens": "24", "chat-n": "2", "chat-temperature": "1", "chat-seed": "7"}
    for field, value in settings.items():
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "chat-logprobs").click()
    driver.find_element(By.ID, "chat-input").send_keys("Hello")
    driver.find_element(By.ID, "chat-send").click()
    wait(driver, lambda d: d.find_element(By.ID, "chat-send").is_enabled() and
         d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant"), "the two replies")
    check(not text(driver, "chat-error"), f"chat error: {text(driver, 'chat-error')}")
    choices = driver.find_elements(By.CSS_SELECTOR, "#messages .message.assistant .choice")
    check(len(choices) == 2, f"{len(choices)} choices shown for n=2")
    titles = driver.execute_script(
        "return [...document.querySelectorAll('#messages .message.assistant .token')]"
        ".map(t => t.title)")
    check(len(titles) >= 2 and all("%" in t and "logprob" in t for t in titles),
          f"token probabilities on hover: {titles[:3]}")
    driver.find_element(By.ID, "chat-logprobs").click()
    n = driver.find_element(By.ID, "chat-n")
    n.clear()
    n.send_keys("1")
    tokens = driver.find_element(By.ID, "chat-max-tokens")
    tokens.clear()
    tokens.send_keys("64")
    schema = {"type": "object", "properties": {"count": {"type": "integer"}},
              "required": ["count"], "additionalProperties": False}
    driver.find_element(By.ID, "chat-schema").send_keys(json.dumps(schema))
    driver.find_element(By.ID, "chat-input").send_keys("Count.")
    driver.find_element(By.ID, "chat-send").click()
    wait(driver, lambda d: d.find_element(By.ID, "chat-send").is_enabled() and
         len(d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant")) == 2,
         "the schema's reply")
    stored = driver.execute_script("return JSON.parse(localStorage.getItem('sluice.conversations'))")
    reply = stored[0]["messages"][-1]["content"]
    value = json.loads(reply)
    check(set(value) == {"count"} and isinstance(value["count"], int), f"schema reply {reply!r}")
    driver.find_element(By.ID, "chat-schema").clear()


HOSTILE = ("Here: <img src=x onerror=\"window.__pwned=1\"> and <script>window.__pwned=2</script> "
           "[link](javascript:window.__pwned=3) **bold** `<b>code</b>`\n\n```html\n<img src=x "
           "onerror=window.__pwned=4>\n```\n")


def model_output_is_text(driver, server):
    show(driver, "chat")
    driver.find_element(By.ID, "chat-new").click()
    # The model's stream, as the server sends it, for this one request: fetch is wrapped to answer
    # /v1/chat/completions with the hostile reply in server-sent events.
    driver.execute_script("""
        const reply = arguments[0];
        const real = window.fetch;
        window.fetch = async (url, options) => {
          if (!String(url).endsWith('/v1/chat/completions')) return real(url, options);
          window.fetch = real;
          const chunks = reply.match(/[\\s\\S]{1,7}/g).map(piece =>
            'data: ' + JSON.stringify({choices: [{index: 0, delta: {content: piece}}]}) + '\\n\\n');
          chunks.push('data: ' + JSON.stringify({choices: [{index: 0, delta: {},
                       finish_reason: 'stop'}]}) + '\\n\\ndata: [DONE]\\n\\n');
          return new Response(new Blob(chunks), {status: 200,
                              headers: {'Content-Type': 'text/event-stream'}});
        };
        window.__pwned = 0;
    """, HOSTILE)
    driver.find_element(By.ID, "chat-input").send_keys("Say something hostile.")
    driver.find_element(By.ID, "chat-send").click()
    wait(driver, lambda d: "window.__pwned=2" in text(d, "messages"), "the hostile reply")

    def assert_inert(where):
        messages = driver.find_element(By.ID, "messages")
        made = [e.tag_name for e in messages.find_elements(By.CSS_SELECTOR, "img, script, b, a")]
        check(not made, f"{where}: elements made from the model's text: {made}")
        shown = messages.text
        check('<img src=x onerror="window.__pwned=1">' in shown and
              "<script>window.__pwned=2</script>" in shown and "<b>code</b>" in shown,
              f"{where}: the markup is not shown as text: {shown!r}")
        check(messages.find_elements(By.CSS_SELECTOR, "strong"), f"{where}: markdown not rendered")
        time.sleep(0.3)
        check(driver.execute_script("return window.__pwned") == 0, f"{where}: a handler ran")

    assert_inert("streamed")
    driver.refresh()  # Again from the conversation kept in localStorage.
    wait(driver, lambda d: d.find_element(By.ID, "app").is_displayed(), "the page again")
    driver.execute_script("window.__pwned = 0")
    show(driver, "chat")
    wait(driver, lambda d: "window.__pwned=2" in text(d, "messages"), "the stored reply")
    assert_inert("from the browser's storage")


def model_control(driver, server):
    show(driver, "dashboard")
    driver.find_element(
        By.CSS_SELECTOR, '#models-table tr[data-model="identity"] button[data-action="unload"]').click()
    wait(driver, lambda d: model_state(d, "identity") == "UNAVAILABLE", "identity unloaded")
    status, _ = server.request("GET", "/v2/models/identity/ready", headers={"X-API-Key": API_KEY})
    check(status != 200, f"identity still ready on the server: {status}")
    driver.find_element(
        By.CSS_SELECTOR, '#models-table tr[data-model="identity"] button[data-action="load"]').click()
    wait(driver, lambda d: model_state(d, "identity") == "READY", "identity loaded again")
    status, _ = server.request("GET", "/v2/models/identity/ready", headers={"X-API-Key": API_KEY})
    check(status == 200, f"identity not ready on the server: {status}")


def bench_runs(driver, server):
    show(driver, "bench")
    choose(driver, "bench-model", "identity")
    for field, value in (("bench-concurrency", "1,4"), ("bench-seconds", "1")):
        box = driver.find_element(By.ID, field)
        box.clear()
        box.send_keys(value)
    driver.find_element(By.ID, "bench-run").click()
    wait(driver, lambda d: text(d, "bench-status").startswith("done"), "the bench", timeout=30)
    rows = driver.find_elements(By.CSS_SELECTOR, "#bench-table tbody tr")
    check(len(rows) == 2, f"{len(rows)} bench rows")
    for row in rows:
        cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
        check(int(cells[1]) > 0 and int(cells[2]) == 0 and float(cells[3]) > 0, f"bench row {cells}")
    points = driver.execute_script(
        "return [Chart.getChart('bench-throughput').data.datasets[0].data.length,"
        " Chart.getChart('bench-latency').data.datasets[2].data.length]")
    check(points == [2, 2], f"bench plots: {points}")


def models_come_and_go(driver, sluice, repository):
    """Language models on demand, as the dashboard shows them without a reload: tiny_llm, not
    loaded at start, listed as a language model its first request loads; READY once a request
    has loaded it; UNAVAILABLE again after its keep_alive."""
    server = Server(sluice, repository, ["--model", "identity", "--keep-alive", "3"])
    try:
        driver.get(server.url + "/")
        wait(driver, lambda d: model_state(d, "tiny_llm") == "UNAVAILABLE" and
             model_row(d, "tiny_llm")[3] == "language model", "tiny_llm listed, not loaded")
        row = " | ".join(model_row(driver, "tiny_llm"))
        check("first request loads it" in row, f"tiny_llm's row before its load: {row!r}")
        status, body = server.request("POST", "/v1/completions", json.dumps(
            {"model": "tiny_llm", "prompt": "hello", "max_tokens": 2}),
            {"Content-Type": "application/json"})
        check(status == 200, f"tiny_llm's first request: {status} {body[:200]}")
        wait(driver, lambda d: model_state(d, "tiny_llm") == "READY" and
             "slots" in model_row(d, "tiny_llm")[4], "tiny_llm READY on the page", 10)
        wait(driver, lambda d: model_state(d, "tiny_llm") == "UNAVAILABLE",
             "tiny_llm unloaded after its keep_alive", 20)
    finally:
        server.stop()


def api_key_prompt_only(driver, sluice, repository):
    server = Server(sluice, repository, ["--api-key", API_KEY])
    try:
        driver.get(server.url + "/")
        wait(driver, lambda d: d.find_element(By.ID, "key-prompt").is_displayed(), "the key prompt")
        time.sleep(1.5)  # Time for anything else to load, were it going to.
        check(not driver.find_element(By.ID, "app").is_displayed(), "the console shows without a key")
        check(driver.find_elements(By.CSS_SELECTOR, "#models-table tbody tr") == [],
              "models listed without a key")
        loaded = driver.execute_script(
            "return performance.getEntriesByType('resource').map(e => e.name)")
        data = [u for u in loaded if "/console/static/" not in u]
        check(data == [server.url + "/v2"], f"loaded without the key: {data}")
        for path in ("/console/events", "/v2/repository/index", "/v2/models/identity", "/metrics"):
            status, _ = server.request("GET" if path != "/v2/repository/index" else "POST", path)
            check(status == 401, f"{path} without the key: {status}")
        check(server.request("GET", "/")[0] == 200 and
              server.request("GET", "/console/static/console.js")[0] == 200,
              "the page and its code load without the key")
        box = driver.find_element(By.ID, "key-input")
        box.send_keys("wrong")
        driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait(driver, lambda d: "refused" in text(d, "key-error"), "a wrong key refused")
        box.clear()
        box.send_keys(API_KEY)
        driver.find_element(By.CSS_SELECTOR, "#key-form button").click()
        wait(driver, lambda d: model_state(d, "identity") == "READY", "the dashboard with the key")
        check(not driver.get_cookies(), f"cookies: {driver.get_cookies()}")
        check(not any("Set-Cookie" in line for line in server.output), "a cookie set")
    finally:
        server.stop()


def screenshots(driver, sluice, repository, directory):
    """The dashboard under load, an image classified and a streamed chat, from a server of
    `repository` (fashion_mnist, resnet18 and smollm2; the default models where they are made)."""
    os.makedirs(directory, exist_ok=True)
    server = Server(sluice, repository)
    try:
        driver.get(server.url + "/")
        wait(driver, lambda d: model_state(d, "smollm2") == "READY", "the models", 120)
        png, _ = fashion_image(server)
        stop = time.time() + 20

        def load(path, body, headers=None):
            while time.time() < stop:
                server.request("POST", path, body, headers)
        jpeg = io.BytesIO()
        Image.fromarray((np.indices((375, 500)).sum(0) % 256).astype(np.uint8)).convert(
            "RGB").save(jpeg, format="JPEG")
        chat = json.dumps({"model": "smollm2", "max_tokens": 48, "messages": [
            {"role": "user", "content": "Name a colour."}]})
        threads = [threading.Thread(target=load, args=("/predictions/fashion_mnist", png))
                   for _ in range(8)]
        threads += [threading.Thread(target=load, args=("/predictions/resnet18", jpeg.getvalue()))
                    for _ in range(2)]
        threads += [threading.Thread(target=load, args=("/v1/chat/completions", chat))
                    for _ in range(2)]
        for t in threads:
            t.start()
        show(driver, "dashboard")
        driver.set_window_size(1440, 1320)  # The language model's charts too.
        time.sleep(18)
        driver.save_screenshot(os.path.join(directory, "console-dashboard.png"))
        driver.set_window_size(1440, 1000)
        for t in threads:
            t.join()
        image_classified(driver, server)
        driver.save_screenshot(os.path.join(directory, "console-try.png"))
        show(driver, "chat")
        driver.find_element(By.ID, "chat-new").click()
        choose(driver, "chat-model", "smollm2")
        driver.find_element(By.ID, "chat-input").send_keys(
            "Write a Python function that reverses a string, with a short explanation.")
        driver.find_element(By.ID, "chat-send").click()
        wait(driver, lambda d: not d.find_element(By.ID, "chat-stop").is_enabled() and
             d.find_elements(By.CSS_SELECTOR, "#messages .message.assistant"), "the reply", 120)
        driver.save_screenshot(os.path.join(directory, "console-chat.png"))
        print(f"screenshots in {directory}")
    finally:
        server.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("sluice")
    parser.add_argument("test_models")
    parser.add_argument("--screenshots", help="save the screenshots in this folder")
    parser.add_argument("--screenshot-models",
                        help="the repository the screenshots' server serves (fashion_mnist, "
                             "resnet18, smollm2); the test's own when not given")
    args = parser.parse_args()
    repository = tempfile.mkdtemp(prefix="sluice-console-")
    driver = None
    server = None
    failures = []
    try:
        for name in ("identity", "fashion_mnist", "tiny_llm"):
            shutil.copytree(os.path.join(args.test_models, name), os.path.join(repository, name))
        shutil.copytree(os.path.join(args.test_models, "gguf_smollm2_q4_1"),
                        os.path.join(repository, "smollm2"))
        server = Server(args.sluice, repository)
        driver = browser()
        tests = [page_loads_clean, dashboard_counter_moves, image_classified, v2_editor,
                 chat_streams_and_stop_cancels, chat_settings_reach_the_server,
                 model_output_is_text, model_control, bench_runs]
        for test in tests:
            started = time.time()
            try:
                test(driver, server)
                errors = console_errors(driver)
                check(not errors, f"console errors: {errors}")
                print(f"ok   {test.__name__} ({time.time() - started:.1f} s)")
            except AssertionError as e:
                failures.append(test.__name__)
                print(f"FAIL {test.__name__}: {e}")
        server.stop()
        server = None
        if args.screenshots and not failures:
            screenshots(driver, args.sluice, args.screenshot_models or repository,
                        args.screenshots)
        for test in (models_come_and_go, api_key_prompt_only):
            started = time.time()
            try:
                test(driver, args.sluice, repository)
                print(f"ok   {test.__name__} ({time.time() - started:.1f} s)")
            except AssertionError as e:
                failures.append(test.__name__)
                print(f"FAIL {test.__name__}: {e}")
    finally:
        if driver:
            driver.quit()
        if server:
            server.stop()
        shutil.rmtree(repository, ignore_errors=True)
    if failures:
        sys.exit(f"console_test: {len(failures)} failed: {', '.join(failures)}")
    print("console_test: all passed")


if __name__ == "__main__":
    main()
