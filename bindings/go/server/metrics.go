package server

import (
	"fmt"
	"net/http"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ttftBuckets are the time-to-first-token histogram's upper bounds, seconds.
var ttftBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

// metrics are the server's counters, served as Prometheus text.
type metrics struct {
	mu       sync.Mutex
	requests map[[2]string]int64 // (path, status) -> count
	ttft     [11]int64           // per bucket, the last +Inf
	ttftSum  float64

	promptTokens       atomic.Int64
	generatedTokens    atomic.Int64
	promptChunks       atomic.Int64
	cachedPromptTokens atomic.Int64
	queued             atomic.Int64
	activeSessions     atomic.Int64
}

func (m *metrics) request(path string, status int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.requests == nil {
		m.requests = map[[2]string]int64{}
	}
	m.requests[[2]string{path, fmt.Sprint(status)}]++
}

func (m *metrics) firstToken(took time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	at := sort.SearchFloat64s(ttftBuckets, took.Seconds())
	m.ttft[at]++
	m.ttftSum += took.Seconds()
}

func (s *Server) serveMetrics(w http.ResponseWriter, r *http.Request) {
	m := &s.metrics
	var b strings.Builder
	metric := func(name, kind, help string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, kind)
	}
	metric("m40_requests_total", "counter", "HTTP requests by path and status.")
	m.mu.Lock()
	keys := make([][2]string, 0, len(m.requests))
	for k := range m.requests {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i][0] < keys[j][0] || keys[i][0] == keys[j][0] && keys[i][1] < keys[j][1]
	})
	for _, k := range keys {
		// Labels from metricPath and status codes: no character to escape.
		fmt.Fprintf(&b, "m40_requests_total{path=\"%s\",status=\"%s\"} %d\n", k[0], k[1], m.requests[k])
	}
	metric("m40_time_to_first_token_seconds", "histogram", "From a request's arrival to its first generated token.")
	var cumulative int64
	for i, le := range ttftBuckets {
		cumulative += m.ttft[i]
		fmt.Fprintf(&b, "m40_time_to_first_token_seconds_bucket{le=\"%g\"} %d\n", le, cumulative)
	}
	cumulative += m.ttft[len(ttftBuckets)]
	fmt.Fprintf(&b, "m40_time_to_first_token_seconds_bucket{le=\"+Inf\"} %d\n", cumulative)
	fmt.Fprintf(&b, "m40_time_to_first_token_seconds_sum %g\n", m.ttftSum)
	fmt.Fprintf(&b, "m40_time_to_first_token_seconds_count %d\n", cumulative)
	m.mu.Unlock()
	for _, v := range []struct {
		name, kind, help string
		value            *atomic.Int64
	}{
		{"m40_prompt_tokens_total", "counter", "Prompt tokens of the requests admitted.", &m.promptTokens},
		{"m40_prompt_tokens_cached_total", "counter", "Prompt tokens a reused session already held (not decoded again).", &m.cachedPromptTokens},
		{"m40_generated_tokens_total", "counter", "Tokens generated.", &m.generatedTokens},
		{"m40_prompt_chunks_total", "counter", "Prompt chunks decoded between decode steps.", &m.promptChunks},
		{"m40_queue_length", "gauge", "Requests waiting for a session.", &m.queued},
		{"m40_active_sessions", "gauge", "Sessions reading a prompt or generating.", &m.activeSessions},
	} {
		metric(v.name, v.kind, v.help)
		fmt.Fprintf(&b, "%s %d\n", v.name, v.value.Load())
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4")
	w.Write([]byte(b.String()))
}
