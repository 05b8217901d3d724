package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	m40 "m40llm/bindings/go"
)

// Server serves one model.
type Server struct {
	model    *m40.Model
	name     string
	nCtx     int
	jobs     chan *job
	slots    chan struct{} // one per request allowed to generate at once
	stop     chan struct{}
	stopOnce sync.Once
	finished sync.WaitGroup
	mux      *http.ServeMux
	// The most requests one decode step has carried (for tests and logs).
	maxBatch atomic.Int32
	// Requests generating now.
	active atomic.Int32
}

// A request being generated.
type job struct {
	ctx       context.Context
	tokens    []m40.Token
	maxTokens int
	sampler   m40.SamplerParams
	pieces    chan string // text as it comes (room for all of it); closed at the end
	finish    string      // "stop" or "length", set before pieces closes
	err       string      // why the request failed, if it did
	generated int
	session   *m40.Session
	next      m40.Token
	pending   []byte // bytes of an incomplete UTF-8 character
}

func NewServer(model *m40.Model, path string, nCtx, sessions int) *Server {
	s := &Server{
		model: model,
		name:  strings.TrimSuffix(filepath.Base(path), ".gguf"),
		nCtx:  nCtx,
		jobs:  make(chan *job),
		slots: make(chan struct{}, sessions),
		stop:  make(chan struct{}),
		mux:   http.NewServeMux(),
	}
	s.mux.HandleFunc("/v1/models", s.models)
	s.mux.HandleFunc("/v1/completions", s.completions)
	s.mux.HandleFunc("/v1/chat/completions", s.chatCompletions)
	s.finished.Add(1)
	go s.schedule()
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close stops the scheduler: requests in progress end with an error, new
// ones are refused (503). Closing twice is a no-op.
func (s *Server) Close() {
	s.stopOnce.Do(func() { close(s.stop) })
	s.finished.Wait()
}

// schedule owns every session: it admits new jobs (decoding their prompts)
// and steps all active ones with one batched decode per token.
func (s *Server) schedule() {
	defer s.finished.Done()
	var active []*job
	for {
		// Wait for work when idle; otherwise take what has arrived.
		if len(active) == 0 {
			select {
			case j := <-s.jobs:
				active = s.admit(active, j)
			case <-s.stop:
				return
			}
		}
	admit:
		for {
			select {
			case j := <-s.jobs:
				active = s.admit(active, j)
			case <-s.stop:
				for _, j := range active {
					s.end(j, "server stopped")
				}
				return
			default:
				break admit
			}
		}
		// Emit each job's sampled token; keep those that go on.
		var sessions []*m40.Session
		var tokens []m40.Token
		kept := active[:0]
		for _, j := range active {
			if done, reason := s.emit(j); done {
				s.end(j, reason)
				continue
			}
			kept = append(kept, j)
			sessions = append(sessions, j.session)
			tokens = append(tokens, j.next)
		}
		active = kept
		if len(active) == 0 {
			continue
		}
		if int32(len(active)) > s.maxBatch.Load() {
			s.maxBatch.Store(int32(len(active)))
		}
		if err := m40.DecodeBatch(sessions, tokens); err != nil {
			for _, j := range active {
				s.end(j, err.Error())
			}
			active = nil
			continue
		}
		kept = active[:0]
		for _, j := range active {
			next, err := j.session.Sample(j.sampler)
			if err != nil {
				s.end(j, err.Error())
				continue
			}
			j.next = next
			kept = append(kept, j)
		}
		active = kept
	}
}

// admit decodes a job's prompt and samples its first token.
func (s *Server) admit(active []*job, j *job) []*job {
	session, err := s.model.NewSession(s.nCtx)
	if err == nil {
		j.session = session
		s.active.Add(1)
		err = session.Decode(j.tokens)
	}
	if err == nil {
		j.next, err = session.Sample(j.sampler)
	}
	if err != nil {
		s.end(j, err.Error())
		return active
	}
	return append(active, j)
}

// emit sends the job's sampled token as text, unless the generation is over
// (end of generation, the token budget, or the client gone).
func (s *Server) emit(j *job) (done bool, reason string) {
	if j.ctx.Err() != nil {
		return true, "client disconnected"
	}
	if s.model.IsEndOfGeneration(j.next) {
		return true, "stop"
	}
	piece, err := s.model.TokenPiece(j.next)
	if err != nil {
		return true, err.Error()
	}
	j.generated++
	j.pending = append(j.pending, piece...)
	// Send whole characters only.
	cut := len(j.pending)
	for cut > 0 && cut > len(j.pending)-4 && !utf8.Valid(j.pending[:cut]) {
		cut--
	}
	if cut > 0 {
		// Never blocks: the channel has room for one piece per token.
		j.pieces <- string(j.pending[:cut])
		j.pending = j.pending[cut:]
	}
	if j.generated >= j.maxTokens {
		return true, "length"
	}
	return false, ""
}

// end finishes a job: reason "stop" or "length" is a normal end (the bytes
// of an incomplete character still pending go out as they are), anything
// else an error.
func (s *Server) end(j *job, reason string) {
	if j.session != nil {
		j.session.Close()
		s.active.Add(-1)
	}
	if reason == "stop" || reason == "length" {
		j.finish = reason
		if len(j.pending) > 0 {
			// Room: one piece per token plus this one.
			j.pieces <- string(j.pending)
		}
	} else {
		j.err = reason
	}
	close(j.pieces)
	<-s.slots
}

// ---- HTTP ----

type request struct {
	Prompt      *string           `json:"prompt"`
	Messages    []m40.ChatMessage `json:"messages"`
	MaxTokens   *int              `json:"max_tokens"`
	Temperature *float32          `json:"temperature"`
	Seed        *uint64           `json:"seed"`
	Stream      bool              `json:"stream"`
}

func httpError(w http.ResponseWriter, status int, message string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": message, "type": "invalid_request_error"}})
}

func (s *Server) models(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		httpError(w, http.StatusMethodNotAllowed, "GET only")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(map[string]any{
		"object": "list",
		"data":   []any{map[string]any{"id": s.name, "object": "model", "owned_by": "m40llm"}},
	})
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request) {
	req, ok := s.decodeRequest(w, r)
	if !ok {
		return
	}
	if req.Prompt == nil {
		httpError(w, http.StatusBadRequest, `"prompt" (a string) is required`)
		return
	}
	s.run(w, r, req, *req.Prompt, false)
}

func (s *Server) chatCompletions(w http.ResponseWriter, r *http.Request) {
	req, ok := s.decodeRequest(w, r)
	if !ok {
		return
	}
	if len(req.Messages) == 0 {
		httpError(w, http.StatusBadRequest, `"messages" (a non-empty list) is required`)
		return
	}
	prompt, err := s.model.ApplyChatTemplate(req.Messages, true)
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	s.run(w, r, req, prompt, true)
}

func (s *Server) decodeRequest(w http.ResponseWriter, r *http.Request) (*request, bool) {
	if r.Method != http.MethodPost {
		httpError(w, http.StatusMethodNotAllowed, "POST only")
		return nil, false
	}
	var req request
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 16<<20)).Decode(&req); err != nil {
		httpError(w, http.StatusBadRequest, "invalid JSON: "+err.Error())
		return nil, false
	}
	return &req, true
}

// run queues the request and writes its reply, whole or as events.
func (s *Server) run(w http.ResponseWriter, r *http.Request, req *request, prompt string, chat bool) {
	tokens, err := s.model.Tokenize(prompt, true)
	if err != nil {
		httpError(w, http.StatusBadRequest, err.Error())
		return
	}
	if len(tokens) >= s.nCtx {
		httpError(w, http.StatusBadRequest, fmt.Sprintf("the prompt has %d tokens; the context holds %d", len(tokens), s.nCtx))
		return
	}
	sampler := m40.DefaultSampler()
	if req.Temperature != nil {
		sampler.Temperature = *req.Temperature
	}
	if req.Seed != nil {
		sampler.Seed = *req.Seed
	}
	// OpenAI's defaults: 16 tokens for a completion, the rest of the
	// context for a chat reply; a random seed unless one is given.
	maxTokens := 16
	if chat {
		maxTokens = s.nCtx
	}
	if req.MaxTokens != nil {
		maxTokens = *req.MaxTokens
	}
	if req.Seed == nil {
		sampler.Seed = uint64(time.Now().UnixNano())
	}
	if limit := s.nCtx - len(tokens); maxTokens > limit || maxTokens <= 0 {
		maxTokens = limit
	}
	// Room for every piece: the scheduler never waits for a slow reader.
	pieces := make(chan string, maxTokens+1)
	j := &job{ctx: r.Context(), tokens: tokens, maxTokens: maxTokens, sampler: sampler, pieces: pieces}
	select {
	case s.slots <- struct{}{}:
	case <-r.Context().Done():
		return
	case <-s.stop:
		httpError(w, http.StatusServiceUnavailable, "the server is stopping")
		return
	}
	select {
	case s.jobs <- j:
	case <-r.Context().Done():
		<-s.slots
		return
	case <-s.stop:
		<-s.slots
		httpError(w, http.StatusServiceUnavailable, "the server is stopping")
		return
	}

	// Nothing is written before the first piece or the end, so that a
	// request that fails at once gets an error status.
	first, more := <-j.pieces
	if !more && j.err != "" {
		httpError(w, http.StatusInternalServerError, j.err)
		return
	}

	id := fmt.Sprintf("m40-%d", time.Now().UnixNano())
	created := time.Now().Unix()
	object := "text_completion"
	if chat {
		object = "chat.completion"
	}
	if !req.Stream {
		var text strings.Builder
		text.WriteString(first)
		for piece := range j.pieces {
			text.WriteString(piece)
		}
		if j.err != "" {
			httpError(w, http.StatusInternalServerError, j.err)
			return
		}
		choice := map[string]any{"index": 0, "finish_reason": j.finish}
		if chat {
			choice["message"] = map[string]any{"role": "assistant", "content": text.String()}
		} else {
			choice["text"] = text.String()
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(map[string]any{
			"id": id, "object": object, "created": created, "model": s.name,
			"choices": []any{choice},
			"usage": map[string]any{"prompt_tokens": len(tokens), "completion_tokens": j.generated,
				"total_tokens": len(tokens) + j.generated},
		})
		return
	}
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	if chat {
		object = "chat.completion.chunk"
	}
	send := func(choice map[string]any) bool {
		data, _ := json.Marshal(map[string]any{"id": id, "object": object, "created": created, "model": s.name,
			"choices": []any{choice}})
		if _, err := fmt.Fprintf(w, "data: %s\n\n", data); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	if chat {
		send(map[string]any{"index": 0, "delta": map[string]any{"role": "assistant"}, "finish_reason": nil})
	}
	stream := func(piece string) bool {
		choice := map[string]any{"index": 0, "finish_reason": nil}
		if chat {
			choice["delta"] = map[string]any{"content": piece}
		} else {
			choice["text"] = piece
		}
		return send(choice)
	}
	if more {
		ok := stream(first)
		for piece := range j.pieces {
			// Once the client is gone, the scheduler sees the request's
			// context end and drops it; what it still sent is drained.
			ok = ok && stream(piece)
		}
		if !ok {
			return
		}
	}
	if j.err != "" {
		// Headers are out: the failure goes as an error event.
		data, _ := json.Marshal(map[string]any{"error": map[string]any{"message": j.err, "type": "server_error"}})
		fmt.Fprintf(w, "data: %s\n\n", data)
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	last := map[string]any{"index": 0, "finish_reason": j.finish}
	if chat {
		last["delta"] = map[string]any{}
	} else {
		last["text"] = ""
	}
	send(last)
	fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}
