module m40llm/bindings/go

go 1.19
