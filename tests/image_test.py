"""The OCI image (deploy/Containerfile), built and run.

Builds it from this build (scripts/image.sh: the binary and its libtorch libraries staged, a
Debian 12 base made locally), then, in a container of it run with `buildah run --isolation chroot`
and host networking (podman run cannot set rlimits on these machines):
- every library of `sluice` resolves inside; no compiler, headers or Python are there;
- it runs as uid 1000;
- its ENTRYPOINT and CMD, with the ports moved to free loopback ones and a model repository
  mounted at /mnt/models, serve: ready, a v2 inference, a chat completion, /metrics, the console;
- SIGTERM to the server (PID 1 of a pod) makes readiness fail at once and the server exit 0 after
  the image's drain delay.

Usage: image_test.py BUILD_DIR TEST_MODELS
"""
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IMAGE = "localhost/sluice:test"
BASE = "localhost/sluice-debian:bookworm"  # scripts/base-image.sh's, kept for the next build


def check(condition, message):
    if not condition:
        sys.exit(f"FAIL: {message}")


def run(args, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=600, **kwargs)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request(method, path, body=body)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, data


def descendants(pid):
    children = run(["pgrep", "-P", str(pid)]).stdout.split()
    found = []
    for child in children:
        found.append(int(child))
        found.extend(descendants(int(child)))
    return found


def images():
    listed = run(["podman", "images", "--all", "--quiet", "--no-trunc"])
    return set(listed.stdout.split())


def remove_new_images(before):
    """Removes the test's image and every intermediate one its build left (the build stages'),
    so that repeated runs do not fill the disk; images that were there before, and the Debian
    base, are kept."""
    base = run(["podman", "image", "inspect", BASE, "--format", "{{.Id}}"]).stdout.split()
    before = before | set(base)
    run(["podman", "rmi", "--force", IMAGE])
    for _ in range(3):  # a stage's image goes only once the images made from it are gone
        left = images() - before
        if not left:
            return
        run(["podman", "rmi", "--force", *left])


def main():
    build_dir, test_models = sys.argv[1:3]
    before = images()
    try:
        test(build_dir, test_models)
    finally:
        remove_new_images(before)


def test(build_dir, test_models):
    start = time.monotonic()
    built = run([os.path.join(ROOT, "scripts", "image.sh"), build_dir, IMAGE], cwd=ROOT)
    check(built.returncode == 0, f"scripts/image.sh failed:\n{built.stdout}\n{built.stderr}")
    print(built.stdout.strip())
    print(f"image built in {time.monotonic() - start:.0f} s")
    config = json.loads(run(["podman", "image", "inspect", IMAGE]).stdout)[0]["Config"]
    check(config["User"] == "1000:1000", f"image user: {config['User']}")
    check(config["Entrypoint"] == ["sluice"], f"entrypoint: {config['Entrypoint']}")
    cmd = config["Cmd"]
    check(cmd[0] == "serve" and "/mnt/models" in cmd and "--drain-delay" in cmd, f"cmd: {cmd}")

    container = run(["buildah", "from", "--name", f"sluice-test-{os.getpid()}", IMAGE])
    check(container.returncode == 0, f"buildah from: {container.stderr}")
    name = container.stdout.strip()
    try:
        def inside(*args, volume=None):
            extra = ["--volume", volume] if volume else []
            return run(["buildah", "run", "--isolation", "chroot", "--network", "host", *extra,
                        name, "--", *args])

        ldd = inside("ldd", "/opt/sluice/bin/sluice")
        check(ldd.returncode == 0 and "not found" not in ldd.stdout, f"ldd:\n{ldd.stdout}")
        libraries = len([line for line in ldd.stdout.splitlines() if "=>" in line])
        print(f"every one of sluice's {libraries} libraries resolves inside the image")
        uid = inside("id", "-u")
        check(uid.stdout.strip() == "1000", f"uid inside: {uid.stdout!r} {uid.stderr!r}")
        absent = inside("sh", "-c", "for f in /usr/bin/gcc /usr/bin/g++ /usr/bin/cc "
                        "/usr/bin/python3 /usr/include/c++ /usr/bin/cmake; do "
                        "[ -e $f ] && echo $f; done; true")
        check(absent.stdout.strip() == "", f"build tools in the image: {absent.stdout}")
        print("runs as uid 1000; no compiler, C++ headers, CMake or Python inside")

        with tempfile.TemporaryDirectory() as repository:
            for model in ("identity", "tiny_llm"):
                shutil.copytree(os.path.join(test_models, model), os.path.join(repository, model))
            # The server runs as uid 1000: the files must be readable by others, as a volume's
            # or KServe's storage initializer's are.
            subprocess.run(["chmod", "-R", "a+rX", repository], check=True)
            http_port, grpc_port = free_port(), free_port()
            args = list(cmd)
            args[args.index("--port") + 1] = str(http_port)
            args[args.index("--grpc-port") + 1] = str(grpc_port)
            args[args.index("--host") + 1] = "127.0.0.1"
            drain = float(args[args.index("--drain-delay") + 1])
            server = subprocess.Popen(
                ["buildah", "run", "--isolation", "chroot", "--network", "host", "--volume",
                 f"{repository}:/mnt/models:ro", name, "--", *config["Entrypoint"], *args],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            output = []
            listening = threading.Event()

            def read():
                for line in server.stdout:
                    output.append(line)
                    if "Sluice listening on" in line:
                        listening.set()

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            try:
                deadline = time.monotonic() + 120
                while not listening.wait(0.2) and server.poll() is None:
                    check(time.monotonic() < deadline, "the image's server did not start in 120 s")
                check(listening.is_set(), f"the image's server did not start:\n{''.join(output)}")
                status, _ = request(http_port, "GET", "/v2/health/ready")
                check(status == 200, f"ready: {status}")
                status, body = request(http_port, "POST", "/v2/models/identity/infer", json.dumps(
                    {"inputs": [{"name": "input", "datatype": "FP32", "shape": [1, 16],
                                 "data": list(range(16))}]}))
                check(status == 200 and json.loads(body)["outputs"][0]["data"] == list(range(16)),
                      f"v2 infer: {status} {body[:200]}")
                status, body = request(http_port, "POST", "/v1/chat/completions", json.dumps(
                    {"model": "tiny_llm", "max_tokens": 4,
                     "messages": [{"role": "user", "content": "Hello"}]}))
                check(status == 200 and json.loads(body)["usage"]["completion_tokens"] >= 1,
                      f"chat completion: {status} {body[:200]}")
                status, body = request(http_port, "GET", "/metrics")
                check(status == 200 and b"sluice_requests_total" in body, f"metrics: {status}")
                status, body = request(http_port, "GET", "/")
                check(status == 200 and b"<title>Sluice console</title>" in body,
                      f"console: {status}")
                print("the image's entrypoint serves: ready, v2 inference, chat completion, "
                      "metrics, the console")
                # The server is the container's process (a pod's PID 1): SIGTERM goes to it.
                pids = [p for p in descendants(server.pid)
                        if os.path.realpath(f"/proc/{p}/exe").endswith("/sluice")]
                check(len(pids) == 1, f"the server's process among {descendants(server.pid)}")
                sigterm_at = time.monotonic()
                os.kill(pids[0], signal.SIGTERM)
                time.sleep(0.2)
                status, _ = request(http_port, "GET", "/v2/health/ready")
                check(status == 503, f"readiness after SIGTERM: {status}")
                code = server.wait(timeout=drain + 60)
                took = time.monotonic() - sigterm_at
                reader.join(timeout=10)
                check(code == 0, f"exit code {code}:\n{''.join(output)}")
                check(took >= drain - 0.2, f"exited {took:.1f} s after SIGTERM, drain {drain} s")
                print(f"SIGTERM: not ready at once, exit 0 after {took:.1f} s (drain delay "
                      f"{drain:g} s)")
            finally:
                if server.poll() is None:
                    for pid in descendants(server.pid):
                        try:
                            os.kill(pid, signal.SIGKILL)
                        except ProcessLookupError:
                            pass
                    server.kill()
                    server.wait()
    finally:
        run(["buildah", "rm", name])
    print(f"image_test: all passed in {time.monotonic() - start:.0f} s")


if __name__ == "__main__":
    main()
