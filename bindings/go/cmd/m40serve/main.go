// m40serve: an HTTP server with OpenAI-style endpoints over libm40llm.
//
//	m40serve -m MODEL [-addr 127.0.0.1:8080] [-device -1] [-threads 0] [-ctx 2048] [-sessions 16]
//
//	GET  /v1/models
//	POST /v1/completions       {"prompt", "max_tokens", "temperature", "seed", "stream"}
//	POST /v1/chat/completions  {"messages", "max_tokens", "temperature", "seed", "stream"}
//
// With "stream": true the reply is server-sent events ("data: {chunk}",
// then "data: [DONE]"). Requests run concurrently: one scheduler goroutine
// decodes each new prompt, then steps all active requests together with one
// m40_decode_batch per token. A client that disconnects is dropped at the
// next step.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"

	m40 "m40llm/bindings/go"
)

func main() {
	path := flag.String("m", "", "GGUF model file")
	addr := flag.String("addr", "127.0.0.1:8080", "listen address")
	device := flag.Int("device", m40.DefaultModelParams().Device, "-1: CPU, 0..: CUDA device")
	threads := flag.Int("threads", 0, "CPU threads (0: one per core)")
	nCtx := flag.Int("ctx", 2048, "context tokens per request")
	sessions := flag.Int("sessions", 16, "requests generating at once (more wait)")
	flag.Parse()
	if *path == "" || *nCtx < 1 || *sessions < 1 {
		fmt.Fprintln(os.Stderr, "m40serve: -m is required; -ctx and -sessions must be at least 1")
		flag.Usage()
		os.Exit(2)
	}
	model, err := m40.Load(*path, m40.ModelParams{Device: *device, Threads: *threads})
	if err != nil {
		log.Fatal(err)
	}
	server := NewServer(model, *path, *nCtx, *sessions)
	defer server.Close()
	log.Printf("m40serve: %s on http://%s", *path, *addr)
	log.Fatal(http.ListenAndServe(*addr, server))
}
