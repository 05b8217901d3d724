# Entry points a newcomer needs; cargo does the work.
#   make run PROMPT="..."  generate text with Gemma 3 270M on the CPU (fetches the model once)
#   make test              fetch the reference model if missing, then run every test
#   make build             release build of libm40llm.so / libm40llm.a
#   FEATURES=cuda          adds the CUDA backend to any of these (needs nvcc 11.8: .ci/install-cuda.sh)
#   make examples          the C programs (generate, m40-bench), in target/release/

CARGO ?= cargo
CC ?= cc
PROMPT ?= The capital of France is
ARGS ?= -n 64
LIB := target/release
FEATURES ?=
CARGO_FEATURES := $(if $(FEATURES),--features $(FEATURES))

.PHONY: build test model examples run

build:
	$(CARGO) build --release $(CARGO_FEATURES)

model:
	@tests/fetch-model.sh > /dev/null

examples: build
	$(CC) -O2 -std=c11 -Wall -Iinclude examples-c/generate.c -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -o $(LIB)/generate
	$(CC) -O2 -std=c11 -Wall -Iinclude examples-c/m40-bench.c -L$(LIB) -Wl,-rpath,$(abspath $(LIB)) -lm40llm -lpthread -lm -o $(LIB)/m40-bench

run: examples model
	$(LIB)/generate "$$(tests/fetch-model.sh)" "$(PROMPT)" $(ARGS)

test: model
	M40_REQUIRE_MODEL=1 $(CARGO) test --release $(CARGO_FEATURES)
