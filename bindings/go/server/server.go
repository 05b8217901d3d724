// Package server is an OpenAI-style HTTP server over one model: completions
// and chat completions (whole or streamed as server-sent events), models,
// health and Prometheus metrics. One scheduler goroutine owns a bounded set
// of sessions it reuses; it admits prompts in chunks between batched decode
// steps of the requests generating.
package server

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	m40 "m40llm/bindings/go"
)

// Config is what `m40 serve` takes from its flags.
type Config struct {
	Name             string // the model's id (requests naming another get 404)
	Created          int64  // when the model was made (Unix seconds), for /v1/models
	NCtx             int    // context tokens of a session
	Sessions         int    // sessions kept: requests generating at once
	QueueLimit       int    // requests that may wait for a session; more get 429
	DefaultMaxTokens int    // a chat request's max_tokens when it gives none
	MaxBodyBytes     int64  // larger request bodies get 413
	APIKey           string // when set, /v1/* and /metrics need "Authorization: Bearer KEY"
	PromptChunk      int    // prompt tokens decoded between steps; 0: sized to a step's time
	MaxChoices       int    // the largest n a request may ask for
	// Connection timeouts (HTTPServer): reading a request's headers, its
	// whole body, keeping an idle connection, and each write to a client.
	HeaderTimeout, ReadTimeout, IdleTimeout, WriteTimeout time.Duration
	Log                                                   *log.Logger // one line a request; nil: none
}

// DefaultConfig has the defaults `m40 serve` documents.
func DefaultConfig() Config {
	return Config{
		NCtx: 4096, Sessions: 4, QueueLimit: 64, DefaultMaxTokens: 512, MaxBodyBytes: 4 << 20,
		MaxChoices: 8, HeaderTimeout: 10 * time.Second, ReadTimeout: 60 * time.Second,
		IdleTimeout: 60 * time.Second, WriteTimeout: 60 * time.Second,
	}
}

// Server serves one model.
type Server struct {
	model    *m40.Model
	cfg      Config
	jobs     chan *job
	stop     chan struct{}
	stopOnce sync.Once
	finished sync.WaitGroup
	mux      *http.ServeMux
	metrics  metrics
	// Requests admitted and not finished, choices counted (the queue bound).
	inFlight atomic.Int64
	// Each token's text and whether it ends a generation, read once rather
	// than through the library for every token generated.
	pieces []string
	eog    []bool
	// The longest token's text: a prompt longer than NCtx times this cannot
	// fit, and is refused before it is tokenized.
	maxTokenBytes int

	// Owned by the scheduler goroutine.
	slots    []*slot
	logits   []float32
	perToken float64 // seconds a prompt token takes (moving average)
	stepTime float64 // seconds a decode step takes (moving average)

	// The most requests one decode step has carried (for tests).
	maxBatch atomic.Int32
}

// New starts serving model with cfg; Close stops it.
func New(model *m40.Model, cfg Config) (*Server, error) {
	if cfg.NCtx < 1 || cfg.Sessions < 1 || cfg.QueueLimit < 0 || cfg.DefaultMaxTokens < 1 ||
		cfg.MaxBodyBytes < 1 || cfg.MaxChoices < 1 || cfg.PromptChunk < 0 {
		return nil, fmt.Errorf("server: context, sessions, default max tokens, body limit and choices must be at least 1, the queue limit and prompt chunk at least 0")
	}
	s := &Server{
		model: model,
		cfg:   cfg,
		jobs:  make(chan *job),
		stop:  make(chan struct{}),
		mux:   http.NewServeMux(),
	}
	n := model.NVocab()
	s.pieces, s.eog = make([]string, n), make([]bool, n)
	for t := range s.pieces {
		// A token without text (an error here) stays "".
		s.pieces[t], _ = model.TokenPiece(m40.Token(t))
		s.eog[t] = model.IsEndOfGeneration(m40.Token(t))
		if len(s.pieces[t]) > s.maxTokenBytes {
			s.maxTokenBytes = len(s.pieces[t])
		}
	}
	if s.maxTokenBytes == 0 {
		s.maxTokenBytes = 1
	}
	s.mux.HandleFunc("/health", s.health)
	s.mux.HandleFunc("/metrics", s.authorized(s.serveMetrics))
	s.mux.HandleFunc("/v1/models", s.authorized(s.models))
	s.mux.HandleFunc("/v1/models/", s.authorized(s.models))
	s.mux.HandleFunc("/v1/completions", s.authorized(s.completions))
	s.mux.HandleFunc("/v1/chat/completions", s.authorized(s.chatCompletions))
	s.finished.Add(1)
	go s.schedule()
	return s, nil
}

// ServeHTTP serves a request and logs it.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	// A keep-alive connection keeps the last response's write deadline:
	// clear it; replies set their own just before they are written.
	if c, ok := r.Context().Value(connKey{}).(net.Conn); ok {
		c.SetWriteDeadline(time.Time{})
	}
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	ctx := context.WithValue(r.Context(), usageKey{}, &rec.usage)
	s.mux.ServeHTTP(rec, r.WithContext(ctx))
	s.metrics.request(metricPath(r.URL.Path), rec.status)
	if s.cfg.Log != nil {
		s.cfg.Log.Printf("%s %s %s %d prompt=%d completion=%d %.3fs", r.RemoteAddr, r.Method,
			r.URL.Path, rec.status, rec.usage.prompt, rec.usage.completion, time.Since(start).Seconds())
	}
}

// metricPath is a request's path as a metrics label: one of a fixed few, so
// that clients cannot grow the metrics without bound.
func metricPath(path string) string {
	switch path {
	case "/health", "/metrics", "/v1/models", "/v1/completions", "/v1/chat/completions":
		return path
	}
	if strings.HasPrefix(path, "/v1/models/") {
		return "/v1/models/{id}"
	}
	return "other"
}

// HTTPServer is an http.Server for s on addr with the configured timeouts;
// each connection's writes get WriteTimeout, so a client that stops reading
// a stream is dropped.
func (s *Server) HTTPServer(addr string) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           s,
		ReadHeaderTimeout: s.cfg.HeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    64 << 10,
		ConnContext: func(ctx context.Context, c net.Conn) context.Context {
			return context.WithValue(ctx, connKey{}, c)
		},
	}
}

// Shutdown stops hs from accepting, ends the streams in flight with an
// error event and [DONE], and returns when their handlers have finished
// (or ctx ends).
func (s *Server) Shutdown(ctx context.Context, hs *http.Server) error {
	done := make(chan error, 1)
	go func() { done <- hs.Shutdown(ctx) }()
	s.Close()
	return <-done
}

// Close stops the scheduler: requests in progress end with an error, new
// ones are refused (503). Sessions are released. Closing twice is a no-op.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.finished.Wait()
	for _, sl := range s.slots {
		sl.session.Close()
	}
	s.slots = nil
}

func (s *Server) stopping() bool {
	select {
	case <-s.stop:
		return true
	default:
		return false
	}
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	if s.stopping() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]any{"status": "stopping"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"status": "ok"})
}

// authorized wraps a handler with the API key check (when a key is set).
func (s *Server) authorized(h http.HandlerFunc) http.HandlerFunc {
	if s.cfg.APIKey == "" {
		return h
	}
	want := []byte("Bearer " + s.cfg.APIKey)
	return func(w http.ResponseWriter, r *http.Request) {
		got := []byte(r.Header.Get("Authorization"))
		if subtle.ConstantTimeCompare(got, want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="m40"`)
			httpError(w, http.StatusUnauthorized, "authentication_error", "a valid API key is required (Authorization: Bearer KEY)")
			return
		}
		h(w, r)
	}
}

// recorder keeps a response's status and token counts for the log line.
type recorder struct {
	http.ResponseWriter
	status int
	wrote  bool
	usage  usage
}

type usage struct{ prompt, completion int }

type usageKey struct{}
type connKey struct{}

func (r *recorder) WriteHeader(status int) {
	if !r.wrote {
		r.status, r.wrote = status, true
	}
	r.ResponseWriter.WriteHeader(status)
}

func (r *recorder) Write(b []byte) (int, error) {
	r.wrote = true
	return r.ResponseWriter.Write(b)
}

func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// setWriteDeadline bounds the next write to the request's connection.
func (s *Server) setWriteDeadline(r *http.Request) {
	if c, ok := r.Context().Value(connKey{}).(net.Conn); ok && s.cfg.WriteTimeout > 0 {
		c.SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	}
}

// What requests get when the server stops.
const stopping = "the server is stopping"
