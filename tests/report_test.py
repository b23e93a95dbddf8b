#!/usr/bin/env python3
"""report.html in headless Chromium: every bench (in-process, against the ceiling, HTTP, sweep,
LLM) writes one into its results folder and `sluice report` merges them; each page renders, every
plot on it has data, and the page loads nothing from the network.

Usage: tests/report_test.py SLUICE TEST_MODELS
"""
import glob
import html.parser
import http.client
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

from PIL import Image

from sluice_server import serving

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  # Whatever the browser itself might look up goes nowhere.
                  "--host-resolver-rules=MAP * ~NOTFOUND"]


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def run(cmd, timeout=300):
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    check(result.returncode == 0, f"{cmd} failed: {result.stdout}\n{result.stderr}")
    return result.stdout


class Page(html.parser.HTMLParser):
    """The plots of a rendered page and what in it could load something."""

    def __init__(self):
        super().__init__()
        self.plots = []  # Per <figure class="plot">: [circles, non-empty polylines, has svg].
        self.in_plot = False
        self.loaders = []
        self.h1 = False
        self.sections = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "figure" and "plot" in (attrs.get("class") or ""):
            self.plots.append([0, 0, False])
            self.in_plot = True
        elif self.in_plot and tag == "svg":
            self.plots[-1][2] = True
        elif self.in_plot and tag == "circle":
            self.plots[-1][0] += 1
        elif self.in_plot and tag == "polyline" and (attrs.get("points") or "").strip():
            self.plots[-1][1] += 1
        if tag == "h1":
            self.h1 = True
        if tag == "section" and "run" in (attrs.get("class") or ""):
            self.sections += 1
        if tag in ("script", "iframe", "object", "embed", "link", "img", "video", "audio"):
            self.loaders.append(tag)
        for name in ("src", "srcset", "href", "data", "poster", "action"):
            value = attrs.get(name)
            if value is not None and not value.startswith("#"):
                self.loaders.append(f"{tag} {name}={value}")

    def handle_endtag(self, tag):
        if tag == "figure":
            self.in_plot = False


def check_in_chromium(page, tmp, min_plots):
    """Renders `page`; returns the parsed DOM after checking plots, network and pixels."""
    name = os.path.basename(os.path.dirname(page)) + "-" + os.path.basename(page)
    netlog = os.path.join(tmp, name + ".netlog.json")
    shot = os.path.join(tmp, name + ".png")
    dom = run(["chromium", *CHROMIUM_FLAGS, f"--log-net-log={netlog}",
               "--net-log-capture-mode=Everything", "--dump-dom", "file://" + page], timeout=120)
    run(["chromium", *CHROMIUM_FLAGS, "--window-size=1400,3000", f"--screenshot={shot}",
         "file://" + page], timeout=120)
    parsed = Page()
    parsed.feed(dom)
    check(parsed.h1, f"{page}: no heading rendered")
    check(len(parsed.plots) >= min_plots, f"{page}: {len(parsed.plots)} plots, want >= {min_plots}")
    for i, (circles, lines, svg) in enumerate(parsed.plots):
        check(svg and circles > 0 and lines > 0, f"{page}: plot {i + 1} has no data")
    check(not parsed.loaders, f"{page}: elements that load: {parsed.loaders}")
    # Nothing requested on the page's behalf (the browser's own background requests are not the
    # page's: they carry no file:// isolation key).
    with open(netlog) as f:
        log = json.load(f)
    kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
    for event in log["events"]:
        params = event.get("params", {})
        if kinds.get(event["type"]) != "URL_REQUEST_START_JOB" or "url" not in params:
            continue
        on_behalf_of_page = "file://" in params.get("network_isolation_key", "") or \
            "file://" in params.get("site_for_cookies", "")
        check(not on_behalf_of_page or params["url"].startswith(("file:", "data:")),
              f"{page} requested {params['url']}")
    # It drew something: many colours, not a blank page.
    with Image.open(shot) as image:
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20)
        check(colours is None or len(colours) > 20, f"{page}: the screenshot is blank")
    return parsed


def main():
    sluice, models = sys.argv[1], os.path.abspath(sys.argv[2])
    check(shutil.which("chromium"), "chromium is not installed (scripts/install-deps.sh)")
    with tempfile.TemporaryDirectory() as tmp:
        results = os.path.join(tmp, "results")
        base = [sluice, "bench", "--results-dir", results]
        # `busy` takes a few ms a request: the runs last long enough for utilisation samples
        # (one every 100 ms).
        run(base + ["--in-process", "--model-repository", models, "-m", "busy",
                    "--concurrency", "4", "--iters", "150"])
        run(base + ["--in-process", "--model-repository", models, "-m", "busy",
                    "--concurrency", "4", "--iters", "120", "--compare-ceiling", "--rounds", "2"])
        run([sluice, "sweep", "--model-repository", models, "-m", "tiny_cnn",
             "--batch-sizes", "1,4", "--backends", "torchscript", "--precisions", "fp32",
             "--iters", "2500", "--results-dir", results])
        repository = os.path.join(tmp, "repository")
        os.mkdir(repository)
        for model in ("identity", "tiny_llm"):
            os.symlink(os.path.join(models, model), os.path.join(repository, model))
        with serving(sluice, ["--model-repository", repository, "--llm-threads", "1"]) as port:
            url = f"http://127.0.0.1:{port}"
            for _ in range(2):  # Two runs of one model: the merged page compares them.
                run(base + ["--url", url, "-m", "identity", "--concurrency", "1,4",
                            "--rate", "300", "--duration", "1", "--warmup", "0.3"])
            run(base + ["--llm", "--url", url, "--concurrency", "1,2", "--requests", "3",
                        "--prompt-tokens", "20", "--output-tokens", "5"])
        dirs = sorted(glob.glob(os.path.join(results, "*")))
        check(len(dirs) == 6, f"result folders: {dirs}")
        plots_by_kind = {"bench-busy": 3, "ceiling-busy": 3, "sweep-tiny_cnn": 6,
                         "http-identity": 5, "llm-tiny_llm": 5}
        total_plots = 0
        for d in dirs:
            page = os.path.join(d, "report.html")
            check(os.path.exists(page), f"no report.html in {d}")
            # <date>-<time>-<kind>-<model>[-<n>]
            kind = re.sub(r"-\d+$", "", os.path.basename(d).split("-", 2)[2])
            total_plots += len(check_in_chromium(page, tmp, plots_by_kind[kind]).plots)
        with open(os.path.join(dirs[1], "report.html")) as f:
            ceiling_page = f.read()
        check("Pipeline against the engine ceiling" in ceiling_page and "median" in ceiling_page,
              "the ceiling run shows its ratios")

        merged = os.path.join(tmp, "merged.html")
        out = run([sluice, "report", results, "-o", merged])
        check(merged in out, out)
        # Every run's plots, and the comparison's throughput by run.
        page = check_in_chromium(merged, tmp, total_plots + 1)
        check(page.sections == 6, f"{page.sections} run sections in the merged page")
        with open(merged) as f:
            text = f.read()
        check("Comparisons" in text and "run 5 / run 4" in text,
              "the two HTTP runs are compared side by side with their ratios")
        # A folder that is not a run is a clear error.
        bad = subprocess.run([sluice, "report", tmp + "/nothing-here"], capture_output=True,
                             text=True)
        check(bad.returncode != 0 and "not a results folder" in bad.stderr + bad.stdout,
              f"report of a missing folder: {bad.stdout} {bad.stderr}")
        check_profiler(sluice, models, tmp)
    print("report: all checks passed")


def check_profile_files(folder, model):
    """The Chrome trace of libtorch's profiler, with aten operators, and the ranked operators."""
    with open(os.path.join(folder, f"profile-{model}-0.json")) as f:
        events = json.load(f)["traceEvents"]
    names = {e.get("name", "") for e in events}
    check(any(n.startswith("aten::") for n in names), f"no aten operators in the trace: {names}")
    with open(os.path.join(folder, f"profile-{model}-0-ops.json")) as f:
        ops = json.load(f)
    check(ops["runs"] == 6 and ops["operators"], f"ops file: {ops}")
    selfs = [op["self_ms"] for op in ops["operators"]]
    check(selfs == sorted(selfs, reverse=True) and selfs[0] > 0, f"ranked by self time: {selfs}")


def check_profiler(sluice, models, tmp):
    """--profile on bench (files in the results folder, top operators in its report) and
    SLUICE_TORCH_PROFILER=1 on serve."""
    results = os.path.join(tmp, "profiled")
    out = run([sluice, "bench", "--in-process", "--model-repository", models, "-m", "tiny_cnn",
               "-b", "4", "--iters", "20", "--profile", "--profile-runs", "6",
               "--results-dir", results])
    (folder,) = glob.glob(os.path.join(results, "*"))
    check("Profile: " + os.path.join(folder, "profile-tiny_cnn-0.json") in out, out)
    check_profile_files(folder, "tiny_cnn")
    page = os.path.join(folder, "report.html")
    with open(page) as f:
        check("Top operators by self time" in f.read(), "the report lists the top operators")
    check_in_chromium(page, tmp, 2)

    served = os.path.join(tmp, "served-profile")
    env = dict(os.environ, SLUICE_TORCH_PROFILER="1")
    body = json.dumps({"inputs": [{"name": "input", "shape": [1, 3, 16, 16], "datatype": "FP32",
                                   "data": [0.5] * 768}]})
    with serving(sluice, ["--model-repository", models, "-m", "tiny_cnn", "--profile-dir", served,
                          "--profile-runs", "6"], env=env) as port:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(12):  # Past the warm-up runs and the window.
            conn.request("POST", "/v2/models/tiny_cnn/infer", body)
            answer = conn.getresponse()
            answer.read()
            check(answer.status == 200, f"infer: {answer.status}")
    check_profile_files(served, "tiny_cnn")


if __name__ == "__main__":
    main()
