# kiln: an ahead-of-time compiler from neural-network graphs to Vulkan C.
#
#   make        install missing packages, build build/kiln and
#               build/libkilnrt.a, compile samples/mlp.yaml, build and run it
#   make test   the same set-up, then every test; ends "N passed, N failed"
#
# Packages are Debian's; when one is missing, make installs it with apt-get
# if it runs as root, and otherwise prints the apt-get line and stops
# (tools/packages.sh). A bare Debian has no make: apt-get install make first.

CC ?= cc
CFLAGS ?= -O2 -g
WARN = -Wall -Wextra -Wshadow -Wundef -Wstrict-prototypes -Wmissing-prototypes \
       -Wpointer-arith -Wcast-qual -Wformat=2 -pedantic
PYTHON ?= /usr/bin/python3
B = build

# make test SANITIZE=1: the compiler, the runtime and every generated program
# built with AddressSanitizer and UndefinedBehaviorSanitizer (in build-san/).
# Findings inside the Vulkan driver are suppressed (tests/sanitize.supp);
# kiln's own never are. The compiler frees little by design (the weights it
# re-encodes, compiler/quantize.c), so leak
# checking applies to the runtime and the programs, not to kiln itself.
ifeq ($(SANITIZE),1)
B = build-san
SAN = -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined \
      -static-libasan
CFLAGS += $(SAN)
export KILN_BUILD := $(abspath $(B))
export KILN_CFLAGS := $(SAN)
export ASAN_OPTIONS := detect_leaks=1:abort_on_error=0:exitcode=23
export LSAN_OPTIONS := suppressions=$(abspath tests/sanitize.supp):print_suppressions=0
export UBSAN_OPTIONS := print_stacktrace=1:halt_on_error=1
# The loader unloads the driver and the validation layer at exit, after which
# leak reports cannot name them: keep them loaded so the suppressions match.
export LD_PRELOAD := $(wildcard /usr/lib/x86_64-linux-gnu/libvulkan_lvp.so \
                       /usr/lib/x86_64-linux-gnu/libVkLayer_khronos_validation.so)
endif

# What kiln needs to build and run, and what its tests need on top.
PACKAGES = build-essential libvulkan-dev libshaderc-dev glslc spirv-tools \
           libyaml-dev mesa-vulkan-drivers vulkan-validationlayers \
           libprotobuf-c-dev protobuf-c-compiler libonnx-dev pkg-config
TEST_PACKAGES = python3 python3-numpy python3-yaml python3-venv python3-pip clang g++ libonnx-testdata \
                graphviz chromium man-db cmake

COMPILER_SRC = $(filter-out compiler/embed.c, $(wildcard compiler/*.c))
COMPILER_OBJ = $(COMPILER_SRC:compiler/%.c=$(B)/compiler/%.o) $(B)/compiler/embedded.o \
               $(B)/compiler/onnx.pb-c.o $(B)/runtime/dtype.o $(B)/runtime/hash.o
ONNX_PROTO = /usr/include/onnx/onnx.proto
RUNTIME_SRC = $(wildcard runtime/*.c)
RUNTIME_OBJ = $(RUNTIME_SRC:runtime/%.c=$(B)/runtime/%.o)
EMBEDDED = $(wildcard shaders/*.comp shaders/*.glsl templates/*.in)
# Debian's shaderc_combined.a leaves glslang and spirv-tools out: link those
# static archives as one group, since they refer to each other.
COMPILER_LIBS = -lyaml -lprotobuf-c -Wl,--start-group -l:libshaderc_combined.a -lglslang -lSPIRV \
                -lMachineIndependent -lOSDependent -lOGLCompiler -lGenericCodeGen -lHLSL \
                -lglslang-default-resource-limits -lSPIRV-Tools-opt -lSPIRV-Tools \
                -Wl,--end-group -lstdc++ -lm -lpthread

.PHONY: all deps test-deps run-sample samples decode llm test onnx-report clean install uninstall
.DEFAULT_GOAL := all

all: deps $(B)/kiln $(B)/libkilnrt.a $(B)/shared/libkilnrt.so run-sample

# ---- packages ----

deps:
	@sh tools/packages.sh $(PACKAGES)

test-deps: deps
	@sh tools/packages.sh $(TEST_PACKAGES)

# ---- the compiler ----

# Every rule that runs the C compiler waits for the package step (| deps):
# under make -jN on a bare machine cc is not there until it has run.
$(B)/embed: compiler/embed.c | deps
	@mkdir -p $(B)
	$(CC) $(CFLAGS) $(WARN) -std=c11 -o $@ $<

$(B)/compiler/embedded.c: $(B)/embed $(EMBEDDED)
	@mkdir -p $(B)/compiler
	$(B)/embed $@ $(EMBEDDED)

$(B)/compiler/embedded.o: $(B)/compiler/embedded.c compiler/kiln.h
	$(CC) $(CFLAGS) -std=c11 -Icompiler -c -o $@ $<

# onnx.proto (from libonnx-dev) through protobuf-c: generated, not committed.
# The package step installs it: a parallel make on a bare machine waits for
# deps here rather than stopping with "No rule to make target". One run of
# protoc-c makes both files (a grouped target: &:).
$(ONNX_PROTO): | deps ;
$(B)/compiler/onnx.pb-c.c $(B)/compiler/onnx.pb-c.h &: $(ONNX_PROTO) | deps
	@mkdir -p $(B)/compiler
	cp $(ONNX_PROTO) $(B)/compiler/onnx.proto
	cd $(B)/compiler && protoc-c --c_out=. onnx.proto

$(B)/compiler/onnx.pb-c.o: $(B)/compiler/onnx.pb-c.c
	$(CC) $(CFLAGS) -c -o $@ $<

ONNX_OBJ = $(patsubst compiler/%.c,$(B)/compiler/%.o,$(wildcard compiler/onnx_*.c)) \
           $(B)/compiler/load_onnx.o
$(ONNX_OBJ): compiler/onnx.h $(B)/compiler/onnx.pb-c.h

COMPILER_HDR = compiler/kiln.h compiler/lower.h compiler/shape.h compiler/onnx.h \
               compiler/ops.def compiler/onnx_versions.def runtime/kiln_rt.h \
               runtime/kiln_rt_tables.h runtime/kiln_hash.h compiler/views.h \
               compiler/rewrite.h compiler/matmul.h compiler/dynamic.h

# kiln compile --report states the runtime library's size: text + data.
$(B)/compiler/main.o: compiler/main.c $(COMPILER_HDR) $(B)/libkilnrt.a
	@mkdir -p $(B)/compiler
	$(CC) $(CFLAGS) $(WARN) -std=c11 -I$(B)/compiler \
	  -DKILN_RUNTIME_BYTES=$$(size -t $(B)/libkilnrt.a | tail -1 | awk '{print $$1 + $$2}') \
	  -c -o $@ $<

$(B)/compiler/%.o: compiler/%.c $(COMPILER_HDR) | deps
	@mkdir -p $(B)/compiler
	$(CC) $(CFLAGS) $(WARN) -std=c11 -I$(B)/compiler -c -o $@ $<

$(B)/kiln: $(COMPILER_OBJ)
	$(CC) $(CFLAGS) -o $@ $^ $(COMPILER_LIBS)

# ---- the runtime ----

$(B)/runtime/%.o: runtime/%.c runtime/kiln_rt.h runtime/kiln_rt_tables.h runtime/internal.h \
                  runtime/kiln_hash.h | deps
	@mkdir -p $(B)/runtime
	$(CC) $(CFLAGS) $(WARN) -std=c99 -fPIC -c -o $@ $<

$(B)/libkilnrt.a: $(RUNTIME_OBJ)
	rm -f $@
	ar rcs $@ $^

# The shared runtime: the same position-independent objects. In its own
# directory, so that -L$(B) -lkilnrt (the tests, the samples) stays static.
# The soname changes when the library's binary interface does (1: 0.2.0,
# where the options structs gained their size field).
RT_SONAME = libkilnrt.so.1
# Exports the API only (runtime/libkilnrt.map), not the kiln__ internals.
$(B)/shared/libkilnrt.so: $(RUNTIME_OBJ) runtime/libkilnrt.map
	@mkdir -p $(B)/shared
	$(CC) $(CFLAGS) -shared -Wl,-soname,$(RT_SONAME) -Wl,--version-script=runtime/libkilnrt.map \
	  -o $@ $(RUNTIME_OBJ) -lvulkan -lm

# ---- the samples: compiled, built and run ----
# `make` runs samples/mlp.yaml; `make samples` runs every sample.

SAMPLES = mlp transformer cnn moe signal train

$(B)/%.c: samples/%.yaml $(B)/kiln
	$(B)/kiln compile $< -o $@

$(B)/%: $(B)/%.c samples/run_model.c $(B)/libkilnrt.a
	$(CC) $(CFLAGS) $(WARN) -std=c99 -Iruntime -I$(B) -DKILN_MODEL=$* -D_POSIX_C_SOURCE=199309L \
	  -include $(B)/$*.h -o $@ samples/run_model.c $(B)/$*.c \
	  -L$(B) -lkilnrt -lvulkan -lm

run-sample: $(B)/mlp
	$(B)/mlp

samples: deps $(SAMPLES:%=$(B)/%) $(B)/decode
	@for m in $(SAMPLES); do echo "== $$m"; $(B)/$$m || exit 1; done
	@echo "== decode"; $(B)/decode

# samples/decode: autoregressive decoding with a key/value cache (state).
$(B)/decoder.c: samples/decode/decoder.yaml samples/decode/rope_cos.bin \
                samples/decode/rope_sin.bin $(B)/kiln
	$(B)/kiln compile $< --name decoder -o $@

$(B)/decode: samples/decode/decode.c $(B)/decoder.c $(B)/libkilnrt.a
	$(CC) $(CFLAGS) $(WARN) -std=c99 -Iruntime -I$(B) -o $@ $< $(B)/decoder.c \
	  -L$(B) -lkilnrt -lvulkan -lm

decode: deps $(B)/decode
	$(B)/decode

# samples/llm: greedy decoding with an exported transformers decoder (the
# tiny Llama of tests/models/llm unless LLM_ONNX names another), its cache
# on the GPU. `make llm` builds and runs it on that model's stored prompt.
LLM_ONNX ?= tests/models/llm/llama_tiny/model.onnx
LLM_SHAPES ?= --shape seq=1..16 --shape past=0..80
$(B)/llm_model.c: $(LLM_ONNX) $(B)/kiln
	$(B)/kiln compile $< --name llm -o $@ $(LLM_SHAPES)

$(B)/llm: samples/llm/llm.c $(B)/llm_model.c $(B)/libkilnrt.a
	$(CC) $(CFLAGS) $(WARN) -std=c99 -Iruntime -I$(B) -o $@ $< $(B)/llm_model.c \
	  -L$(B) -lkilnrt -lvulkan -lm

llm: deps $(B)/llm
	$(B)/llm -n 32 121 131 193 243 8 36 210 242

.PRECIOUS: $(B)/%.c

# ---- tests ----

# The model runner the tests link every generated test model with
# (compiled with --name model).
$(B)/run_model_test.o: samples/run_model.c runtime/kiln_rt.h runtime/kiln_rt_tables.h | deps
	$(CC) $(CFLAGS) $(WARN) -std=c99 -Iruntime -DKILN_MODEL=model \
	  -DKILN_DECLARE_MODEL -c -o $@ $<

$(B)/test_units: tests/test_units.c $(filter-out $(B)/compiler/main.o, $(COMPILER_OBJ))
	$(CC) $(CFLAGS) $(WARN) -std=c11 -Icompiler -o $@ $^ $(COMPILER_LIBS)

# What the tests run: tests/run_tests.py, run by hand, makes it first.
test-build: $(B)/kiln $(B)/libkilnrt.a $(B)/shared/libkilnrt.so $(B)/run_model_test.o $(B)/test_units

# The build on every core once the packages are in (test-deps first).
NPROC := $(shell nproc 2>/dev/null || echo 1)
test: test-deps
	@$(MAKE) --no-print-directory -j$(NPROC) test-build
	$(PYTHON) tests/run_tests.py

# Runs every ONNX conformance case; rewrites tests/onnx/REPORT.md and the
# list of passing cases that make test holds kiln to.
onnx-report: test-deps $(B)/kiln $(B)/libkilnrt.a $(B)/run_model_test.o
	$(PYTHON) tests/onnx/conformance.py --report

# ---- install ----
# make install PREFIX=/usr/local [DESTDIR=...]: the compiler, the runtime
# (static and shared), its headers, a pkg-config file (kilnrt), a CMake
# package (find_package(kiln): lib/cmake/kiln) and the man page.
# samples/embed/ builds against them with pkg-config alone, or with CMake.

PREFIX ?= /usr/local
RT_VERSION = $(shell sed -n 's/^\#define KILN_RT_VERSION "\(.*\)"/\1/p' runtime/kiln_rt.h)
BINDIR = $(DESTDIR)$(PREFIX)/bin
LIBDIR = $(DESTDIR)$(PREFIX)/lib
INCDIR = $(DESTDIR)$(PREFIX)/include
MANDIR = $(DESTDIR)$(PREFIX)/share/man/man1

install: deps $(B)/kiln $(B)/libkilnrt.a $(B)/shared/libkilnrt.so
	install -d $(BINDIR) $(LIBDIR)/pkgconfig $(INCDIR) $(MANDIR)
	install -m 755 $(B)/kiln $(BINDIR)/kiln
	install -m 644 $(B)/libkilnrt.a $(LIBDIR)/libkilnrt.a
	install -m 755 $(B)/shared/libkilnrt.so $(LIBDIR)/$(RT_SONAME)
	ln -sf $(RT_SONAME) $(LIBDIR)/libkilnrt.so
	install -m 644 runtime/kiln_rt.h runtime/kiln_rt_tables.h runtime/kiln_rt_vulkan.h $(INCDIR)/
	install -m 644 compiler/kiln.1 $(MANDIR)/kiln.1
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(RT_VERSION)|' \
	  runtime/kilnrt.pc.in > $(LIBDIR)/pkgconfig/kilnrt.pc
	install -d $(LIBDIR)/cmake/kiln
	sed -e 's|@VERSION@|$(RT_VERSION)|' runtime/kiln-config.cmake.in \
	  > $(LIBDIR)/cmake/kiln/kiln-config.cmake
	sed -e 's|@VERSION@|$(RT_VERSION)|' runtime/kiln-config-version.cmake.in \
	  > $(LIBDIR)/cmake/kiln/kiln-config-version.cmake
	@echo "kiln: installed in $(DESTDIR)$(PREFIX)"

uninstall:
	rm -f $(BINDIR)/kiln $(LIBDIR)/libkilnrt.a $(LIBDIR)/$(RT_SONAME) $(LIBDIR)/libkilnrt.so \
	  $(INCDIR)/kiln_rt.h $(INCDIR)/kiln_rt_tables.h $(INCDIR)/kiln_rt_vulkan.h $(MANDIR)/kiln.1 $(LIBDIR)/pkgconfig/kilnrt.pc \
	  $(LIBDIR)/cmake/kiln/kiln-config.cmake $(LIBDIR)/cmake/kiln/kiln-config-version.cmake
	-rmdir $(LIBDIR)/cmake/kiln 2>/dev/null

# ---- fuzzing ----
# make fuzz [FUZZ_SECONDS=60] [FUZZ_TARGETS="yaml onnx ..."]: builds the
# libFuzzer targets of tests/fuzz/fuzz.c with clang, ASan and UBSan (in
# build-fuzz/), seeds each corpus from samples/, the ONNX test data and
# tests/fuzz/regressions/, and runs each target for FUZZ_SECONDS. A finding
# stops it and leaves the input in build-fuzz/findings/; copy it into
# tests/fuzz/regressions/TARGET/ once fixed (make test replays those).

FUZZ_TARGETS ?= yaml onnx onnx_dims safetensors frontend
FUZZ_SECONDS ?= 60
FUZZ_FLAGS = -O1 -g -fsanitize=fuzzer-no-link,address,undefined \
             -fno-sanitize-recover=undefined -fno-omit-frame-pointer
FUZZ_RUN = -max_total_time=$(FUZZ_SECONDS) -timeout=10 -rss_limit_mb=2048 \
           -malloc_limit_mb=512 -max_len=65536 -print_final_stats=1

.PHONY: fuzz fuzz-build
fuzz: test-deps
	@sh tools/packages.sh libclang-rt-dev
	$(MAKE) --no-print-directory -j$(NPROC) B=build-fuzz CC=clang CFLAGS="$(FUZZ_FLAGS)" fuzz-build
	$(PYTHON) tests/fuzz/seeds.py build-fuzz/corpus $(FUZZ_TARGETS)
	@mkdir -p build-fuzz/findings
	@for t in $(FUZZ_TARGETS); do \
	  echo "== fuzz $$t ($(FUZZ_SECONDS) s)"; \
	  ASAN_OPTIONS=detect_leaks=1 build-fuzz/fuzz_$$t $(FUZZ_RUN) \
	    -artifact_prefix=build-fuzz/findings/$$t- build-fuzz/corpus/$$t 2>build-fuzz/fuzz_$$t.log \
	    || { tail -60 build-fuzz/fuzz_$$t.log; exit 1; }; \
	  grep -E "^stat::(number_of_executed_units|peak_rss_mb)|^#[0-9]+.*DONE" build-fuzz/fuzz_$$t.log; \
	done

FUZZ_OBJ = $(filter-out $(B)/compiler/main.o, $(COMPILER_OBJ))
fuzz-build: $(FUZZ_TARGETS:%=$(B)/fuzz_%)

$(B)/fuzz_%: tests/fuzz/fuzz.c $(FUZZ_OBJ)
	$(CC) $(CFLAGS) -fsanitize=fuzzer $(WARN) -Wno-missing-prototypes -std=c11 -Icompiler \
	  -DFUZZ_$* -o $@ $^ $(COMPILER_LIBS)

clean:
	rm -rf $(B)
