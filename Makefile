# Entry points a newcomer needs; cargo does the work.
#   make test    fetch the reference model if missing, then run every test
#   make build   release build of libm40llm.so / libm40llm.a

CARGO ?= cargo

.PHONY: build test model

build:
	$(CARGO) build --release

model:
	tests/fetch-model.sh

test: model
	M40_REQUIRE_MODEL=1 $(CARGO) test --release
